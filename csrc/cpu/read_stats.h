// The refine read's greedy statistics with the GEMM and its epilogue fused (float32, AVX-512):
// the products of a tile of vocabulary ids with every row stay in registers, get their base
// logits added and fold into each row's running max, argmax and sum of exp, so neither the
// products nor the logits are ever written.
#pragma once

#include <cstdint>

#include "xkernels/sampling.h"

namespace xkernels::cpu {

// Whether this CPU runs read_stats (AVX-512F).
bool read_stats_supported();

// z [rows, r] (row-major) laid out for read_stats in out (packed_read_size(rows, r) floats): blocks of
// 64 rows (the last one rounded up to 16, zero-padded), each k-major, so a block's rows at one k are
// adjacent.
int64_t packed_read_size(int64_t rows, int64_t r);
void pack_read_rows(const float* z, int64_t rows, int64_t r, float* out);

// For each row m < rows: the RowStats of l_m[i] = s[m][i] + dot(w[i], z_m) (the greedy read) over ids
// i0 <= i < i1 (w [V, r] float32 row-major, z as packed by pack_read_rows), with global ids, as
// cpu::row_stats gives them over those logits (NaN and infinite rows included). Needs
// read_stats_supported().
void read_stats(const float* w, int64_t r, const float* packed_z, int64_t rows, const float* const* s, int64_t i0,
                int64_t i1, RowStats* out);

}  // namespace xkernels::cpu
