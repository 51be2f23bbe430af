// Argument checks shared by the CPU and CUDA kernels of each op. They look only
// at metadata, never at values on the device (no host sync).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace xkernels {

// Whether XKERNELS_CHECK=1 asks the CUDA kernels for value checks that need a
// host sync (token ids in range).
bool value_checks_enabled();

// The Philox seed and offset of a call: the ints, or the tensors that override
// them (checked: int64, one element, on `device`).
struct RngArgs {
  uint64_t seed;
  uint64_t offset;
  const int64_t* seed_ptr;    // null: use `seed`
  const int64_t* offset_ptr;  // null: use `offset`
};
RngArgs rng_args(int64_t seed, int64_t offset, const std::optional<at::Tensor>& seed_tensor,
                 const std::optional<at::Tensor>& offset_tensor, const at::Device& device);

struct ChainVerifyShape {
  int64_t n, k, v;
};
ChainVerifyShape check_chain_verify(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                                    const std::optional<at::Tensor>& draft_probs, double temperature);

// Raises if any draft id lies outside [0, V) (reads the values).
void check_draft_ids(const at::Tensor& draft_tokens, int64_t vocab);

}  // namespace xkernels
