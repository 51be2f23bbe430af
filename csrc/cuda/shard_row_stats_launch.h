// The host interface of the shard_row_stats CUDA kernel: plain pointers, no torch headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "launch_types.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cuda {

struct ShardRowStatsParams {
  const void* logits;  // [n, r, v], global ids vocab_start .. vocab_start + v - 1
  LogitsType dtype;
  int64_t n, r, v, s, e, q;  // s selected rows per sequence, e excluded ids per row, q rows of draft_probs
  int64_t vocab_start, ignore_id;
  const int64_t* rows;            // [n, s] or null: row j of each sequence (s = r)
  const int64_t* exclude;         // [n, s, e] or null
  const float* draft_probs;       // [n, q, v] or null
  const float* residual_stats;    // [n, s, 2] (with draft_probs)
  bool sample, raw_stats;
  SamplingView s_args;   // each sequence's temperature (inv_t 0: greedy) and stream; no filters
  const float* cut_value;  // [n, s] or null: the rows' cuts (filter_keeps), of the scaled logits
  const int32_t* cut_id;
  // outputs [n, s]
  float *row_max, *row_sum, *pick_score, *pick_logit;
  int64_t *top_id, *pick_id;
};

cudaError_t launch_shard_row_stats(const ShardRowStatsParams& p, cudaStream_t stream);

}  // namespace xkernels::cuda
