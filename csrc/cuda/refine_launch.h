// The host interface of the refine CUDA kernels: plain pointers, no torch headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "launch_types.h"

namespace xkernels::cuda {

// Limits of the CUDA kernels (checked by the bindings).
constexpr int64_t kRefineMaxSlots = 64;
constexpr int64_t kRefineMaxRank = 1024;

struct RefineParams {
  const float* ctx;  // [n, b, r]
  // Slot k reads prefix[k] for k < prefix_len, else drafted[k - prefix_len]:
  // refine_step passes prev_tokens as the prefix (prefix_len = b); the loops pass
  // prefix_tokens (prefix_len = f + 1) and their current drafted tokens.
  const int64_t* prefix;
  int64_t prefix_len;
  const void* base;  // [n, d, v]
  LogitsType base_type;
  const void *emb, *mix, *w_gate, *w_up, *w_down, *w_read;
  WeightType weight_type;
  int64_t n, b, d, f, r, h, v;
  float inv_t;  // 0: greedy
  uint64_t seed, offset;
  const int64_t* seed_ptr;
  const int64_t* offset_ptr;
  int num_sms;
  int cc_major;  // the device's compute capability: tensor-core reads need 8 or more
};

size_t refine_workspace_bytes(const RefineParams& p);

// tokens/logprobs [n, d]. Returns the launch error, if any.
cudaError_t launch_refine_step(const RefineParams& p, void* workspace, int64_t* tokens, float* logprobs,
                               cudaStream_t stream);

// tokens/logprobs [n, d], iters [n] (int32). A fixed number of launches for
// max_iters passes; converged sequences' blocks exit at once.
cudaError_t launch_jacobi_refine(const RefineParams& p, int64_t max_iters, void* workspace, int64_t* tokens,
                                 float* logprobs, int32_t* iters, cudaStream_t stream);

// tokens (zero-filled by the caller) and logprobs [n, d].
cudaError_t launch_sequential_refine(const RefineParams& p, void* workspace, int64_t* tokens, float* logprobs,
                                     cudaStream_t stream);

}  // namespace xkernels::cuda
