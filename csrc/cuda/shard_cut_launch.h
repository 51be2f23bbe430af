// The host interface of the shard_cut_histogram, shard_cut_pick and shard_cut_candidates CUDA kernels: plain pointers, no
// torch headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "launch_types.h"

namespace xkernels::cuda {

struct ShardCutHistogramParams {
  const void* logits;  // [r, v], global ids vocab_start .. vocab_start + v - 1
  LogitsType dtype;
  int64_t r, v, vocab_start, ignore_id;
  const float* scale;     // [r]
  const int64_t* prefix;  // [r]
  int shift;              // 0, 8, ..., 56
  const float* row_max;     // [r] or null: counts, not masses
  const float* keep_value;  // [r] or null: no keep cut
  const int32_t* keep_id;
  int64_t* out;  // [r, 2, 256], zero-filled by the caller; the kernel adds into it
};

// Blocks a row takes: enough for the chip at a few rows, each block at least 8 ids a thread.
int64_t shard_cut_blocks_per_row(int64_t r, int64_t v);

cudaError_t launch_shard_cut_histogram(const ShardCutHistogramParams& p, cudaStream_t stream);

struct ShardCutPickParams {
  const int64_t* hist;  // [r, parts, 256]
  int64_t r, parts;
  const double* target;  // [r]
  int64_t *prefix, *before;  // [r], [r, 2]: read and updated in place (the binding's copies)
};

cudaError_t launch_shard_cut_pick(const ShardCutPickParams& p, cudaStream_t stream);

struct ShardCutCandidatesParams {
  const void* logits;  // [r, v], global ids vocab_start .. vocab_start + v - 1
  LogitsType dtype;
  int64_t r, v, vocab_start, ignore_id, count;  // count in [0, kCutCandidatesMax]
  const float* scale;    // [r]
  const float* row_max;  // [r] or null: no weights
  int64_t* keys;         // [r, count], every entry written
  int64_t* weights;      // [r, count, 2] zero-filled by the caller, or null without row_max
};

cudaError_t launch_shard_cut_candidates(const ShardCutCandidatesParams& p, cudaStream_t stream);

}  // namespace xkernels::cuda
