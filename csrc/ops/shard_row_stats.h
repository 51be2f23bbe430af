// shard_row_stats's argument checks and outputs, shared by its CPU and CUDA kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace xkernels {

// logits [N, R, V] (a vocabulary shard of V ids from vocab_start), S selected rows per sequence,
// E excluded ids per selected row, Q rows of draft_probs (0 without).
struct ShardRowShape {
  int64_t n, r, v, s, e, q;
};

// Metadata only (no values read, no host sync).
ShardRowShape check_shard_row_stats(const at::Tensor& logits, int64_t vocab_start,
                                    const std::optional<at::Tensor>& rows, const std::optional<at::Tensor>& exclude,
                                    const std::optional<at::Tensor>& draft_probs,
                                    const std::optional<at::Tensor>& residual_stats, bool sample, double temperature);

// Raises if rows holds an index outside [0, r) (reads the values: a host sync on CUDA).
void check_shard_rows(const at::Tensor& rows, int64_t r);

// The six outputs [N, S]: row_max, row_sum (float32), top_id (int64), pick_score (float32),
// pick_id (int64), pick_logit (float32).
struct ShardRowOutputs {
  at::Tensor row_max, row_sum, top_id, pick_score, pick_id, pick_logit;
};
ShardRowOutputs shard_row_outputs(const at::Tensor& logits, const ShardRowShape& s);

}  // namespace xkernels
