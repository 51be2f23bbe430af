#include "row_reduce.h"

#include <cstring>

// Each hot loop is compiled for AVX-512, AVX2 and the baseline, picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define XK_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define XK_CLONES
#endif

namespace xkernels::cpu {
namespace {

// exp(x) for x <= 0 (Cephes' polynomial, about 1 ulp), without branches so that
// the summing loop vectorises; x below -87 returns about 1e-38 instead of a
// denormal, which no sum of at least 1 can see.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = x - n * 0.693359375f - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
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

// Reductions keep kLanes independent accumulators so the compiler can use
// vector registers without reordering a single float chain.
constexpr int kLanes = 16;

XK_CLONES static float max_ignoring_nan(const float* a, int64_t n, bool* has_nan) {
  float m[kLanes];
  int nan[kLanes];
  for (int j = 0; j < kLanes; ++j) m[j] = kNegInf, nan[j] = 0;
  int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      m[j] = a[v + j] > m[j] ? a[v + j] : m[j];
      nan[j] |= a[v + j] != a[v + j];
    }
  for (; v < n; ++v) {
    m[0] = a[v] > m[0] ? a[v] : m[0];
    nan[0] |= a[v] != a[v];
  }
  float best = kNegInf;
  int any_nan = 0;
  for (int j = 0; j < kLanes; ++j) best = m[j] > best ? m[j] : best, any_nan |= nan[j];
  *has_nan = any_nan != 0;
  return best;
}

XK_CLONES static float sum_exp_shifted(const float* a, int64_t n, float shift) {
  float acc[kLanes] = {};
  int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += exp_nonpositive(a[v + j] - shift);
  for (; v < n; ++v) acc[0] += exp_nonpositive(a[v] - shift);
  float sum = 0.0f;
  for (int j = 0; j < kLanes; ++j) sum += acc[j];
  return sum;
}

ArgMax row_argmax(const float* a, int64_t n) {
  bool has_nan = false;
  const float m = max_ignoring_nan(a, n, &has_nan);
  for (int64_t v = 0; v < n; ++v)
    if (has_nan ? is_nan_f32(a[v]) : a[v] == m) return ArgMax{a[v], static_cast<int32_t>(v)};
  return argmax_empty();
}

RowStats row_stats(const float* a, int64_t n) {
  RowStats s{row_argmax(a, n), 0.0f};
  if (!stats_degenerate(s)) s.sum = sum_exp_shifted(a, n, s.top.val);
  return s;
}

}  // namespace xkernels::cpu
