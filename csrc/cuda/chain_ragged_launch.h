// The host interface of chain_verify_ragged_'s CUDA kernel: plain pointers, no torch headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "launch_types.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cuda {

struct ChainRaggedParams {
  const void* logits;  // [t + n, v]
  LogitsType dtype;
  const int64_t* draft;  // [t]
  const int64_t* cu;     // [n], inclusive cumsum of the drafts per request
  const void* q;         // [t, v] or null, of q_dtype (read in it)
  LogitsType q_dtype;
  int64_t t, n, v, max_spec_len;
  SamplingView s;  // per-row parameters and streams
  bool block;                         // block verification
  int32_t* out;         // [n, max_spec_len + 1]
  int32_t* num_emitted;  // [n]
  float* logprobs;      // [n, max_spec_len + 1], or null: not computed
  int32_t* errors;      // [n], or null: each request's row_param_errors OR-ed in
};

// The workspace launch_chain_ragged needs: every row's prepared state, and the filtered rows'
// slice summaries and candidates (candidates.cuh).
size_t chain_ragged_workspace_bytes(const ChainRaggedParams& p);
// Launches the kernels (a block per row slice and a block per row for the filtered rows' cuts, a
// block per row, then a block per request) on `stream`; returns the launch error, if any.
cudaError_t launch_chain_ragged(const ChainRaggedParams& p, void* workspace, cudaStream_t stream);

}  // namespace xkernels::cuda
