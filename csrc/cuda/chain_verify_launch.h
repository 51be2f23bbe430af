// The host interface of the chain_verify CUDA kernels: plain pointers, no
// torch headers, so the .cu compiles fast.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "launch_types.h"
#include "xkernels/sampling.h"

namespace xkernels::cuda {

struct ChainVerifyParams {
  const void* logits;  // [n, k+1, v]
  LogitsType dtype;
  const int64_t* draft;  // [n, k]
  const void* q;         // [n, k, v] or null, of q_dtype (read in it)
  LogitsType q_dtype;
  int64_t n, k, v;
  float inv_t;  // 0: greedy
  uint64_t seed, offset;
  const int64_t* seed_ptr;    // overrides seed when set
  const int64_t* offset_ptr;  // overrides offset when set
  int64_t* accept_len;        // [n]
  int64_t* out_tokens;        // [n, k+1]
  int num_sms;
};

// Bytes of device scratch the kernels need.
size_t chain_verify_workspace_bytes(const ChainVerifyParams& p);

// Launches the kernels on `stream`; `workspace` holds
// chain_verify_workspace_bytes(p) bytes. Returns the launch error, if any.
cudaError_t launch_chain_verify(const ChainVerifyParams& p, void* workspace, cudaStream_t stream);

}  // namespace xkernels::cuda
