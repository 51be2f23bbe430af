// The host interface of the dllm_step CUDA kernels: plain pointers, no torch headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "launch_types.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cuda {

// dllm_step's rule and its randomness (spiffy_accept takes the same): sequence n's parameters
// s.row(n) (inv_t 0: greedy) and stream s.stream(n), its position p at slot p.
struct DllmRule {
  int64_t mask_id, num_unmask;
  bool use_threshold;
  float threshold;
  SamplingView s;
  bool filtered;  // some sequence may filter: dllm_filtered_kernel picks its filtered rows
};

struct DllmParams {
  const void* logits;  // [n, l, v]
  LogitsType dtype;
  const int64_t* block;  // [n, l]
  int64_t n, l, v;
  DllmRule rule;
  // new_block: a copy of block; positions and tokens: filled with -1 (by the caller)
  int64_t *new_block, *positions, *tokens;
  float* confidence;  // [n, l]
  int num_sms;        // sizes the split of the rows over the grid
  bool radix_only;    // every filtered row by dllm_filtered_kernel, as before the candidate pipeline
                      // (the emulation's tests compare the two paths; the op leaves it false)
};

size_t dllm_workspace_bytes(const DllmParams& p);
cudaError_t launch_dllm_step(const DllmParams& p, void* workspace, cudaStream_t stream);

}  // namespace xkernels::cuda
