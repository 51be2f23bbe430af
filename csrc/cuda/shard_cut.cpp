// shard_cut_histogram, shard_cut_pick and shard_cut_candidates on CUDA: checks, the outputs and the launches on the current
// stream.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops/shard_cut.h"
#include "binding.h"
#include "shard_cut_launch.h"
#include "xkernels/shard_cut.h"

namespace xkernels {
namespace {

at::Tensor shard_cut_histogram_cuda(const at::Tensor& logits, const at::Tensor& scale, const at::Tensor& prefix,
                                    int64_t shift, int64_t vocab_start, int64_t ignore_id,
                                    const std::optional<at::Tensor>& row_max,
                                    const std::optional<at::Tensor>& keep_value,
                                    const std::optional<at::Tensor>& keep_id) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const ShardCutCall c = shard_cut_histogram_call(logits, scale, prefix, shift, vocab_start, row_max, keep_value,
                                                  keep_id);  // out zero-filled on the current stream
  cuda::ShardCutHistogramParams p{};
  p.logits = c.logits.const_data_ptr();
  p.dtype = cuda::logits_type(c.logits);
  p.r = c.s.r, p.v = c.s.v, p.vocab_start = vocab_start, p.ignore_id = ignore_id;
  p.scale = c.scale.const_data_ptr<float>();
  p.prefix = c.prefix.const_data_ptr<int64_t>();
  p.shift = static_cast<int>(shift);
  p.row_max = c.row_max.defined() ? c.row_max.const_data_ptr<float>() : nullptr;
  p.keep_value = c.keep_value.defined() ? c.keep_value.const_data_ptr<float>() : nullptr;
  p.keep_id = c.keep_id.defined() ? c.keep_id.const_data_ptr<int32_t>() : nullptr;
  p.out = c.out.mutable_data_ptr<int64_t>();
  cuda::check_launch(cuda::launch_shard_cut_histogram(p, cuda::stream()), "shard_cut_histogram");
  return c.out;
}

std::tuple<at::Tensor, at::Tensor> shard_cut_pick_cuda(const at::Tensor& hist, const at::Tensor& prefix,
                                                       const at::Tensor& before, const at::Tensor& target) {
  const c10::cuda::CUDAGuard guard(hist.device());
  const ShardPickCall c = shard_cut_pick_call(hist, prefix, before, target);  // the copies on the stream
  const cuda::ShardCutPickParams p{c.hist.const_data_ptr<int64_t>(), c.r, c.parts, c.target.const_data_ptr<double>(),
                                   c.prefix.mutable_data_ptr<int64_t>(), c.before.mutable_data_ptr<int64_t>()};
  cuda::check_launch(cuda::launch_shard_cut_pick(p, cuda::stream()), "shard_cut_pick");
  return {c.prefix, c.before};
}

std::tuple<at::Tensor, at::Tensor> shard_cut_candidates_cuda(const at::Tensor& logits, const at::Tensor& scale,
                                                             int64_t count, int64_t vocab_start, int64_t ignore_id,
                                                             const std::optional<at::Tensor>& row_max) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const ShardCandidatesCall c = shard_cut_candidates_call(logits, scale, count, vocab_start, row_max);
  cuda::ShardCutCandidatesParams p{};
  p.logits = c.logits.const_data_ptr();
  p.dtype = cuda::logits_type(c.logits);
  p.r = c.s.r, p.v = c.s.v, p.vocab_start = vocab_start, p.ignore_id = ignore_id, p.count = count;
  p.scale = c.scale.const_data_ptr<float>();
  p.row_max = c.row_max.defined() ? c.row_max.const_data_ptr<float>() : nullptr;
  p.keys = c.keys.mutable_data_ptr<int64_t>();
  p.weights = c.row_max.defined() ? c.weights.mutable_data_ptr<int64_t>() : nullptr;
  cuda::check_launch(cuda::launch_shard_cut_candidates(p, cuda::stream()), "shard_cut_candidates");
  return {c.keys, c.weights};
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CUDA, m) {
  m.impl("shard_cut_histogram", &shard_cut_histogram_cuda);
  m.impl("shard_cut_pick", &shard_cut_pick_cuda);
  m.impl("shard_cut_candidates", &shard_cut_candidates_cuda);
}

}  // namespace xkernels
