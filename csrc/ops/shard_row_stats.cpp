// shard_row_stats: the C++ API (through the dispatcher) and the argument checks both kernels run.
#include "shard_row_stats.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>


#include "checks.h"
#include "xkernels/ops.h"

namespace xkernels {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> shard_row_stats(
    const at::Tensor& logits, int64_t vocab_start, const std::optional<at::Tensor>& rows,
    const std::optional<at::Tensor>& exclude, const std::optional<at::Tensor>& draft_probs,
    const std::optional<at::Tensor>& residual_stats, int64_t ignore_id, bool sample, bool raw_stats,
    XK_SHARD_SAMPLING_ARGS) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("xkernels::shard_row_stats", "")
                       .typed<decltype(shard_row_stats)>();
  return op.call(logits, vocab_start, rows, exclude, draft_probs, residual_stats, ignore_id, sample, raw_stats,
                 XK_SHARD_SAMPLING_FORWARD);
}

ShardRowShape check_shard_row_stats(const at::Tensor& logits, int64_t vocab_start,
                                    const std::optional<at::Tensor>& rows, const std::optional<at::Tensor>& exclude,
                                    const std::optional<at::Tensor>& draft_probs,
                                    const std::optional<at::Tensor>& residual_stats, bool sample) {
  check_devices(logits, "logits", {{rows, "rows"}, {exclude, "exclude"}, {draft_probs, "draft_probs"},
                                   {residual_stats, "residual_stats"}});
  TORCH_CHECK(logits.dim() == 3, "logits must have shape [N, R, V_local], got ", logits.sizes());
  ShardRowShape s{logits.size(0), logits.size(1), logits.size(2), logits.size(1), 0, 0};
  check_shard_logits(logits, vocab_start);
  if (rows.has_value()) {
    TORCH_CHECK(rows->scalar_type() == at::kLong, "rows must be int64, got ", rows->scalar_type());
    TORCH_CHECK(rows->dim() == 2 && rows->size(0) == s.n, "rows must have shape [N, S] with N = ", s.n, ", got ",
                rows->sizes());
    s.s = rows->size(1);
  }
  if (exclude.has_value()) {
    TORCH_CHECK(exclude->scalar_type() == at::kLong, "exclude must be int64, got ", exclude->scalar_type());
    TORCH_CHECK(exclude->dim() == 3 && exclude->size(0) == s.n && exclude->size(1) == s.s,
                "exclude must have shape [N, S, E] = [", s.n, ", ", s.s, ", E], got ", exclude->sizes());
    s.e = exclude->size(2);
  }
  TORCH_CHECK(draft_probs.has_value() == residual_stats.has_value(),
              "draft_probs and residual_stats go together (the residual max(p - q, 0) needs p's global statistics)");
  if (draft_probs.has_value()) {
    TORCH_CHECK(sample, "draft_probs is only read when sampling (sample=True)");
    const auto& q = *draft_probs;
    TORCH_CHECK(q.scalar_type() == at::kFloat, "draft_probs must be float32, got ", q.scalar_type());
    TORCH_CHECK(q.dim() == 3 && q.size(0) == s.n && q.size(1) <= s.r && q.size(2) == s.v,
                "draft_probs must have shape [N, Q, V_local] with Q <= R: [", s.n, ", <=", s.r, ", ", s.v, "], got ",
                q.sizes());
    s.q = q.size(1);
    const auto& st = *residual_stats;
    TORCH_CHECK(st.scalar_type() == at::kFloat, "residual_stats must be float32, got ", st.scalar_type());
    TORCH_CHECK(st.dim() == 3 && st.size(0) == s.n && st.size(1) == s.s && st.size(2) == 2,
                "residual_stats must have shape [N, S, 2] = [", s.n, ", ", s.s, ", 2], got ", st.sizes());
  }
  return s;
}

ShardSampling shard_sampling(const ShardRowShape& s, const at::Tensor& logits, bool sample, XK_SHARD_SAMPLING_ARGS) {
  check_errors(errors, s.n);
  // No filters here (the cut comes in cut_value / cut_id), so their order is moot.
  ShardSampling out{sampling_args(s.n, logits.device(), temperature, temperature_tensor, 0, std::nullopt, 1.0,
                                  std::nullopt, 0.0, std::nullopt, seed, seed_tensor, offset, offset_tensor,
                                  "top_k_first", !errors.has_value()),
                    at::Tensor(), at::Tensor()};
  TORCH_CHECK(!sample || out.args.may_sample(),
              "sample=True needs temperature > 0 (greedy rows need no sampling); a per-row temperature may hold 0s");
  TORCH_CHECK(cut_value.has_value() == cut_id.has_value(), "cut_value and cut_id go together (a cut is a value and an id)");
  if (cut_value.has_value()) {
    check_devices(logits, "logits", {{cut_value, "cut_value"}, {cut_id, "cut_id"}});
    TORCH_CHECK(cut_value->scalar_type() == at::kFloat, "cut_value must be float32, got ", cut_value->scalar_type());
    TORCH_CHECK(cut_id->scalar_type() == at::kLong || cut_id->scalar_type() == at::kInt,
                "cut_id must be int64 or int32, got ", cut_id->scalar_type());
    for (const auto* t : {&*cut_value, &*cut_id}) {
      const char* name = t == &*cut_value ? "cut_value" : "cut_id";
      TORCH_CHECK(t->dim() == 2 && t->size(0) == s.n && t->size(1) == s.s, name, " must have shape [N, S] = [", s.n,
                  ", ", s.s, "], got ", t->sizes());
    }
    out.cut_value = cut_value->contiguous();
    out.cut_id = cut_ids_int32(*cut_id);
  }
  return out;
}

void check_shard_rows(const at::Tensor& rows, int64_t r) {
  if (rows.numel() == 0) return;
  const int64_t lo = rows.min().item<int64_t>(), hi = rows.max().item<int64_t>();
  TORCH_CHECK(lo >= 0 && hi < r, "rows holds row indices outside [0, ", r, ")");
}

ShardRowOutputs shard_row_outputs(const at::Tensor& logits, const ShardRowShape& s) {
  const auto f = logits.options().dtype(at::kFloat), i = logits.options().dtype(at::kLong);
  return ShardRowOutputs{at::empty({s.n, s.s}, f), at::empty({s.n, s.s}, f), at::empty({s.n, s.s}, i),
                         at::empty({s.n, s.s}, f), at::empty({s.n, s.s}, i), at::empty({s.n, s.s}, f)};
}

}  // namespace xkernels
