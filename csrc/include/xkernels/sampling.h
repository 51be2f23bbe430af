// Sampling math shared by the CPU and CUDA kernels: a torch.argmax-compatible
// running argmax, online softmax statistics, Gumbel noise from the package's
// Philox stream, and the acceptance rule of speculative verification.
#pragma once

#include <cstdint>

#include "xkernels/host_device.h"
#include "xkernels/philox.h"

namespace xkernels {

// A running argmax that, like torch.argmax, ranks NaN above every number and
// breaks ties toward the lowest index. The empty state loses to everything.
struct ArgMax {
  float val;
  int32_t idx;
};

constexpr int32_t kNoIndex = 0x7FFFFFFF;

XK_HD ArgMax argmax_empty() { return ArgMax{kNegInf, kNoIndex}; }

// Whether (v, i) ranks before (best_v, best_i).
XK_HD bool argmax_before(float v, int32_t i, float best_v, int32_t best_i) {
  const bool v_nan = is_nan_f32(v), best_nan = is_nan_f32(best_v);
  if (v_nan || best_nan) return v_nan && (!best_nan || i < best_i);
  return v > best_v || (v == best_v && i < best_i);
}

XK_HD void argmax_observe(ArgMax& best, float v, int32_t i) {
  if (argmax_before(v, i, best.val, best.idx)) best = ArgMax{v, i};
}

XK_HD ArgMax argmax_merge(ArgMax a, ArgMax b) {
  return argmax_before(b.val, b.idx, a.val, a.idx) ? b : a;
}

// Softmax statistics of one row of scaled logits a = logits / T:
// top = argmax(a), sum = sum_v exp(a_v - top.val). A row whose top value is
// not finite (it holds a NaN or +inf, or is all -inf) has no softmax; the ops
// treat it as a point mass at top.idx.
struct RowStats {
  ArgMax top;
  float sum;
};

XK_HD RowStats stats_empty() { return RowStats{argmax_empty(), 0.0f}; }

XK_HD bool stats_degenerate(const RowStats& s) { return !is_finite_f32(s.top.val); }

// Rescales `sum` from max `from` to max `to` (to >= from); -inf rows add nothing.
XK_HD float rescaled_sum(float sum, float from, float to) {
  return from == kNegInf ? 0.0f : sum * exp_f32(from - to);
}

XK_HD void stats_observe(RowStats& s, float a, int32_t i) {
  if (argmax_before(a, i, s.top.val, s.top.idx)) {
    s.sum = a == kNegInf ? 0.0f : rescaled_sum(s.sum, s.top.val, a) + 1.0f;
    s.top = ArgMax{a, i};
  } else if (a != kNegInf) {
    s.sum += exp_f32(a - s.top.val);
  }
}

XK_HD RowStats stats_merge(const RowStats& x, const RowStats& y) {
  RowStats out;
  out.top = argmax_merge(x.top, y.top);
  out.sum = rescaled_sum(x.sum, x.top.val, out.top.val) + rescaled_sum(y.sum, y.top.val, out.top.val);
  return out;
}

// softmax(a)[v] for a = a_v, given the row's statistics.
XK_HD float stats_prob(const RowStats& s, float a) { return exp_f32(a - s.top.val) / s.sum; }

// Standard Gumbel noise -log(-log(u)) from one Philox word.
XK_HD float gumbel_from_word(uint32_t word) { return -log_f32(-log_f32(uniform_open(word))); }

// Above any noise gumbel_from_word returns (its maximum is -log(-log(1 - 2^-24))
// = 16.64): a candidate whose score plus this bound is below the best so far
// cannot win, so its noise need not be drawn.
constexpr float kGumbelBound = 16.7f;

// 1 - uniform_open(word), exactly: with k = word >> 9, u = (2k + 1) 2^-24 and
// 1 - u = (2k' + 1) 2^-24 for k' = 2^23 - 1 - k = (~word) >> 9, which is
// (1 + k' 2^-23) - (1 - 2^-24), both floats, their difference exact.
XK_HD float uniform_complement(uint32_t word) {
  return float_from_bits(0x3F800000u | (~word >> 9)) - 0x1.fffffep-1f;  // 1 - 2^-24
}

// Which ids' scores a Gumbel-max pass computes. An id with log weight w and
// uniform u (noise G = -log(-log u)) beats the best score b only if w + G > b,
// that is -log u < exp(w - b). Since -log u > 1 - u on (0, 1), an id with
// 1 - u >= exp(w - b + c) cannot win: one exp2 settles what the score's two logs
// would, and the logs run only for the ids that pass, about sum_x exp(w_x - b):
// a few a row once b is near the row's best score.
//
// The margin c = 2^-10 + |b| 2^-18 covers every rounding (float32, round to
// nearest; logf within 1 ulp, 2^x within 2 ulp where it is a normal float, as
// CUDA's and glibc's are). Let t = b - w (exact) and h = |b| 2^-24 + 2^-150 (at
// least half the gap between b and the float below it: a sum below b - h rounds
// below b). The test computes k = (b - c) log2(e) once, r = w log2(e) - k and
// y = 2^r, and skips when 1 - u >= y.
//  1. The computed noise is at most 16.64 + 2^-18 < 17. If t >= 17 + h, every
//     word gives fl(w + G) < b.
//  2. Else r = (c - t) log2(e) + E, where E, the roundings of b - c, of log2(e),
//     of the products and of the difference, is within (2|b| + 2c + 18) 2^-22 +
//     |r| 2^-24. For |b| >= 2^23, c > 32 makes r > 16: no skip. For smaller b,
//     r > -30: y is within a factor 1 - 2^-21 of 2^r, and a skip gives
//     -log u > 1 - u >= y, so G < -r ln 2 + 2^-20 = t - c - E ln 2 + 2^-20. The
//     computed noise is within 2^-18 of G (the inner log's relative error 2^-23
//     moves the outer log by < 2^-22.9; the outer log is within 2^-19 as |G| <
//     17), so it is below t - c + |E| ln 2 + 2^-17 <= t - h: c exceeds h +
//     |E| ln 2 + 2^-17 <= |b| 2^-20.5 + c 2^-21.5 + 2^-16.
// (k is +inf only for b > 2.3e38; a w whose w log2(e) is still finite then lies
// more than about c - 2^-23 |b| > 17 + h below b: case 1.)
// So a skipped id's score is strictly below b and would not have been kept,
// whatever the indices (ties included). A NaN b or w, an infinite b, or w = +inf
// make the test false (no skip); w = -inf is never drawn. A gate built for an
// earlier, lower best is looser, never wrong: the best only rises.
struct GumbelGate {
  float k;  // (b - c) log2(e)
};

XK_HD GumbelGate gumbel_gate(float best) {
  const float c = (best < 0.0f ? -best : best) * 0x1p-18f + 0x1p-10f;
  return GumbelGate{(best - c) * kLog2e};
}

// 2^x for the test: within 2 ulp where the result is a normal float, and in [0, 2^-126] below
// that (r <= -30 happens only in case 1 above, where any answer is right). On CUDA the bare MUFU
// instruction, which exp2f runs for such x too: its handling of subnormal results would cost
// three more instructions an id.
XK_HD float gate_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

// Whether the id of log weight w and Philox word `word` cannot beat the gate's best.
XK_HD bool gumbel_cannot_win(const GumbelGate& gate, float w, uint32_t word) {
  return uniform_complement(word) >= gate_exp2(w * kLog2e - gate.k);
}

// The test for a weight given linearly, x > 0 (score logf(x) + G): 2^(w log2(e) - k)
// for w = log x is x 2^-k, one multiply an id by e = 2^-k, taken once. The error
// analysis above holds with logf's ulp (|w| 2^-23 in the exponent) in place of
// the rounding of w log2(e), and y = x e is rounded once (a normal float in case
// 2). Needs e normal: else (b - c > 87, or < -88) this returns +inf, and x e
// tests nothing.
XK_HD float gumbel_gate_scale(const GumbelGate& gate) {
  const float e = gate_exp2(-gate.k);
  return e >= 0x1p-126f ? e : __builtin_huge_valf();
}

XK_HD bool gumbel_cannot_win_linear(float scale, float x, uint32_t word) {
  return uniform_complement(word) >= x * scale;
}

// Gumbel-max over ids 4g .. 4g+count-1 (count <= 4) with log weights w (-inf:
// never drawn) and the noise of (sequence, position), into best. Draw g is made
// only if some id could beat best with the largest noise, and an id's exact score
// only if gumbel_cannot_win leaves it possible.
XK_HD void gumbel_group(ArgMax& best, uint64_t seed, uint64_t offset, uint32_t sequence, uint32_t position,
                        uint32_t g, const float* w, int count) {
  float top = kNegInf;  // the group's largest weight, NaNs aside (as before, they make no group live)
  for (int j = 0; j < 4; ++j)
    if (j < count) top = max_ignoring_nan(top, w[j]);
  if (top == kNegInf || !(top + kGumbelBound >= best.val)) return;
  const Philox4 r = philox_draw(seed, offset, sequence, position, g);
  // All four tests first, without branches, then one branch for the group: most groups have no id
  // left, and a warp then runs no exact score at all.
  const GumbelGate gate = gumbel_gate(best.val);
  bool may_win[4], any = false;
  for (int j = 0; j < 4; ++j) {
    may_win[j] = j < count && (w[j] != kNegInf) & !gumbel_cannot_win(gate, w[j], r.w[j]);
    any |= may_win[j];
  }
  if (!any) return;
  for (int j = 0; j < 4; ++j)
    if (may_win[j]) argmax_observe(best, w[j] + gumbel_from_word(r.w[j]), static_cast<int32_t>(4 * g + j));
}

XK_HD float acceptance_coin(uint64_t seed, uint64_t offset, uint32_t sequence, uint32_t row) {
  return uniform_open(philox_draw(seed, offset, sequence, row, kCoinDraw).w[0]);
}

// Speculative acceptance of one draft token x at one verification row.
// greedy: T == 0 or a degenerate row; then x is accepted iff it is the argmax.
// Otherwise p = softmax(a)[x]; with the draft's own probability q = q(x) the
// rule is u * q < p (accept with probability min(1, p / q)); without draft
// probabilities the draft is a deterministic proposal and the rule is u < p.
XK_HD bool draft_accepted(bool greedy, int32_t x, const RowStats& s, float a_x, bool has_q, float q_x,
                          float u) {
  if (greedy) return x == s.top.idx;
  const float p = stats_prob(s, a_x);
  return has_q ? u * q_x < p : u < p;
}

// What the sampling pass draws at the row where verification stopped.
enum SampleMode : int32_t {
  kSampleDone = 0,      // the token is already known (greedy)
  kSamplePlain = 1,     // from p = softmax(a): the bonus row
  kSampleExclude = 2,   // from p with the rejected draft removed (no draft probabilities)
  kSampleResidual = 3,  // from normalize(max(p - q, 0))
};

struct SampleJob {
  int32_t mode;      // SampleMode
  int32_t row;       // verification row of the sample
  int32_t exclude;   // the rejected draft (kSampleExclude)
  int32_t fallback;  // the row's argmax, used if nothing can be drawn
  RowStats stats;    // of the row
};

// log of the unnormalised probability of drawing v under the job's mode, or
// -inf if v cannot be drawn.
XK_HD float sample_log_weight(const SampleJob& job, float a, int32_t v, float q) {
  switch (job.mode) {
    case kSampleExclude:
      return v == job.exclude ? kNegInf : a;
    case kSampleResidual: {
      const float r = stats_prob(job.stats, a) - q;
      return r > 0.0f ? log_f32(r) : kNegInf;
    }
    default:
      return a;
  }
}

// gumbel_group for weights r of ids 4g .. 4g+3 given linearly (score logf(r) + noise; r <= 0 or
// NaN: never drawn, so ids past a row's end hold 0): the group draws only if its largest r e exceeds
// 2^-24, the least 1 - u (else every id fails the test whatever its word), and logf(r) runs only for
// the ids the test leaves.
XK_HD void linear_group(ArgMax& best, uint64_t seed, uint64_t offset, uint32_t sequence, uint32_t position,
                        uint32_t g, const float (&r)[4]) {
  float top = 0.0f;
  for (int j = 0; j < 4; ++j) top = max_ignoring_nan(top, r[j]);
  const float scale = gumbel_gate_scale(gumbel_gate(best.val));
  if (!(top * scale > 0x1p-24f)) return;  // no r > 0: 0 * scale is 0 or NaN
  const Philox4 word = philox_draw(seed, offset, sequence, position, g);
  bool may_win[4], any = false;
  for (int j = 0; j < 4; ++j) {
    may_win[j] = (r[j] > 0.0f) & !gumbel_cannot_win_linear(scale, r[j], word.w[j]);
    any |= may_win[j];
  }
  if (!any) return;
  for (int j = 0; j < 4; ++j)
    if (may_win[j])
      argmax_observe(best, log_f32(r[j]) + gumbel_from_word(word.w[j]), static_cast<int32_t>(4 * g + j));
}

// linear_group for the residual weights r = p - q (kSampleResidual).
XK_HD void residual_group(ArgMax& best, const SampleJob& job, uint64_t seed, uint64_t offset, uint32_t sequence,
                          uint32_t g, const float* a, const float* q, int count) {
  float r[4];
  for (int j = 0; j < 4; ++j) r[j] = j < count ? stats_prob(job.stats, a[j]) - (q ? q[j] : 0.0f) : 0.0f;
  linear_group(best, seed, offset, sequence, static_cast<uint32_t>(job.row), g, r);
}

// Gumbel-max over vocabulary ids 4g .. 4g+count-1 under the job's weights (gumbel_group).
XK_HD void sample_group(ArgMax& best, const SampleJob& job, uint64_t seed, uint64_t offset,
                        uint32_t sequence, uint32_t g, const float* a, const float* q, int count) {
  if (job.mode == kSampleResidual) return residual_group(best, job, seed, offset, sequence, g, a, q, count);
  float w[4];
  for (int j = 0; j < 4; ++j)
    w[j] = j < count ? sample_log_weight(job, a[j], static_cast<int32_t>(4 * g + j), q ? q[j] : 0.0f) : kNegInf;
  gumbel_group(best, seed, offset, sequence, static_cast<uint32_t>(job.row), g, w, count);
}

XK_HD int32_t sample_result(const SampleJob& job, const ArgMax& best) {
  return best.val == kNegInf ? job.fallback : best.idx;
}

// One pass over a row of scaled logits a that both samples and scores:
// pick = argmax(a + noise) (noise = 0 for greedy), with the pick's own a, and the
// softmax statistics of a, so log_softmax(a)[pick] needs no second pass.
struct SampledRow {
  ArgMax pick;   // by the perturbed score
  float pick_a;  // a at pick.idx
  RowStats stats;
};

XK_HD SampledRow sampled_empty() { return SampledRow{argmax_empty(), kNegInf, stats_empty()}; }

XK_HD void sampled_observe(SampledRow& r, float a, float noise, int32_t v) {
  stats_observe(r.stats, a, v);
  const float score = a + noise;
  if (argmax_before(score, v, r.pick.val, r.pick.idx)) {
    r.pick = ArgMax{score, v};
    r.pick_a = a;
  }
}

XK_HD SampledRow sampled_merge(const SampledRow& x, const SampledRow& y) {
  const bool take_y = argmax_before(y.pick.val, y.pick.idx, x.pick.val, x.pick.idx);
  return SampledRow{take_y ? y.pick : x.pick, take_y ? y.pick_a : x.pick_a, stats_merge(x.stats, y.stats)};
}

// The token of a merged row: the perturbed argmax, or the row's argmax when the row has no
// softmax (a NaN, a +inf, or all -inf: a point mass at its torch.argmax whatever the noise).
XK_HD int32_t sampled_token(const SampledRow& r) {
  const int32_t idx = stats_degenerate(r.stats) ? r.stats.top.idx : r.pick.idx;
  return idx == kNoIndex ? 0 : idx;
}

// log_softmax(a)[pick]; NaN when the row has no softmax.
XK_HD float sampled_logprob(const SampledRow& r) {
  return stats_degenerate(r.stats) ? __builtin_nanf("") : r.pick_a - r.stats.top.val - log_f32(r.stats.sum);
}

}  // namespace xkernels
