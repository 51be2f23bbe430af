// shard_cut_histogram and shard_cut_pick on CUDA: checks, the outputs and the launches on the current
// stream.
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
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
  const auto s = check_shard_cut_histogram(logits, scale, prefix, shift, vocab_start, row_max, keep_value, keep_id);
  const c10::cuda::CUDAGuard guard(logits.device());
  const auto l = logits.contiguous();
  const auto sc = scale.contiguous(), pf = prefix.contiguous();
  const auto rm = row_max.has_value() ? row_max->contiguous() : at::Tensor();
  const auto kv = keep_value.has_value() ? keep_value->contiguous() : at::Tensor();
  const auto ki = shard_cut_keep_id(keep_id);
  auto out = at::zeros({s.r, 2, kCutBuckets}, logits.options().dtype(at::kLong));  // on the current stream
  cuda::ShardCutHistogramParams p{};
  p.logits = l.const_data_ptr();
  p.dtype = cuda::logits_type(l);
  p.r = s.r, p.v = s.v, p.vocab_start = vocab_start, p.ignore_id = ignore_id;
  p.scale = sc.const_data_ptr<float>();
  p.prefix = pf.const_data_ptr<int64_t>();
  p.shift = static_cast<int>(shift);
  p.row_max = rm.defined() ? rm.const_data_ptr<float>() : nullptr;
  p.keep_value = kv.defined() ? kv.const_data_ptr<float>() : nullptr;
  p.keep_id = ki.defined() ? ki.const_data_ptr<int32_t>() : nullptr;
  p.out = out.mutable_data_ptr<int64_t>();
  cuda::check_launch(cuda::launch_shard_cut_histogram(p, cuda::stream()), "shard_cut_histogram");
  return out;
}

std::tuple<at::Tensor, at::Tensor> shard_cut_pick_cuda(const at::Tensor& hist, const at::Tensor& prefix,
                                                       const at::Tensor& before, const at::Tensor& target) {
  const auto s = check_shard_cut_pick(hist, prefix, before, target);
  const c10::cuda::CUDAGuard guard(hist.device());
  const auto h = hist.contiguous(), tg = target.contiguous();
  auto new_prefix = prefix.contiguous().clone(), new_before = before.contiguous().clone();  // on the stream
  cuda::ShardCutPickParams p{h.const_data_ptr<int64_t>(), s.r, s.parts, tg.const_data_ptr<double>(),
                             new_prefix.mutable_data_ptr<int64_t>(), new_before.mutable_data_ptr<int64_t>()};
  cuda::check_launch(cuda::launch_shard_cut_pick(p, cuda::stream()), "shard_cut_pick");
  return {new_prefix, new_before};
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CUDA, m) {
  m.impl("shard_cut_histogram", &shard_cut_histogram_cuda);
  m.impl("shard_cut_pick", &shard_cut_pick_cuda);
}

}  // namespace xkernels
