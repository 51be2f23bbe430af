// The host interface of the refine CUDA kernels: plain pointers, no torch headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "launch_types.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cuda {

// Limit of the CUDA kernels (checked by the binding): front_mix stages a block's slots in shared memory.
constexpr int64_t kRefineMaxSlots = 64;

// How a pass computes the read z w_read^T (the binding takes it from XKERNELS_REFINE_READ):
//  kGemm:  a GEMM of the caller (cuBLAS) into float32 products, one for the whole vocabulary where
//          they fit RefineParams::slice_bytes, else one a vocabulary slice; then
//          read_epilogue_kernel over them
//  kFused: read_fused_kernel streams w_read once and runs the epilogue on its tensor-core
//          products (bfloat16 weights, r a multiple of 8 up to kRefineFusedMaxRank, w_read
//          16-byte aligned; elsewhere the pass takes the GEMM)
//  kAuto:  kFused where it applies and the pass has at most kRefineFusedAutoRows rows, else kGemm
enum class RefineReadMode { kAuto, kGemm, kFused };
constexpr int64_t kRefineFusedMaxRank = 256;  // z and a w_read tile of 64 ids stay in shared memory
// Rows of a pass up to which kAuto picks the fused read: one or two row groups of 64 (refine_step
// to N=4 and N=8 at D=15, every Jacobi and sequential pass to N=8). A design estimate (bench/floors.md),
// not measured: the override lets a GPU run compare both paths.
constexpr int64_t kRefineFusedAutoRows = 128;
// The binding's budget of one GEMM slice (products in HBM, read back once by the epilogue): the
// whole read in one GEMM to N=64 at D=15, V=151936 (583 MB of products).
constexpr int64_t kRefineGemmBytes = int64_t{1} << 30;

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
  // Each sequence's parameters and stream (view.row(n), view.stream(n); slot d of sequence n
  // draws at stream slot d).
  SamplingView s;
  // Some sequence may sample with top-k, top-p or min-p: the epilogue then keeps such rows'
  // logits in the workspace ([rows, v] float32); filtered_pick_kernel finds their cuts and
  // samples them over the kept ids, in place of the fused result.
  bool filter;
  // Every filtered row by filtered_pick_kernel alone, as before the candidate pipeline (the
  // emulation's tests of that kernel; the binding leaves it false).
  bool pick_only = false;
  int num_sms;
  int cc_major;  // compute capability: the fused read's bfloat16 tensor cores need 8 or more
  RefineReadMode read_mode;
  // Bytes one GEMM slice of the read may take, its float32 products and w_read rows (the binding
  // passes kRefineGemmBytes, or a sixteenth of the device's memory where that is less).
  int64_t slice_bytes;
};

// One vocabulary slice of the read's product, run by the caller (cuBLAS through ATen in
// refine.cpp; plain loops in the CPU emulation) on the launch stream, without a host sync:
//   out[i * len + j] = sum_c a[i * lda + c] * b[j * r + c]   (i < rows, j < len)
// a (the rows' z) and b (w_read from the slice's first id) hold elements of `type`; the sum is
// accumulated and stored in float32. With bfloat16 weights z was rounded to bfloat16.
struct ReadGemm {
  const void* a;
  int64_t lda, rows;
  const void* b;
  int64_t len, r;
  WeightType type;
  float* out;
};
using ReadGemmFn = cudaError_t (*)(void* context, const ReadGemm& gemm, cudaStream_t stream);
struct ReadGemmRunner {
  ReadGemmFn fn;
  void* context;
};

// How one launch sequence over `rows` rows reads the vocabulary. Host planning shared by the
// binding and the emulation; valid for any sizes (rows = 0, v = 1, slice_bytes = 0 included).
struct RefineReadPlan {
  bool fused;        // read_fused_kernel (below); else the GEMM slices and read_epilogue_kernel
  int64_t partials;  // partial results per row, which merge_kernel combines
  // The GEMM path (and a pass without a read, fused = false):
  int64_t chunk;             // ids an epilogue block reads: a multiple of 4 (a Philox draw covers 4 ids)
  int64_t chunks;            // partial results per row: ceil(v / chunk)
  int64_t chunks_per_slice;  // chunks a GEMM slice covers
  int64_t slice;             // ids a GEMM slice covers: chunks_per_slice * chunk
  int64_t slices;            // GEMM + epilogue launches of a pass: ceil(chunks / chunks_per_slice)
  // The fused path: the rows split into `groups` of 16 * m_tiles; each group's `blocks` blocks
  // (one partial a row each) stride over the vocabulary's `tiles` tiles of 64 ids.
  int64_t m_tiles;  // 1, 2 or 4
  int64_t groups, blocks, tiles;
  int64_t smem_bytes;  // dynamic shared memory of a block
};
RefineReadPlan refine_read_plan(const RefineParams& p, int64_t rows, bool read);

size_t refine_workspace_bytes(const RefineParams& p);

// tokens/logprobs [n, d]. Returns the launch error, if any.
cudaError_t launch_refine_step(const RefineParams& p, const ReadGemmRunner& gemm, void* workspace, int64_t* tokens,
                               float* logprobs, cudaStream_t stream);

// tokens/logprobs [n, d], iters [n] (int32). A fixed launch sequence for max_iters passes (the
// GEMMs included); converged sequences' blocks exit at once.
cudaError_t launch_jacobi_refine(const RefineParams& p, const ReadGemmRunner& gemm, int64_t max_iters,
                                 void* workspace, int64_t* tokens, float* logprobs, int32_t* iters,
                                 cudaStream_t stream);

// tokens (zero-filled by the caller) and logprobs [n, d].
cudaError_t launch_sequential_refine(const RefineParams& p, const ReadGemmRunner& gemm, void* workspace,
                                     int64_t* tokens, float* logprobs, cudaStream_t stream);

}  // namespace xkernels::cuda
