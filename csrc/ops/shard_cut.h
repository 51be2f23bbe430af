// The argument checks of shard_cut_histogram and shard_cut_pick, the radix select of a sharded row's
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

// Shapes, dtypes and devices, and the ints (shift a multiple of 8 in [0, 56]). The tensors' values
// need no check: any prefix, scale or cut only changes which ids weigh.
ShardCutShape check_shard_cut_histogram(const at::Tensor& logits, const at::Tensor& scale, const at::Tensor& prefix,
                                        int64_t shift, int64_t vocab_start, const std::optional<at::Tensor>& row_max,
                                        const std::optional<at::Tensor>& keep_value,
                                        const std::optional<at::Tensor>& keep_id);

// R rows of P parts (1: hi; 2: hi and lo) of a round's histograms.
struct ShardPickShape {
  int64_t r, parts;
};
ShardPickShape check_shard_cut_pick(const at::Tensor& hist, const at::Tensor& prefix, const at::Tensor& before,
                                    const at::Tensor& target);

// keep_id as int32 (ids past int32 clamped: they keep every tie), contiguous; undefined without.
at::Tensor shard_cut_keep_id(const std::optional<at::Tensor>& keep_id);

}  // namespace xkernels
