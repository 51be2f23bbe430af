// The host interface of the draft-tree CUDA kernels: plain pointers, no torch headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "launch_types.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cuda {

// build_draft_tree: a warp per sequence, its search state in shared memory, or in `workspace` when
// it does not fit (tree_build_workspace_bytes: 0 then). With a mask the warp then writes the
// tree's tree_attention_mask (packed: uint8 bits, else bool bytes) in the same launch.
struct TreeBuildParams {
  const float* logprobs;  // [n, d, k]
  const int64_t* tokens;  // [n, d, k]
  int64_t n, d, k, budget;
  int64_t *out_tokens, *parents, *depth, *num_nodes;  // [n, budget+1], [n]
  uint8_t* mask = nullptr;  // [n, budget+1, packed ? ceil((budget+1)/8) : budget+1] or null
  bool packed = false;
};
size_t tree_build_workspace_bytes(const TreeBuildParams& p);
cudaError_t launch_build_draft_tree(const TreeBuildParams& p, void* workspace, cudaStream_t stream);

// tree_attention_mask (mask != null; packed: uint8 bits, else bool bytes) or tree_positions
// (depth != null): a block per sequence, a thread per node walking its ancestors. Invalid
// parents end the walk (memory-safe).
struct TreeMaskParams {
  const int64_t* parents;    // [n, m]
  const int64_t* num_nodes;  // [n] or null
  int64_t n, m;
  bool packed;
  uint8_t* mask;   // [n, m, packed ? ceil(m/8) : m] or null
  int64_t* depth;  // [n, m] or null
};
cudaError_t launch_tree_mask(const TreeMaskParams& p, cudaStream_t stream);

// tree_verify: sequence n reads its parameters and stream from s (s.row(n), s.stream(n); node i
// owns slot i); with filters the walk finds the cut of each row it visits (row_filter.cuh) and
// leaves it in the workspace for the draw.
struct TreeVerifyParams {
  const int64_t *tokens, *parents, *num_nodes;  // [n, m], [n, m], [n] or null
  const void* logits;                           // [n, m, v]
  LogitsType dtype;
  const void* q;         // [n, m, v] or null, of q_dtype (read in it: draft_probs.cuh)
  LogitsType q_dtype;
  bool without_replacement;
  int64_t n, m, v;
  SamplingView s;
  bool may_sample;  // some row may have T > 0 (else every walk is greedy: no sampling passes)
  bool filtered;    // some row may filter (top_k, top_p, min_p): the walk cuts the rows it visits
  int64_t *accept_len, *path, *out_tokens;  // [n], [n, m], [n, m]
  int num_sms;                              // sizes the split of the sampling pass
  int max_smem;  // shared memory a block may opt into (bytes; 0: 48 KB): sizes the draft passes' q stage
  bool clusters;  // the device runs thread block clusters (compute capability 9.0 and up)
};
size_t tree_verify_workspace_bytes(const TreeVerifyParams& p);
cudaError_t launch_tree_verify(const TreeVerifyParams& p, void* workspace, cudaStream_t stream);

// compact_kv_: a block per (sequence, head); an invalid path stops the moves (memory-safe).
struct CompactKvParams {
  char* cache;  // element (s, h, l, e) at ((s * stride0 + h * stride1 + l * stride2) + e) * elem bytes
  int64_t stride0, stride1, stride2, n, heads, len, d, elem;
  const int64_t *path, *accept_len;  // [n, m], [n]
  int64_t m, prefix_len;
};
cudaError_t launch_compact_kv(const CompactKvParams& p, cudaStream_t stream);

}  // namespace xkernels::cuda
