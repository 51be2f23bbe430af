// shard_row_stats's argument checks and outputs, shared by its CPU and CUDA kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "sampling_args.h"

namespace xkernels {

// logits [N, R, V] (a vocabulary shard of V ids from vocab_start), S selected rows per sequence,
// E excluded ids per selected row, Q rows of draft_probs (0 without).
struct ShardRowShape {
  int64_t n, r, v, s, e, q;
};

// The arguments after raw_stats, as the schema lists them.
#define XK_SHARD_SAMPLING_ARGS                                                                              \
  double temperature, int64_t seed, int64_t offset, const std::optional<at::Tensor>&seed_tensor,            \
      const std::optional<at::Tensor>&offset_tensor, const std::optional<at::Tensor>&temperature_tensor,    \
      const std::optional<at::Tensor>&cut_value, const std::optional<at::Tensor>&cut_id,                    \
      const std::optional<at::Tensor>&errors
#define XK_SHARD_SAMPLING_FORWARD \
  temperature, seed, offset, seed_tensor, offset_tensor, temperature_tensor, cut_value, cut_id, errors

// The checked sampling arguments: the per-sequence temperatures and streams (sampling_args, no
// filters: the cut stands for them; with errors, check_errors'd, the per-sequence temperatures are
// left to the flag, not raised for), and each selected row's cut (cut_value float32 [N, S] and
// cut_id [N, S], held as int32: an id past int32 keeps every tie).
struct ShardSampling {
  SamplingArgs args;
  at::Tensor cut_value, cut_id;  // undefined: keep every id
};

// Shapes, dtypes and devices (and the sampling values where sampling_args checks them).
ShardRowShape check_shard_row_stats(const at::Tensor& logits, int64_t vocab_start,
                                    const std::optional<at::Tensor>& rows, const std::optional<at::Tensor>& exclude,
                                    const std::optional<at::Tensor>& draft_probs,
                                    const std::optional<at::Tensor>& residual_stats, bool sample);
ShardSampling shard_sampling(const ShardRowShape& s, const at::Tensor& logits, bool sample, XK_SHARD_SAMPLING_ARGS);

// Raises if rows holds an index outside [0, r) (reads the values: a host sync on CUDA).
void check_shard_rows(const at::Tensor& rows, int64_t r);

// The six outputs [N, S]: row_max, row_sum (float32), top_id (int64), pick_score (float32),
// pick_id (int64), pick_logit (float32).
struct ShardRowOutputs {
  at::Tensor row_max, row_sum, top_id, pick_score, pick_id, pick_logit;
};
ShardRowOutputs shard_row_outputs(const at::Tensor& logits, const ShardRowShape& s);

}  // namespace xkernels
