// The draft-tree ops on CUDA, one launch each, never waiting on the host:
//  build_draft_tree:    a warp per sequence runs the best-first search of xkernels/tree.h, each pop
//                       a warp-wide max over the frontier spread across its lanes, the state in
//                       shared memory (global scratch when it does not fit in 48 KB: any budget).
//  tree_attention_mask: a block per sequence stages the parents in shared memory and zeroes the
//  / tree_positions     mask, then a thread per node walks its ancestors, setting its own row
//                       (no two threads write one row).
//  tree_verify:         a block per sequence walks the tree; at each visited node the block
//                       reduces that one row's softmax statistics, thread 0 tests the children in
//                       order, and with draft_probs the block sums the residual (read-only, from the
//                       row and q) when a test needs it. Only visited rows are read. At T > 0 two
//                       more launches draw the token at the stop node (Gumbel-max, each row split
//                       over many blocks) and merge. With filters the walk finds the cut of each
//                       row it visits (row_filter.cuh, after that row's statistics pass, which
//                       notes the row's top key bits for it) and leaves it for the draw; the walk
//                       and the draw read p' through it.
//  compact_kv_:         a block per (sequence, head) moves the accepted entries in path order.
// Values the host cannot check without a sync (parents, num_nodes, token ids, path) are handled
// memory-safely: an invalid parent ends a walk, a child whose token lies outside [0, V) is never
// accepted, an invalid path stops the moves; XKERNELS_CHECK=1 makes the bindings raise instead.
#include <cuda_pipeline_primitives.h>

#include "device_utils.cuh"
#include "per_device.h"
#include "row_filter.cuh"
#include "row_reduce.cuh"
#include "tree_launch.h"
#include "xkernels/tree.h"

namespace xkernels::cuda {
namespace {

__device__ __forceinline__ int64_t node_count(const int64_t* num_nodes, int64_t n, int64_t m) {
  if (!num_nodes) return m;
  const int64_t c = num_nodes[n];
  return c < 1 ? 1 : c > m ? m : c;
}

constexpr size_t kBuildSmemLimit = 48 * 1024;

// One sequence's search state: every candidate ever pushed, indexed by push order (at most
// 2 * budget + 1, from offset 0), its key (0 once popped), the entry each node came from, and the
// log-probs (staged in shared memory only).
struct BuildLayout {
  size_t keys, node_entry, logprobs, total;  // byte offsets; total: the bytes
};

__host__ __device__ inline BuildLayout build_layout(int64_t budget, int64_t slots, bool with_logprobs) {
  const size_t pushes = 2 * static_cast<size_t>(budget) + 1;
  BuildLayout l{};
  l.keys = sizeof(TreeCandidate) * pushes;
  l.node_entry = l.keys + sizeof(uint32_t) * pushes;
  l.logprobs = l.node_entry + sizeof(uint32_t) * (budget + 1);
  l.total = l.logprobs + (with_logprobs ? sizeof(float) * slots : 0);
  return l;
}

// Shared-memory bytes of one sequence's search (0: it does not fit; global scratch instead).
size_t build_smem_bytes(const TreeBuildParams& p) {
  const size_t bytes = build_layout(p.budget, p.d * p.k, true).total;
  return bytes <= kBuildSmemLimit ? bytes : 0;
}

// A candidate's rank as one integer: the score's bits made monotone (-0 as +0, so that equal
// scores give equal keys) above the complement of its push order, so that the larger key is the
// entry popped first (xkernels/tree.h). 0 is no entry: no score maps there (scores are never NaN).
__device__ __forceinline__ uint64_t candidate_key(float score, uint32_t order) {
  const uint32_t u = __float_as_uint(score == 0.0f ? 0.0f : score);
  const uint32_t monotone = (u & 0x80000000u) ? ~u : u | 0x80000000u;
  return static_cast<uint64_t>(monotone) << 32 | ~order;
}

// The warp's largest candidate_key. From sm_80 two redux.sync maxima: of the high words (scores),
// then of the low words (push orders) of the lanes holding that score, instead of five rounds of a
// 64-bit shuffle and compare on the pop's critical path (~80-100 cycles instead of ~200).
__device__ __forceinline__ uint64_t warp_max_key(uint64_t key) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  const uint32_t hi = static_cast<uint32_t>(key >> 32), top = __reduce_max_sync(kFullMask, hi);
  const uint32_t lo = __reduce_max_sync(kFullMask, hi == top ? static_cast<uint32_t>(key) : 0u);
  return static_cast<uint64_t>(top) << 32 | lo;
#else
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const uint64_t other = __shfl_xor_sync(kFullMask, key, d);
    key = other > key ? other : key;
  }
  return key;
#endif
}

// A warp per sequence runs the best-first search of xkernels/tree.h with the frontier spread over
// its lanes: lane j holds the candidates of push order j mod 32 and keeps the key of its best live
// one, so a pop is a warp-wide max of 32 keys (warp_max_key) instead of a heap's chain of
// dependent loads in one lane. Every lane computes the popped entry's successors (broadcast reads);
// their owners store them, and the popped entry's owner rescans its own candidates.
__global__ void __launch_bounds__(32) build_tree_kernel(TreeBuildParams p, uint8_t* scratch, bool staged) {
  extern __shared__ __align__(16) uint8_t build_smem[];
  const int lane = threadIdx.x;
  const int64_t n = blockIdx.x, m = p.budget + 1, slots = p.d * p.k;
  const BuildLayout layout = build_layout(p.budget, slots, staged);
  uint8_t* base = staged ? build_smem : scratch + n * layout.total;
  auto* entries = reinterpret_cast<TreeCandidate*>(base);
  auto* keys = reinterpret_cast<uint32_t*>(base + layout.keys);  // the high word of candidate_key
  auto* node_entry = reinterpret_cast<uint32_t*>(base + layout.node_entry);
  const float* lp = p.logprobs + n * slots;
  if (staged) {
    float* lp_s = reinterpret_cast<float*>(base + layout.logprobs);
    for (int64_t i = lane; i < slots; i += 32) lp_s[i] = lp[i];
    __syncwarp();
    lp = lp_s;
  }
  uint64_t mine = 0;  // candidate_key of this lane's best live entry, 0: none
  uint32_t pushed = 0;
  // Every lane pushes the same successors; lane order % 32 stores each.
  const auto push = [&](const TreeCandidate (&next)[2], int count) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (j >= count) break;
      const uint32_t order = pushed + j;
      if (order % 32 == static_cast<uint32_t>(lane)) {
        const uint64_t key = candidate_key(next[j].score, order);
        entries[order] = next[j];
        keys[order] = static_cast<uint32_t>(key >> 32);
        mine = key > mine ? key : mine;
      }
    }
    pushed += count;
  };
  TreeCandidate next[2];
  push(next, tree_first(lp, p.d, p.k, p.budget, next));
  int64_t nodes = 1;
  while (nodes <= p.budget) {
    __syncwarp();  // the entries stored last round
    const uint64_t best = warp_max_key(mine);
    if (best == 0) break;  // the frontier is empty
    const uint32_t popped = ~static_cast<uint32_t>(best);
    const TreeCandidate c = entries[popped];
    if (lane == 0) node_entry[nodes] = popped;
    push(next, tree_successors(c, nodes, lp, p.d, p.k, pushed, next));
    ++nodes;
    if (popped % 32 == static_cast<uint32_t>(lane)) {
      keys[popped] = 0;
      mine = 0;
      for (uint32_t j = lane; j < pushed; j += 32) {
        const uint32_t key = keys[j];
        const uint64_t cand = key ? static_cast<uint64_t>(key) << 32 | ~j : 0;
        mine = cand > mine ? cand : mine;
      }
    }
  }
  __syncwarp();
  const int64_t* tok = p.tokens + n * slots;
  for (int64_t i = lane; i < m; i += 32) {
    int64_t token = -1, parent = -1, depth = 0;
    if (i > 0 && i < nodes) {
      const TreeCandidate c = entries[node_entry[i]];
      token = tok[c.slot * p.k + c.rank], parent = c.parent, depth = c.slot + 1;
    }
    p.out_tokens[n * m + i] = token, p.parents[n * m + i] = parent, p.depth[n * m + i] = depth;
  }
  if (lane == 0) p.num_nodes[n] = nodes;
}

// Shared-memory bytes of tree_mask_kernel's staged parents (0: they do not fit; read from global).
size_t mask_smem_bytes(const TreeMaskParams& p) {
  const size_t bytes = sizeof(int32_t) * p.m;
  return bytes <= kBuildSmemLimit ? bytes : 0;
}

// The walks up the tree read each parent many times: staged in shared memory (as int32, an
// invalid parent as -1, so a value past 2^31 cannot alias a node) they cost tens of cycles a step
// instead of a global load's latency.
__global__ void __launch_bounds__(kThreads) tree_mask_kernel(TreeMaskParams p, bool staged) {
  extern __shared__ int32_t staged_parents[];
  const int64_t n = blockIdx.x;
  const int64_t count = node_count(p.num_nodes, n, p.m);
  const int64_t* parents = p.parents + n * p.m;
  // The parent of j, or -1 where the walk ends (an invalid parent).
  const auto valid_parent = [&](int64_t j) {
    const int64_t up = parents[j];
    return up < 0 || up >= j ? int64_t{-1} : up;
  };
  if (staged)
    for (int64_t j = threadIdx.x; j < p.m; j += kThreads) staged_parents[j] = static_cast<int32_t>(valid_parent(j));
  const int64_t row_bytes = p.packed ? (p.m + 7) / 8 : p.m;
  uint8_t* mask = p.mask ? p.mask + n * p.m * row_bytes : nullptr;
  if (mask)
    for (int64_t b = threadIdx.x; b < p.m * row_bytes; b += kThreads) mask[b] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < p.m; i += kThreads) {
    uint8_t* row = mask ? mask + i * row_bytes : nullptr;
    int64_t depth = 0;
    for (int64_t j = i;;) {
      if (row) {
        if (p.packed)
          row[j / 8] |= static_cast<uint8_t>(1u << (j % 8));
        else
          row[j] = 1;
      }
      if (j == 0 || i >= count) break;
      const int64_t up = staged ? staged_parents[j] : valid_parent(j);
      if (up < 0) break;  // an invalid parent ends the walk
      j = up;
      ++depth;
    }
    if (p.depth) p.depth[n * p.m + i] = depth;
  }
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

struct VerifyWorkspace {
  int32_t* kids;      // [n, m] the children of the node being tested
  int32_t* rejected;  // [n, m] tokens rejected at it (with draft_probs each once)
  FilterCut* cuts;    // [n, m] the cuts of the visited rows (the walk's), or null: no filter
  StopJob* jobs;      // [n]
  ArgMax* slices;     // [n, sample_slices]: each slice's Gumbel-max
  int sample_slices;
  int q_depth;  // q_stage_depth
};

// What thread 0 decides and the block shares at one node.
struct NodeState {
  RowStats stats;
  const float* q;  // the node's draft row
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

__device__ __forceinline__ FilterCut node_cut(const FilterCut* cuts, int64_t row) {
  return cuts ? cuts[row] : FilterCut{kNegInf, 0x7FFFFFFF};  // the second keeps every id
}

template <int kIds>
__device__ __forceinline__ void keep_chunk(const FilterCut& cut, float (&a)[kIds], int32_t first_id) {
#pragma unroll
  for (int j = 0; j < kIds; ++j) a[j] = kept(cut, a[j], first_id + j);
}

// Four consecutive ids of a row as floats.
struct Four {
  float x[4];
};

// e = exp(a - max) of a scaled logit a, as the row statistics compute it (one FMA, one exp2).
__device__ __forceinline__ float softmax_weight(float a, float top_log2) { return exp2f(fmaf(a, kLog2e, -top_log2)); }

// The Gumbel-max log-weights of ids 4g .. 4g+count-1 at the stop node, the scaled logits `a` but
// the rejected tokens. Those are looked up only when the group could still win (removing ids only
// lowers weights), so most groups skip the list.
__device__ __forceinline__ void stop_weights(const float (&a)[4], int64_t g, int count, const int32_t* rejected,
                                             int32_t nrej, float best, float (&wt)[4]) {
  bool live = false;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    wt[j] = j >= count ? kNegInf : a[j];
    live |= wt[j] + kGumbelBound >= best;
  }
  if (!live) return;
  for (int32_t k = 0; k < nrej; ++k) {
    const int64_t x = rejected[k];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (4 * g + j == x) wt[j] = kNegInf;
  }
}

// tree_verify_kernel's block (a sequence) and its loads of 16 bytes in flight a thread: 512 threads
// with 16 reading a row (128 KB a block, 121-122 registers). With draft_probs (T > 0) the kernel
// holds more state through its passes: ptxas fits 8 row loads in 128 registers without a spill
// (sm_90a; deeper spills), 64 KB a block, and the passes that also read q (a node's first pass,
// which sums q beside the row statistics, and the residual passes) copy q's float4s of those chunks
// into shared memory asynchronously (cp.async), which holds no registers: 64 KB of the row and
// 128 KB of q in flight a block at 16-bit logits (64 KB of q at float32), where the device lets a
// block have that much shared memory (q_stage_depth). XKERNELS_PTXAS_VERBOSE=1 shows the registers.
// A walk that cuts its rows (kFilter) runs 256 threads: the selection (row_filter.cuh) needs more
// registers than 512 threads leave (128 a thread: ptxas spilled, inlined or called), and fits the
// 255 of 256 threads without a spill beside the walk (sm_90a), which then keeps half the bytes in
// flight.
constexpr int kVerifyThreads = 512, kFilteredVerifyThreads = 256;
template <bool kFilter>
constexpr int kVerifyBlock = kFilter ? kFilteredVerifyThreads : kVerifyThreads;
template <bool kDraft>
constexpr int kRowDepth = kDraft ? 8 : 16;

// What the draft kernel's q stage leaves of the shared memory a block may have: the kernel's static
// shared memory (336 bytes, ptxas) and a margin.
constexpr size_t kStaticSmemReserve = 1024;

// The dynamic shared memory of the selection's state, ahead of the q stage (16-byte aligned).
__host__ __device__ constexpr size_t cut_smem_bytes() { return (sizeof(CutShared) + 15) / 16 * 16; }

// The chunks a thread of the draft kernel reads at once in the passes that read q (at most
// kRowDepth<true>): as many as the block's q stage (16 bytes a thread per 4 ids of a chunk) fits in
// the shared memory the device allows (max_smem; 0: 48 KB) beside the cut's state with filters. 8
// on an H100/H200 (227 KB) and A100 (163 KB), filtered or not; at 16-bit logits 6 on parts with
// 99 KB (7 filtered, at half the threads). At least 1 unfiltered; filtered 0 where the cut's
// state leaves no room for a chunk (48 KB at 16-bit logits).
int q_stage_depth(const TreeVerifyParams& p) {
  const size_t limit = p.max_smem > 0 ? static_cast<size_t>(p.max_smem) : 48 * 1024;
  const size_t reserve = kStaticSmemReserve + (p.filtered ? cut_smem_bytes() : 0);
  const size_t ids = p.dtype == LogitsType::kFloat32 ? 4 : 8;  // a chunk's: 16 bytes of logits
  const size_t chunk = sizeof(float) * ids * (p.filtered ? kFilteredVerifyThreads : kVerifyThreads);
  const size_t fit = limit > reserve ? (limit - reserve) / chunk : 0;
  const size_t least = p.filtered ? 0 : 1;
  return static_cast<int>(fit < least ? least : fit > kRowDepth<true> ? kRowDepth<true> : fit);
}

// A row of logits and its row of q read side by side by the block (of kBlock threads), each thread's
// ids in increasing order: when vector_ok (both rows start 16-byte aligned and hold whole chunks)
// chunks of kIds ids, thread t taking chunks t, t + kBlock, ... (as thread_row_stats reads the row alone), `depth`
// (q_stage_depth) a round: their 16-byte loads of the row into registers and their kIds / 4 float4
// of q into `stage` (depth * kIds floats a thread of shared memory), each chunk then to
// on_chunk(a[kIds], q[kIds], first id); otherwise every id to on_id(a, q, id). a: the logits times
// scale.
template <int kBlock, typename T, typename OnChunk, typename OnId>
__device__ __forceinline__ void for_each_row_and_q(const T* row, const float* q, int64_t v, bool vector_ok,
                                                   float scale, float4* stage, int depth, OnChunk&& on_chunk,
                                                   OnId&& on_id) {
  constexpr int kIds = 16 / sizeof(T), kQuads = kIds / 4;
  // Where chunk c's q lands: its round slot's kQuads float4s, consecutive threads at consecutive
  // float4s (no bank conflicts). Thread t's chunks of a round are t + kBlock u, u < depth.
  const auto staged = [&](int64_t c) {
    return stage + static_cast<int>(c / kBlock) % depth * kQuads * kBlock + threadIdx.x;
  };
  const int64_t whole = vector_ok ? v / kIds : 0;
  for_each_batched<kRowDepth<true>>(
      threadIdx.x, whole, kBlock, depth,
      [&](int64_t c) {
        float4* at = staged(c);
#pragma unroll
        for (int j = 0; j < kQuads; ++j)
          __pipeline_memcpy_async(at + j * kBlock, reinterpret_cast<const float4*>(q) + kQuads * c + j,
                                  sizeof(float4));
        return reinterpret_cast<const uint4*>(row)[c];
      },
      [&](int64_t c, const uint4& x) {
        // The round's copies, all of them at its first chunk (the later waits find none pending).
        __pipeline_commit();
        __pipeline_wait_prior(0);
        float a[kIds], qs[kIds];
        unpack<T>(x, scale, a);
        const float4* at = staged(c);
#pragma unroll
        for (int j = 0; j < kQuads; ++j) {
          const float4 y = at[j * kBlock];
          qs[4 * j] = y.x, qs[4 * j + 1] = y.y, qs[4 * j + 2] = y.z, qs[4 * j + 3] = y.w;
        }
        on_chunk(a, qs, static_cast<int32_t>(kIds * c));
      });
  for (int64_t i = kIds * whole + threadIdx.x; i < v; i += kBlock)
    on_id(scaled(row, i, scale), q[i], static_cast<int32_t>(i));
}

// The residual's sum, sum_i max(e_i - coef q_i, 0) with e_i = exp(a_i - max) from the row (at
// thread 0): read-only, from the logits and q, nothing stored.
template <int kBlock, typename T>
__device__ __forceinline__ float residual_sum(const T* row, const float* q, int64_t v, bool vector_ok, float scale,
                                              float4* stage, int depth, float top_log2, TreeCoef coef,
                                              const FilterCut& cut) {
  constexpr int kIds = 16 / sizeof(T);
  float total = 0.0f;
  for_each_row_and_q<kBlock>(
      row, q, v, vector_ok, scale, stage, depth,
      [&](const float (&a)[kIds], const float (&qs)[kIds], int32_t id) {
        float add = 0.0f;
#pragma unroll
        for (int k = 0; k < kIds; ++k)
          add += tree_residual_weight(softmax_weight(kept(cut, a[k], id + k), top_log2), qs[k], coef);
        total += add;
      },
      [&](float a, float qx, int32_t id) {
        total += tree_residual_weight(softmax_weight(kept(cut, a, id), top_log2), qx, coef);
      });
  return block_sum<kBlock>(total);
}

// One thread's share of a row's softmax statistics (exactly thread_row_stats's) and of q's sum, in
// one pass over both rows: q's sum, needed at a node with children, rides on the row's pass.
// observe(a): each scaled logit, as read (the cut's top key bits).
template <int kBlock, typename T, typename Observe>
__device__ __forceinline__ RowStats thread_row_stats_and_q_sum(const T* row, const float* q, int64_t v,
                                                               bool vector_ok, float scale, float4* stage, int depth,
                                                               float& zq, const Observe& observe) {
  constexpr int kIds = 16 / sizeof(T);
  RowStats s = stats_empty();
  for_each_row_and_q<kBlock>(
      row, q, v, vector_ok, scale, stage, depth,
      [&](const float (&a)[kIds], const float (&qs)[kIds], int32_t id) {
#pragma unroll
        for (int k = 0; k < kIds; ++k) observe(a[k]);
        observe_chunk_in_order<false>(s, a, id);
        float add = 0.0f;
#pragma unroll
        for (int k = 0; k < kIds; k += 4) add += (qs[k] + qs[k + 1]) + (qs[k + 2] + qs[k + 3]);
        zq += add;
      },
      [&](float a, float qx, int32_t id) {
        observe(a);
        stats_observe(s, a, id);
        zq += qx;
      });
  return s;
}

struct VisitedCut {
  FilterCut cut;
  RowStats stats;  // of the filtered row p' (at thread 0)
};

// The cut of a visited row (row_filter.cuh) whose statistics pass noted its top key bits in cs, and
// the filtered row's statistics: the kept ids' sum from the selection, or a pass where it is not
// known. The filtered walk's (kFilteredVerifyThreads threads).
template <typename T>
__device__ __forceinline__ VisitedCut cut_visited_row(CutShared& cs, const T* row, int64_t v, float scale, RowSampling rs,
                                                   RowStats s) {
  const RowView<T> r{row, v, scale};
  const int mass_shift = cut_mass_shift(v);
  unsigned long long kept;
  const FilterCut c = filter_cut(cs, r, s.top.val, rs, mass_shift, &kept);
  return VisitedCut{c, RowStats{s.top, kept_sum<kFilteredVerifyThreads>(r, c, s.top.val, kept, mass_shift)}};
}

// Warp 0 tests the children of `node` in node order, 32 candidate nodes a round: at a point mass,
// the first child whose token is the row's argmax; with deterministic children, the rule of
// xkernels/tree.h, the loads and coins of a round's children in parallel and only the running
// `remaining` lane by lane. Writes sh.chosen and the rejected tokens (sh.rejected of them).
template <typename T>
__device__ __forceinline__ void test_children(NodeState& sh, const RowStats& s, bool point_mass, const T* row,
                                              float scale, const FilterCut& cut, const int64_t* tokens,
                                              const int64_t* parents, int64_t node, int64_t count, int64_t v,
                                              int32_t* rejected, const RowStream& st) {
  const int lane = threadIdx.x;
  int64_t chosen = -1;
  int32_t nrej = 0;
  float remaining = 1.0f;
  for (int64_t c0 = node + 1; c0 < count && chosen < 0; c0 += 32) {
    const int64_t c = c0 + lane;
    const bool kid = c < count && parents[c] == node;
    const int64_t x = kid ? tokens[c] : -1;
    if (point_mass) {
      const unsigned hits = __ballot_sync(kFullMask, kid && x == s.top.idx);
      if (hits) chosen = c0 + __ffs(static_cast<int>(hits)) - 1;
      continue;
    }
    // A token outside [0, V) is never accepted; one an earlier child had was rejected then (r(x) = 0).
    bool live = kid && x >= 0 && x < v;
    for (int j = 0; j < 32; ++j) {
      const int64_t xj = __shfl_sync(kFullMask, x, j);
      const int live_j = __shfl_sync(kFullMask, static_cast<int>(live), j);
      if (j < lane && live_j && xj == x) live = false;
    }
    for (int32_t k = 0; k < nrej && live; ++k) live = rejected[k] != x;
    float p_x = 0.0f, u = 0.0f;
    if (live) {
      p_x = stats_prob(s, kept(cut, scaled(row, x, scale), static_cast<int32_t>(x)));
      u = st.coin(static_cast<uint32_t>(c));
    }
    for (unsigned tested = __ballot_sync(kFullMask, live); tested; tested &= tested - 1) {
      const int j = __ffs(static_cast<int>(tested)) - 1;
      const float p_j = __shfl_sync(kFullMask, p_x, j), u_j = __shfl_sync(kFullMask, u, j);
      const int64_t x_j = __shfl_sync(kFullMask, x, j);
      if (tree_accept_plain(u_j, p_j, remaining)) {
        chosen = c0 + j;
        break;
      }
      if (lane == 0) rejected[nrej] = static_cast<int32_t>(x_j);
      ++nrej;
      remaining -= p_j;
    }
    __syncwarp();  // the rejected tokens, read by every lane next round
  }
  if (lane == 0) sh.chosen = chosen, sh.rejected = nrej;
}

// Warp 0 lists the children of `node` in node order in kids (sh.kids of them), a ballot a round.
__device__ __forceinline__ void list_children(NodeState& sh, const int64_t* parents, int64_t node, int64_t count,
                                              int32_t* kids) {
  const int lane = threadIdx.x;
  int32_t k = 0;
  for (int64_t c0 = node + 1; c0 < count; c0 += 32) {
    const int64_t c = c0 + lane;
    const bool kid = c < count && parents[c] == node;
    const unsigned found = __ballot_sync(kFullMask, kid);
    if (kid) kids[k + __popc(found & ((1u << lane) - 1u))] = static_cast<int32_t>(c);
    k += __popc(found);
  }
  if (lane == 0) sh.kids = k;
}

// vector_ok: rows of logits (and of q) start 16-byte aligned, so whole chunks load as vectors.
// kDraft: p.q is set (the residual passes are compiled only then). kFilter: w.cuts is set, some
// sequence may filter (the selection is compiled only then).
template <typename T, bool kDraft, bool kFilter>
__global__ void __launch_bounds__(kVerifyBlock<kFilter>, 1)
    tree_verify_kernel(TreeVerifyParams p, VerifyWorkspace w, bool vector_ok) {
  constexpr int kBlock = kVerifyBlock<kFilter>;
  constexpr int kIds = 16 / sizeof(T);
  __shared__ NodeState sh;
  // kFilter: the selection's state (cut_smem_bytes), then the draft kernel's q stage (w.q_depth
  // chunks a thread).
  extern __shared__ __align__(16) float4 verify_smem[];
  CutShared* cs = reinterpret_cast<CutShared*>(verify_smem);
  float4* q_stage = verify_smem + (kFilter ? cut_smem_bytes() / sizeof(float4) : 0);
  __shared__ RowStream st;  // thread 0's, kept out of the registers of the row passes
  __shared__ FilterCut visited_cut;  // the visited row's
  const int64_t n = blockIdx.x, m = p.m, v = p.v;
  const int64_t count = node_count(p.num_nodes, n, m);
  const int64_t* tokens = p.tokens + n * m;
  const int64_t* parents = p.parents + n * m;
  int32_t* kids = w.kids + n * m;
  int32_t* rejected = w.rejected + n * m;
  if (threadIdx.x == 0) st = p.s.stream(n);
  const RowSampling rs = p.s.row(n);
  const float inv_t = rs.inv_t;
  const bool greedy = inv_t == 0.0f;  // a greedy row of the draft kernel reads no q
  const float scale = greedy ? 1.0f : inv_t;
  const bool filtering = kFilter && !greedy && filters_active(rs, v);  // the same for the whole block
  const TopBits bits = filtering ? top_bits(rs, v) : TopBits::kNone;
  const auto note = [&](float a) {  // the statistics pass's share of the cut
    if (bits != TopBits::kNone) observe_top_bits(*cs, a, bits);
  };
  int64_t node = 0, acc = 0;
  for (;;) {
    const T* row = static_cast<const T*>(p.logits) + (n * m + node) * v;
    if (bits != TopBits::kNone) {
      clear_top_bits(*cs);
      __syncthreads();
    }
    if (kDraft) {
      // The children first (they depend on the parents alone): q's sum is needed only at a node
      // with children, and then rides on the row's pass.
      if (threadIdx.x == 0) sh.q = p.q + (n * m + node) * v;
      if (threadIdx.x < 32) list_children(sh, parents, node, count, kids);
      __syncthreads();
    }
    const bool with_q = kDraft && !greedy && sh.kids > 0;  // read before block_merge's barrier, then rewritten
    // One block reads the row, 128 KB in flight (64 KB with draft_probs, and 128 KB of q beside it
    // at a node with children; half of each in a filtered walk's 256 threads): 64 blocks then keep
    // 4-12 MB in flight, about HBM's bandwidth times its latency or more.
    const int64_t chunks = (v + kIds - 1) / kIds;
    float zq = 0.0f;
    RowStats s =
        greedy ? thread_row_stats<T, true, kRowDepth<kDraft>>(row, v, 0, chunks, vector_ok, 1.0f, -1, threadIdx.x,
                                                              kBlock)
        : with_q ? thread_row_stats_and_q_sum<kBlock>(row, sh.q, v, vector_ok, scale, q_stage, w.q_depth, zq, note)
                 : thread_row_stats<T, false, kRowDepth<kDraft>>(row, v, 0, chunks, vector_ok, scale, -1, threadIdx.x,
                                                                 kBlock, note);
    s = block_merge<kBlock>(s, stats_empty());
    if (with_q) zq = block_sum<kBlock>(zq);  // block_merge's buffer is another: no barrier between
    if constexpr (kFilter) {  // the row's cut, and p' = its filtered row's statistics
      if (threadIdx.x == 0) {
        sh.stats = s;
        visited_cut = keep_all();
      }
      __syncthreads();
      if (filtering && !stats_degenerate(sh.stats)) {
        const VisitedCut c = cut_visited_row(*cs, row, v, scale, rs, sh.stats);
        if (threadIdx.x == 0) s = c.stats, visited_cut = c.cut;
      }
      if (threadIdx.x == 0) w.cuts[n * m + node] = visited_cut;  // for the draw at the stop node
      __syncthreads();  // sh.stats is read before the node's state rewrites it
    }
    if (threadIdx.x == 0)
      sh = NodeState{s, kDraft ? sh.q : nullptr, tree_residual_start(s.sum, zq), -1, kDraft ? sh.kids : 0, 0, -1,
                     false, false};
    __syncthreads();
    s = sh.stats;
    const FilterCut cut = kFilter ? visited_cut : keep_all();
    const bool point_mass = greedy || stats_degenerate(s);
    const float top_log2 = s.top.val * kLog2e;
    if (point_mass || !kDraft) {
      if (threadIdx.x < 32)
        test_children(sh, s, point_mass, row, scale, cut, tokens, parents, node, count, v, rejected, st);
      __syncthreads();
    }
    if (kDraft && !point_mass && sh.kids > 0) {
      // The residual in closed form (xkernels/tree.h's TreeResidual): thread 0 tests the children
      // in order; before a test that follows a rejection, the block sums the residual over the row.
      bool stale = false;  // thread 0's: res.sum is that of an earlier coef
      for (int32_t i = 0; i < sh.kids; ++i) {
        __syncthreads();
        if (threadIdx.x == 0) {
          const int64_t x = tokens[kids[i]];
          sh.x = x >= 0 && x < v ? static_cast<int32_t>(x) : -1;
          sh.pass = sh.x >= 0 && stale;
        }
        __syncthreads();
        if (sh.x < 0) continue;  // a token outside [0, V): never accepted, no residual step
        if (sh.pass) {
          const float total = residual_sum<kBlock>(row, sh.q, v, vector_ok, scale, q_stage, w.q_depth, top_log2,
                                           tree_coef(sh.res.coef), cut);
          if (threadIdx.x == 0) {
            sh.res.sum = total;
            sh.empty = !(total > 0.0f);
            stale = false;
          }
          __syncthreads();
          if (sh.empty) break;
        }
        if (threadIdx.x == 0) {
          const int32_t x = sh.x;
          bool repeated = false;
          for (int32_t k = 0; k < sh.rejected; ++k) repeated |= rejected[k] == x;
          const float q_x = sh.q[x];
          const float e_x = softmax_weight(kept(cut, scaled(row, x, scale), x), top_log2);
          if (tree_residual_accepts(sh.res, st.coin(static_cast<uint32_t>(kids[i])), e_x, q_x, repeated)) {
            sh.chosen = kids[i];
          } else {
            tree_residual_reject(sh.res, q_x, p.without_replacement && !repeated);
            if (!repeated) rejected[sh.rejected++] = x;
            stale = true;
          }
        }
        __syncthreads();
        if (sh.chosen >= 0) break;
      }
    }
    __syncthreads();
    const int64_t chosen = sh.chosen;
    if (chosen < 0) {
      if (threadIdx.x == 0) {  // the row's argmax, unless the sampling pass draws
        const bool draw = !point_mass && !sh.empty;
        const bool residual = kDraft && sh.rejected > 0;
        const ArgMax top = sh.stats.top;
        p.out_tokens[n * m + acc] = top.idx;
        p.accept_len[n] = acc;
        w.jobs[n] = StopJob{draw ? static_cast<int32_t>(node) : -1, static_cast<int32_t>(acc),
                            residual ? 0 : sh.rejected, residual, top.idx, top.val * kLog2e, scale,
                            tree_coef(sh.res.coef)};
      }
      break;
    }
    if (threadIdx.x == 0) {
      p.out_tokens[n * m + acc] = tokens[chosen];
      p.path[n * m + acc + 1] = chosen;
    }
    ++acc;
    node = chosen;
    __syncthreads();  // sh and the shared reduction buffers are reused for the next node
  }
  for (int64_t j = threadIdx.x; j < m; j += kBlock) {
    if (j == 0) p.path[n * m] = 0;
    if (j > acc) p.path[n * m + j] = -1;
    if (j > acc) p.out_tokens[n * m + j] = -1;
  }
}

// The stop rows' Gumbel-max, each row split in w.sample_slices slices over the grid (one block a
// sequence had left the draw, Philox-bound, on a single SM). Weights: the scaled logits without the
// rejected tokens, or the residual max(e - coef q, 0) from the row and q, linear (linear_group).
// Every block starts from the exact score of the row's argmax. kDraft: residual draws can occur (p.q
// set; the plain draws alone take 48 registers, with residual ones 80).
template <typename T, bool kDraft>
__global__ void __launch_bounds__(kThreads) tree_sample_kernel(TreeVerifyParams p, VerifyWorkspace w, bool vector_ok) {
  __shared__ ArgMax start;
  __shared__ FilterCut cut;  // thread 0's, kept out of the registers of the pass (it spilled there)
  const int64_t n = blockIdx.x / w.sample_slices, m = p.m, v = p.v;
  const int slice = static_cast<int>(blockIdx.x % w.sample_slices);
  const StopJob job = w.jobs[n];
  if (job.node < 0) return;  // the same for the whole block
  // The noise of the stop node's slot of the sequence's stream.
  const RowStream st = p.s.stream(n);
  const uint64_t seed = st.seed, offset = st.offset_at(static_cast<uint32_t>(job.node));
  const uint32_t sequence = st.sequence_at(), node = st.position_at(static_cast<uint32_t>(job.node));
  const float scale = job.scale;
  const T* row = static_cast<const T*>(p.logits) + (n * m + job.node) * v;
  const float* q = kDraft && job.residual ? p.q + (n * m + job.node) * v : nullptr;
  const int32_t* rejected = w.rejected + n * m;
  // The residual of scaled logit a and draft probability qx.
  const auto residual = [&](float a, float qx) {
    return tree_residual_weight(softmax_weight(a, job.top_log2), qx, job.coef);
  };
  if (threadIdx.x == 0) {
    cut = node_cut(w.cuts, n * m + job.node);
    const int32_t x = job.top;
    float wt = kNegInf;
    if (q) {
      const float r = residual(scaled(row, x, scale), q[x]);  // the argmax: always kept
      wt = r > 0.0f ? log_f32(r) : kNegInf;
    } else {
      bool seen = false;
      for (int32_t k = 0; k < job.nrej; ++k) seen |= rejected[k] == x;
      if (!seen) wt = scaled(row, x, scale);
    }
    start = gumbel_score(wt, x, seed, offset, sequence, node);
  }
  __syncthreads();
  ArgMax best = start;
  // Ids 4g .. 4g+cnt-1: scaled logits a (the cut's dropped ids as -inf) and (residual draws) q.
  const auto observe = [&](int64_t g, Four a, const Four& qs, int cnt) {
    float wt[4];
    keep_chunk(cut, a.x, static_cast<int32_t>(4 * g));
    if (q) {
#pragma unroll
      for (int j = 0; j < 4; ++j) wt[j] = j < cnt ? residual(a.x[j], qs.x[j]) : 0.0f;
      linear_group(best, seed, offset, sequence, node, static_cast<uint32_t>(g), wt);
    } else {
      stop_weights(a.x, g, cnt, rejected, job.nrej, best.val, wt);
      tree_sample_group(best, seed, offset, sequence, node, static_cast<uint32_t>(g), wt, cnt);
    }
  };
  struct Group {
    Four a, q;
  };
  const SliceRange range = slice_range(v, 4, w.sample_slices, slice);
  const int64_t vector_end = vector_ok ? vector_span_end(range.begin, range.end, v / 4) : range.begin;
  for_each_batched<4>(
      range.begin + threadIdx.x, vector_end, kThreads,
      [&](int64_t g) {
        Group x{};
        unpack<T>(reinterpret_cast<const typename Quad<T>::type*>(row)[g], scale, x.a.x);
        if (q) unpack<float>(reinterpret_cast<const float4*>(q)[g], 1.0f, x.q.x);
        return x;
      },
      [&](int64_t g, const Group& x) { observe(g, x.a, x.q, 4); });
  for (int64_t g = vector_end + threadIdx.x; g < range.end; g += kThreads) {
    const int cnt = v - 4 * g < 4 ? static_cast<int>(v - 4 * g) : 4;
    Group x;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      x.a.x[j] = j < cnt ? scaled(row, 4 * g + j, scale) : 0.0f;
      x.q.x[j] = j < cnt && q ? q[4 * g + j] : 0.0f;
    }
    observe(g, x.a, x.q, cnt);
  }
  best = block_merge(best, argmax_empty());
  if (threadIdx.x == 0) w.slices[blockIdx.x] = best;
}

// A warp a sequence merges the slices of its draw (at most kMaxRowSlices) and writes the token.
__global__ void __launch_bounds__(kThreads) tree_sample_finish_kernel(TreeVerifyParams p, VerifyWorkspace w) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (n >= p.n) return;
  const StopJob job = w.jobs[n];
  if (job.node < 0) return;
  const ArgMax best = warp_merge_slices(w.slices + n * w.sample_slices, w.sample_slices, argmax_empty());
  if (lane == 0 && best.idx != kNoIndex) p.out_tokens[n * p.m + job.acc] = best.idx;
}

template <typename E>
__global__ void compact_kv_kernel(CompactKvParams p) {
  const int64_t s = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  int64_t a = p.accept_len[s];
  a = a < 0 ? 0 : a > p.m - 1 ? p.m - 1 : a;
  const int64_t* path = p.path + s * p.m;
  E* base = reinterpret_cast<E*>(p.cache) + s * p.stride0 + h * p.stride1;
  int64_t prev = 0;
  // Increasing j: a source (path[j] >= j) is never a slot an earlier step wrote, so the threads
  // need no barrier between steps.
  for (int64_t j = 1; j <= a; ++j) {
    const int64_t src = path[j];
    if (src < j || src <= prev || p.prefix_len + src >= p.len) break;  // an invalid path stops the moves
    prev = src;
    if (src == j) continue;
    E* dst_row = base + (p.prefix_len + j) * p.stride2;
    const E* src_row = base + (p.prefix_len + src) * p.stride2;
    for (int64_t e = threadIdx.x; e < p.d; e += blockDim.x) dst_row[e] = src_row[e];
  }
}

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

// The walk's launch: dynamic shared memory for the cut's state (kFilter) and the q stage (kDraft).
template <typename T, bool kDraft, bool kFilter>
cudaError_t launch_walk(const TreeVerifyParams& p, const VerifyWorkspace& w, bool vector_ok, cudaStream_t stream) {
  constexpr int kBlock = kVerifyBlock<kFilter>;
  const size_t stage = kDraft ? sizeof(float) * (16 / sizeof(T)) * kBlock * w.q_depth : 0;
  const size_t smem = (kFilter ? cut_smem_bytes() : 0) + stage;
  if (kDraft) {
    // Above 48 KB of dynamic shared memory a kernel must opt in: once a device, to the device's limit.
    static PerDevice opted_in;
    const cudaError_t err = opt_in_max_dynamic_smem(opted_in, tree_verify_kernel<T, kDraft, kFilter>);
    if (err != cudaSuccess) return err;
  }
  tree_verify_kernel<T, kDraft, kFilter><<<p.n, kBlock, smem, stream>>>(p, w, vector_ok);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_walks(const TreeVerifyParams& p, const VerifyWorkspace& w, bool vector_ok, cudaStream_t stream) {
  if (p.q && p.may_sample) {  // at T = 0 draft_probs play no part
    if (w.q_depth < 1) return cudaErrorInvalidConfiguration;  // the cut's state and one chunk do not fit
    if (w.cuts) return launch_walk<T, true, true>(p, w, vector_ok, stream);
    return launch_walk<T, true, false>(p, w, vector_ok, stream);
  }
  if (w.cuts) return launch_walk<T, false, true>(p, w, vector_ok, stream);
  return launch_walk<T, false, false>(p, w, vector_ok, stream);
}

template <typename T>
cudaError_t launch_verify_typed(const TreeVerifyParams& p, const VerifyWorkspace& w, cudaStream_t stream) {
  // Rows of logits and q start 16-byte aligned.
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && p.v % 4 == 0 &&
                         reinterpret_cast<uintptr_t>(p.logits) % 16 == 0 &&
                         (p.q == nullptr || reinterpret_cast<uintptr_t>(p.q) % 16 == 0);
  const cudaError_t err = launch_walks<T>(p, w, vector_ok, stream);
  if (err != cudaSuccess) return err;
  if (p.may_sample) {  // greedy walks write every token themselves
    if (p.q)
      tree_sample_kernel<T, true><<<p.n * w.sample_slices, kThreads, 0, stream>>>(p, w, vector_ok);
    else
      tree_sample_kernel<T, false><<<p.n * w.sample_slices, kThreads, 0, stream>>>(p, w, vector_ok);
    tree_sample_finish_kernel<<<(p.n + kWarps - 1) / kWarps, kThreads, 0, stream>>>(p, w);
  }
  return cudaGetLastError();
}

}  // namespace

size_t tree_build_workspace_bytes(const TreeBuildParams& p) {
  return build_smem_bytes(p) ? 0 : align_up(build_layout(p.budget, p.d * p.k, false).total * p.n);
}

cudaError_t launch_build_draft_tree(const TreeBuildParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const size_t smem = build_smem_bytes(p);
  build_tree_kernel<<<p.n, 32, smem, stream>>>(p, static_cast<uint8_t*>(workspace), smem != 0);
  return cudaGetLastError();
}

cudaError_t launch_tree_mask(const TreeMaskParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const size_t smem = mask_smem_bytes(p);
  tree_mask_kernel<<<p.n, kThreads, smem, stream>>>(p, smem != 0);
  return cudaGetLastError();
}

size_t tree_verify_workspace_bytes(const TreeVerifyParams& p) {
  const size_t lists = 2 * align_up(sizeof(int32_t) * p.n * p.m) + (p.filtered ? align_up(sizeof(FilterCut) * p.n * p.m) : 0);
  const size_t draws = align_up(sizeof(StopJob) * p.n) +
                       align_up(sizeof(ArgMax) * p.n * row_slice_count(p.n, p.v, p.num_sms));
  return lists + draws;
}

cudaError_t launch_tree_verify(const TreeVerifyParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  char* at = static_cast<char*>(workspace);
  VerifyWorkspace w{};
  w.kids = reinterpret_cast<int32_t*>(at);
  at += align_up(sizeof(int32_t) * p.n * p.m);
  w.rejected = reinterpret_cast<int32_t*>(at);
  at += align_up(sizeof(int32_t) * p.n * p.m);
  if (p.filtered) {
    w.cuts = reinterpret_cast<FilterCut*>(at);
    at += align_up(sizeof(FilterCut) * p.n * p.m);
  }
  w.jobs = reinterpret_cast<StopJob*>(at);
  at += align_up(sizeof(StopJob) * p.n);
  w.slices = reinterpret_cast<ArgMax*>(at);
  w.sample_slices = row_slice_count(p.n, p.v, p.num_sms);
  w.q_depth = q_stage_depth(p);
  switch (p.dtype) {
    case LogitsType::kFloat32: return launch_verify_typed<float>(p, w, stream);
    case LogitsType::kBFloat16: return launch_verify_typed<__nv_bfloat16>(p, w, stream);
    case LogitsType::kFloat16: return launch_verify_typed<__half>(p, w, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_compact_kv(const CompactKvParams& p, cudaStream_t stream) {
  if (p.n == 0 || p.heads == 0) return cudaSuccess;
  const int64_t blocks = p.n * p.heads;
  switch (p.elem) {
    case 1: compact_kv_kernel<uint8_t><<<blocks, 128, 0, stream>>>(p); break;
    case 2: compact_kv_kernel<uint16_t><<<blocks, 128, 0, stream>>>(p); break;
    case 4: compact_kv_kernel<uint32_t><<<blocks, 128, 0, stream>>>(p); break;
    case 8: compact_kv_kernel<uint64_t><<<blocks, 128, 0, stream>>>(p); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace xkernels::cuda
