// shard_cut_histogram, shard_cut_pick and shard_cut_candidates: the C++ API (through the dispatcher) and the argument
// checks both kernels run.
#include "shard_cut.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>


#include "checks.h"
#include "xkernels/ops.h"
#include "xkernels/shard_cut.h"

namespace xkernels {

at::Tensor shard_cut_histogram(const at::Tensor& logits, const at::Tensor& scale, const at::Tensor& prefix,
                               int64_t shift, int64_t vocab_start, int64_t ignore_id,
                               const std::optional<at::Tensor>& row_max, const std::optional<at::Tensor>& keep_value,
                               const std::optional<at::Tensor>& keep_id) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("xkernels::shard_cut_histogram", "")
                       .typed<decltype(shard_cut_histogram)>();
  return op.call(logits, scale, prefix, shift, vocab_start, ignore_id, row_max, keep_value, keep_id);
}

std::tuple<at::Tensor, at::Tensor> shard_cut_pick(const at::Tensor& hist, const at::Tensor& prefix,
                                                  const at::Tensor& before, const at::Tensor& target) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("xkernels::shard_cut_pick", "")
                       .typed<decltype(shard_cut_pick)>();
  return op.call(hist, prefix, before, target);
}

std::tuple<at::Tensor, at::Tensor> shard_cut_candidates(const at::Tensor& logits, const at::Tensor& scale,
                                                        int64_t count, int64_t vocab_start, int64_t ignore_id,
                                                        const std::optional<at::Tensor>& row_max) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("xkernels::shard_cut_candidates", "")
                       .typed<decltype(shard_cut_candidates)>();
  return op.call(logits, scale, count, vocab_start, ignore_id, row_max);
}

static void check_row_tensor(const at::Tensor& t, const char* name, int64_t r, bool ids) {
  const auto dt = t.scalar_type();
  if (ids) {
    TORCH_CHECK(dt == at::kLong || dt == at::kInt, name, " must be int64 or int32, got ", dt);
  } else {
    TORCH_CHECK(dt == at::kFloat, name, " must be float32, got ", dt);
  }
  TORCH_CHECK(t.dim() == 1 && t.size(0) == r, name, " must have shape [R] with R = ", r, " (logits' rows), got ",
              t.sizes());
}

ShardCutCall shard_cut_histogram_call(const at::Tensor& logits, const at::Tensor& scale, const at::Tensor& prefix,
                                      int64_t shift, int64_t vocab_start, const std::optional<at::Tensor>& row_max,
                                      const std::optional<at::Tensor>& keep_value,
                                      const std::optional<at::Tensor>& keep_id) {
  check_devices(logits, "logits", {{scale, "scale"}, {prefix, "prefix"}, {row_max, "row_max"},
                                   {keep_value, "keep_value"}, {keep_id, "keep_id"}});
  TORCH_CHECK(logits.dim() == 2, "logits must have shape [R, V_local], got ", logits.sizes());
  const ShardCutShape s{logits.size(0), logits.size(1)};
  check_shard_logits(logits, vocab_start);
  TORCH_CHECK(shift >= 0 && shift <= kCutTopShift && shift % kCutDigitBits == 0,
              "shift must be one of 0, 8, ..., 56 (the digit a round histograms), got ", shift);
  check_row_tensor(scale, "scale", s.r, false);
  TORCH_CHECK(prefix.scalar_type() == at::kLong, "prefix must be int64, got ", prefix.scalar_type());
  check_row_tensor(prefix, "prefix", s.r, true);
  if (row_max.has_value()) check_row_tensor(*row_max, "row_max", s.r, false);
  TORCH_CHECK(keep_value.has_value() == keep_id.has_value(),
              "keep_value and keep_id go together (a cut is a value and an id)");
  if (keep_value.has_value()) {
    check_row_tensor(*keep_value, "keep_value", s.r, false);
    check_row_tensor(*keep_id, "keep_id", s.r, true);
  }
  const auto contiguous = [](const std::optional<at::Tensor>& t) {
    return t.has_value() ? t->contiguous() : at::Tensor();
  };
  const at::Tensor id = keep_id.has_value() ? cut_ids_int32(*keep_id) : at::Tensor();
  return ShardCutCall{s,
                      logits.contiguous(),
                      scale.contiguous(),
                      prefix.contiguous(),
                      contiguous(row_max),
                      contiguous(keep_value),
                      id,
                      at::zeros({s.r, 2, kCutBuckets}, logits.options().dtype(at::kLong))};
}

ShardCandidatesCall shard_cut_candidates_call(const at::Tensor& logits, const at::Tensor& scale, int64_t count,
                                              int64_t vocab_start, const std::optional<at::Tensor>& row_max) {
  check_devices(logits, "logits", {{scale, "scale"}, {row_max, "row_max"}});
  TORCH_CHECK(logits.dim() == 2, "logits must have shape [R, V_local], got ", logits.sizes());
  const ShardCutShape s{logits.size(0), logits.size(1)};
  check_shard_logits(logits, vocab_start);
  TORCH_CHECK(count >= 0 && count <= kCutCandidatesMax, "count must be in [0, ", kCutCandidatesMax,
              "] (the lowest keys a row keeps), got ", count);
  check_row_tensor(scale, "scale", s.r, false);
  if (row_max.has_value()) check_row_tensor(*row_max, "row_max", s.r, false);
  const auto ids = logits.options().dtype(at::kLong);
  return ShardCandidatesCall{s,
                             logits.contiguous(),
                             scale.contiguous(),
                             row_max.has_value() ? row_max->contiguous() : at::Tensor(),
                             at::empty({s.r, count}, ids),
                             at::zeros({s.r, row_max.has_value() ? count : 0, 2}, ids)};
}

ShardPickCall shard_cut_pick_call(const at::Tensor& hist, const at::Tensor& prefix, const at::Tensor& before,
                                  const at::Tensor& target) {
  check_devices(hist, "hist", {{prefix, "prefix"}, {before, "before"}, {target, "target"}});
  TORCH_CHECK(hist.scalar_type() == at::kLong, "hist must be int64, got ", hist.scalar_type());
  TORCH_CHECK(hist.dim() == 3 && (hist.size(1) == 1 || hist.size(1) == 2) && hist.size(2) == kCutBuckets,
              "hist must have shape [R, P, 256] with P = 1 (hi parts) or 2 (hi and lo parts), got ", hist.sizes());
  const int64_t r = hist.size(0), parts = hist.size(1);
  TORCH_CHECK(prefix.scalar_type() == at::kLong, "prefix must be int64, got ", prefix.scalar_type());
  TORCH_CHECK(prefix.dim() == 1 && prefix.size(0) == r, "prefix must have shape [R] with R = ", r,
              " (hist's rows), got ", prefix.sizes());
  TORCH_CHECK(before.scalar_type() == at::kLong, "before must be int64, got ", before.scalar_type());
  TORCH_CHECK(before.dim() == 2 && before.size(0) == r && before.size(1) == 2, "before must have shape [R, 2] = [",
              r, ", 2], got ", before.sizes());
  TORCH_CHECK(target.scalar_type() == at::kDouble, "target must be float64, got ", target.scalar_type());
  TORCH_CHECK(target.dim() == 1 && target.size(0) == r, "target must have shape [R] with R = ", r,
              " (hist's rows), got ", target.sizes());
  return ShardPickCall{r, parts, hist.contiguous(), target.contiguous(), prefix.contiguous().clone(),
                       before.contiguous().clone()};
}

}  // namespace xkernels
