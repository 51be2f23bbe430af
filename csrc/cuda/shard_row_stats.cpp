// shard_row_stats on CUDA: checks, allocation and the launch on the current stream (with `errors`,
// first param_errors_kernel's).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops/checks.h"
#include "../ops/shard_row_stats.h"
#include "binding.h"
#include "param_errors_binding.h"
#include "shard_row_stats_launch.h"

namespace xkernels {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> shard_row_stats_cuda(
    const at::Tensor& logits, int64_t vocab_start, const std::optional<at::Tensor>& rows,
    const std::optional<at::Tensor>& exclude, const std::optional<at::Tensor>& draft_probs,
    const std::optional<at::Tensor>& residual_stats, int64_t ignore_id, bool sample, bool raw_stats,
    XK_SHARD_SAMPLING_ARGS) {
  check_devices(logits, "logits", {{errors, "errors"}});  // first, as the op's own tensors
  const auto s = check_shard_row_stats(logits, vocab_start, rows, exclude, draft_probs, residual_stats, sample);
  const c10::cuda::CUDAGuard guard(logits.device());
  const ShardSampling sampling = shard_sampling(s, logits, sample, XK_SHARD_SAMPLING_FORWARD);
  const auto l = logits.contiguous();
  const auto r = rows.has_value() ? rows->contiguous() : at::Tensor();
  if (r.defined() && value_checks_enabled()) check_shard_rows(r, s.r);  // else bad rows get empty results
  cuda::flag_param_errors(sampling.args, errors, "shard_row_stats");
  const auto ex = exclude.has_value() ? exclude->contiguous() : at::Tensor();
  const auto q = draft_probs.has_value() ? draft_probs->contiguous() : at::Tensor();
  const auto rs = residual_stats.has_value() ? residual_stats->contiguous() : at::Tensor();
  auto out = shard_row_outputs(logits, s);
  cuda::ShardRowStatsParams p{};
  p.logits = l.const_data_ptr();
  p.dtype = cuda::logits_type(l);
  p.n = s.n, p.r = s.r, p.v = s.v, p.s = s.s, p.e = s.e, p.q = s.q;
  p.vocab_start = vocab_start, p.ignore_id = ignore_id;
  p.rows = r.defined() ? r.const_data_ptr<int64_t>() : nullptr;
  p.exclude = ex.defined() ? ex.const_data_ptr<int64_t>() : nullptr;
  p.draft_probs = q.defined() ? q.const_data_ptr<float>() : nullptr;
  p.residual_stats = rs.defined() ? rs.const_data_ptr<float>() : nullptr;
  p.sample = sample, p.raw_stats = raw_stats;
  p.s_args = sampling_view(sampling.args);
  p.cut_value = sampling.cut_value.defined() ? sampling.cut_value.const_data_ptr<float>() : nullptr;
  p.cut_id = sampling.cut_id.defined() ? sampling.cut_id.const_data_ptr<int32_t>() : nullptr;
  p.row_max = out.row_max.mutable_data_ptr<float>();
  p.row_sum = out.row_sum.mutable_data_ptr<float>();
  p.pick_score = out.pick_score.mutable_data_ptr<float>();
  p.pick_logit = out.pick_logit.mutable_data_ptr<float>();
  p.top_id = out.top_id.mutable_data_ptr<int64_t>();
  p.pick_id = out.pick_id.mutable_data_ptr<int64_t>();
  cuda::check_launch(cuda::launch_shard_row_stats(p, cuda::stream()), "shard_row_stats");
  return {out.row_max, out.row_sum, out.top_id, out.pick_score, out.pick_id, out.pick_logit};
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CUDA, m) { m.impl("shard_row_stats", &shard_row_stats_cuda); }

}  // namespace xkernels
