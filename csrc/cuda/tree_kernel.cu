// The draft-tree ops on CUDA, one launch each, never waiting on the host:
//  build_draft_tree:    a warp per sequence runs the best-first search of xkernels/tree.h, each pop
//                       a warp-wide max over the frontier spread across its lanes, the state in
//                       shared memory (global scratch when it does not fit in 48 KB: any budget);
//                       asked for the mask, the warp then writes its rows as tree_attention_mask's
//                       walks do (mark_ancestors), the parents read from the search state.
//  tree_attention_mask: a block per sequence stages the parents in shared memory and zeroes the
//  / tree_positions     mask, then a thread per node walks its ancestors, setting its own row
//                       (no two threads write one row).
//  tree_verify:         a block per sequence walks the tree (a cluster of two blocks on sm_90+,
//                       filtered or not: each reads half of every pass over a row, both merge
//                       the halves, and a filtered row's candidates, alike and take the same
//                       decisions; see tree_walk.cuh); at each visited node the block
//                       reduces that one row's softmax statistics, thread 0 tests the children in
//                       order, and with draft_probs the block sums the residual (read-only, from the
//                       row and q) when a test needs it. Only visited rows are read. At T > 0 two
//                       more launches draw the token at the stop node (Gumbel-max, each row split
//                       over many blocks) and merge. With filters the walk finds the cut of each
//                       row it visits and leaves it for the draw; the walk and the draw read p'
//                       through it. A top-k cut comes from the candidates that row's statistics
//                       pass keeps (candidates.cuh's warp buffers, select_cut), with no other pass
//                       over the row where they settle it (with draft_probs q is read once more
//                       for its sum, and the residual sums take the kept ids alone unless some q
//                       is below 0), and the stop draw from such a row is drawn in the walk from
//                       the kept ids (the sampling launches skip it); other cuts take the radix
//                       path (row_filter.cuh), whose top key bits the statistics pass notes, and
//                       so do the rows the candidates do not settle, after a pass that notes them.
//  compact_kv_:         a block per (sequence, head) moves the accepted entries in path order.
// Values the host cannot check without a sync (parents, num_nodes, token ids, path) are handled
// memory-safely: an invalid parent ends a walk, a child whose token lies outside [0, V) is never
// accepted, an invalid path stops the moves; XKERNELS_CHECK=1 makes the bindings raise instead.
// The walk's kernel is tree_walk.cuh's.
#include "tree_verify.cuh"

namespace xkernels::cuda {
namespace {

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

__host__ __device__ inline int64_t mask_row_bytes(int64_t m, bool packed) { return packed ? (m + 7) / 8 : m; }

// Sets row i of a sequence's mask (zeroed beforehand; none: null) to node i and, for a real node
// (i < count), its ancestors, following parent(j) up to the root or to a -1 (an invalid parent ends
// the walk); returns the steps taken, i's depth. A thread a row: no two threads write one byte.
// Parents lie below their nodes, so the walk leaves a packed byte for good: its bits gather in a
// register and it is stored once, with no read of it on the walk's chain.
template <typename Parent>
__device__ __forceinline__ int64_t mark_ancestors(uint8_t* row, bool packed, int64_t i, int64_t count,
                                                  const Parent& parent) {
  int64_t depth = 0, j = i;
  uint32_t byte = 0;  // packed: the bits of byte j / 8 so far
  for (;;) {
    if (packed)
      byte |= 1u << (j % 8);
    else if (row)
      row[j] = 1;
    const int64_t up = j == 0 || i >= count ? -1 : parent(j);
    if (up < 0) break;
    if (packed && up / 8 != j / 8) {
      if (row) row[j / 8] = static_cast<uint8_t>(byte);
      byte = 0;
    }
    j = up;
    ++depth;
  }
  if (packed && row) row[j / 8] = static_cast<uint8_t>(byte);
  return depth;
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
  if (p.mask) {
    const int64_t row_bytes = mask_row_bytes(m, p.packed);
    uint8_t* mask = p.mask + n * m * row_bytes;
    for (int64_t b = lane; b < m * row_bytes; b += 32) mask[b] = 0;
    __syncwarp();  // the zeros before other lanes' bits
    // The nodes' parents are valid by construction: no check, no staging.
    const auto parent = [&](int64_t j) { return static_cast<int64_t>(entries[node_entry[j]].parent); };
    for (int64_t i = lane; i < m; i += 32) mark_ancestors(mask + i * row_bytes, p.packed, i, nodes, parent);
  }
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
  const int64_t row_bytes = mask_row_bytes(p.m, p.packed);
  uint8_t* mask = p.mask ? p.mask + n * p.m * row_bytes : nullptr;
  if (mask)
    for (int64_t b = threadIdx.x; b < p.m * row_bytes; b += kThreads) mask[b] = 0;
  __syncthreads();
  const auto parent = [&](int64_t j) { return staged ? int64_t{staged_parents[j]} : valid_parent(j); };
  for (int64_t i = threadIdx.x; i < p.m; i += kThreads) {
    const int64_t depth = mark_ancestors(mask ? mask + i * row_bytes : nullptr, p.packed, i, count, parent);
    if (p.depth) p.depth[n * p.m + i] = depth;
  }
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

// The chunks a thread of the draft kernel reads at once in the passes that read q (at most
// kRowDepth<true>): as many as the block's q stage (a chunk's q a thread: 16 bytes per 4 ids of
// float32 q, 8 of 16-bit q) fits in the shared memory the device allows (max_smem; 0: 48 KB) beside
// the cut's state with filters. 8 on an H100/H200 (227 KB) and A100 (163 KB), filtered or not; at
// 16-bit logits and float32 q 6 on parts with 99 KB (7 filtered, at half the threads). At least 1
// unfiltered; filtered 0 where the cut's state leaves no room for a chunk (48 KB at 16-bit logits
// and float32 q).
int q_stage_depth(const TreeVerifyParams& p) {
  const size_t limit = p.max_smem > 0 ? static_cast<size_t>(p.max_smem) : 48 * 1024;
  const size_t reserve = kStaticSmemReserve + (p.filtered ? cut_smem_bytes() : 0);
  const size_t ids = p.dtype == LogitsType::kFloat32 ? 4 : 8;  // a chunk's: 16 bytes of logits
  const size_t q_bytes = p.q_dtype == LogitsType::kFloat32 ? 4 : 2;
  const size_t chunk = q_bytes * ids * (p.filtered ? kFilteredVerifyThreads : kVerifyThreads);
  const size_t fit = limit > reserve ? (limit - reserve) / chunk : 0;
  const size_t least = p.filtered ? 0 : 1;
  return static_cast<int>(fit < least ? least : fit > kRowDepth<true> ? kRowDepth<true> : fit);
}

// The 16-byte chunks of the stop row a thread of tree_sample_kernel keeps in flight (each with its
// q for a residual draw): 16 KB a block of the row at 16-bit logits (8 KB before, in 8-byte loads).
constexpr int kSampleDepth = 4;

// The stop rows' Gumbel-max, each row split in w.sample_slices slices over the grid (one block a
// sequence had left the draw, Philox-bound, on a single SM). Weights: the scaled logits without the
// rejected tokens, or the residual max(e - coef q, 0) from the row and q, linear (linear_group).
// Every block starts from the exact score of the row's argmax. kDraft: residual draws can occur (p.q
// set, of type Q; the plain draws alone take 62 registers, with residual ones 76, sm_90a).
template <typename T, typename Q, bool kDraft>
__global__ void __launch_bounds__(kThreads) tree_sample_kernel(TreeVerifyParams p, VerifyWorkspace w, bool vector_ok) {
  __shared__ ArgMax start;
  __shared__ FilterCut cut;  // thread 0's, kept out of the registers of the pass (it spilled there)
  const int64_t n = blockIdx.x / w.sample_slices, m = p.m, v = p.v;
  const int slice = static_cast<int>(blockIdx.x % w.sample_slices);
  const StopJob job = w.jobs[n];
  if (job.node < 0) return;  // the same for the whole block
  if (slice == 0) XK_ROW_PASS();  // the slices read the stop row once between them
  // The noise of the stop node's slot of the sequence's stream.
  const RowStream st = p.s.stream(n);
  const uint64_t seed = st.seed, offset = st.offset_at(static_cast<uint32_t>(job.node));
  const uint32_t sequence = st.sequence_at(), node = st.position_at(static_cast<uint32_t>(job.node));
  const float scale = job.scale;
  const T* row = static_cast<const T*>(p.logits) + (n * m + job.node) * v;
  const Q* q = kDraft && job.residual ? static_cast<const Q*>(p.q) + (n * m + job.node) * v : nullptr;
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
      const float r = residual(scaled(row, x, scale), to_float(q[x]));  // the argmax: always kept
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
  // Chunks of 16 bytes of the row (kIds ids, kIds / 4 groups) and their q, kSampleDepth in flight a
  // thread; the slices are whole chunks. The groups, their weights and scores are those of any other
  // split: the draw is the best score of all of them.
  using C = QChunk<T, Q>;
  constexpr int kIds = C::kIds;
  struct Chunk {
    uint4 row;
    typename C::Unit q[kDraft ? C::kUnits : 1];
  };
  const SliceRange range = slice_range(v, kIds, w.sample_slices, slice);
  const int64_t vector_end = vector_ok ? vector_span_end(range.begin, range.end, v / kIds) : range.begin;
  for_each_batched<kSampleDepth>(
      range.begin + threadIdx.x, vector_end, kThreads,
      [&](int64_t c) {
        Chunk x{};
        x.row = reinterpret_cast<const uint4*>(row)[c];
        if (kDraft && q) {
#pragma unroll
          for (int j = 0; j < C::kUnits; ++j) x.q[j] = reinterpret_cast<const typename C::Unit*>(q)[C::kUnits * c + j];
        }
        return x;
      },
      [&](int64_t c, const Chunk& x) {
        float a[kIds], qs[kIds] = {};
        unpack<T>(x.row, scale, a);
        if (kDraft && q) {
          const Q* e = reinterpret_cast<const Q*>(x.q);
#pragma unroll
          for (int k = 0; k < kIds; ++k) qs[k] = to_float(e[k]);
        }
#pragma unroll
        for (int h = 0; h < kIds / 4; ++h) {
          Four ga, gq;
#pragma unroll
          for (int j = 0; j < 4; ++j) ga.x[j] = a[4 * h + j], gq.x[j] = qs[4 * h + j];
          observe(kIds / 4 * c + h, ga, gq, 4);
        }
      });
  const int64_t groups = (v + 3) / 4, slice_groups = kIds / 4 * range.end;
  const int64_t g_end = slice_groups < groups ? slice_groups : groups;
  for (int64_t g = kIds / 4 * vector_end + threadIdx.x; g < g_end; g += kThreads) {
    const int cnt = v - 4 * g < 4 ? static_cast<int>(v - 4 * g) : 4;
    Four ga, gq;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      ga.x[j] = j < cnt ? scaled(row, 4 * g + j, scale) : 0.0f;
      gq.x[j] = j < cnt && q ? to_float(q[4 * g + j]) : 0.0f;
    }
    observe(g, ga, gq, cnt);
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

template <typename T, typename Q>
cudaError_t launch_walks(const TreeVerifyParams& p, const VerifyWorkspace& w, bool vector_ok, cudaStream_t stream) {
  const bool draft = p.q && p.may_sample;  // at T = 0 draft_probs play no part
  if (draft && w.q_depth < 1) return cudaErrorInvalidConfiguration;  // the cut's state and one chunk do not fit
  if (w.cuts)
    return draft ? launch_verify_walk<T, Q, true, true>(p, w, vector_ok, stream)
                 : launch_verify_walk<T, float, false, true>(p, w, vector_ok, stream);
  return draft ? launch_verify_walk<T, Q, true, false>(p, w, vector_ok, stream)
               : launch_verify_walk<T, float, false, false>(p, w, vector_ok, stream);
}

template <typename T, typename Q>
cudaError_t launch_verify_typed(const TreeVerifyParams& p, const VerifyWorkspace& w, cudaStream_t stream) {
  // Rows of logits start 16-byte aligned, and rows of q at a multiple of their chunk's q (8 bytes at
  // least: V a multiple of 4).
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && p.v % 4 == 0 &&
                         reinterpret_cast<uintptr_t>(p.logits) % 16 == 0 &&
                         (p.q == nullptr || reinterpret_cast<uintptr_t>(p.q) % 16 == 0);
  const cudaError_t err = launch_walks<T, Q>(p, w, vector_ok, stream);
  if (err != cudaSuccess) return err;
  if (p.may_sample) {  // greedy walks write every token themselves
    if (p.q)
      tree_sample_kernel<T, Q, true><<<p.n * w.sample_slices, kThreads, 0, stream>>>(p, w, vector_ok);
    else
      tree_sample_kernel<T, float, false><<<p.n * w.sample_slices, kThreads, 0, stream>>>(p, w, vector_ok);
    tree_sample_finish_kernel<<<(p.n + kWarps - 1) / kWarps, kThreads, 0, stream>>>(p, w);
  }
  return cudaGetLastError();
}

// q's element type (float32 when there is no q: nothing reads it then; the binding checked the type).
template <typename T>
cudaError_t launch_verify_q(const TreeVerifyParams& p, const VerifyWorkspace& w, cudaStream_t stream) {
  if (p.q && p.q_dtype == LogitsType::kBFloat16) return launch_verify_typed<T, __nv_bfloat16>(p, w, stream);
  if (p.q && p.q_dtype == LogitsType::kFloat16) return launch_verify_typed<T, __half>(p, w, stream);
  return launch_verify_typed<T, float>(p, w, stream);
}

// The blocks that may walk a sequence: a cluster's where the device runs clusters.
int64_t walk_team(const TreeVerifyParams& p) { return p.clusters ? kVerifyTeam : 1; }

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
  const size_t lists = 2 * align_up(sizeof(int32_t) * walk_team(p) * p.n * p.m) +
                       (p.filtered ? align_up(sizeof(FilterCut) * p.n * p.m) : 0);
  const size_t draws = align_up(sizeof(StopJob) * p.n) +
                       align_up(sizeof(ArgMax) * p.n * row_slice_count(p.n, p.v, p.num_sms));
  const size_t team = p.clusters ? align_up(sizeof(TeamShare) * p.n * 2 * kVerifyTeam) : 0;
  const size_t team_cands = p.clusters && p.filtered ? align_up(sizeof(TeamCandidates) * p.n * 2 * kVerifyTeam) : 0;
  return lists + draws + team + team_cands;
}

cudaError_t launch_tree_verify(const TreeVerifyParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  char* at = static_cast<char*>(workspace);
  VerifyWorkspace w{};
  w.kids = reinterpret_cast<int32_t*>(at);
  at += align_up(sizeof(int32_t) * walk_team(p) * p.n * p.m);
  w.rejected = reinterpret_cast<int32_t*>(at);
  at += align_up(sizeof(int32_t) * walk_team(p) * p.n * p.m);
  if (p.filtered) {
    w.cuts = reinterpret_cast<FilterCut*>(at);
    at += align_up(sizeof(FilterCut) * p.n * p.m);
  }
  w.jobs = reinterpret_cast<StopJob*>(at);
  at += align_up(sizeof(StopJob) * p.n);
  w.slices = reinterpret_cast<ArgMax*>(at);
  w.sample_slices = row_slice_count(p.n, p.v, p.num_sms);
  at += align_up(sizeof(ArgMax) * p.n * w.sample_slices);
  if (p.clusters) {
    w.team = reinterpret_cast<TeamShare*>(at);
    at += align_up(sizeof(TeamShare) * p.n * 2 * kVerifyTeam);
    if (p.filtered) w.team_cands = reinterpret_cast<TeamCandidates*>(at);
  }
  w.q_depth = q_stage_depth(p);
  switch (p.dtype) {
    case LogitsType::kFloat32: return launch_verify_q<float>(p, w, stream);
    case LogitsType::kBFloat16: return launch_verify_q<__nv_bfloat16>(p, w, stream);
    case LogitsType::kFloat16: return launch_verify_q<__half>(p, w, stream);
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

