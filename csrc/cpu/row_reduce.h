// Vectorisable CPU row reductions: scaled float copies of a logits row, the
// torch.argmax-compatible maximum, and sum(exp(a - max)). They compute the same
// RowStats as the per-element stats_observe of xkernels/sampling.h, in passes
// the compiler can vectorise.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "xkernels/sampling.h"

namespace xkernels::cpu {

// out[v] = float(row[v]) * scale. scale == 1 copies exactly.
void scale_row(const float* row, int64_t n, float scale, float* out);
void scale_row(const c10::BFloat16* row, int64_t n, float scale, float* out);
void scale_row(const c10::Half* row, int64_t n, float scale, float* out);

// out[m * out_stride + i] = (float(bias[m][i]) + float(in[i * rows + m])) * scale (i < n, m < rows):
// id-major products [n, rows] (float32 or bfloat16) plus each row's bias, as scaled rows.
// X(P, T) for every pair: float32 or bfloat16 products (the weights' dtype), float32, bfloat16 or
// float16 base logits.
#define XK_TRANSPOSE_ADD_SCALE_TYPES(X) \
  X(float, float) X(float, c10::BFloat16) X(float, c10::Half) X(c10::BFloat16, float) \
  X(c10::BFloat16, c10::BFloat16) X(c10::BFloat16, c10::Half)
#define XK_DECLARE_TRANSPOSE_ADD_SCALE(P, T)                                                                  \
  void transpose_add_scale(const P* in, int64_t n, int64_t rows, const T* const* bias, float scale, float* out, \
                           int64_t out_stride);
XK_TRANSPOSE_ADD_SCALE_TYPES(XK_DECLARE_TRANSPOSE_ADD_SCALE)
#undef XK_DECLARE_TRANSPOSE_ADD_SCALE

// torch.argmax of a (the first NaN if there is one).
ArgMax row_argmax(const float* a, int64_t n);

// r[v] = max(softmax(a)[v] - q[v] * q_scale, 0), the unnormalised residual of speculative
// sampling, given a's statistics (top = max, sum = sum exp(a - top)); ids with a = -inf get 0.
void residual_row(const float* a, const float* q, int64_t n, float top, float sum, float* r, float q_scale = 1.0f);

// The indices i < n of a with lo <= a[i] <= hi (NaNs never), ascending, into idx; returns how many.
// Blocks of 32 without one cost four vector compares.
int64_t indices_in_range(const float* a, int64_t n, float lo, float hi, int32_t* idx);

// sum of a (8 lanes, then the lanes in order).
float row_sum(const float* a, int64_t n);

// e[v] = exp(a[v] - top), 0 where a[v] = -inf: the softmax of a times its sum.
void exp_row(const float* a, int64_t n, float top, float* e);

// sum of max(e[v] - coef q[v], 0) (xkernels/tree.h's tree_residual_weight, here in double), read-only.
float residual_sum(const float* e, const float* q, int64_t n, double coef);

// In place e[v] = max(e[v] - coef q[v], 0), in double.
void residual_fill(float* e, const float* q, int64_t n, double coef);

// Gumbel-max over log r (zeros cannot be drawn) with the noise of (sequence, position): the draw
// sample_group of xkernels/sampling.h makes, with most noise and logs skipped: 32 ids at a time
// without Philox when none could win with the largest noise, and an id's logs only if the top
// bits of its Philox word let it reach the best score so far. Element i of r is the id
// 4 * first_draw + i (its noise: word i % 4 of draw first_draw + i / 4), so a vocabulary shard
// that starts at a multiple of 4 draws the noise of its global ids; the returned idx is i.
ArgMax sample_positive(uint64_t seed, uint64_t offset, uint32_t sequence, uint32_t position, const float* r,
                       int64_t n, uint32_t first_draw = 0);

// The same over log weights a (-inf cannot be drawn) but the element `exclude` (-1: none).
ArgMax sample_logits(uint64_t seed, uint64_t offset, uint32_t sequence, uint32_t position, const float* a, int64_t n,
                     int64_t exclude, uint32_t first_draw = 0);

// Softmax statistics of a; sum is 0 when the row is degenerate.
RowStats row_stats(const float* a, int64_t n);

}  // namespace xkernels::cpu
