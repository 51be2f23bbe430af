#include "read_stats.h"

#include <algorithm>
#include <vector>

#include "row_reduce.h"
#include "vec_math.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define XK_READ_AVX512 1
#define XK_AVX512 __attribute__((target("avx512f")))
#endif

namespace xkernels::cpu {
namespace {

constexpr int64_t kBlockRows = 64;  // 4 registers of 16 rows: with 6 ids, 24 accumulators of the 32

int64_t lanes_of(int64_t rows) { return (rows + 15) / 16 * 16; }

// The degenerate rows (a NaN, or no finite maximum): the chunk's logits of row m written out, then
// cpu::row_stats over them, so those rows get row_stats' own rules.
RowStats degenerate_row(const float* w, int64_t r, const float* packed_z, int64_t rows, const float* s, int64_t m,
                        int64_t i0, int64_t i1) {
  const int64_t b0 = m / kBlockRows * kBlockRows, width = std::min(kBlockRows, lanes_of(rows) - b0);
  const float* z = packed_z + b0 * r + (m - b0);
  std::vector<float> logits(static_cast<size_t>(i1 - i0));
  for (int64_t i = i0; i < i1; ++i) {
    float dot = 0.0f;
    for (int64_t k = 0; k < r; ++k) dot += w[i * r + k] * z[k * width];
    logits[i - i0] = s[i] + dot;
  }
  RowStats st = row_stats(logits.data(), i1 - i0);
  if (st.top.idx != kNoIndex) st.top.idx += static_cast<int32_t>(i0);
  return st;
}

#ifdef XK_READ_AVX512

// Running statistics of 16 rows, a row a lane.
struct Lanes {
  __m512 max, sum;
  __m512i idx;
  __mmask16 nan;
};

// The base logits of 16 rows at one id: two gathers of 8 (64-bit byte offsets from row 0's, so the
// rows' logits may lie anywhere).
XK_AVX512 inline __m512 gather_rows(const float* at, __m512i lo, __m512i hi) {
  const __m256 a = _mm512_i64gather_ps(lo, at, 1), b = _mm512_i64gather_ps(hi, at, 1);
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(a)), _mm256_castps_pd(b), 1));
}

XK_AVX512 inline __m512 exp16(__m512 x) { return (__m512)exp_nonpositive<f32x16>((f32x16)x); }

// Ids id0 .. id0 + jn - 1 (w: their J rows, r floats each) against Q * 16 rows (b: packed k-major):
// J x Q products in registers, then into the rows' statistics. Ids ascend, and an id replaces the
// max only when strictly greater, so ties keep the lowest id, as torch.argmax does.
template <int Q, int J>
XK_AVX512 void tile(const float* w, int64_t r, const float* b, int32_t id0, int jn, const float* s0,
                    const __m512i* offsets, Lanes* lanes) {
  __m512 acc[J][Q];
  for (int j = 0; j < J; ++j)
    for (int q = 0; q < Q; ++q) acc[j][q] = _mm512_setzero_ps();
  for (int64_t k = 0; k < r; ++k) {
    // The next tile's rows, a cache line at a time: J interleaved streams of r floats are too short
    // for the hardware prefetcher (64 rows, r = 256: 8.5 ms without, 6.6 with, in scratch timings).
    // Past the last id this touches nothing: a prefetch never faults.
    if (k % 16 == 0)
      for (int j = 0; j < J; ++j) _mm_prefetch(reinterpret_cast<const char*>(w + (J + j) * r + k), _MM_HINT_T0);
    __m512 bk[Q];
    for (int q = 0; q < Q; ++q) bk[q] = _mm512_loadu_ps(b + k * Q * 16 + q * 16);
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j) {
      const __m512 x = _mm512_set1_ps(w[j * r + k]);
      for (int q = 0; q < Q; ++q) acc[j][q] = _mm512_fmadd_ps(x, bk[q], acc[j][q]);
    }
  }
  for (int q = 0; q < Q; ++q) {
    Lanes& st = lanes[q];
    __m512 l[J];
    __m512 best = st.max;
    __m512i idx = st.idx;
    for (int j = 0; j < J; ++j) {
      if (j >= jn) break;
      l[j] = _mm512_add_ps(acc[j][q], gather_rows(s0 + id0 + j, offsets[2 * q], offsets[2 * q + 1]));
      st.nan |= _mm512_cmp_ps_mask(l[j], l[j], _CMP_UNORD_Q);
      const __mmask16 better = _mm512_cmp_ps_mask(l[j], best, _CMP_GT_OQ);
      best = _mm512_mask_mov_ps(best, better, l[j]);
      idx = _mm512_mask_set1_epi32(idx, better, id0 + j);
    }
    // sum is relative to the max: rescale it only in lanes whose max grew. Lanes still at -inf add
    // nothing (exp(-inf - -inf) would be NaN): the sum must stay 0 until a finite id comes.
    __m512 sum = st.sum;
    const __mmask16 grew = _mm512_cmp_ps_mask(best, st.max, _CMP_GT_OQ);
    const __mmask16 live = _mm512_cmp_ps_mask(best, _mm512_set1_ps(kNegInf), _CMP_GT_OQ);
    if (grew) sum = _mm512_mask_mul_ps(sum, grew, sum, exp16(_mm512_sub_ps(st.max, best)));
    for (int j = 0; j < J; ++j) {
      if (j >= jn) break;
      sum = _mm512_mask_add_ps(sum, live, sum, exp16(_mm512_sub_ps(l[j], best)));
    }
    st.max = best;
    st.sum = sum;
    st.idx = idx;
  }
}

// Every id of [i0, i1) in tiles of J; the last, short one from zero-padded copies of its rows.
template <int Q, int J>
XK_AVX512 void tiles(const float* w, int64_t r, const float* b, int64_t i0, int64_t i1, const float* s0,
                     const __m512i* offsets, Lanes* lanes) {
  int64_t i = i0;
  for (; i + J <= i1; i += J) tile<Q, J>(w + i * r, r, b, static_cast<int32_t>(i), J, s0, offsets, lanes);
  if (i < i1) {
    std::vector<float> rest(static_cast<size_t>(J * r), 0.0f);
    std::copy(w + i * r, w + i1 * r, rest.begin());
    tile<Q, J>(rest.data(), r, b, static_cast<int32_t>(i), static_cast<int>(i1 - i), s0, offsets, lanes);
  }
}

XK_AVX512 void read_stats_avx512(const float* w, int64_t r, const float* packed_z, int64_t rows,
                                 const float* const* s, int64_t i0, int64_t i1, RowStats* out) {
  const char* s0 = reinterpret_cast<const char*>(s[0]);
  for (int64_t b0 = 0; b0 < rows; b0 += kBlockRows) {
    const int64_t block_rows = std::min(kBlockRows, rows - b0);
    const int q_regs = static_cast<int>((block_rows + 15) / 16);
    Lanes lanes[4];
    __m512i offsets[8];
    for (int q = 0; q < q_regs; ++q) {
      int64_t off[16];
      for (int lane = 0; lane < 16; ++lane) {
        const int64_t m = b0 + q * 16 + lane;  // padding lanes read row 0's logits and are ignored
        off[lane] = m < rows ? reinterpret_cast<const char*>(s[m]) - s0 : 0;
      }
      offsets[2 * q] = _mm512_loadu_si512(off);
      offsets[2 * q + 1] = _mm512_loadu_si512(off + 8);
      lanes[q] = Lanes{_mm512_set1_ps(kNegInf), _mm512_setzero_ps(), _mm512_setzero_si512(), 0};
    }
    const float* b = packed_z + b0 * r;
    const float* base = s[0];
    // Q registers of rows x J ids: at most 24 accumulators, the rest for the loads and the broadcast
    // (one register of rows: 8 ids, as fast as 16 and twice 24, which spills, in scratch timings).
    switch (q_regs) {
      case 4: tiles<4, 6>(w, r, b, i0, i1, base, offsets, lanes); break;
      case 3: tiles<3, 8>(w, r, b, i0, i1, base, offsets, lanes); break;
      case 2: tiles<2, 12>(w, r, b, i0, i1, base, offsets, lanes); break;
      default: tiles<1, 8>(w, r, b, i0, i1, base, offsets, lanes); break;
    }
    for (int q = 0; q < q_regs; ++q) {
      alignas(64) float mx[16], sm[16];
      alignas(64) int32_t ix[16];
      _mm512_store_ps(mx, lanes[q].max);
      _mm512_store_ps(sm, lanes[q].sum);
      _mm512_store_si512(ix, lanes[q].idx);
      for (int lane = 0; lane < 16 && b0 + q * 16 + lane < rows; ++lane) {
        const int64_t m = b0 + q * 16 + lane;
        const bool nan = (lanes[q].nan >> lane) & 1;
        out[m] = nan || !is_finite_f32(mx[lane])
                     ? degenerate_row(w, r, packed_z, rows, s[m], m, i0, i1)
                     : RowStats{ArgMax{mx[lane], ix[lane]}, sm[lane]};
      }
    }
  }
}

#endif

}  // namespace

bool read_stats_supported() {
#ifdef XK_READ_AVX512
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported;
#else
  return false;
#endif
}

int64_t packed_read_size(int64_t rows, int64_t r) { return lanes_of(rows) * r; }

void pack_read_rows(const float* z, int64_t rows, int64_t r, float* out) {
  const int64_t lanes = lanes_of(rows);
  std::fill(out, out + lanes * r, 0.0f);
  for (int64_t b0 = 0; b0 < rows; b0 += kBlockRows) {
    const int64_t width = std::min(kBlockRows, lanes - b0);
    for (int64_t m = b0; m < std::min(rows, b0 + kBlockRows); ++m)
      for (int64_t k = 0; k < r; ++k) out[b0 * r + k * width + (m - b0)] = z[m * r + k];
  }
}

void read_stats(const float* w, int64_t r, const float* packed_z, int64_t rows, const float* const* s, int64_t i0,
                int64_t i1, RowStats* out) {
#ifdef XK_READ_AVX512
  if (rows > 0 && i1 > i0) read_stats_avx512(w, r, packed_z, rows, s, i0, i1, out);
#endif
}

}  // namespace xkernels::cpu
