// What tree_verify's walk (tree_walk.cuh) shares with the rest of the op (tree_kernel.cu): the
// workspace, the per-node state, the block sizes.
#pragma once

#include <type_traits>

#include "candidates.cuh"
#include "device_utils.cuh"
#include "row_filter.cuh"
#include "row_reduce.cuh"
#include "tree_launch.h"
#include "xkernels/tree.h"

namespace xkernels::cuda {

__device__ __forceinline__ int64_t node_count(const int64_t* num_nodes, int64_t n, int64_t m) {
  if (!num_nodes) return m;
  const int64_t c = num_nodes[n];
  return c < 1 ? 1 : c > m ? m : c;
}

// The draw a sequence still needs where its walk stopped, left by tree_verify_kernel for the split
// sampling pass.
struct StopJob {
  int32_t node;   // the stop node, or -1: nothing to draw (the token is written)
  int32_t acc;    // accepted tokens: the draw goes to out_tokens[acc]
  int32_t nrej;   // tokens rejected at the node (w.rejected), or
  bool residual;  // draw from max(e - coef q, 0) instead (xkernels/tree.h's TreeResidual)
  int32_t top;    // the stop row's argmax: the token if nothing can be drawn
  float top_log2;  // the row's max times log2(e)
  float scale;     // the sequence's 1 / T
  TreeCoef coef;   // the residual's
};

// A block's share of a pass over a row in a clustered walk: its statistics and, with draft_probs, q's
// or the residual's sum.
struct TeamShare {
  RowStats stats;
  float sum;
};

struct TeamCandidates;  // below

struct VerifyWorkspace {
  int32_t* kids;      // [n, m] the children of the node being tested (team: [kVerifyTeam n, m])
  int32_t* rejected;  // [n, m] tokens rejected at it (with draft_probs each once; team as kids)
  FilterCut* cuts;    // [n, m] the cuts of the visited rows (the walk's), or null: no filter
  StopJob* jobs;      // [n]
  ArgMax* slices;     // [n, sample_slices]: each slice's Gumbel-max
  int sample_slices;
  int q_depth;  // q_stage_depth
  // A walk a cluster of kVerifyTeam blocks (p.clusters; null without): each block's share of a
  // pass over the row, [n, 2, kVerifyTeam] (two sets, team_merge's parity); kids and rejected then
  // hold kVerifyTeam times their rows, rank r's at [r n + sequence].
  TeamShare* team;
  TeamCandidates* team_cands;  // a filtered walk's team (cuts and team set), as team: each block's lists
};

// A chunk's q (the kIds values of Q beside a 16-byte chunk of logits T): kUnits copies of a Unit, 8
// or 16 bytes (cp.async's sizes, for the walk's q stage; float logits with 16-bit q: 8 bytes).
template <typename T, typename Q>
struct QChunk {
  static constexpr int kIds = 16 / sizeof(T), kBytes = kIds * sizeof(Q);
  using Unit = std::conditional_t<(kBytes >= 16), uint4, uint2>;
  static constexpr int kUnits = kBytes / sizeof(Unit), kUnitIds = sizeof(Unit) / sizeof(Q);
};

// What thread 0 decides and the block shares at one node.
struct NodeState {
  RowStats stats;
  const void* q;  // the node's draft row (of the walk's q type)
  TreeResidual res;
  int64_t chosen;
  int32_t kids, rejected, x;
  bool pass, empty;  // pass: res.sum is stale (a rejection came before child x): the block sums r
};

template <typename T>
__device__ __forceinline__ float scaled(const T* row, int64_t x, float scale) {
  return to_float(row[x]) * scale;
}

// A scaled logit as the node's filtered row p' holds it: -inf where the cut drops id x. A NaN
// stays: its row has no softmax and is the point mass at torch.argmax it is unfiltered.
__device__ __forceinline__ float kept(const FilterCut& cut, float a, int32_t x) {
  return filter_keeps(cut, a, x) || is_nan_f32(a) ? a : kNegInf;
}

// e = exp(a - max) of a scaled logit a, as the row statistics compute it (one FMA, one exp2).
__device__ __forceinline__ float softmax_weight(float a, float top_log2) { return exp2f(fmaf(a, kLog2e, -top_log2)); }

// tree_verify_kernel's block (a sequence) and its loads of 16 bytes in flight a thread: 512 threads
// with 16 reading a row (128 KB a block, 121-122 registers). With draft_probs (T > 0) the kernel
// holds more state through its passes: ptxas fits 8 row loads in 128 registers without a spill
// (sm_90a; deeper spills), 64 KB a block, and the passes that also read q (a node's first pass,
// which sums q beside the row statistics, and the residual passes) copy q's part of those chunks
// into shared memory asynchronously (cp.async), which holds no registers: 64 KB of the row and
// 128 KB of float32 q in flight a block at 16-bit logits (64 KB of q at float32 logits; half of
// each with 16-bit q), where the device lets a block have that much shared memory (q_stage_depth).
// XKERNELS_PTXAS_VERBOSE=1 shows the registers.
// A walk that cuts its rows (kFilter) runs 256 threads: the selection (row_filter.cuh) needs more
// registers than 512 threads leave (128 a thread: ptxas spilled, inlined or called), and fits the
// 255 of 256 threads without a spill beside the walk (sm_90a), which then keeps half the bytes in
// flight.
constexpr int kVerifyThreads = 512, kFilteredVerifyThreads = 256;
// The blocks of a walk on sm_90+ (tree_walk.cuh): a cluster a sequence, each block a share of every
// pass over a row, so that 64 sequences read on 128 SMs instead of 64.
constexpr int kVerifyTeam = 2;
template <bool kFilter>
constexpr int kVerifyBlock = kFilter ? kFilteredVerifyThreads : kVerifyThreads;
template <bool kDraft>
constexpr int kRowDepth = kDraft ? 8 : 16;
// The statistics pass's chunks in flight a thread: a filtered walk without draft_probs, which also
// keeps the row's candidates, reads 10 (40 KB a block): at 16 it spilled, and at 12 once the warps'
// float sums went to select_cut for top-p alone (sm_90a, 255 registers); as a team 8 (32 KB a
// block, 64 KB a sequence): 9-11 spilled 16-28 bytes.
template <bool kDraft, bool kFilter, bool kCluster = false>
constexpr int kWalkDepth = kFilter && !kDraft && !kCluster ? 10 : kRowDepth<kDraft || kFilter>;

// What the draft kernel's q stage leaves of the shared memory a block may have: the kernel's static
// shared memory (336 bytes, ptxas) and a margin.
constexpr size_t kStaticSmemReserve = 1024;

// A filtered walk's candidates (candidates.cuh) of the row it stands on: each warp's buffer, which
// the statistics pass fills by ballot (a warp a slice of select_cut's: kWarpSlots = kSliceKeep), the
// warps' summaries, and the selection over them. A team's blocks each hold every warp's of the
// team, block r's warps at lists r kWalkWarps + warp.
constexpr int kWalkWarps = kFilteredVerifyThreads / 32;
constexpr int kWalkLists = kWalkWarps * kVerifyTeam;
static_assert(kFilteredVerifyThreads == kThreads, "select_cut and select_keep run kThreads threads");
static_assert(kWarpSlots == kSliceKeep, "a warp's buffer is a slice's candidates");
static_assert(kWalkLists <= kMaxSlices, "select_cut merges at most kMaxSlices lists");
struct WalkCandidates {
  Candidate cands[kWalkLists][kSliceKeep];
  SliceSummary sums[kWalkLists];
  SelectShared select;
};

// One block's lists of a filtered walk's team, handed to the others through the workspace
// (VerifyWorkspace::team_cands), and whether some q it read was below 0.
struct alignas(16) TeamCandidates {
  Candidate cands[kWalkWarps][kSliceKeep];
  SliceSummary sums[kWalkWarps];
  uint32_t q_negative;
};

// A kept id of a row the candidates settled, at a node with children of the walk with draft_probs:
// its residual max(e - c q, 0) needs e and q alone, so the residual sums and the stop draw read
// these instead of the row and q (tree_walk.cuh's list_kept_residual).
struct KeptResidual {
  uint64_t order;  // residual_order: the thread that adds the id to residual_sum's total, then the id
  float e, q;      // exp(a - max) as the walk computes it (softmax_weight), and q(id)
};

// The residual list, over the selection's gathered ids (select_cut's scratch: free once it has
// returned; the ranked head, which draw_kept reads, stays).
static_assert(sizeof(KeptResidual) * kWalkLists * kSliceKeep <= sizeof(SelectShared::gathered),
              "a settled row keeps at most its warps' candidates");
__device__ __forceinline__ KeptResidual* kept_residual_list(WalkCandidates& wc) {
  return reinterpret_cast<KeptResidual*>(wc.select.gathered);
}

// The selection's state: the radix cut's, or over it the candidates' (a row takes one, then the
// other only where the candidates do not settle its cut).
union WalkCutShared {
  CutShared radix;
  WalkCandidates cand;
};

// The dynamic shared memory of the selection's state, ahead of the q stage (16-byte aligned).
__host__ __device__ constexpr size_t cut_smem_bytes() { return (sizeof(WalkCutShared) + 15) / 16 * 16; }

// tree_verify's walk with draft_probs of type Q (kDraft) or without (Q float, unread), that cuts its
// rows (kFilter) or not (tree_walk.cuh; logits T and q each float, __nv_bfloat16 or __half). Its
// instantiations take most of the tree kernels' compile time: the unfiltered ones are
// tree_verify_kernel.cu's, the filtered ones have a file a logits type
// (tree_filtered_verify_<type>_kernel.cu).
template <typename T, typename Q, bool kDraft, bool kFilter>
cudaError_t launch_verify_walk(const TreeVerifyParams& p, const VerifyWorkspace& w, bool vector_ok,
                               cudaStream_t stream);

}  // namespace xkernels::cuda
