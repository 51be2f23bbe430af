#include "row_reduce.h"
#include "vec_math.h"

#include "xkernels/tree.h"

#include <cmath>
#include <cstring>

// Each hot loop is compiled for AVX-512, AVX2 and the baseline, picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define XK_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define XK_CLONES
#endif

namespace xkernels::cpu {
namespace {

constexpr int kLanes = 8;

inline f32x8 load8(const float* p) { return load<f32x8>(p); }

template <typename T>
inline void scale_row_impl(const T* row, int64_t n, float scale, float* out) {
  for (int64_t v = 0; v < n; ++v) out[v] = static_cast<float>(row[v]) * scale;
}

// Eight consecutive values as float32.
inline f32x8 load8(const c10::BFloat16* p) {
  typedef uint16_t u16x8 __attribute__((vector_size(16)));
  typedef uint32_t u32x8 __attribute__((vector_size(32)));
  u16x8 h;
  std::memcpy(&h, p, sizeof(h));
  const u32x8 bits = __builtin_convertvector(h, u32x8) << 16;
  f32x8 x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}
inline f32x8 load8(const c10::Half* p) {
  f32x8 x;
  for (int j = 0; j < 8; ++j) x[j] = static_cast<float>(p[j]);
  return x;
}

// out row j (at out + j * out_stride), ids i0..i0+7 = (bias_j[i0..] + column j of the 8 x 8 block of in
// (row i at in + i * in_stride)) * scale: the unpack / shuffle / lane-swap transpose of AVX, through
// vector extensions so each target clone lowers it to its own registers.
template <typename P, typename T>
__attribute__((always_inline)) inline void transpose8x8_add(const P* in, int64_t in_stride, const T* const* bias,
                                                            int64_t i0, float scale, float* out, int64_t out_stride) {
  f32x8 r[8], t[8], s[8];
  for (int i = 0; i < 8; ++i) r[i] = load8(in + i * in_stride);
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; ++h) {
      s[i + 2 * h] = __builtin_shufflevector(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      s[i + 2 * h + 1] = __builtin_shufflevector(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  // s[0..3] hold columns (0, 4), (1, 5), (2, 6), (3, 7) of rows 0-3, s[4..7] those of rows 4-7.
  for (int j = 0; j < 4; ++j) {
    const f32x8 lo = (load8(bias[j] + i0) + __builtin_shufflevector(s[j], s[j + 4], 0, 1, 2, 3, 8, 9, 10, 11)) * scale;
    const f32x8 hi =
        (load8(bias[j + 4] + i0) + __builtin_shufflevector(s[j], s[j + 4], 4, 5, 6, 7, 12, 13, 14, 15)) * scale;
    std::memcpy(out + j * out_stride + i0, &lo, sizeof(lo));
    std::memcpy(out + (j + 4) * out_stride + i0, &hi, sizeof(hi));
  }
}

// always_inline: each target clone below must get its own copy, not a call to the baseline one.
template <typename P, typename T>
__attribute__((always_inline)) inline void transpose_add_scale_impl(const P* in, int64_t n, int64_t rows, const T* const* bias, float scale,
                                     float* out, int64_t out_stride) {
  const auto one = [&](int64_t i, int64_t m) {
    out[m * out_stride + i] = (static_cast<float>(bias[m][i]) + static_cast<float>(in[i * rows + m])) * scale;
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    int64_t m = 0;
    for (; m + 8 <= rows; m += 8) transpose8x8_add(in + i * rows + m, rows, bias + m, i, scale, out + m * out_stride, out_stride);
    for (; m < rows; ++m)
      for (int64_t k = i; k < i + 8; ++k) one(k, m);
  }
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = i; k < n; ++k) one(k, m);
}

}  // namespace

XK_CLONES void scale_row(const float* row, int64_t n, float scale, float* out) { scale_row_impl(row, n, scale, out); }
XK_CLONES void scale_row(const c10::BFloat16* row, int64_t n, float scale, float* out) {
  scale_row_impl(row, n, scale, out);
}
XK_CLONES void scale_row(const c10::Half* row, int64_t n, float scale, float* out) {
  scale_row_impl(row, n, scale, out);
}

#define XK_DEFINE_TRANSPOSE_ADD_SCALE(P, T)                                                                   \
  XK_CLONES void transpose_add_scale(const P* in, int64_t n, int64_t rows, const T* const* bias, float scale, \
                                     float* out, int64_t out_stride) {                                      \
    transpose_add_scale_impl(in, n, rows, bias, scale, out, out_stride);                                    \
  }
XK_TRANSPOSE_ADD_SCALE_TYPES(XK_DEFINE_TRANSPOSE_ADD_SCALE)
#undef XK_DEFINE_TRANSPOSE_ADD_SCALE

// One pass: each lane keeps its first maximum (NaNs are skipped and flagged).
XK_CLONES static ArgMax argmax_ignoring_nan(const float* a, int64_t n, bool* has_nan) {
  constexpr int kWide = 16;
  f32x16 best = splat<f32x16>(kNegInf);
  i32x16 best_idx = {}, idx = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, nan = {};
  int64_t v = 0;
  for (; v + kWide <= n; v += kWide, idx += kWide) {
    const f32x16 x = load<f32x16>(a + v);
    const i32x16 better = x > best;
    best = better ? x : best;
    best_idx = better ? idx : best_idx;
    nan |= x != x;
  }
  ArgMax out = argmax_empty();
  bool any_nan = false;
  for (int j = 0; j < kWide; ++j) {
    if (best[j] != kNegInf) argmax_observe(out, best[j], best_idx[j]);
    any_nan |= nan[j] != 0;
  }
  for (; v < n; ++v) {
    any_nan |= is_nan_f32(a[v]);
    if (!is_nan_f32(a[v])) argmax_observe(out, a[v], static_cast<int32_t>(v));
  }
  if (out.val == kNegInf) out = ArgMax{kNegInf, 0};  // no NaN and a -inf maximum: all are -inf
  *has_nan = any_nan;
  return out;
}

XK_CLONES static float sum_exp_shifted(const float* a, int64_t n, float shift) {
  constexpr int kWide = 16;
  f32x16 acc = splat<f32x16>(0.0f);
  const f32x16 s = splat<f32x16>(shift);
  int64_t v = 0;
  for (; v + kWide <= n; v += kWide) acc += exp_nonpositive(load<f32x16>(a + v) - s);
  f32x16 tail = splat<f32x16>(kNegInf);
  for (int j = 0; v + j < n; ++j) tail[j] = a[v + j];
  acc += exp_nonpositive(tail - s);
  float sum = 0.0f;
  for (int j = 0; j < kWide; ++j) sum += acc[j];
  return sum;
}

ArgMax row_argmax(const float* a, int64_t n) {
  bool has_nan = false;
  const ArgMax top = argmax_ignoring_nan(a, n, &has_nan);
  if (!has_nan) return top;
  for (int64_t v = 0;; ++v)
    if (is_nan_f32(a[v])) return ArgMax{a[v], static_cast<int32_t>(v)};
}

XK_CLONES void residual_row(const float* a, const float* q, int64_t n, float top, float sum, float* r, float q_scale) {
  const f32x8 t = splat(top), inv = splat(1.0f / sum), zero = splat(0.0f), neg_inf = splat(kNegInf);
  const f32x8 qs = splat(q_scale);
  int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes) {
    const f32x8 x = load8(a + v);
    const f32x8 d = exp_nonpositive(x - t) * inv - load8(q + v) * qs;
    f32x8 out = d > zero ? d : zero;
    out = x == neg_inf ? zero : out;
    std::memcpy(r + v, &out, sizeof(out));
  }
  for (; v < n; ++v) {
    const float d = a[v] == kNegInf ? 0.0f : exp_f32(a[v] - top) / sum - q[v] * q_scale;
    r[v] = d > 0.0f ? d : 0.0f;
  }
}

XK_CLONES float row_sum(const float* a, int64_t n) {
  f32x8 acc = splat(0.0f);
  int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes) acc += load8(a + v);
  float total = 0.0f;
  for (int j = 0; j < kLanes; ++j) total += acc[j];
  for (; v < n; ++v) total += a[v];
  return total;
}

XK_CLONES void exp_row(const float* a, int64_t n, float top, float* e) {
  const f32x16 t = splat<f32x16>(top), zero = splat<f32x16>(0.0f), neg_inf = splat<f32x16>(kNegInf);
  int64_t v = 0;
  for (; v + 16 <= n; v += 16) {
    const f32x16 x = load<f32x16>(a + v);
    const f32x16 out = x == neg_inf ? zero : exp_nonpositive(x - t);
    std::memcpy(e + v, &out, sizeof(out));
  }
  for (; v < n; ++v) e[v] = a[v] == kNegInf ? 0.0f : exp_f32(a[v] - top);
}

// max(e - coef q, 0) of 8 ids in double: e - coef q is then exact but for one rounding, as the
// two FMAs of tree_residual_weight nearly make it.
typedef double f64x8 __attribute__((vector_size(64)));
static inline f64x8 residual8(const float* e, const float* q, double coef) {
  const f64x8 d = __builtin_convertvector(load8(e), f64x8) - coef * __builtin_convertvector(load8(q), f64x8);
  return d > 0.0 ? d : f64x8{};
}

XK_CLONES int64_t indices_in_range(const float* a, int64_t n, float lo, float hi, int32_t* idx) {
  int64_t found = 0, v = 0;
  for (; v + 32 <= n; v += 32) {
    i32x8 any = {};
    for (int b = 0; b < 4; ++b) {
      const f32x8 x = load<f32x8>(a + v + 8 * b);
      any |= (x >= lo) & (x <= hi);
    }
    int32_t hit = 0;
    for (int j = 0; j < 8; ++j) hit |= any[j];
    if (hit == 0) continue;  // most blocks, once the candidates are few
    for (int64_t j = v; j < v + 32; ++j) {
      idx[found] = static_cast<int32_t>(j);
      found += (a[j] >= lo) & (a[j] <= hi);
    }
  }
  for (; v < n; ++v) {
    idx[found] = static_cast<int32_t>(v);
    found += (a[v] >= lo) & (a[v] <= hi);
  }
  return found;
}

XK_CLONES float residual_sum(const float* e, const float* q, int64_t n, double coef) {
  f64x8 acc = {};
  int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes) acc += residual8(e + v, q + v, coef);
  double total = 0.0;
  for (int j = 0; j < kLanes; ++j) total += acc[j];
  for (; v < n; ++v) {
    const double d = static_cast<double>(e[v]) - coef * q[v];
    total += d > 0.0 ? d : 0.0;
  }
  return static_cast<float>(total);
}

XK_CLONES void residual_fill(float* e, const float* q, int64_t n, double coef) {
  int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes) {
    const f32x8 out = __builtin_convertvector(residual8(e + v, q + v, coef), f32x8);
    std::memcpy(e + v, &out, sizeof(out));
  }
  for (; v < n; ++v) {
    const double d = static_cast<double>(e[v]) - coef * q[v];
    e[v] = static_cast<float>(d > 0.0 ? d : 0.0);
  }
}

namespace {

typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef uint64_t u64x8 __attribute__((vector_size(64)));

struct MulHiLo32x8 {
  void operator()(u32x8 a, uint32_t b, u32x8& hi, u32x8& lo) const {
    const u64x8 p = __builtin_convertvector(a, u64x8) * b;
    hi = __builtin_convertvector(p >> 32, u32x8);
    lo = __builtin_convertvector(p, u32x8);
  }
};

// philox_draw (xkernels/philox.h) of draws first .. first+7 of one (sequence, position) stream at
// once: words[j][lane] is word j of draw first + lane.
__attribute__((always_inline)) inline void philox_draws8(uint64_t seed, uint64_t offset, uint32_t sequence,
                                                         uint32_t position, uint32_t first, u32x8 words[4]) {
  words[0] = u32x8{0, 1, 2, 3, 4, 5, 6, 7} + first;
  words[1] = u32x8{} + position, words[2] = u32x8{} + sequence, words[3] = u32x8{} + static_cast<uint32_t>(offset);
  philox_rounds(words, static_cast<uint32_t>(seed),
                static_cast<uint32_t>(seed >> 32) ^ static_cast<uint32_t>(offset >> 32), MulHiLo32x8{});
}

// The noise of a Philox word is gumbel_from_word(w), increasing in w. Words with the same top
// kBinBits bits have noise at most gumbel_bound(bin): an id whose log weight plus that bound is
// below the best score so far cannot win, and is skipped without its logs.
constexpr int kBinBits = 8, kBins = 1 << kBinBits;

// The bound of each bin, rounded up a little, plus a margin covering the rounding of the scores'
// logs; and exp(-that), for weights given linearly.
struct GumbelBounds {
  float log_margin[kBins], scale[kBins];
  GumbelBounds() {
    for (int b = 0; b < kBins; ++b) {
      const double bound = (b + 1 < kBins ? -std::log(-std::log((b + 1.0) / kBins)) + 1e-3 : kGumbelBound) + 1e-2;
      log_margin[b] = static_cast<float>(bound);
      scale[b] = static_cast<float>(std::exp(-bound));
    }
  }
};

const GumbelBounds kBounds;

// Weights r > 0 given linearly (zeros cannot be drawn): score log r + noise; r can win only if
// r >= exp(best) * scale[bin].
struct LinearWeights {
  static constexpr float kNone = 0.0f;  // the thresholds before anything is drawn
  static i32x8 drawable(f32x8 x) { return x > splat(0.0f); }
  static float score(float x, uint32_t word) { return log_f32(x) + gumbel_from_word(word); }
  static float threshold(float best, int bin) { return exp_f32(best) * kBounds.scale[bin]; }
};

// Log weights a (-inf cannot be drawn): score a + noise; a can win only if a >= best - bound.
struct LogWeights {
  static constexpr float kNone = kNegInf;
  static i32x8 drawable(f32x8 x) { return x != splat(kNegInf); }
  static float score(float x, uint32_t word) { return x + gumbel_from_word(word); }
  static float threshold(float best, int bin) { return best - kBounds.log_margin[bin]; }
};

// Bit i set where drawable(x[i]) and x[i] >= at[i], for 32 ids.
template <typename W>
__attribute__((always_inline)) inline uint32_t candidates32(const float* x, const float* at) {
  uint32_t mask = 0;
  for (int k = 0; k < 4; ++k) {
    const f32x8 v = load8(x + kLanes * k);
    const i32x8 m = W::drawable(v) & (v >= load8(at + kLanes * k));
    for (int j = 0; j < kLanes; ++j) mask |= static_cast<uint32_t>(m[j] & 1) << (kLanes * k + j);
  }
  return mask;
}

// Gumbel-max over ids 0 .. n-1 but `exclude` with the noise of (sequence, position): what
// sample_group of xkernels/sampling.h draws, 8 draws (32 ids) at a time. A block is skipped
// without Philox when none of its ids could win with the largest noise; an id's score (its logs)
// is computed only if its noise's bin lets it reach the best so far. The thresholds follow a best
// that may lag the current one (lower thresholds skip less, never wrongly).
template <typename W>
__attribute__((always_inline)) inline ArgMax gumbel_argmax(uint64_t seed, uint64_t offset, uint32_t sequence, uint32_t position, const float* w,
                            int64_t n, int64_t exclude, uint32_t first_draw) {
  ArgMax best = argmax_empty();
  float at[kBins], built_for = kNegInf;
  for (float& t : at) t = W::kNone;
  constexpr int kIds = 4 * kLanes;
  float loosest[kIds], per_id[kIds];
  int64_t g = 0;
  for (; 4 * g + kIds <= n; g += kLanes) {
    const float* wb = w + 4 * g;
    for (float& t : loosest) t = at[kBins - 1];
    if (candidates32<W>(wb, loosest) == 0) continue;
    u32x8 words[4];
    philox_draws8(seed, offset, sequence, position, first_draw + static_cast<uint32_t>(g), words);
    for (int lane = 0; lane < kLanes; ++lane)
      for (int j = 0; j < 4; ++j) per_id[4 * lane + j] = at[words[j][lane] >> (32 - kBinBits)];
    for (uint32_t mask = candidates32<W>(wb, per_id); mask; mask &= mask - 1) {
      const int i = __builtin_ctz(mask);
      if (4 * g + i != exclude)
        argmax_observe(best, W::score(wb[i], words[i % 4][i / 4]), static_cast<int32_t>(4 * g + i));
    }
    if (best.val > built_for + 0.01f) {
      for (int b = 0; b < kBins; ++b) at[b] = W::threshold(best.val, b);
      built_for = best.val;
    }
  }
  for (; 4 * g < n; ++g) {  // the last groups one draw at a time, every drawable id scored
    const Philox4 noise = philox_draw(seed, offset, sequence, position, first_draw + static_cast<uint32_t>(g));
    for (int j = 0; j < 4 && 4 * g + j < n; ++j) {
      const float x = w[4 * g + j];
      if (W::drawable(splat(x))[0] && 4 * g + j != exclude)
        argmax_observe(best, W::score(x, noise.w[j]), static_cast<int32_t>(4 * g + j));
    }
  }
  return best;
}

}  // namespace

XK_CLONES ArgMax sample_positive(uint64_t seed, uint64_t offset, uint32_t sequence, uint32_t position, const float* r,
                                 int64_t n, uint32_t first_draw) {
  return gumbel_argmax<LinearWeights>(seed, offset, sequence, position, r, n, -1, first_draw);
}

XK_CLONES ArgMax sample_logits(uint64_t seed, uint64_t offset, uint32_t sequence, uint32_t position, const float* a,
                               int64_t n, int64_t exclude, uint32_t first_draw) {
  return gumbel_argmax<LogWeights>(seed, offset, sequence, position, a, n, exclude, first_draw);
}

RowStats row_stats(const float* a, int64_t n) {
  RowStats s{row_argmax(a, n), 0.0f};
  if (!stats_degenerate(s)) s.sum = sum_exp_shifted(a, n, s.top.val);
  return s;
}

}  // namespace xkernels::cpu
