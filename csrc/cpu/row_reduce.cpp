#include "row_reduce.h"

#include "xkernels/tree.h"

#include <cstring>

// Each hot loop is compiled for AVX-512, AVX2 and the baseline, picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define XK_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define XK_CLONES
#endif

namespace xkernels::cpu {
namespace {

// GCC/Clang vector extensions: each target clone lowers them to its widest registers.
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
constexpr int kLanes = 8;

inline f32x8 splat(float x) { return f32x8{x, x, x, x, x, x, x, x}; }

inline f32x8 load8(const float* p) {
  f32x8 x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}

// exp(x) for x <= 0 (Cephes' polynomial, about 1 ulp), branch-free on 8 lanes; x below -87
// gives about 1e-38 instead of a denormal, which no sum of at least 1 can see.
inline f32x8 exp_nonpositive(f32x8 x) {
  const f32x8 lowest = splat(-87.0f);
  x = x < lowest ? lowest : x;
  const f32x8 round = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const f32x8 n = (x * splat(1.44269504088896341f) + round) - round;
  const f32x8 r = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
  f32x8 p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.0f);
  const i32x8 bits = (__builtin_convertvector(n, i32x8) + 127) << 23;
  f32x8 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

template <typename T>
inline void scale_row_impl(const T* row, int64_t n, float scale, float* out) {
  for (int64_t v = 0; v < n; ++v) out[v] = static_cast<float>(row[v]) * scale;
}

}  // namespace

XK_CLONES void scale_row(const float* row, int64_t n, float scale, float* out) { scale_row_impl(row, n, scale, out); }
XK_CLONES void scale_row(const c10::BFloat16* row, int64_t n, float scale, float* out) {
  scale_row_impl(row, n, scale, out);
}
XK_CLONES void scale_row(const c10::Half* row, int64_t n, float scale, float* out) {
  scale_row_impl(row, n, scale, out);
}

// One pass: each lane keeps its first maximum (NaNs are skipped and flagged).
XK_CLONES static ArgMax argmax_ignoring_nan(const float* a, int64_t n, bool* has_nan) {
  f32x8 best = splat(kNegInf);
  i32x8 best_idx = {}, idx = {0, 1, 2, 3, 4, 5, 6, 7}, nan = {};
  int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes, idx += kLanes) {
    const f32x8 x = load8(a + v);
    const i32x8 better = x > best;
    best = better ? x : best;
    best_idx = better ? idx : best_idx;
    nan |= x != x;
  }
  ArgMax out = argmax_empty();
  bool any_nan = false;
  for (int j = 0; j < kLanes; ++j) {
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
  f32x8 acc = splat(0.0f);
  const f32x8 s = splat(shift);
  int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes) acc += exp_nonpositive(load8(a + v) - s);
  f32x8 tail = splat(kNegInf);
  for (int j = 0; v + j < n; ++j) tail[j] = a[v + j];
  acc += exp_nonpositive(tail - s);
  float sum = 0.0f;
  for (int j = 0; j < kLanes; ++j) sum += acc[j];
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

XK_CLONES float residual_update(float* r, const float* q, int64_t n, float r_sum, float q_sum) {
  const f32x8 rs = splat(r_sum), qs = splat(q_sum > 0.0f ? q_sum : 1.0f), zero = splat(0.0f);
  const f32x8 use_q = splat(q_sum > 0.0f ? 1.0f : 0.0f);
  f32x8 acc = zero;
  int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes) {
    const f32x8 d = load8(r + v) / rs - load8(q + v) / qs * use_q;
    const f32x8 out = d > zero ? d : zero;
    acc += out;
    std::memcpy(r + v, &out, sizeof(out));
  }
  float total = 0.0f;
  for (int j = 0; j < kLanes; ++j) total += acc[j];
  for (; v < n; ++v) {
    r[v] = tree_residual(r[v], r_sum, q[v], q_sum);
    total += r[v];
  }
  return total;
}

ArgMax sample_positive(uint64_t seed, uint64_t offset, uint32_t sequence, uint32_t position, const float* r,
                       int64_t n) {
  ArgMax best = argmax_empty();
  float threshold = 0.0f;
  for (int64_t g = 0; 4 * g < n; ++g) {
    const int count = n - 4 * g < 4 ? static_cast<int>(n - 4 * g) : 4;
    const float* rg = r + 4 * g;
    bool live = false;
    for (int j = 0; j < count; ++j) live |= rg[j] > 0.0f && rg[j] >= threshold;
    if (!live) continue;
    const Philox4 noise = philox_draw(seed, offset, sequence, position, static_cast<uint32_t>(g));
    for (int j = 0; j < count; ++j)
      if (rg[j] > 0.0f)
        argmax_observe(best, log_f32(rg[j]) + gumbel_from_word(noise.w[j]), static_cast<int32_t>(4 * g + j));
    threshold = best.val == kNegInf ? 0.0f : exp_f32(best.val - kGumbelBound);
  }
  return best;
}

RowStats row_stats(const float* a, int64_t n) {
  RowStats s{row_argmax(a, n), 0.0f};
  if (!stats_degenerate(s)) s.sum = sum_exp_shifted(a, n, s.top.val);
  return s;
}

}  // namespace xkernels::cpu
