// What the files of the Spiffy CUDA kernels share (spiffy_kernel.cu's split, so that no
// translation unit compiles for long): the masked rows' reduction of materialize's first pass, and
// the accept walk, whose kernel template is instantiated unfiltered in spiffy_accept_kernel.cu and
// filtered in spiffy_filtered_accept_[cluster_]<type>_kernel.cu (each combination in one file only).
#pragma once

#include <cooperative_groups.h>

#include <type_traits>

#include "device_utils.cuh"
#include "dllm_row.cuh"
#include "spiffy_launch.h"

namespace xkernels::cuda {

inline size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

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
// orders it): written by the leader (thread 0 of block 0), read by every thread after the barrier.
struct AcceptWalk {
  int64_t cur;    // the kept draft the walk stands on; -1: the root
  int64_t count;  // the masked rows of the next step, listed in AcceptWorkspace::rows
  int64_t done;
};

struct AcceptWorkspace {
  float* conf;      // [n, l], a step's confidence of each masked row
  int64_t* x0;      // [n, l], its pick
  uint8_t* chosen;  // [n, l], dllm_select's scratch
  int64_t* rows;    // [n, l], the masked rows of the step, ascending
  AcceptWalk* walk;  // [n]
};

// The blocks that walk one sequence: a thread block cluster (kCluster, sm_90+: co-scheduled, so they
// can wait for each other), or one block.
template <bool kCluster>
__device__ __forceinline__ unsigned team_rank() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  if constexpr (kCluster) return cooperative_groups::this_cluster().block_rank();
#endif
  return 0;
}

// A barrier of every thread of the team; cluster.sync (barrier.cluster arrive.release and
// wait.acquire) also orders the global memory the team's blocks exchange.
template <bool kCluster>
__device__ __forceinline__ void team_sync() {
  if constexpr (kCluster) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#else
    __trap();  // never launched: spiffy_accept_blocks takes one block a sequence below sm_90
#endif
  } else {
    __syncthreads();
  }
}

// The leader's plan of the next step: lists the masked rows of state; the walk stops when none is
// left or when committing them all would overflow the outputs (only a row without a softmax can
// pick the mask token).
__device__ inline void accept_plan(const int64_t* state, int64_t l, int64_t mask_id, int64_t committed, int64_t* rows,
                                   AcceptWalk* walk) {
  int64_t count = 0;
  for (int64_t q = 0; q < l; ++q)
    if (state[q] == mask_id) rows[count++] = q;
  walk->count = count;
  walk->done = count == 0 || committed + count > l;
}

// The walk of sequence blockIdx.x / blocks (blocks: the cluster's size with kCluster, else 1). Each
// step the team's blocks read the masked rows of the node reached, a block a row (its threads over
// the row, 16 loads of 16 B in flight each: 64 KB a block; dllm_row.cuh's rule), rows dealt out in
// turn; then the leader applies the selection, looks for a kept draft equal to the new block and
// plans the next step. Two team barriers a step. kFilter (some sequence may filter): every row is
// picked by dllm_filtered_pick, each filtered row's cut found on it (two reads of the row, the rows
// the walk visits only); a kernel of its own, as dllm_row_pick's loads beside the selection spilled.
// 255 registers, no spill (sm_90a), 8 loads in flight a thread in the statistics pass (32 KB an SM).
template <typename T, bool kCluster, bool kFilter>
__global__ void __launch_bounds__(kThreads, 1) spiffy_accept_kernel(SpiffyAcceptParams p, AcceptWorkspace ws,
                                                                 unsigned blocks, bool vector_ok) {
  __shared__ std::conditional_t<kFilter, CutShared, char> sh;
  const unsigned rank = team_rank<kCluster>();
  const int64_t n = blockIdx.x / blocks;
  const bool leader = rank == 0 && threadIdx.x == 0;
  int64_t* state = p.new_block + n * p.l;
  float* conf = ws.conf + n * p.l;
  int64_t *x0 = ws.x0 + n * p.l, *rows = ws.rows + n * p.l;
  AcceptWalk* walk = ws.walk + n;
  const RowSampling rs = p.rule.s.row(n);
  const float inv_t = rs.inv_t;
  const int mass_shift = cut_mass_shift(p.v);
  const RowStream stream = p.rule.s.stream(n);
  int64_t committed = 0;  // the leader's
  if (leader) {
    walk->cur = -1;
    accept_plan(state, p.l, p.rule.mask_id, committed, rows, walk);
  }
  team_sync<kCluster>();
  int64_t steps = 0;
  AcceptWalk w = *walk;
  for (; !w.done; ++steps) {
    const T* logits = w.cur < 0 ? static_cast<const T*>(p.root_logits) + n * p.l * p.v
                                : static_cast<const T*>(p.draft_logits) + (n * p.k + w.cur) * p.l * p.v;
    const RowStream st = dllm_step_stream(stream, steps, p.l);
    for (int64_t j = rank; j < w.count; j += blocks) {  // the same for the whole block
      const int64_t q = rows[j];
      const auto slot = static_cast<uint32_t>(q);
      DllmPick pick;
      if constexpr (kFilter)
        pick = dllm_filtered_pick<8>(sh, logits + q * p.v, p.v, p.rule.mask_id, rs, mass_shift, st.seed,
                                  st.offset_at(slot), st.sequence_at(), st.position_at(slot), vector_ok);
      else
        pick = dllm_row_pick(logits + q * p.v, p.v, p.rule.mask_id, inv_t, keep_all(), st.seed, st.offset_at(slot),
                             st.sequence_at(), st.position_at(slot), vector_ok, threadIdx.x, kThreads,
                             [](auto s, auto empty) { return block_merge_all(s, empty); });
      if (threadIdx.x == 0) x0[q] = pick.token, conf[q] = pick.confidence;
    }
    team_sync<kCluster>();  // the picks, to the leader
    if (leader) {
      uint8_t* chosen = ws.chosen + n * p.l;
      dllm_select(conf, state, x0, p.l, p.rule.mask_id, p.rule.num_unmask, p.rule.use_threshold, p.rule.threshold,
                  chosen, state, p.positions + n * p.l + committed, p.tokens + n * p.l + committed);
      for (int64_t q = 0; q < p.l; ++q) committed += chosen[q];
      const int64_t m = spiffy_match(state, p.drafts + n * p.k * p.l, p.node_ids + n * p.k, p.k, p.l);
      if (m < 0) {
        walk->done = 1;
      } else {
        walk->cur = m;
        accept_plan(state, p.l, p.rule.mask_id, committed, rows, walk);
      }
    }
    team_sync<kCluster>();  // the plan, to every block
    w = *walk;
  }
  if (leader) p.num_steps[n] = steps, p.continue_from[n] = w.cur;
}

// The launch of n sequences a cluster of `blocks` (the attribute lives in *cluster).
inline cudaLaunchConfig_t accept_cluster_config(int64_t n, unsigned blocks, cudaLaunchAttribute* cluster) {
  cluster->id = cudaLaunchAttributeClusterDimension;
  cluster->val.clusterDim.x = blocks, cluster->val.clusterDim.y = 1, cluster->val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(n * blocks)), config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = 0, config.attrs = cluster, config.numAttrs = 1;
  return config;
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
