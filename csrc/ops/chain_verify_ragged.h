// chain_verify_ragged_'s argument checks, which the CPU and CUDA kernels both run.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "sampling_args.h"

namespace xkernels {

struct RaggedShape {
  int64_t t, n, v, max_spec_len;
};

// Shapes, dtypes and devices (errors: int32 [N], contiguous); on the CPU (on CUDA with
// XKERNELS_CHECK=1) also the values: cu_num_draft_tokens non-decreasing from >= 0 and ending at T,
// no request above max_spec_len, draft ids in [0, V).
RaggedShape check_chain_verify_ragged(const at::Tensor& draft_tokens, const at::Tensor& cu_num_draft_tokens,
                                      const at::Tensor& target_logits, int64_t max_spec_len,
                                      const std::optional<at::Tensor>& draft_probs,
                                      const at::Tensor& output_token_ids, const at::Tensor& num_emitted,
                                      const std::optional<at::Tensor>& logprobs,
                                      const std::optional<at::Tensor>& errors);

}  // namespace xkernels
