// What the files of the Spiffy CUDA kernels share (spiffy_kernel.cu's split, so that no
// translation unit compiles for long): the masked rows' reduction of materialize's first pass, and
// the accept walk and its prepare kernel, whose templates are instantiated unfiltered in
// spiffy_accept_kernel.cu and filtered in spiffy_filtered_accept_[prepare_|cluster_]<type>_kernel.cu
// (each combination in one file only).
#pragma once

#include <type_traits>

#include "candidates.cuh"
#include "cluster_team.cuh"
#include "device_utils.cuh"
#include "dllm_candidates.cuh"
#include "dllm_row.cuh"
#include "spiffy_launch.h"

namespace xkernels::cuda {

// The warp's merge of each lane's top tokens: kSpiffyMaxRank rounds of a warp argmax over the
// lanes' next candidates; the winning lane moves to its next one. Every lane returns the result.
__device__ inline TopTokens warp_merge_top(const TopTokens& mine) {
  TopTokens out;
  top_clear(out);
  int cursor = 0;
#pragma unroll
  for (int j = 0; j < kSpiffyMaxRank; ++j) {
    float v = kNegInf;
    int32_t i = kNoIndex;
#pragma unroll
    for (int c = 0; c < kSpiffyMaxRank; ++c)
      if (c == cursor) v = mine.val[c], i = mine.idx[c];
    const ArgMax best = warp_merge(ArgMax{v, i});
    out.val[j] = best.val, out.idx[j] = best.idx;
    if (best.idx == i && i != kNoIndex) ++cursor;
  }
  return out;
}

// One slice of a masked row, as spiffy_rows_kernel leaves it for the materialize kernel.
struct RowSlice {
  RowStats raw;      // of the raw logits (the mask token at -inf)
  float scaled_sum;  // sum of exp((a - raw.top.val) * scale) over the slice
  TopTokens top;
};

// scaled_sum taken from max `from` to max `to` (to >= from); a slice of -inf adds nothing.
__device__ __forceinline__ float scaled_sum_to(float sum, float from, float to, float scale) {
  return from == kNegInf ? 0.0f : sum * exp_f32((from - to) * scale);
}

// The order of argmax_before over values as one key: larger for a value that goes first, every NaN
// above +inf, -0 equal to +0 (ties then go to the lower id); 0 is below every value (no id).
__device__ __forceinline__ uint32_t top_value_key(float a) {
  if (is_nan_f32(a)) return 0xFFFFFFFFu;
  return order_key(a == 0.0f ? 0.0f : a);
}

// The kSpiffyMaxRank largest of the warp's keys, two a lane (repeats count): lane j <
// kSpiffyMaxRank gets the (j + 1)-th, 0 past the keys the warp holds. A round takes one
// occurrence of the warp's max out (the lowest lane's a, else its b): a REDUX and two ballots.
__device__ __forceinline__ uint32_t warp_largest_keys(uint32_t a, uint32_t b) {
  const int lane = threadIdx.x % 32;
  uint32_t mine = 0;
#pragma unroll
  for (int j = 0; j < kSpiffyMaxRank; ++j) {
    const uint32_t m = __reduce_max_sync(kFullMask, a > b ? a : b);
    const unsigned in_a = __ballot_sync(kFullMask, a == m), in_b = __ballot_sync(kFullMask, b == m);
    if (in_a != 0u) {
      if (lane == __ffs(static_cast<int>(in_a)) - 1) a = 0;
    } else if (lane == __ffs(static_cast<int>(in_b)) - 1) {
      b = 0;
    }
    if (lane == j) mine = m;
  }
  return mine;
}

// A value and id that may be among a slice's top tokens.
struct TopCandidate {
  float val;
  int32_t idx;
};
constexpr int kTopCandidates = 128;  // past this many, the slice's top tokens come by insertion

// The order of argmax_before as one 64-bit key (unique: the id breaks ties, lower first).
__device__ __forceinline__ uint64_t candidate_key(const TopCandidate& c) {
  return static_cast<uint64_t>(top_value_key(c.val)) << 32 | (0xFFFFFFFFu - static_cast<uint32_t>(c.idx));
}

// A thread's top tokens of its chunks of `range` (values as reduce_row_slice reads them), by
// insertion: reduce_row_slice's exact fallback for a slice whose candidate list overflows.
template <typename T, int kDepth>
__device__ __forceinline__ TopTokens thread_top_by_insertion(const T* src, int64_t v, SliceRange range, int64_t mask,
                                                             bool vector_ok) {
  constexpr int kIds = 16 / sizeof(T);
  TopTokens top;
  top_clear(top);
  for_each_row_value<T, kDepth>(
      src, v, range.begin, range.end, vector_ok, 1.0f, mask, threadIdx.x, kThreads,
      [&](const float (&a)[kIds], int32_t id) {
        float m = a[0];
#pragma unroll
        for (int j = 1; j < kIds; ++j) m = max_nan(m, a[j]);
        // Ids rise, so a chunk whose best loses to the eighth kept token has nothing to insert.
        const int last = kSpiffyMaxRank - 1;
        if (top.idx[last] == kNoIndex || (!(m <= top.val[last]) && !is_nan_f32(top.val[last]))) {
#pragma unroll
          for (int j = 0; j < kIds; ++j) top_observe(top, a[j], id + j);
        }
      },
      [&](float a, int32_t id) { top_observe(top, a, id); });
  return top;
}

// The merge of every thread's top tokens, at thread 0: each warp's, then warp 0 over the warps'.
__device__ __forceinline__ TopTokens block_merge_top(TopTokens top) {
  __shared__ TopTokens warp_tops[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  top = warp_merge_top(top);
  if (lane == 0) warp_tops[warp] = top;
  __syncthreads();
  if (warp == 0) {
    if (lane < kWarps)
      top = warp_tops[lane];
    else
      top_clear(top);
    top = warp_merge_top(top);
  }
  __syncthreads();  // warp_tops is reused by a next call
  return top;
}

// The top tokens of a slice, at thread 0, from each thread's best value key `best` (0: it read no
// id). The kSpiffyMaxRank-th largest best of the block bounds the slice's kSpiffyMaxRank-th token
// from below (that many threads each hold a value at least as large), so only the threads whose
// best reaches the bound (a few on a real row) read their chunks again, just read (L1/L2), and
// append the ids at or above it to a shared list, ranked once. A list past kTopCandidates (a run of
// ties at the bound: a flat row) falls back to insertion over the slice, read again. The per-id
// insertion it replaces ran on nearly every chunk and made the pass instruction-bound.
template <typename T, int kDepth>
__device__ __forceinline__ TopTokens slice_top_tokens(const T* src, int64_t v, SliceRange range, int64_t mask,
                                                      bool vector_ok, uint32_t best) {
  constexpr int kIds = 16 / sizeof(T);
  static_assert(kWarps * kSpiffyMaxRank == 64, "warp 0 takes the warps' largest keys two a lane");
  __shared__ uint32_t warp_keys[kWarps * kSpiffyMaxRank];
  __shared__ TopCandidate candidates[kTopCandidates];
  __shared__ int count;
  __shared__ uint32_t bound;
  __shared__ TopTokens top;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t largest = warp_largest_keys(best, 0u);
  if (lane < kSpiffyMaxRank) warp_keys[warp * kSpiffyMaxRank + lane] = largest;
  if (threadIdx.x == 0) count = 0, top_clear(top);
  __syncthreads();
  if (warp == 0) {
    const uint32_t b = warp_largest_keys(warp_keys[lane], warp_keys[lane + 32]);
    if (lane == kSpiffyMaxRank - 1) bound = b;
  }
  __syncthreads();
  const uint32_t at_least = bound;
  const auto push = [&](float a, int32_t id) {
    const int at = atomicAdd(&count, 1);
    if (at < kTopCandidates) candidates[at] = TopCandidate{a, id};
  };
  if (best != 0u && best >= at_least) {
    for_each_row_value<T, kDepth>(
        src, v, range.begin, range.end, vector_ok, 1.0f, mask, threadIdx.x, kThreads,
        [&](const float (&a)[kIds], int32_t id) {
          float m = a[0];
#pragma unroll
          for (int j = 1; j < kIds; ++j) m = max_nan(m, a[j]);
          if (top_value_key(m) < at_least) return;
#pragma unroll
          for (int j = 0; j < kIds; ++j)
            if (top_value_key(a[j]) >= at_least) push(a[j], id + j);
        },
        [&](float a, int32_t id) {
          if (top_value_key(a) >= at_least) push(a, id);
        });
  }
  __syncthreads();
  const int found = count;
  if (found > kTopCandidates) {  // the same for the whole block
    if (range.begin == 0) XK_ROW_PASS();  // the emulation counts the re-read where the row's first slice re-reads
    return block_merge_top(thread_top_by_insertion<T, kDepth>(src, v, range, mask, vector_ok));
  }
  if (static_cast<int>(threadIdx.x) < found) {
    const TopCandidate c = candidates[threadIdx.x];
    const uint64_t key = candidate_key(c);
    int rank = 0;
    for (int u = 0; u < found; ++u) rank += candidate_key(candidates[u]) > key;
    if (rank < kSpiffyMaxRank) top.val[rank] = c.val, top.idx[rank] = c.idx;
  }
  __syncthreads();
  const TopTokens result = top;
  __syncthreads();  // the shared state is reused by a next call
  return result;
}

// A block's reduction of chunks `range` of masked row `src` (every thread's ids first, first +
// kThreads, ...): the raw statistics (at every thread), and, at thread 0, the slice's tempered sum
// at kScaled and its top tokens (slice_top_tokens); observe(a, id) sees each raw value read.
template <typename T, bool kScaled, int kDepth, typename Observe>
__device__ __forceinline__ RowSlice reduce_row_slice(const T* src, int64_t v, SliceRange range, int64_t mask,
                                                     float scale, bool vector_ok, const Observe& observe) {
  constexpr int kIds = 16 / sizeof(T);
  const float scale_log2e = scale * kLog2e;
  RowStats raw = stats_empty();
  float scaled = 0.0f;
  for_each_row_value<T, kDepth>(
      src, v, range.begin, range.end, vector_ok, 1.0f, mask, threadIdx.x, kThreads,
      [&](const float (&a)[kIds], int32_t id) {
        const float before = raw.top.val;
        observe_chunk_in_order<false>(raw, a, id);
#pragma unroll
        for (int j = 0; j < kIds; ++j) observe(a[j], id + j);
        if constexpr (kScaled) {
          if (raw.top.val != before) scaled = scaled_sum_to(scaled, before, raw.top.val, scale);
          const float off = raw.top.val == kNegInf ? 0.0f : raw.top.val * scale_log2e;
          float add = 0.0f;
#pragma unroll
          for (int j = 0; j < kIds; ++j) add += exp2f(fmaf(a[j], scale_log2e, -off));
          scaled += add;
        }
      },
      [&](float a, int32_t id) {
        const float before = raw.top.val;
        stats_observe(raw, a, id);
        observe(a, id);
        if constexpr (kScaled) {
          if (raw.top.val != before) scaled = scaled_sum_to(scaled, before, raw.top.val, scale);
          if (a != kNegInf) scaled += exp_f32((a - raw.top.val) * scale);
        }
      });
  const uint32_t best = raw.top.idx == kNoIndex ? 0u : top_value_key(raw.top.val);
  const RowStats merged = block_merge_all(raw, stats_empty());
  if constexpr (kScaled) scaled = block_sum(scaled_sum_to(scaled, raw.top.val, merged.top.val, scale));
  const TopTokens top = slice_top_tokens<T, kDepth>(src, v, range, mask, vector_ok, best);
  return RowSlice{merged, kScaled ? scaled : merged.sum, top};
}

// Whether masked row `row` filters (its sequence sampled with some filter active): its cut comes
// from spiffy_filtered.cuh's launches; the same for a whole block.
__device__ __forceinline__ bool filtered_row(const SpiffyMaterializeParams& p, int64_t row) {
  if (!p.filtered || p.block[row] != p.mask_id) return false;
  const RowSampling rs = p.s.row(row / p.l);
  return rs.inv_t != 0.0f && filters_active(rs, p.v);
}

// What the blocks walking one sequence share between steps, in the workspace (the team's barrier
// orders it): written by the leader (warp 0 of block 0), read by every thread after the barrier.
// Two a sequence, step s's plan in the (s % 2)-th: a step whose rows were prepared has no barrier
// before the leader plans the next, so a block may still be reading this step's plan then.
struct AcceptWalk {
  int64_t cur;    // the kept draft the walk stands on; -1: the root
  int64_t count;  // the masked rows of the next step, listed in AcceptWorkspace::rows
  int64_t done;
};

struct AcceptWorkspace {
  float* conf;      // [n, k + 1, l], each node's (the root, then the drafts) confidence of each masked row
  int64_t* x0;      // [n, k + 1, l], its pick
  uint8_t* chosen;  // [n, l], dllm_select's scratch
  int64_t* rows;    // [n, l], the masked rows of the step, ascending
  AcceptWalk* walk;  // [n, 2]
  bool drafts = false;  // the prepare kernel picks the kept drafts' rows too (accept_prepared_step)
  // The prepared rows' candidate pipeline (spiffy_filtered.cuh), [n, nodes, l] as the prepare
  // kernel's rows (nodes: k + 1 with drafts, else 1); settled null where it does not run.
  SliceSummary* sums = nullptr;  // [rows]
  Candidate* cands = nullptr;    // [rows, kSliceKeep]
  RowStats* raw = nullptr;       // [rows]
  int32_t* settled = nullptr;    // [rows]
};

// The masked positions of tokens[0, l), at every lane of the (full) warp.
__device__ inline int64_t warp_count_masked(const int64_t* tokens, int64_t l, int64_t mask_id) {
  int64_t count = 0;
  for (int64_t base = 0; base < l; base += 32) {
    const int64_t p = base + threadIdx.x % 32;
    count += __popc(__ballot_sync(kFullMask, p < l && tokens[p] == mask_id));
  }
  return count;
}

// The step at which the walk stands on a node with `count` masked rows when `masked0` rows of the
// root are masked, where the rule fixes it: 0 at the root; without a threshold each step commits
// num_unmask tokens (fewer only at a last step, which leaves none masked), so a node is reached
// after (masked0 - count) / num_unmask steps or never. -1 where the rule does not fix it (a
// threshold commits a data-dependent number) or the drafts are not prepared (drafts false).
// spiffy_accept_prepare_kernel picks each node's rows at that step; the walk picks a step's rows
// itself only where it is not that step.
__device__ __forceinline__ int64_t accept_prepared_step(const DllmRule& rule, bool drafts, int64_t masked0,
                                                        int64_t count) {
  if (count == masked0) return 0;
  if (!drafts || rule.use_threshold || rule.num_unmask <= 0 || count > masked0 || (masked0 - count) % rule.num_unmask != 0)
    return -1;
  return (masked0 - count) / rule.num_unmask;
}

// The shared memory of a row's pick where the kernel may filter: the cut's, or with the candidate
// pipeline (kCandidates) its three steps'.
template <bool kFilter, bool kCandidates>
using AcceptShared = std::conditional_t<kFilter, std::conditional_t<kCandidates, BlockPickShared, CutShared>, char>;

// The pick of masked row q of a node's logits `node` at a step's stream st, by a block (the same
// token and confidence whichever way; at thread 0): the prepare kernel's by dllm_filtered_pick
// where it may filter (its rows that filter went through the pipeline before it), the walk's
// (kCandidates) through the candidate pipeline on the block (dllm_block_filtered_pick: one read of a
// filtered row its candidates settle, unless p.radix_only).
template <typename T, bool kFilter, bool kCandidates = false>
__device__ __forceinline__ DllmPick accept_row_pick(AcceptShared<kFilter, kCandidates>& sh,
                                                    const SpiffyAcceptParams& p, const T* node, int64_t q,
                                                    const RowSampling& rs, int mass_shift, const RowStream& st,
                                                    bool vector_ok) {
  const auto slot = static_cast<uint32_t>(q);
  const T* src = node + q * p.v;
  if constexpr (kFilter && kCandidates)
    return dllm_block_filtered_pick<7>(sh, src, p.v, p.rule.mask_id, rs, mass_shift, st.seed, st.offset_at(slot),
                                       st.sequence_at(), st.position_at(slot), vector_ok, !p.radix_only);
  else if constexpr (kFilter)
    return dllm_filtered_pick<8>(sh, src, p.v, p.rule.mask_id, rs, mass_shift, st.seed, st.offset_at(slot),
                                 st.sequence_at(), st.position_at(slot), vector_ok);
  else
    return dllm_row_pick(src, p.v, p.rule.mask_id, rs.inv_t, keep_all(), st.seed, st.offset_at(slot),
                         st.sequence_at(), st.position_at(slot), vector_ok, threadIdx.x, kThreads,
                         [](auto s, auto empty) { return block_merge_all(s, empty); });
}

// The logits of node c of sequence n (0: the root, d + 1: draft d).
template <typename T>
__device__ __forceinline__ const T* accept_node_logits(const SpiffyAcceptParams& p, int64_t n, int64_t c) {
  return c == 0 ? static_cast<const T*>(p.root_logits) + n * p.l * p.v
                : static_cast<const T*>(p.draft_logits) + (n * p.k + c - 1) * p.l * p.v;
}

// Row r of the prepare kernels' [n, nodes, l] order: its sequence, node (0: the root, d + 1: draft
// d), position and slot of ws.x0 and ws.conf.
struct AcceptRow {
  int64_t n, c, q, slot;
};

__device__ __forceinline__ AcceptRow accept_row(const SpiffyAcceptParams& p, const AcceptWorkspace& ws, int64_t r) {
  const int64_t nodes = ws.drafts ? p.k + 1 : 1;
  const int64_t q = r % p.l, c = r / p.l % nodes, n = r / (p.l * nodes);
  return AcceptRow{n, c, q, (n * (p.k + 1) + c) * p.l + q};
}

// The step at which the prepare kernels pick row a, at every thread of the block (warp 0 counts the
// masked rows; two barriers), or -1 where they do not: the row is not masked, its draft is not
// kept, or the rule does not fix the node's step (accept_prepared_step). The same for the whole block.
__device__ inline int64_t prepared_row_step(const SpiffyAcceptParams& p, const AcceptWorkspace& ws, AcceptRow a) {
  __shared__ int64_t step;
  const int64_t* root = p.new_block + a.n * p.l;  // the block: the walk has not started
  const int64_t* tokens = a.c == 0 ? root : p.drafts + (a.n * p.k + a.c - 1) * p.l;
  if (tokens[a.q] != p.rule.mask_id || (a.c > 0 && p.node_ids[a.n * p.k + a.c - 1] < 0)) return -1;
  if (threadIdx.x < 32) {
    const int64_t masked0 = warp_count_masked(root, p.l, p.rule.mask_id);
    const int64_t count = a.c == 0 ? masked0 : warp_count_masked(tokens, p.l, p.rule.mask_id);
    const int64_t s = accept_prepared_step(p.rule, ws.drafts, masked0, count);
    if (threadIdx.x == 0) step = a.c == 0 || s > 0 ? s : -1;  // a draft is never the walk's step 0
  }
  __syncthreads();
  const int64_t s = step;
  __syncthreads();  // step is reused by a next row
  return s;
}

// Every (sequence, node, row) a block, before the walk: the masked rows of the root, and with
// ws.drafts of each kept draft where the rule fixes the step the walk would reach it at
// (accept_prepared_step), are picked at that step's stream into the node's slots of ws.x0 and
// ws.conf. All rows at once over the whole GPU, where the walk's team reads a step's rows a few
// blocks at a time; a draft the walk never reaches is read for nothing (spiffy_accept_kernel.cu
// asks for the drafts only where the walk's teams leave most of the GPU idle). A row the candidate
// pipeline settled (ws.settled, kFilter) is skipped: spiffy_filtered.cuh's pick kernel wrote it.
template <typename T, bool kFilter>
__global__ void __launch_bounds__(kThreads, 1) spiffy_accept_prepare_kernel(SpiffyAcceptParams p, AcceptWorkspace ws,
                                                                          bool vector_ok) {
  __shared__ AcceptShared<kFilter, false> sh;
  const int64_t rows = p.n * (ws.drafts ? p.k + 1 : 1) * p.l;
  const int mass_shift = cut_mass_shift(p.v);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // the same for the whole block
    if (kFilter && ws.settled != nullptr && ws.settled[r]) continue;
    const AcceptRow a = accept_row(p, ws, r);
    const int64_t s = prepared_row_step(p, ws, a);
    if (s < 0) continue;
    const RowSampling rs = p.rule.s.row(a.n);
    const RowStream st = dllm_step_stream(p.rule.s.stream(a.n), s, p.l);
    const DllmPick pick = accept_row_pick<T, kFilter>(sh, p, accept_node_logits<T>(p, a.n, a.c), a.q, rs, mass_shift,
                                                      st, vector_ok);
    if (threadIdx.x == 0) ws.x0[a.slot] = pick.token, ws.conf[a.slot] = pick.confidence;
  }
}

// The leader's work, on warp 0 of the team's block 0 (every lane of it calls each, gets the same
// results): positions over the lanes, where a thread did all of it in turn, a load at a time.

// The plan of the next step: lists the masked rows of state, ascending; the walk stops when none is
// left or when committing them all would overflow the outputs (only a row without a softmax can
// pick the mask token).
__device__ inline void warp_accept_plan(const int64_t* state, int64_t l, int64_t mask_id, int64_t committed,
                                        int64_t* rows, AcceptWalk* walk) {
  const int lane = threadIdx.x % 32;
  int64_t count = 0;
  for (int64_t base = 0; base < l; base += 32) {
    const int64_t q = base + lane;
    const bool masked = q < l && state[q] == mask_id;
    const unsigned ballot = __ballot_sync(kFullMask, masked);
    if (masked) rows[count + __popc(ballot & ((1u << lane) - 1u))] = q;
    count += __popc(ballot);
  }
  if (lane == 0) walk->count = count, walk->done = count == 0 || committed + count > l;
}

// A masked position and its confidence; p < 0: none.
struct RankedPosition {
  float conf;
  int64_t p;
};

// The first of a and b by dllm_before (a total order: the choice does not depend on the order of
// the merges, so the warp finds what dllm_select's loop finds).
__device__ __forceinline__ RankedPosition ranked_first(RankedPosition a, RankedPosition b) {
  if (b.p < 0) return a;
  return a.p < 0 || dllm_before(b.conf, b.p, a.conf, a.p) ? b : a;
}

// The first of the masked positions of state not yet chosen (chosen null: none is), at every lane.
__device__ inline RankedPosition warp_first_masked(const float* conf, const int64_t* state, const uint8_t* chosen,
                                                   int64_t l, int64_t mask_id) {
  RankedPosition best{0.0f, -1};
  for (int64_t p = threadIdx.x % 32; p < l; p += 32)
    if (state[p] == mask_id && (chosen == nullptr || !chosen[p])) best = ranked_first(best, RankedPosition{conf[p], p});
  for (int d = 16; d > 0; d >>= 1)
    best = ranked_first(best, RankedPosition{__shfl_xor_sync(kFullMask, best.conf, d),
                                             __shfl_xor_sync(kFullMask, best.p, d)});
  return best;
}

// dllm_select (xkernels/dllm.h) on the warp, state both the block and the new block: the same
// positions chosen, written and listed ascending. Returns how many.
__device__ inline int64_t warp_dllm_select(const float* conf, int64_t* state, const int64_t* x0, int64_t l,
                                           const DllmRule& rule, uint8_t* chosen, int64_t* positions,
                                           int64_t* tokens) {
  const int lane = threadIdx.x % 32;
  const RankedPosition best = warp_first_masked(conf, state, nullptr, l, rule.mask_id);
  if (best.p < 0) return 0;
  const int64_t masked = warp_count_masked(state, l, rule.mask_id);
  const int64_t take = rule.use_threshold ? 1 : rule.num_unmask < masked ? rule.num_unmask : masked;
  for (int64_t p = lane; p < l; p += 32)
    chosen[p] = rule.use_threshold && state[p] == rule.mask_id && conf[p] > rule.threshold;
  __syncwarp();
  if (lane == 0 && take > 0) chosen[best.p] = 1;  // with a threshold, the best at least
  __syncwarp();
  if (!rule.use_threshold) {
    for (int64_t t = 1; t < take; ++t) {  // the best not yet chosen, take times (best was the first)
      const RankedPosition next = warp_first_masked(conf, state, chosen, l, rule.mask_id);
      __syncwarp();  // every lane has read chosen
      if (lane == 0) chosen[next.p] = 1;
      __syncwarp();
    }
  }
  int64_t count = 0;
  for (int64_t base = 0; base < l; base += 32) {
    const int64_t p = base + lane;
    const bool picked = p < l && chosen[p];
    const unsigned ballot = __ballot_sync(kFullMask, picked);
    if (picked) {
      const int64_t j = count + __popc(ballot & ((1u << lane) - 1u));
      state[p] = x0[p], positions[j] = p, tokens[j] = x0[p];
    }
    count += __popc(ballot);
  }
  __syncwarp();  // the new block, to every lane
  return count;
}

// spiffy_match (xkernels/spiffy.h) on the warp: the first kept draft equal to block, or -1.
__device__ inline int64_t warp_spiffy_match(const int64_t* block, const int64_t* drafts, const int64_t* node_ids,
                                            int64_t k, int64_t l) {
  for (int64_t d = 0; d < k; ++d) {
    if (node_ids[d] < 0) continue;
    bool equal = true;
    for (int64_t base = 0; base < l && equal; base += 32) {
      const int64_t p = base + threadIdx.x % 32;
      equal = __all_sync(kFullMask, p >= l || drafts[d * l + p] == block[p]);
    }
    if (equal) return d;
  }
  return -1;
}

// The walk of sequence blockIdx.x / blocks (blocks: the cluster's size with kCluster, else 1). Each
// step stands on a node: where spiffy_accept_prepare_kernel picked its masked rows at this step
// (accept_prepared_step), the leader reads those picks; else the team's blocks read the rows, a
// block a row (its threads over the row, 16 loads of 16 B in flight each: 64 KB a block; dllm_row.cuh's
// rule), rows dealt out in turn, and a team barrier hands the picks over. Then the leader applies
// the selection, looks for a kept draft equal to the new block and plans the next step; a team
// barrier hands the plan over. kFilter (some sequence may filter): a kernel of its own, as
// dllm_row_pick's loads beside the selection spilled; a filtered row is scanned once for its
// candidates (16 KB in flight a block), then picked from them in the block, or where they do not
// settle it by dllm_filtered_pick (its cut found on the row, a second read), as every other row:
// 7 loads in flight a thread in its statistics pass (28 KB an SM; 8 spilled 32 bytes beside the
// scan). 242-254 registers, no spill (sm_90a).
template <typename T, bool kCluster, bool kFilter>
__global__ void __launch_bounds__(kThreads, 1) spiffy_accept_kernel(SpiffyAcceptParams p, AcceptWorkspace ws,
                                                                 unsigned blocks, bool vector_ok) {
  __shared__ AcceptShared<kFilter, true> sh;
  const unsigned rank = team_rank<kCluster>();
  const int64_t n = blockIdx.x / blocks;
  int64_t* state = p.new_block + n * p.l;
  int64_t* rows = ws.rows + n * p.l;
  AcceptWalk* walk = ws.walk + 2 * n;
  const RowSampling rs = p.rule.s.row(n);
  const int mass_shift = cut_mass_shift(p.v);
  const RowStream stream = p.rule.s.stream(n);
  const bool leader_warp = rank == 0 && threadIdx.x < 32;
  int64_t committed = 0;  // the leader warp's
  if (leader_warp) {
    if (threadIdx.x == 0) walk->cur = -1;
    warp_accept_plan(state, p.l, p.rule.mask_id, committed, rows, walk);
  }
  team_sync<kCluster>();
  int64_t steps = 0;
  AcceptWalk w = *walk;
  const int64_t masked0 = w.count;
  for (; !w.done; ++steps) {
    const int64_t node = (n * (p.k + 1) + w.cur + 1) * p.l;  // the node's slots of ws.x0 and ws.conf
    float* conf = ws.conf + node;
    int64_t* x0 = ws.x0 + node;
    if (accept_prepared_step(p.rule, ws.drafts, masked0, w.count) != steps) {  // the same for the whole team
      const T* logits = accept_node_logits<T>(p, n, w.cur + 1);
      const RowStream st = dllm_step_stream(stream, steps, p.l);
      for (int64_t j = rank; j < w.count; j += blocks) {  // the same for the whole block
        const int64_t q = rows[j];
        const DllmPick pick = accept_row_pick<T, kFilter, true>(sh, p, logits, q, rs, mass_shift, st, vector_ok);
        if (threadIdx.x == 0) x0[q] = pick.token, conf[q] = pick.confidence;
      }
      team_sync<kCluster>();  // the picks, to the leader
    }
    if (leader_warp) {
      committed += warp_dllm_select(conf, state, x0, p.l, p.rule, ws.chosen + n * p.l, p.positions + n * p.l + committed,
                                    p.tokens + n * p.l + committed);
      const int64_t m = warp_spiffy_match(state, p.drafts + n * p.k * p.l, p.node_ids + n * p.k, p.k, p.l);
      AcceptWalk* next = walk + (steps + 1) % 2;
      if (m < 0) {
        if (threadIdx.x == 0) next->cur = w.cur, next->count = 0, next->done = 1;
      } else {
        if (threadIdx.x == 0) next->cur = m;
        warp_accept_plan(state, p.l, p.rule.mask_id, committed, rows, next);
      }
    }
    team_sync<kCluster>();  // the plan, to every block
    w = walk[(steps + 1) % 2];
  }
  if (rank == 0 && threadIdx.x == 0) p.num_steps[n] = steps, p.continue_from[n] = w.cur;
}

// The launch of n sequences a cluster of `blocks` (the attribute lives in *cluster).
inline cudaLaunchConfig_t accept_cluster_config(int64_t n, unsigned blocks, cudaLaunchAttribute* cluster) {
  return cluster_config(static_cast<unsigned>(n * blocks), kThreads, 0, nullptr, blocks, cluster);
}

// The walk's launch, a block a sequence (kCluster false; blocks is 1) or a cluster of `blocks`.
template <typename T, bool kCluster, bool kFilter>
cudaError_t launch_accept_walk(const SpiffyAcceptParams& p, const AcceptWorkspace& ws, unsigned blocks, bool vector_ok,
                               cudaStream_t stream) {
  if constexpr (!kCluster) {
    spiffy_accept_kernel<T, false, kFilter><<<p.n, kThreads, 0, stream>>>(p, ws, 1u, vector_ok);
    return cudaGetLastError();
  } else {
    cudaLaunchAttribute cluster{};
    cudaLaunchConfig_t config = accept_cluster_config(p.n, blocks, &cluster);
    config.stream = stream;
    return cudaLaunchKernelEx(&config, spiffy_accept_kernel<T, true, kFilter>, p, ws, blocks, vector_ok);
  }
}

// The prepare kernel's launch, a block a (sequence, prepared node, row) up to the grid's limit, which
// it strides.
template <typename T, bool kFilter>
cudaError_t launch_accept_prepare(const SpiffyAcceptParams& p, const AcceptWorkspace& ws, bool vector_ok,
                                  cudaStream_t stream) {
  const int64_t rows = p.n * (ws.drafts ? p.k + 1 : 1) * p.l;
  const auto grid = static_cast<unsigned>(rows < 0x7FFFFFFF ? rows : 0x7FFFFFFF);
  spiffy_accept_prepare_kernel<T, kFilter><<<grid, kThreads, 0, stream>>>(p, ws, vector_ok);
  return cudaGetLastError();
}

// launch_accept_prepare<T, true> (spiffy_filtered.cuh; a file a logits type:
// spiffy_filtered_accept_prepare_<type>_kernel.cu, as the filtered walks' files would each compile it).
template <typename T>
cudaError_t launch_filtered_accept_prepare(const SpiffyAcceptParams& p, const AcceptWorkspace& ws, bool vector_ok,
                                           cudaStream_t stream);

// launch_accept_walk<T, kCluster, true> (spiffy_filtered.cuh; for float, __nv_bfloat16 and __half
// logits, a file each with clusters and one without: spiffy_filtered_accept_[cluster_]<type>_kernel.cu).
template <typename T, bool kCluster>
cudaError_t launch_filtered_accept_walk(const SpiffyAcceptParams& p, const AcceptWorkspace& ws, unsigned blocks,
                                        bool vector_ok, cudaStream_t stream);

template <typename Launch>
cudaError_t by_dtype(LogitsType dtype, Launch&& launch) {
  switch (dtype) {
    case LogitsType::kFloat32: return launch(float{});
    case LogitsType::kBFloat16: return launch(__nv_bfloat16{});
    case LogitsType::kFloat16: return launch(__half{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace xkernels::cuda
