// The argument checks of shard_cut_histogram, shard_cut_pick and shard_cut_candidates: the radix select of a sharded row's
// whole-vocabulary cut (xkernels/shard_cut.h), shared by their CPU and CUDA kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace xkernels {

// R rows of a shard of V ids from vocab_start.
struct ShardCutShape {
  int64_t r, v;
};

// A checked shard_cut_histogram call: its tensors as the kernels read them (contiguous; keep_id as
// int32, ids past int32 clamped: they keep every tie; undefined where absent) and its zero-filled
// output. Checks shapes, dtypes and devices, and the ints (shift a multiple of 8 in [0, 56]); the
// tensors' values need none: any prefix, scale or cut only changes which ids weigh.
struct ShardCutCall {
  ShardCutShape s;
  at::Tensor logits, scale, prefix, row_max, keep_value, keep_id, out;
};
ShardCutCall shard_cut_histogram_call(const at::Tensor& logits, const at::Tensor& scale, const at::Tensor& prefix,
                                      int64_t shift, int64_t vocab_start, const std::optional<at::Tensor>& row_max,
                                      const std::optional<at::Tensor>& keep_value,
                                      const std::optional<at::Tensor>& keep_id);

// A checked shard_cut_pick call: R rows of P parts (1: hi; 2: hi and lo) of a round's histograms,
// hist and target contiguous, and the outputs: copies of prefix and before that the kernels update.
struct ShardPickCall {
  int64_t r, parts;
  at::Tensor hist, target, prefix, before;
};
ShardPickCall shard_cut_pick_call(const at::Tensor& hist, const at::Tensor& prefix, const at::Tensor& before,
                                  const at::Tensor& target);

// A checked shard_cut_candidates call: logits, scale and row_max (undefined where absent) contiguous,
// and the outputs: keys [R, count] (the kernels write every entry) and weights [R, count, 2]
// zero-filled ([R, 0, 2] without row_max). count in [0, kCutCandidatesMax].
struct ShardCandidatesCall {
  ShardCutShape s;
  at::Tensor logits, scale, row_max, keys, weights;
};
ShardCandidatesCall shard_cut_candidates_call(const at::Tensor& logits, const at::Tensor& scale, int64_t count,
                                              int64_t vocab_start, const std::optional<at::Tensor>& row_max);

}  // namespace xkernels
