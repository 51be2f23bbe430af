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

// torch.argmax of a (the first NaN if there is one).
ArgMax row_argmax(const float* a, int64_t n);

// Softmax statistics of a; sum is 0 when the row is degenerate.
RowStats row_stats(const float* a, int64_t n);

}  // namespace xkernels::cpu
