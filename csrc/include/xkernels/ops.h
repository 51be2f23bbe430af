// The C++ API of xkernels. Each function calls its op through the torch
// dispatcher, so CPU and CUDA tensors reach the matching kernel. Link against
// XKernels::xkernels (find_package(XKernels)); see README.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

namespace xkernels {

// Speculative verification of a chain of K drafts per sequence.
//   draft_tokens  int64 [N, K]
//   target_logits float32 / bfloat16 / float16 [N, K+1, V]; row i is the
//                 target's next-token logits after the prefix and i drafts
//   draft_probs   optional float32 [N, K, V], the distributions the drafts
//                 were sampled from
//   temperature   0 for greedy verification
//   seed, offset  the Philox stream; seed_tensor / offset_tensor (int64, one
//                 element, on the logits' device) override them at run time so
//                 a captured CUDA graph can advance them
// Returns (accept_len int64 [N], out_tokens int64 [N, K+1]): the accepted
// drafts, then the correction or bonus token, then -1.
std::tuple<at::Tensor, at::Tensor> chain_verify(const at::Tensor& draft_tokens,
                                                const at::Tensor& target_logits,
                                                const std::optional<at::Tensor>& draft_probs = std::nullopt,
                                                double temperature = 0.0, int64_t seed = 0, int64_t offset = 0,
                                                const std::optional<at::Tensor>& seed_tensor = std::nullopt,
                                                const std::optional<at::Tensor>& offset_tensor = std::nullopt);

// How the library was built: version, whether CUDA kernels are compiled and
// for which architectures.
std::string build_info();

}  // namespace xkernels
