// tree_verify's walk (tree_kernel.cu's comment): its kernel template and launch. Included only by
// the files that instantiate it (tree_verify_kernel.cu, tree_filtered_verify_<type>_kernel.cu), each
// combination in one file, so that no translation unit compiles for long.
#pragma once

#include <cuda_pipeline_primitives.h>

#include "cluster_team.cuh"
#include "per_device.h"
#include "tree_verify.cuh"

namespace xkernels::cuda {

// A row of logits and its row of q (of type Q, each value converted to float where it is used:
// exact, so the floats of a float32 copy) read side by side by the block (of kBlock threads; the
// team's share: block `rank` of kTeam, whose threads take their turns after the lower blocks'), each
// thread's ids in increasing order: when vector_ok (both rows start aligned and hold whole chunks)
// chunks of kIds ids, team thread f = rank kBlock + t taking chunks f, f + kTeam kBlock, ... (as
// thread_row_stats reads the row alone), `depth` (q_stage_depth) a round: their 16-byte loads of
// the row into registers and their q units (QChunk) into `stage` (depth chunks of q a thread of
// shared memory), each chunk then to on_chunk(a[kIds], q[kIds], first id); otherwise every id to
// on_id(a, q, id). a: the logits times scale. kWithRow false: q alone (the row is not read, a is
// 0), through the stage all the same, so that its loads in flight hold no registers.
template <int kBlock, bool kWithRow = true, int kTeam = 1, typename T, typename Q, typename OnChunk, typename OnId>
__device__ __forceinline__ void for_each_row_and_q(const T* row, const Q* q, int64_t v, bool vector_ok, float scale,
                                                   void* stage, int depth, unsigned rank, OnChunk&& on_chunk,
                                                   OnId&& on_id) {
  using C = QChunk<T, Q>;
  using Unit = typename C::Unit;
  constexpr int kIds = C::kIds, kUnits = C::kUnits;
  constexpr int64_t kStride = static_cast<int64_t>(kTeam) * kBlock;
  // Where chunk c's q lands: its round slot's kUnits units, consecutive threads at consecutive
  // units (no bank conflicts). Thread t's chunks of a round are first + kStride u, u < depth.
  const uint32_t t = pass_thread();
  const int64_t first = static_cast<int64_t>(rank) * kBlock + t;
  const auto staged = [&](int64_t c) {
    return static_cast<Unit*>(stage) + static_cast<int>(c / kStride) % depth * kUnits * kBlock + t;
  };
  const int64_t whole = vector_ok ? v / kIds : 0;
  for_each_batched<kRowDepth<true>>(
      first, whole, kStride, depth,
      [&](int64_t c) {
        Unit* at = staged(c);
#pragma unroll
        for (int j = 0; j < kUnits; ++j)
          __pipeline_memcpy_async(at + j * kBlock, reinterpret_cast<const Unit*>(q) + kUnits * c + j, sizeof(Unit));
        if constexpr (kWithRow) return reinterpret_cast<const uint4*>(row)[c];
        else return 0;
      },
      [&](int64_t c, const auto& x) {
        // The round's copies, all of them at its first chunk (the later waits find none pending).
        __pipeline_commit();
        __pipeline_wait_prior(0);
        float a[kIds] = {}, qs[kIds];
        if constexpr (kWithRow) unpack<T>(x, scale, a);
        const Unit* at = staged(c);
#pragma unroll
        for (int j = 0; j < kUnits; ++j) {
          const Unit y = at[j * kBlock];
          const Q* e = reinterpret_cast<const Q*>(&y);
#pragma unroll
          for (int k = 0; k < C::kUnitIds; ++k) qs[C::kUnitIds * j + k] = to_float(e[k]);
        }
        on_chunk(a, qs, static_cast<int32_t>(kIds * c));
      });
  for (int64_t i = kIds * whole + first; i < v; i += kStride)
    on_id(kWithRow ? scaled(row, i, scale) : 0.0f, to_float(q[i]), static_cast<int32_t>(i));
}

// The residual's sum, sum_i max(e_i - coef q_i, 0) with e_i = exp(a_i - max) from the row (at
// thread 0; the block's share of the team's, kTeam): read-only, from the logits and q, nothing stored.
template <int kBlock, int kTeam = 1, typename T, typename Q>
__device__ __forceinline__ float residual_sum(const T* row, const Q* q, int64_t v, bool vector_ok, float scale,
                                              void* stage, int depth, unsigned rank, float top_log2, TreeCoef coef,
                                              const FilterCut& cut) {
  constexpr int kIds = 16 / sizeof(T);
  if (rank == 0) XK_ROW_PASS();  // a team's blocks read the row once between them
  float total = 0.0f;
  for_each_row_and_q<kBlock, true, kTeam>(
      row, q, v, vector_ok, scale, stage, depth, rank,
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

// A chunk's q summed as q's sum takes it (in fours, then the fours in order): the pass that reads q
// beside the row and the pass that reads q alone (q_sum_noting_sign) give bitwise the same sum.
template <int kIds>
__device__ __forceinline__ float q_chunk_sum(const float (&qs)[kIds]) {
  float add = 0.0f;
#pragma unroll
  for (int k = 0; k < kIds; k += 4) add += (qs[k] + qs[k + 1]) + (qs[k + 2] + qs[k + 3]);
  return add;
}

// One thread's share of a row's softmax statistics (exactly thread_row_stats's) and of q's sum, in
// one pass over both rows: q's sum, needed at a node with children, rides on the row's pass.
template <int kBlock, int kTeam = 1, typename T, typename Q>
__device__ __forceinline__ RowStats thread_row_stats_and_q_sum(const T* row, const Q* q, int64_t v, bool vector_ok,
                                                               float scale, void* stage, int depth, unsigned rank,
                                                               float& zq) {
  constexpr int kIds = 16 / sizeof(T);
  RowStats s = stats_empty();
  for_each_row_and_q<kBlock, true, kTeam>(
      row, q, v, vector_ok, scale, stage, depth, rank,
      [&](const float (&a)[kIds], const float (&qs)[kIds], int32_t id) {
        observe_chunk_in_order<false>(s, a, id);
        zq += q_chunk_sum(qs);
      },
      [&](float a, float qx, int32_t id) {
        stats_observe(s, a, id);
        zq += qx;
      });
  return s;
}

// One thread's share of q's sum from q alone, bitwise thread_row_stats_and_q_sum's (the same ids to
// the same thread, in the same order and groups), where the row's statistics pass keeps its
// candidates (row_stats_keeping_candidates: reading q beside it, or after it into registers, the
// walk spilled, sm_90a): through the q stage, as the passes that read both. negative: some q < 0,
// the one value at which an id the cut drops adds to the residual (max(0 - c q, 0) > 0), so that
// its sums cannot be taken over the kept ids alone.
template <int kBlock, int kTeam, typename T, typename Q>
__device__ __forceinline__ float q_sum_noting_sign(const Q* q, int64_t v, bool vector_ok, void* stage, int depth,
                                                   unsigned rank, bool& negative) {
  constexpr int kIds = 16 / sizeof(T);
  float zq = 0.0f;
  bool neg = false;
  for_each_row_and_q<kBlock, false, kTeam>(
      static_cast<const T*>(nullptr), q, v, vector_ok, 1.0f, stage, depth, rank,
      [&](const float (&)[kIds], const float (&qs)[kIds], int32_t) {
#pragma unroll
        for (int k = 0; k < kIds; ++k) neg |= qs[k] < 0.0f;
        zq += q_chunk_sum(qs);
      },
      [&](float, float qx, int32_t) {
        neg |= qx < 0.0f;
        zq += qx;
      });
  negative = neg;
  return zq;
}

// A filtered row's statistics pass that keeps the row's candidates (candidates.cuh): each thread's
// statistics exactly as thread_row_stats has them, the same ids in the same order (chunks t,
// t + kBlock, ..., then single ids), but in rounds of kDepth chunks a thread the whole block takes
// together, so that each warp offers the ids above its threshold to its buffer `buf` by ballot,
// ranked at the end. No histogram atomics. A round's chunks that hold such an id (rare once the
// buffers have filled) are offered after the round, loaded again (from L1, just read): an offer
// inlined a chunk of the unrolled round took ptxas minutes and spilled (sm_90a). kTeam: the
// block's share of the team's (block `rank`), its thread t reading as the team's thread
// rank kBlock + t of kTeam kBlock.
template <int kBlock, int kDepth, int kTeam = 1, typename T>
__device__ __forceinline__ RowStats row_stats_keeping_candidates(const T* row, int64_t v, bool vector_ok, float scale,
                                                                 unsigned rank, Candidate* buf, WarpCandidates& wc) {
  constexpr int kIds = 16 / sizeof(T);
  constexpr int64_t kStride = static_cast<int64_t>(kTeam) * kBlock;
  static_assert(kDepth <= 32, "a bit a chunk of the round");
  const uint32_t t = (kTeam > 1 ? rank * kBlock : 0u) + pass_thread();
  RowStats s = stats_empty();
  const int64_t whole = vector_ok ? v / kIds : 0;
  const uint4* chunks = reinterpret_cast<const uint4*>(row);
  for (int64_t c0 = 0; c0 < whole; c0 += kDepth * kStride) {
    uint4 x[kDepth];
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int64_t c = c0 + u * kStride + t;
      if (c < whole) x[u] = chunks[c];
    }
    uint32_t pending = 0;  // the round's chunks some lane of the warp offers from (the same at every lane)
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int64_t c = c0 + u * kStride + t;
      float m = kNegInf;
      if (c < whole) {
        float a[kIds];
        unpack<T>(x[u], scale, a);
        observe_chunk_in_order<false>(s, a, static_cast<int32_t>(kIds * c));
#pragma unroll
        for (int j = 0; j < kIds; ++j) m = max_nan(m, a[j]);
      }
      // most chunks hold no id above the warp's threshold: one ballot settles them
      pending |= static_cast<uint32_t>(__ballot_sync(kFullMask, m != kNegInf && order_key(m) > wc.tau) != 0) << u;
    }
    for (; pending != 0; pending &= pending - 1) {
      const int64_t c = c0 + (__ffs(static_cast<int>(pending)) - 1) * kStride + t;
      const bool live = c < whole;
      float a[kIds];
      if (live) unpack<T>(chunks[c], scale, a);
#pragma unroll
      for (int j = 0; j < kIds; ++j)
        offer(buf, wc, live ? order_key(a[j]) : 0u, static_cast<int32_t>(kIds * c + j), live && a[j] != kNegInf);
    }
  }
  for (int64_t b = kIds * whole; b < v; b += kStride) {  // a partial last chunk, or an unaligned row
    const int64_t i = b + t;
    const bool live = i < v;
    const float a = live ? scaled(row, i, scale) : kNegInf;
    if (live) stats_observe(s, a, static_cast<int32_t>(i));
    offer(buf, wc, order_key(a), static_cast<int32_t>(i), live && a != kNegInf);
  }
  warp_keep_best(buf, wc, kWarpSlots);  // ranks the buffer, drops nothing
  return s;
}

struct VisitedCut {
  FilterCut cut;
  RowStats stats;  // of the filtered row p' (at thread 0)
  bool settled;    // by the candidates: the kept ids are the ranked head's first (select_keep)
};

// The most roundings of each kind (float_sum_error's steps) a term of a warp's float sum in the
// walk passes: two a chunk (or id) its thread reads after its own, a chunk's sum, the warp's merges.
template <int kIds>
__device__ __forceinline__ int64_t walk_sum_steps(int64_t v, bool vector_ok) {
  constexpr int64_t kBlock = kFilteredVerifyThreads;
  const int64_t reads = vector_ok ? (v / kIds + kBlock - 1) / kBlock + 1 : (v + kBlock - 1) / kBlock;
  return 2 * reads + kIds + 64;
}

// The cut of a visited row (row_filter.cuh) and the filtered row's statistics: the kept ids' sum
// from the selection, or a pass where it is not known. The statistics pass kept the row's
// candidates in cs.cand (a warp a slice), and where select_cut settles the cut from them the row
// takes no other pass (top-p alone: with the row's total bounded by the warps' float sums);
// where it does not, one pass notes the top key bits (min-p alone's floor needs none) and the radix
// path runs (a team's blocks each alone, reaching the same cut). The filtered walk's
// (kFilteredVerifyThreads threads); lists: the warps' lists in cs.cand (kWalkWarps a block of the team).
template <typename T>
__device__ __forceinline__ VisitedCut cut_visited_row(WalkCutShared& cs, const T* row, int64_t v, bool vector_ok,
                                                      float scale, RowSampling rs, RowStats s, int lists) {
  const RowView<T> r{row, v, scale};
  const int mass_shift = cut_mass_shift(v);
  RowCut c;
  if (select_cut(cs.cand.select, cs.cand.sums, cs.cand.cands[0], lists, rs, v, mass_shift, &c,
                 walk_sum_steps<16 / sizeof(T)>(v, vector_ok)))
    return VisitedCut{c.cut, RowStats{s.top, fixed_sum_value(c.kept, mass_shift)}, true};
  __syncthreads();  // the selection's state is read before the radix path's overwrites it
  const TopBits bits = top_bits(rs, v);
  if (bits != TopBits::kNone) {
    clear_top_bits(cs.radix);
    __syncthreads();
    r.for_each_any_order([&](int64_t, float a) { observe_top_bits(cs.radix, a, bits); });
    __syncthreads();
  }
  unsigned long long kept;
  const FilterCut cut = filter_cut(cs.radix, r, s.top.val, rs, mass_shift, &kept);
  return VisitedCut{cut, RowStats{s.top, kept_sum(r, cut, s.top.val, kept, mass_shift)}, false};
}

// A Gumbel-max over n entries of a settled row's kept ids, each scored as tree_sample_kernel scores
// it (gumbel_score of entry e's log-weight and id, weight(e, id): -inf where it cannot be drawn; the
// same Philox words, and that kernel's groups skip only ids that cannot win), so the same token
// without a pass over the row; the row's argmax `top` where none can be drawn. The whole block; the
// token at thread 0.
template <typename Weight>
__device__ __forceinline__ int32_t draw_over_kept(int n, const RowStream& st, uint32_t node, int32_t top,
                                                  const Weight& weight) {
  const uint64_t offset = st.offset_at(node);
  const uint32_t sequence = st.sequence_at(), position = st.position_at(node);
  ArgMax best = argmax_empty();
  for (int e = threadIdx.x; e < n; e += kFilteredVerifyThreads) {
    int32_t id;
    const float w = weight(e, id);
    best = argmax_merge(best, gumbel_score(w, id, st.seed, offset, sequence, position));
  }
  best = block_merge<kFilteredVerifyThreads>(best, argmax_empty());
  return best.idx == kNoIndex ? top : best.idx;
}

// The stop node's draw where the candidates settled its cut, from p': the kept ids (the ranked
// head's prefix) but the `nrej` rejected ones; lists: select_cut's.
__device__ __forceinline__ int32_t draw_kept(WalkCandidates& wc, int lists, const FilterCut& cut,
                                             const int32_t* rejected, int32_t nrej, const RowStream& st, uint32_t node,
                                             int32_t top) {
  Candidate* kept = wc.cands[0];  // the selection has read the warps' candidates
  const int n = select_keep(wc.select, lists, cut, kept);
  __syncthreads();
  return draw_over_kept(n, st, node, top, [&](int e, int32_t& id) {
    const Candidate c = kept[e];
    bool seen = false;
    for (int32_t k = 0; k < nrej; ++k) seen |= rejected[k] == c.id;
    id = c.id;
    return seen ? kNegInf : key_value(c.key);
  });
}

// The thread that adds id i to residual_sum's total (kBlock threads, kIds ids a chunk, `whole`
// chunks read as vectors, the ids past them one by one), above i: kept_residual_sum's order.
template <int kBlock, int kIds>
__device__ __forceinline__ uint64_t residual_order(int32_t i, int64_t whole) {
  const int64_t ids = kIds * whole;
  const int64_t owner = i < ids ? i / kIds % kBlock : (i - ids) % kBlock;
  return static_cast<uint64_t>(owner) << 32 | static_cast<uint32_t>(i);
}

// The residual list of a settled row at a node with children (KeptResidual): its kept ids with e
// and q (q gathered at them: the only reads of q the residual sums and the draw then make), in
// residual_order (of the team's kTeam kBlock threads). Returns their count. The whole block, after
// the row's cut and statistics.
template <int kBlock, int kTeam, typename T, typename Q>
__device__ __forceinline__ int list_kept_residual(WalkCandidates& wc, const FilterCut& cut, const Q* q, int64_t v,
                                                  bool vector_ok, float top_log2) {
  constexpr int kIds = 16 / sizeof(T);
  Candidate* kept = wc.cands[0];
  const int n = select_keep(wc.select, kWalkWarps * kTeam, cut, kept);
  __syncthreads();
  KeptResidual* list = kept_residual_list(wc);
  int n2 = 1;
  while (n2 < n) n2 <<= 1;
  const int64_t whole = vector_ok ? v / kIds : 0;
  for (int j = threadIdx.x; j < n2; j += kBlock) {
    KeptResidual r{~0ull, 0.0f, 0.0f};  // padding: last
    if (j < n) {
      const Candidate c = kept[j];
      r = KeptResidual{residual_order<kBlock * kTeam, kIds>(c.id, whole), softmax_weight(key_value(c.key), top_log2),
                       to_float(q[c.id])};
    }
    list[j] = r;
  }
  __syncthreads();
  block_bitonic_sort(
      n2, [&](int j, int i) { return list[j].order < list[i].order; },
      [&](int i, int j) {
        const KeptResidual x = list[i];
        list[i] = list[j];
        list[j] = x;
      });
  return n;
}

// residual_sum over a settled row's kept ids alone (list_kept_residual's n), bitwise: an id the cut
// drops has e = 0 and, with no q below 0, a residual of 0, so each thread adds what it added there
// but the zeros, in the same order and groups (a chunk's ids together, each id past the chunks
// alone), and the block sums the threads' totals as there. A team's block sums every block's share
// in turn (thread t that of the team's thread r kBlock + t) and adds them in rank order, as
// team_merge does: the team's residual_sum, at thread 0.
template <int kBlock, int kTeam, int kIds>
__device__ __forceinline__ float kept_residual_sum(const KeptResidual* list, int n, int64_t v, bool vector_ok,
                                                   TreeCoef coef) {
  const int64_t ids = vector_ok ? kIds * (v / kIds) : 0;
  float team_total = 0.0f;
  for (int r = 0; r < kTeam; ++r) {
    const uint64_t owner = static_cast<uint64_t>(r) * kBlock + threadIdx.x;
    int j = 0;
    for (int hi = n; j < hi;) {  // this thread's first entry
      const int mid = (j + hi) / 2;
      if (list[mid].order < owner << 32) j = mid + 1;
      else hi = mid;
    }
    float total = 0.0f, add = 0.0f;
    int64_t group = -1;
    for (; j < n && list[j].order >> 32 == owner; ++j) {
      const int32_t id = static_cast<int32_t>(list[j].order);
      const int64_t g = id < ids ? id / kIds : -2 - static_cast<int64_t>(id);
      if (g != group) total += add, add = 0.0f, group = g;
      add += tree_residual_weight(list[j].e, list[j].q, coef);
    }
    total += add;
    if (r > 0) __syncthreads();  // block_sum's buffer is reused
    const float share = block_sum<kBlock>(total);
    team_total = r == 0 ? share : team_total + share;
  }
  return team_total;
}

// The stop node's residual draw (tree_sample_kernel's, from max(e - coef q, 0)) where the residual
// list holds the row's kept ids: elsewhere the residual is 0, no id there can be drawn.
__device__ __forceinline__ int32_t draw_kept_residual(const KeptResidual* list, int n, TreeCoef coef,
                                                      const RowStream& st, uint32_t node, int32_t top) {
  return draw_over_kept(n, st, node, top, [&](int e, int32_t& id) {
    const KeptResidual k = list[e];
    const float r = tree_residual_weight(k.e, k.q, coef);
    id = static_cast<int32_t>(k.order);
    return r > 0.0f ? log_f32(r) : kNegInf;
  });
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

// A filtered row's candidate lists of block `rank` of a team (its warps' at lists rank kWalkWarps +
// warp of wc), and whether some q it read was below 0, to its slot `out` of the pass's set of
// w.team_cands, before team_merge's barrier (the block's lists complete: block_merge's barrier).
// Whole lists, a 16-byte vector a thread (the entries past a list's count unread).
static_assert(sizeof(TeamCandidates::cands) == kFilteredVerifyThreads * sizeof(uint4), "a vector a thread");
__device__ __forceinline__ void export_candidates(const WalkCandidates& wc, unsigned rank, uint32_t q_negative,
                                                  TeamCandidates* out) {
  const int first = static_cast<int>(rank) * kWalkWarps;
  reinterpret_cast<uint4*>(out->cands)[threadIdx.x] = reinterpret_cast<const uint4*>(wc.cands[first])[threadIdx.x];
  if (threadIdx.x < kWalkWarps) out->sums[threadIdx.x] = wc.sums[first + threadIdx.x];
  if (threadIdx.x == 0) out->q_negative = q_negative;
}

// Block r's lists, after team_merge's barrier, to lists r kWalkWarps + warp of wc; its q's sign
// into q_negative (at thread 0). The block's later barriers order them before the selection.
__device__ __forceinline__ void import_candidates(const TeamCandidates* in, unsigned r, WalkCandidates& wc,
                                                  uint32_t& q_negative) {
  const int first = static_cast<int>(r) * kWalkWarps;
  reinterpret_cast<uint4*>(wc.cands[first])[threadIdx.x] = reinterpret_cast<const uint4*>(in->cands)[threadIdx.x];
  if (threadIdx.x < kWalkWarps) wc.sums[first + threadIdx.x] = in->sums[threadIdx.x];
  if (threadIdx.x == 0 && in->q_negative) q_negative = 1u;
}

// The team's merge of a pass over the row (kCluster): each block's share (`mine`, at its thread 0)
// to its slot of the sequence's `slots` (w.team), a cluster barrier, then every block merges the
// slots in rank order, so that all of them hold bitwise the same values and take the same
// decisions. The slots alternate between two sets (parity): a block that writes a set passed the
// barrier of the pass between, which every reader of that set reaches only after reading it. The
// merged values at thread 0.
template <int kTeam>
__device__ __forceinline__ TeamShare team_merge(TeamShare* slots, unsigned rank, int& parity, const TeamShare& mine) {
  TeamShare* set = slots + parity * kTeam;
  if (threadIdx.x == 0) set[rank] = mine;
  team_sync<true>();
  parity ^= 1;
  TeamShare out = mine;
  if (threadIdx.x == 0) {
    out = set[0];
    for (int r = 1; r < kTeam; ++r) out = TeamShare{stats_merge(out.stats, set[r].stats), out.sum + set[r].sum};
  }
  return out;
}

// vector_ok: rows of logits (and of q) start aligned, so whole chunks load as vectors. kDraft: p.q
// is set, of type Q (the residual passes are compiled only then). kFilter: w.cuts is set, some
// sequence may filter (the selection is compiled only then). kCluster (sm_90+): a cluster of
// kVerifyTeam blocks walks each sequence: each block reads its share of every pass over a row (the
// statistics with q's sum, the residual sums; the team's threads take the row's chunks in turn),
// team_merge gives every block the team's values, and each walks the tree as a lone block does,
// taking the same decisions; rank 0 alone writes the walk's outputs, and each block lists its
// children and rejected tokens in its own rows of w.kids and w.rejected (rank 0's those of a lone
// block, which the stop draw reads). A filtered row's candidates: each block's warps keep those of
// their chunks, hand them to the others through w.team_cands in the same barrier, and every block
// selects over all the team's lists in rank order (the same cut, kept ids and draws); where they do
// not settle the cut, each block finds it alone on the radix path (the same cut).
template <typename T, typename Q, bool kDraft, bool kFilter, bool kCluster = false>
__global__ void __launch_bounds__(kVerifyBlock<kFilter>, 1)
    tree_verify_kernel(TreeVerifyParams p, VerifyWorkspace w, bool vector_ok) {
  constexpr int kBlock = kVerifyBlock<kFilter>;
  constexpr int kTeam = kCluster ? kVerifyTeam : 1;
  constexpr int kLists = kWalkWarps * kTeam;  // a filtered row's candidate lists
  constexpr int kIds = 16 / sizeof(T);
  __shared__ NodeState sh;
  // kFilter: the selection's state (cut_smem_bytes), then the draft kernel's q stage (w.q_depth
  // chunks a thread).
  extern __shared__ __align__(16) float4 verify_smem[];
  WalkCutShared* cs = reinterpret_cast<WalkCutShared*>(verify_smem);
  void* q_stage = verify_smem + (kFilter ? cut_smem_bytes() / sizeof(float4) : 0);
  __shared__ RowStream st;  // thread 0's, kept out of the registers of the row passes
  __shared__ FilterCut visited_cut;  // the visited row's
  __shared__ uint32_t q_negative;    // some q < 0 in a row q_sum_noting_sign read
  // The block's rank in its team, read where it is used rather than held through the passes (held,
  // the filtered team walks spilled: sm_90a).
  const auto rank = [] { return team_rank<kCluster>(); };
  const int64_t n = blockIdx.x / kTeam, m = p.m, v = p.v;
  const int64_t count = node_count(p.num_nodes, n, m);
  const int64_t* tokens = p.tokens + n * m;
  const int64_t* parents = p.parents + n * m;
  // The block's rows of w.kids and w.rejected, computed where used too (held, the filtered team
  // walks with 16-bit draft_probs spilled).
  const auto kids = [&] { return w.kids + (rank() * p.n + n) * m; };
  const auto rejected = [&] { return w.rejected + (rank() * p.n + n) * m; };
  int parity = 0;  // team_merge's
  if (threadIdx.x == 0) st = p.s.stream(n);
  const RowSampling rs = p.s.row(n);
  const float inv_t = rs.inv_t;
  const bool greedy = inv_t == 0.0f;  // a greedy row of the draft kernel reads no q
  const float scale = greedy ? 1.0f : inv_t;
  // The same for the whole block. Its cuts are selected from the candidates the statistics pass
  // keeps (cut_visited_row; top-p alone with the row's total bounded by the pass's float sum).
  const bool filtering = kFilter && !greedy && filters_active(rs, v);
  int64_t node = 0, acc = 0;
  for (;;) {
    const T* row = static_cast<const T*>(p.logits) + (n * m + node) * v;
    if (kDraft) {
      // The children first (they depend on the parents alone): q's sum is needed only at a node
      // with children, and then rides on the row's pass (or follows it, q_sum_noting_sign).
      if (threadIdx.x == 0) sh.q = static_cast<const Q*>(p.q) + (n * m + node) * v, q_negative = 0;
      if (threadIdx.x < 32) list_children(sh, parents, node, count, kids());
      __syncthreads();
    }
    const bool with_q = kDraft && !greedy && sh.kids > 0;  // read before block_merge's barrier, then rewritten
    // One block reads the row, 128 KB in flight (64 KB with draft_probs, and 128 KB of q beside it
    // at a node with children; half of each in a filtered walk's 256 threads, and 40 KB there
    // without draft_probs, 32 KB with them where the pass keeps candidates, kWalkDepth, and q then
    // read after it, q_sum_noting_sign): 64 blocks then keep 2-12 MB in flight, about HBM's
    // bandwidth times its latency or more. kCluster: two blocks on two SMs read it, twice that.
    const int64_t chunks = (v + kIds - 1) / kIds;
    float zq = 0.0f;
    RowStats s;
    if (kFilter && filtering) {
      WarpCandidates wc;
      const int list = (kTeam > 1 ? rank() * kWalkWarps : 0) + threadIdx.x / 32;  // the warp's, in the team's
      constexpr int kDepth = kWalkDepth<kDraft, kFilter, kCluster>;
      s = row_stats_keeping_candidates<kBlock, kDepth, kTeam>(row, v, vector_ok, scale, rank(), cs->cand.cands[list],
                                                              wc);
      // the warp's float sum, which bounds the row's total for top-p alone (select_cut's float_steps)
      const RowStats ws = warp_merge(s);
      if (threadIdx.x % 32 == 0) {
        const double mass = ws.sum;
        cs->cand.sums[list] = SliceSummary{ws.top, mass, static_cast<double>(ws.top.val) * mass, wc.tau, wc.count};
      }
      if constexpr (kDraft) {
        if (with_q) {
          bool negative;
          zq = q_sum_noting_sign<kBlock, kTeam, T>(static_cast<const Q*>(sh.q), v, vector_ok, q_stage, w.q_depth,
                                                   rank(), negative);
          if (negative) atomicOr(&q_negative, 1u);  // read after block_merge's barriers
        }
      }
    } else {
      constexpr int kDepth = kWalkDepth<kDraft, kFilter, kCluster>;
      const int64_t first = rank() * kBlock + pass_thread(), stride = kTeam * kBlock;  // the team's threads in turn
      s = greedy ? thread_row_stats<T, true, kDepth>(row, v, 0, chunks, vector_ok, 1.0f, -1, first, stride)
          : with_q ? thread_row_stats_and_q_sum<kBlock, kTeam>(row, static_cast<const Q*>(sh.q), v, vector_ok, scale,
                                                               q_stage, w.q_depth, rank(), zq)
                   : thread_row_stats<T, false, kDepth>(row, v, 0, chunks, vector_ok, scale, -1, first, stride);
    }
    s = block_merge<kBlock>(s, stats_empty());
    if (with_q) zq = block_sum<kBlock>(zq);  // block_merge's buffer is another: no barrier between
    if constexpr (kCluster) {
      const int64_t set = (n * 2 + parity) * kTeam;  // team_merge's set of this pass, in w.team_cands too
      if (kFilter && filtering) export_candidates(cs->cand, rank(), q_negative, w.team_cands + set + rank());
      const TeamShare team = team_merge<kTeam>(w.team + n * 2 * kTeam, rank(), parity, TeamShare{s, zq});
      s = team.stats, zq = team.sum;
      if (kFilter && filtering) {
        for (unsigned r = 0; r < kTeam; ++r)
          if (r != rank()) import_candidates(w.team_cands + set + r, r, cs->cand, q_negative);
      }
    }
    bool settled = false;  // the candidates settled the row's cut
    if constexpr (kFilter) {  // the row's cut, and p' = its filtered row's statistics
      if (threadIdx.x == 0) {
        sh.stats = s;
        visited_cut = keep_all();
      }
      __syncthreads();
      if (filtering && !stats_degenerate(sh.stats)) {
        const VisitedCut c = cut_visited_row(*cs, row, v, vector_ok, scale, rs, sh.stats, kLists);
        if (threadIdx.x == 0) s = c.stats, visited_cut = c.cut;
        settled = c.settled;
      }
      if (threadIdx.x == 0 && rank() == 0) w.cuts[n * m + node] = visited_cut;  // for the draw at the stop node
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
    // A settled row at a node with children takes its residual sums and draw over its kept ids alone
    // (kept_residual_sum), where no q is below 0 (else the ids the cut drops add to them): listed
    // once the first of them is needed (after a rejection; most walks accept the first child).
    bool by_kept = false;
    if constexpr (kFilter && kDraft) by_kept = settled && with_q && q_negative == 0;
    int kept_n = 0;
    const auto kept_list = [&] {  // the whole block
      if (kept_n == 0)
        kept_n = list_kept_residual<kBlock, kTeam, T>(cs->cand, cut, static_cast<const Q*>(sh.q), v, vector_ok,
                                                      top_log2);
      return kept_residual_list(cs->cand);
    };
    if (point_mass || !kDraft) {
      if (threadIdx.x < 32)
        test_children(sh, s, point_mass, row, scale, cut, tokens, parents, node, count, v, rejected(), st);
      __syncthreads();
    }
    if (kDraft && !point_mass && sh.kids > 0) {
      // The residual in closed form (xkernels/tree.h's TreeResidual): thread 0 tests the children
      // in order; before a test that follows a rejection, the block sums the residual over the row.
      bool stale = false;  // thread 0's: res.sum is that of an earlier coef
      for (int32_t i = 0; i < sh.kids; ++i) {
        __syncthreads();
        if (threadIdx.x == 0) {
          const int64_t x = tokens[kids()[i]];
          sh.x = x >= 0 && x < v ? static_cast<int32_t>(x) : -1;
          sh.pass = sh.x >= 0 && stale;
        }
        __syncthreads();
        if (sh.x < 0) continue;  // a token outside [0, V): never accepted, no residual step
        if (sh.pass) {
          const TreeCoef coef = tree_coef(sh.res.coef);
          float total;
          if (by_kept) {
            const KeptResidual* list = kept_list();
            total = kept_residual_sum<kBlock, kTeam, kIds>(list, kept_n, v, vector_ok, coef);
          } else {
            total = residual_sum<kBlock, kTeam>(row, static_cast<const Q*>(sh.q), v, vector_ok, scale, q_stage,
                                                w.q_depth, rank(), top_log2, coef, cut);
            if constexpr (kCluster)
              total = team_merge<kTeam>(w.team + n * 2 * kTeam, rank(), parity, TeamShare{stats_empty(), total}).sum;
          }
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
          for (int32_t k = 0; k < sh.rejected; ++k) repeated |= rejected()[k] == x;
          const float q_x = to_float(static_cast<const Q*>(sh.q)[x]);
          const float e_x = softmax_weight(kept(cut, scaled(row, x, scale), x), top_log2);
          if (tree_residual_accepts(sh.res, st.coin(static_cast<uint32_t>(kids()[i])), e_x, q_x, repeated)) {
            sh.chosen = kids()[i];
          } else {
            tree_residual_reject(sh.res, q_x, p.without_replacement && !repeated);
            if (!repeated) rejected()[sh.rejected++] = x;
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
      const bool draw = !point_mass && !sh.empty;
      const bool residual = kDraft && sh.rejected > 0;
      const ArgMax top = sh.stats.top;
      // A cut the candidates settled draws here, from its kept ids: from p' without the rejected
      // tokens, or from the residual where its list holds the kept ids.
      const bool here = settled && draw && (!residual || by_kept);
      int32_t token = top.idx;  // the row's argmax, unless a draw finds another
      if (kFilter && here) {
        const uint32_t at = static_cast<uint32_t>(node);
        if (residual) {
          const KeptResidual* list = kept_list();
          token = draw_kept_residual(list, kept_n, tree_coef(sh.res.coef), st, at, top.idx);
        } else {
          token = draw_kept(cs->cand, kLists, cut, rejected(), sh.rejected, st, at, top.idx);
        }
      }
      if (threadIdx.x == 0 && rank() == 0) {
        p.out_tokens[n * m + acc] = token;
        p.accept_len[n] = acc;
        w.jobs[n] = StopJob{draw && !here ? static_cast<int32_t>(node) : -1, static_cast<int32_t>(acc),
                            residual ? 0 : sh.rejected, residual, top.idx, top.val * kLog2e, scale,
                            tree_coef(sh.res.coef)};
      }
      break;
    }
    if (threadIdx.x == 0 && rank() == 0) {
      p.out_tokens[n * m + acc] = tokens[chosen];
      p.path[n * m + acc + 1] = chosen;
    }
    ++acc;
    node = chosen;
    __syncthreads();  // sh and the shared reduction buffers are reused for the next node
  }
  if (rank() != 0) return;  // the walk's outputs are rank 0's
  for (int64_t j = threadIdx.x; j < m; j += kBlock) {
    if (j == 0) p.path[n * m] = 0;
    if (j > acc) p.path[n * m + j] = -1;
    if (j > acc) p.out_tokens[n * m + j] = -1;
  }
}

// Whether the current device runs the walk's clusters: an sm_90+ image of the kernel and room for a
// cluster of it (with smem bytes of dynamic shared memory), asked once a device (a failed query,
// not kept, reads as no: a block a sequence).
template <typename T, typename Q, bool kDraft, bool kFilter>
bool verify_walk_clusters(size_t smem) {
  static PerDevice at_once;
  return at_once.get([smem] {
    cudaLaunchAttribute cluster{};
    const cudaLaunchConfig_t config =
        cluster_config(kVerifyTeam, kVerifyBlock<kFilter>, smem, nullptr, kVerifyTeam, &cluster);
    int count = 0;
    if (!has_cluster_image(tree_verify_kernel<T, Q, kDraft, kFilter, true>) ||
        cudaOccupancyMaxActiveClusters(&count, tree_verify_kernel<T, Q, kDraft, kFilter, true>, &config) !=
            cudaSuccess) {
      (void)cudaGetLastError();  // a query's failure is no launch error
      return PerDevice::Result{0, false};
    }
    return PerDevice::Result{count, true};
  }) > 0;
}

// The walk as a cluster of kVerifyTeam blocks a sequence, where the binding asks for it (w.team; a
// filtered walk's lists too) and the device runs it: whether it launched, its error in *err. The
// filtered walks' are compiled in files of their own (tree_filtered_team_verify_<type>_kernel.cu;
// the lone walks' files declare them extern: XK_TREE_TEAM_WALK_ELSEWHERE), the others with the
// lone walks.
template <typename T, typename Q, bool kDraft, bool kFilter>
bool launch_team_walk(const TreeVerifyParams& p, const VerifyWorkspace& w, bool vector_ok, size_t smem,
                      cudaStream_t stream, cudaError_t* err) {
  if (!w.team || (kFilter && !w.team_cands) || p.n > 0x7FFFFFFF / kVerifyTeam) return false;
  if (kDraft) {  // above 48 KB of dynamic shared memory a kernel must opt in: once a device
    static PerDevice opted_in;
    *err = opt_in_max_dynamic_smem(opted_in, tree_verify_kernel<T, Q, kDraft, kFilter, true>);
    if (*err != cudaSuccess) return true;
  }
  if (!verify_walk_clusters<T, Q, kDraft, kFilter>(smem)) return false;
  cudaLaunchAttribute cluster{};
  const cudaLaunchConfig_t config = cluster_config(static_cast<unsigned>(p.n * kVerifyTeam), kVerifyBlock<kFilter>,
                                                   smem, stream, kVerifyTeam, &cluster);
  *err = cudaLaunchKernelEx(&config, tree_verify_kernel<T, Q, kDraft, kFilter, true>, p, w, vector_ok);
  return true;
}

// The walk's launch: dynamic shared memory for the cut's state (kFilter) and the q stage (kDraft);
// a cluster a sequence where launch_team_walk runs one, else a block a sequence.
template <typename T, typename Q, bool kDraft, bool kFilter>
cudaError_t launch_verify_walk(const TreeVerifyParams& p, const VerifyWorkspace& w, bool vector_ok,
                               cudaStream_t stream) {
  constexpr int kBlock = kVerifyBlock<kFilter>;
  const size_t stage = kDraft ? sizeof(Q) * (16 / sizeof(T)) * kBlock * w.q_depth : 0;
  const size_t smem = (kFilter ? cut_smem_bytes() : 0) + stage;
  cudaError_t err = cudaSuccess;
  if (kDraft) {  // above 48 KB of dynamic shared memory a kernel must opt in: once a device
    static PerDevice opted_in;
    err = opt_in_max_dynamic_smem(opted_in, tree_verify_kernel<T, Q, kDraft, kFilter>);
    if (err != cudaSuccess) return err;
  }
  if (launch_team_walk<T, Q, kDraft, kFilter>(p, w, vector_ok, smem, stream, &err)) return err;
  tree_verify_kernel<T, Q, kDraft, kFilter><<<p.n, kBlock, smem, stream>>>(p, w, vector_ok);
  return cudaGetLastError();
}

}  // namespace xkernels::cuda

// An explicit instantiation of the walk's launch (in the files that compile the walks).
#define XK_TREE_VERIFY_WALK(T, Q, kDraft, kFilter)                \
  template cudaError_t xkernels::cuda::launch_verify_walk<T, Q, kDraft, kFilter>( \
      const xkernels::cuda::TreeVerifyParams&, const xkernels::cuda::VerifyWorkspace&, bool, cudaStream_t);
// The filtered walk's team launch: compiled in a file of its own (XK_TREE_TEAM_WALK), declared so
// where its lone walk is (XK_TREE_TEAM_WALK_ELSEWHERE), so that no translation unit compiles both.
#define XK_TREE_TEAM_WALK(T, Q, kDraft)                                                                    \
  template bool xkernels::cuda::launch_team_walk<T, Q, kDraft, true>(                                     \
      const xkernels::cuda::TreeVerifyParams&, const xkernels::cuda::VerifyWorkspace&, bool, size_t, cudaStream_t, \
      cudaError_t*);
#define XK_TREE_TEAM_WALK_ELSEWHERE(T, Q, kDraft) extern XK_TREE_TEAM_WALK(T, Q, kDraft)
