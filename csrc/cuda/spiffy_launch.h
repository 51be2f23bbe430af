// The host interface of the Spiffy CUDA kernels: plain pointers, no torch headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dllm_launch.h"
#include "launch_types.h"
#include "xkernels/spiffy.h"

namespace xkernels::cuda {

struct SpiffyMaterializeParams {
  const void* logits;  // [n, l, v]
  LogitsType dtype;
  const int64_t* block;  // [n, l]
  GraphView graph;
  int64_t n, l, v, mask_id, keep;
  SamplingView s;             // sequence n scores with spiffy_scale(s.row(n)) under its filters
  bool filtered;              // some sequence may filter: spiffy_filtered.cuh cuts its filtered rows
  int64_t* drafts;            // [n, keep, l]
  int64_t* node_ids;          // [n, keep], filled with -1 by the caller
  float* scores;              // [n, keep], filled with 0 by the caller
  int num_sms;                // sizes the split of the rows over the grid
};

size_t spiffy_materialize_workspace_bytes(const SpiffyMaterializeParams& p);
cudaError_t launch_spiffy_materialize(const SpiffyMaterializeParams& p, void* workspace, cudaStream_t stream);

struct SpiffyAcceptParams {
  const void* root_logits;   // [n, l, v]
  const void* draft_logits;  // [n, k, l, v]
  LogitsType dtype;
  const int64_t *drafts, *node_ids;  // [n, k, l], [n, k]
  int64_t n, l, v, k;
  DllmRule rule;
  // new_block: a copy of the block; positions, tokens: -1; num_steps: 0; continue_from: -1 (the caller)
  int64_t *new_block, *positions, *tokens, *num_steps, *continue_from;
  bool clusters;  // the device runs thread block clusters (compute capability 9.0 and up)
  bool radix_only = false;  // every filtered row by dllm_filtered_pick, as before the candidate pipeline
};

// Blocks a sequence on sm_90+: a thread block cluster of the largest portable size, or of the
// smaller one where the device cannot run every sequence's larger cluster at once.
constexpr unsigned kAcceptCluster = 8, kAcceptClusterSmall = 4;

size_t spiffy_accept_workspace_bytes(const SpiffyAcceptParams& p);
// The blocks that walk each sequence, when p.clusters and the kernel's binary is sm_90+: a cluster
// of kAcceptCluster where the device runs p.n of them at once (cudaOccupancyMaxActiveClusters, asked
// once a device), else of kAcceptClusterSmall; otherwise 1. The grid is n times that.
unsigned spiffy_accept_blocks(const SpiffyAcceptParams& p);
cudaError_t launch_spiffy_accept(const SpiffyAcceptParams& p, void* workspace, cudaStream_t stream);

struct SpiffyMaskParams {
  const int64_t* prefix_lens;  // [n]
  int64_t n, num_drafts, block_size, max_prefix;
  bool packed;
  uint8_t* mask;  // [n, q, row bytes]
};

cudaError_t launch_spiffy_attention_mask(const SpiffyMaskParams& p, cudaStream_t stream);

}  // namespace xkernels::cuda
