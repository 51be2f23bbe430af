// shard_row_stats on the CPU: the selected rows in parallel, each a scaled copy of the shard's row
// (aligned to a multiple of 4 global ids, so the Philox draws of row_reduce's samplers are the
// global ids' draws) with the ids outside its cut at -inf, its statistics, then the Gumbel-max pick
// in the sequence's stream.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../ops/checks.h"
#include "../ops/shard_row_stats.h"
#include "dispatch.h"
#include "row_reduce.h"
#include "xkernels/param_errors.h"

namespace xkernels {
namespace {

struct ShardArgs {
  ShardRowShape s;
  int64_t vocab_start, ignore_id;
  bool sample, raw_stats;
  SamplingView view;          // temperatures and streams (no filters)
  const float* cut_value;     // [n, s] or null
  const int32_t* cut_id;
};

// Sets the ids of a (n values of global ids from `first`) outside the cut to -inf: filter_keeps as
// two loops the compiler vectorises, a >= cut.val up to id cut.idx (ties kept), a > cut.val past it.
void drop_outside(float* a, int64_t n, int64_t first, const FilterCut& cut) {
  const int64_t ties = std::clamp<int64_t>(int64_t{cut.idx} - first + 1, 0, n);
  for (int64_t i = 0; i < ties; ++i) a[i] = a[i] >= cut.val ? a[i] : kNegInf;
  for (int64_t i = ties; i < n; ++i) a[i] = a[i] > cut.val ? a[i] : kNegInf;
}

struct ShardOut {
  float *row_max, *row_sum, *pick_score, *pick_logit;
  int64_t *top_id, *pick_id;
};

// Entry (n, j) of the selection, row `row` of sequence n. buf and res hold pad + V floats, pad =
// vocab_start % 4: element i of them is the global id (vocab_start - pad) + i.
template <typename T>
void shard_entry(const ShardArgs& c, int64_t n, int64_t j, int64_t row, const T* logits, const int64_t* exclude,
                 const float* q, const float* residual_stats, float* buf, float* res, const ShardOut& o) {
  const auto& s = c.s;
  const int64_t pad = c.vocab_start % 4, e = n * s.s + j;
  const float inv_t = c.view.row(n).inv_t;  // 0: greedy
  const T* src = logits + (n * s.r + row) * s.v;
  float* a = buf + pad;
  for (int64_t i = 0; i < pad; ++i) buf[i] = kNegInf;
  const bool scale_stats = !c.raw_stats && inv_t != 0.0f;
  const bool cut = c.cut_value && inv_t != 0.0f;  // a cut of the scaled row; a greedy row keeps its argmax
  const FilterCut fc{cut ? c.cut_value[e] : 0.0f, cut ? c.cut_id[e] : 0};
  cpu::scale_row(src, s.v, scale_stats ? inv_t : 1.0f, a);
  const int64_t ignore = c.ignore_id - c.vocab_start;  // local index of the ignored id
  const bool ignore_here = ignore >= 0 && ignore < s.v;
  if (ignore_here) a[ignore] = kNegInf;
  if (cut && scale_stats) drop_outside(a, s.v, c.vocab_start, fc);
  const RowStats st = s.v ? cpu::row_stats(a, s.v) : stats_empty();
  o.row_max[e] = st.top.val;
  o.row_sum[e] = stats_degenerate(st) ? 0.0f : st.sum;
  o.top_id[e] = s.v ? c.vocab_start + st.top.idx : -1;
  o.pick_score[e] = kNegInf, o.pick_id[e] = -1, o.pick_logit[e] = kNegInf;
  if (!c.sample || s.v == 0 || inv_t == 0.0f) return;
  if (!scale_stats) {  // a holds the raw logits: x * 1 * inv_t rounds like x * inv_t
    for (int64_t i = 0; i < s.v; ++i) a[i] *= inv_t;
    if (cut) drop_outside(a, s.v, c.vocab_start, fc);
  }
  for (int64_t k = 0; k < s.e; ++k) {
    const int64_t x = exclude[e * s.e + k] - c.vocab_start;
    if (x >= 0 && x < s.v) a[x] = kNegInf;
  }
  const auto first_draw = static_cast<uint32_t>(c.vocab_start / 4);
  const RowStream stream = c.view.stream(n);
  const auto slot = static_cast<uint32_t>(row);
  const uint64_t seed = stream.seed, offset = stream.offset_at(slot);
  const uint32_t seq = stream.sequence_at(), pos = stream.position_at(slot);
  ArgMax best;
  if (q && row < s.q) {
    for (int64_t i = 0; i < pad; ++i) res[i] = 0.0f;
    cpu::residual_row(a, q + (n * s.q + row) * s.v, s.v, residual_stats[2 * e], residual_stats[2 * e + 1], res + pad);
    best = cpu::sample_positive(seed, offset, seq, pos, res, pad + s.v, first_draw);
  } else {
    best = cpu::sample_logits(seed, offset, seq, pos, buf, pad + s.v, -1, first_draw);
  }
  if (best.val == kNegInf) return;
  const int64_t x = best.idx - pad;
  o.pick_score[e] = best.val;
  o.pick_id[e] = c.vocab_start + x;
  o.pick_logit[e] = c.raw_stats ? static_cast<float>(src[x]) : static_cast<float>(src[x]) * inv_t;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> shard_row_stats_cpu(
    const at::Tensor& logits, int64_t vocab_start, const std::optional<at::Tensor>& rows,
    const std::optional<at::Tensor>& exclude, const std::optional<at::Tensor>& draft_probs,
    const std::optional<at::Tensor>& residual_stats, int64_t ignore_id, bool sample, bool raw_stats,
    XK_SHARD_SAMPLING_ARGS) {
  check_devices(logits, "logits", {{errors, "errors"}});  // first, as the op's own tensors
  const auto s = check_shard_row_stats(logits, vocab_start, rows, exclude, draft_probs, residual_stats, sample);
  const ShardSampling sampling = shard_sampling(s, logits, sample, XK_SHARD_SAMPLING_FORWARD);
  const ShardArgs c{s,
                    vocab_start,
                    ignore_id,
                    sample,
                    raw_stats,
                    sampling_view(sampling.args),
                    sampling.cut_value.defined() ? sampling.cut_value.const_data_ptr<float>() : nullptr,
                    sampling.cut_id.defined() ? sampling.cut_id.const_data_ptr<int32_t>() : nullptr};
  const auto l = logits.contiguous();
  const auto r = rows.has_value() ? rows->contiguous() : at::Tensor();
  if (r.defined()) check_shard_rows(r, s.r);
  if (errors) or_param_errors(c.view, s.n, errors->mutable_data_ptr<int32_t>());
  const auto ex = exclude.has_value() ? exclude->contiguous() : at::Tensor();
  const auto q = draft_probs.has_value() ? draft_probs->contiguous() : at::Tensor();
  const auto rs = residual_stats.has_value() ? residual_stats->contiguous() : at::Tensor();
  auto out = shard_row_outputs(logits, s);
  const ShardOut o{out.row_max.mutable_data_ptr<float>(),    out.row_sum.mutable_data_ptr<float>(),
                   out.pick_score.mutable_data_ptr<float>(), out.pick_logit.mutable_data_ptr<float>(),
                   out.top_id.mutable_data_ptr<int64_t>(),   out.pick_id.mutable_data_ptr<int64_t>()};
  const int64_t* rp = r.defined() ? r.const_data_ptr<int64_t>() : nullptr;
  const int64_t* ep = ex.defined() ? ex.const_data_ptr<int64_t>() : nullptr;
  const float* qp = q.defined() ? q.const_data_ptr<float>() : nullptr;
  const float* sp = rs.defined() ? rs.const_data_ptr<float>() : nullptr;
  cpu::dispatch_logits(l.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* lp = l.const_data_ptr<T>();
    at::parallel_for(0, s.n * s.s, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> buf(static_cast<size_t>(s.v + 4)), res(qp ? static_cast<size_t>(s.v + 4) : 0);
      for (int64_t e = begin; e < end; ++e) {
        const int64_t n = e / s.s, j = e % s.s;
        shard_entry(c, n, j, rp ? rp[e] : j, lp, ep, qp, sp, buf.data(), res.data(), o);
      }
    });
  });
  return {out.row_max, out.row_sum, out.top_id, out.pick_score, out.pick_id, out.pick_logit};
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CPU, m) { m.impl("shard_row_stats", &shard_row_stats_cpu); }

}  // namespace xkernels
