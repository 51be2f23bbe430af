// The Spiffy ops on CUDA, one launch each, never waiting on the host.
//  materialize: two launches. Every masked row split over the grid (softmax statistics and top
//               tokens of each slice), then a block per sequence: its warps merge each row's
//               slices; then the ranking, the node scores and the kept set
//               (one block-wide argmax per kept node) follow xkernels/spiffy.h.
//  accept:      a thread block cluster of 8 or 4 blocks per sequence (sm_90+; one block below) walks the
//               steps: the step's masked rows are dealt out to its blocks, a block a row (dllm_step's
//               row rule, dllm_row.cuh), on the logits of the block reached; cluster.sync; thread 0 of
//               block 0 applies the selection, looks for a kept draft equal to the new block and lists
//               the next step's rows; cluster.sync. A cluster's blocks are co-scheduled, so they may
//               wait for each other; ordinary blocks could deadlock doing so.
//  mask:        a warp per mask row, a lane per output byte.
#include <cooperative_groups.h>

#include <type_traits>

#include "device_utils.cuh"
#include "dllm_row.cuh"
#include "per_device.h"
#include "spiffy_launch.h"

namespace xkernels::cuda {
namespace {

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

// The warp's merge of each lane's top tokens: kSpiffyMaxRank rounds of a warp argmax over the
// lanes' next candidates; the winning lane moves to its next one. Every lane returns the result.
__device__ TopTokens warp_merge_top(const TopTokens& mine) {
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

// A block's reduction of chunks `range` of masked row `src` (every thread's ids first, first +
// kThreads, ...): the raw statistics (at every thread), and, at thread 0, the slice's tempered sum
// at kScaled and its top tokens; observe(a, id) sees each raw value read.
template <typename T, bool kScaled, int kDepth, typename Observe>
__device__ __forceinline__ RowSlice reduce_row_slice(const T* src, int64_t v, SliceRange range, int64_t mask,
                                                     float scale, bool vector_ok, const Observe& observe) {
  __shared__ TopTokens warp_tops[kWarps];
  constexpr int kIds = 16 / sizeof(T);
  const float scale_log2e = scale * kLog2e;
  RowStats raw = stats_empty();
  float scaled = 0.0f;
  TopTokens top;
  top_clear(top);
  for_each_row_value<T, kDepth>(
      src, v, range.begin, range.end, vector_ok, 1.0f, mask, threadIdx.x, kThreads,
      [&](const float (&a)[kIds], int32_t id) {
        const float before = raw.top.val;
        observe_chunk_in_order<false>(raw, a, id);
        float m = a[0];
#pragma unroll
        for (int j = 1; j < kIds; ++j) m = max_nan(m, a[j]);
#pragma unroll
        for (int j = 0; j < kIds; ++j) observe(a[j], id + j);
        // Ids rise, so a chunk whose best loses to the eighth kept token has nothing to insert.
        const int last = kSpiffyMaxRank - 1;
        if (top.idx[last] == kNoIndex || (!(m <= top.val[last]) && !is_nan_f32(top.val[last]))) {
#pragma unroll
          for (int j = 0; j < kIds; ++j) top_observe(top, a[j], id + j);
        }
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
        top_observe(top, a, id);
        observe(a, id);
        if constexpr (kScaled) {
          if (raw.top.val != before) scaled = scaled_sum_to(scaled, before, raw.top.val, scale);
          if (a != kNegInf) scaled += exp_f32((a - raw.top.val) * scale);
        }
      });
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const RowStats merged = block_merge_all(raw, stats_empty());
  if constexpr (kScaled) scaled = block_sum(scaled_sum_to(scaled, raw.top.val, merged.top.val, scale));
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
  return RowSlice{merged, kScaled ? scaled : merged.sum, top};
}

// Whether spiffy_filtered_rows_kernel reduces row `row` (masked, its sequence sampled with some
// filter active); the same for a whole block.
__device__ __forceinline__ bool filtered_row(const SpiffyMaterializeParams& p, int64_t row) {
  if (!p.filtered || p.block[row] != p.mask_id) return false;
  const RowSampling rs = p.s.row(row / p.l);
  return rs.inv_t != 0.0f && filters_active(rs, p.v);
}

// Pass 1 of materialize: every masked row split in `slices` slices over the grid (row_reduce.cuh
// reads them; at kScaled the tempered sum comes in the same pass). Rows that are not masked, and
// those spiffy_filtered_rows_kernel reduces, are skipped.
template <typename T, bool kScaled>
__global__ void __launch_bounds__(kThreads) spiffy_rows_kernel(SpiffyMaterializeParams p, RowSlice* out, int slices,
                                                               bool vector_ok) {
  constexpr int kIds = 16 / sizeof(T);
  const int64_t row = blockIdx.x / slices;  // n * l + position
  const int slice = static_cast<int>(blockIdx.x % slices);
  if (p.block[row] != p.mask_id || filtered_row(p, row)) return;  // the same for the whole block
  if (slice == 0) XK_ROW_PASS();  // the emulation counts a read of the row where its first slice reads
  const RowSlice s =
      reduce_row_slice<T, kScaled, 4>(static_cast<const T*>(p.logits) + row * p.v, p.v, slice_range(p.v, kIds, slices, slice),
                                      p.mask_id, spiffy_scale(p.s.row(row / p.l)), vector_ok, [](float, int32_t) {});
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// Pass 1 of materialize for the masked rows whose sequence filters, a block a row, in two reads: the
// raw statistics and top tokens, which also note the tempered row's top key bits for the cut, then
// the cut (row_filter.cuh), whose ranked candidates give the kept ids' tempered sum (a pass more
// for min-p alone). The row's result goes to its first slice, the others are emptied;
// every row's cut goes to cuts (keep_all where the row is not filtered). One block an SM, as
// dllm_step's filtered kernel, with 16 loads of 16 B in flight a thread in the first read (64 KB).
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    spiffy_filtered_rows_kernel(SpiffyMaterializeParams p, FilterCut* cuts, RowSlice* out, int slices, int mass_shift,
                                bool vector_ok) {
  __shared__ CutShared sh;
  constexpr int kIds = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  if (!filtered_row(p, row)) {
    if (threadIdx.x == 0) cuts[row] = keep_all();
    return;
  }
  const T* src = static_cast<const T*>(p.logits) + row * p.v;
  const RowSampling rs = p.s.row(row / p.l);
  const float scale = spiffy_scale(rs);  // rs.inv_t: the row samples
  const TopBits bits = top_bits(rs, p.v);
  if (bits != TopBits::kNone) clear_top_bits(sh);
  __syncthreads();
  XK_ROW_PASS();
  RowSlice s = reduce_row_slice<T, true, 16>(src, p.v, SliceRange{0, (p.v + kIds - 1) / kIds}, p.mask_id, scale,
                                            vector_ok, [&](float a, int32_t) { observe_top_bits(sh, a * scale, bits); });
  __syncthreads();  // the top bits are complete
  const float top = s.raw.top.val * scale;  // the tempered top: rounding is monotone
  FilterCut cut = keep_all();
  if (is_finite_f32(top)) {  // a row without a softmax is scored as it is (the filtered reference's rule)
    const RowView<T> r{src, p.v, scale, p.mask_id};
    unsigned long long kept;
    cut = filter_cut(sh, r, top, rs, mass_shift, &kept);
    // The kept ids' sum of exp(a - top): the scaled sum position_top reads, from the raw top at `scale`.
    if (cut_active(cut)) {
      const float sum = kept_sum(r, cut, top, kept, mass_shift);
      if (threadIdx.x == 0) s.scaled_sum = sum;
    }
  }
  if (threadIdx.x == 0) cuts[row] = cut;
  for (int j = threadIdx.x; j < slices; j += kThreads) {
    if (j == 0) {
      out[row * slices] = s;
    } else {
      RowSlice empty{stats_empty(), 0.0f, {}};
      top_clear(empty.top);
      out[row * slices + j] = empty;
    }
  }
}

// Pass 2: a block per sequence. Its warps merge the slices of each masked row (a lane a slice).
__global__ void __launch_bounds__(kThreads)
    spiffy_materialize_kernel(SpiffyMaterializeParams p, const FilterCut* cuts, const RowSlice* rows, int slices,
                              PositionTop* pos, int32_t* order, float* score, uint8_t* state) {
  __shared__ int64_t masked_shared;
  const int64_t n = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t* block = p.block + n * p.l;
  pos += n * p.l, order += n * p.l, score += n * p.graph.g, state += n * p.graph.g;
  const float scale = spiffy_scale(p.s.row(n));
  for (int64_t q = warp; q < p.l; q += kWarps) {
    if (block[q] != p.mask_id) continue;  // the same for the whole warp
    RowSlice mine{stats_empty(), 0.0f, {}};
    top_clear(mine.top);
    if (lane < slices) mine = rows[(n * p.l + q) * slices + lane];
    const RowStats raw = warp_merge(mine.raw);
    const float scaled_sum = warp_sum(scaled_sum_to(mine.scaled_sum, mine.raw.top.val, raw.top.val, scale));
    const TopTokens top = warp_merge_top(mine.top);
    if (lane == 0) {
      position_top(top, raw, scaled_sum, scale, pos[q]);
      const FilterCut cut = row_cut_or_all(cuts, n * p.l + q);  // a token it drops has probability 0
      for (int j = 0; j < kSpiffyMaxRank && cut_active(cut); ++j)
        if (pos[q].token[j] >= 0 && !filter_keeps(cut, top.val[j] * scale, pos[q].token[j])) pos[q].logp[j] = kNegInf;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) masked_shared = spiffy_rank_positions(pos, block, p.l, p.mask_id, order);
  __syncthreads();
  const GraphView& gr = p.graph;
  for (int64_t g = threadIdx.x; g < gr.g; g += kThreads) {
    score[g] = g == 0 ? kNegInf : spiffy_local_log(gr.ranks + g * gr.k * 2, gr.k, pos, order, masked_shared);
    state[g] = kNodeOut;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    spiffy_combine_scores(gr, score);
    spiffy_expand(gr, 0, score, state);
  }
  __syncthreads();
  for (int64_t r = 0; r < p.keep; ++r) {
    ArgMax best = argmax_empty();
    for (int64_t g = threadIdx.x; g < gr.g; g += kThreads)
      if (state[g] == kNodeFrontier) argmax_observe(best, score[g], static_cast<int32_t>(g));
    best = block_merge(best, argmax_empty());
    if (threadIdx.x == 0) {
      int64_t* draft = p.drafts + (n * p.keep + r) * p.l;
      if (best.idx == kNoIndex) {
        for (int64_t q = 0; q < p.l; ++q) draft[q] = block[q];
      } else {
        state[best.idx] = kNodeKept;
        spiffy_expand(gr, best.idx, score, state);
        spiffy_fill(gr.ranks + best.idx * gr.k * 2, gr.k, pos, order, block, p.l, draft);
        p.node_ids[n * p.keep + r] = best.idx;
        p.scores[n * p.keep + r] = exp_f32(best.val);
      }
    }
    __syncthreads();  // state, and block_merge's buffer
  }
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

// The workspace of spiffy_accept carved from `base` (null: only sized); *bytes is its size.
AcceptWorkspace accept_workspace(const SpiffyAcceptParams& p, void* base, size_t* bytes) {
  char* at = static_cast<char*>(base);
  size_t used = 0;
  const auto take = [&](size_t size) {
    void* out = at ? at + used : nullptr;
    used += align_up(size);
    return out;
  };
  const size_t nl = static_cast<size_t>(p.n * p.l);
  AcceptWorkspace ws;
  ws.conf = static_cast<float*>(take(sizeof(float) * nl));
  ws.x0 = static_cast<int64_t*>(take(sizeof(int64_t) * nl));
  ws.chosen = static_cast<uint8_t*>(take(nl));
  ws.rows = static_cast<int64_t*>(take(sizeof(int64_t) * nl));
  ws.walk = static_cast<AcceptWalk*>(take(sizeof(AcceptWalk) * static_cast<size_t>(p.n)));
  *bytes = used;
  return ws;
}

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
__device__ void accept_plan(const int64_t* state, int64_t l, int64_t mask_id, int64_t committed, int64_t* rows,
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

constexpr int kMaskRowsPerBlock = kWarps;  // a warp a mask row

// A warp per mask row (grid-stride), its lanes over the row's bytes: the row's intervals are
// computed once a row, not once a byte (64-bit divisions cost tens of instructions each).
__global__ void __launch_bounds__(kThreads) spiffy_mask_kernel(SpiffyMaskParams p, int64_t q_len, int64_t row_bytes,
                                                               int64_t rows) {
  const int lane = threadIdx.x % 32;
  const int64_t keys = p.max_prefix + q_len;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kMaskRowsPerBlock + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kMaskRowsPerBlock) {
    const SpiffyMaskRow r = spiffy_mask_row(row % q_len, p.block_size, p.max_prefix, p.prefix_lens[row / q_len]);
    uint8_t* out = p.mask + row * row_bytes;
    for (int64_t byte = lane; byte < row_bytes; byte += 32) {
      if (!p.packed) {
        out[byte] = spiffy_mask_at(r, byte);
        continue;
      }
      uint8_t bits = 0;
      for (int b = 0; b < 8 && 8 * byte + b < keys; ++b)
        bits |= static_cast<uint8_t>(spiffy_mask_at(r, 8 * byte + b)) << b;
      out[byte] = bits;
    }
  }
}

template <typename T>
cudaError_t materialize_typed(const SpiffyMaterializeParams& p, void* workspace, cudaStream_t stream) {
  char* at = static_cast<char*>(workspace);
  auto* pos = reinterpret_cast<PositionTop*>(at);
  at += align_up(sizeof(PositionTop) * p.n * p.l);
  auto* order = reinterpret_cast<int32_t*>(at);
  at += align_up(sizeof(int32_t) * p.n * p.l);
  auto* score = reinterpret_cast<float*>(at);
  at += align_up(sizeof(float) * p.n * p.graph.g);
  auto* state = reinterpret_cast<uint8_t*>(at);
  at += align_up(static_cast<size_t>(p.n * p.graph.g));
  auto* rows = reinterpret_cast<RowSlice*>(at);
  const int slices = masked_row_slices(p.n * p.l, p.v, p.num_sms, p.dtype);
  at += align_up(sizeof(RowSlice) * p.n * p.l * slices);
  FilterCut* cuts = p.filtered ? reinterpret_cast<FilterCut*>(at) : nullptr;
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
  if (p.l > 0) {  // an empty grid is a launch error
    if (cuts)
      spiffy_filtered_rows_kernel<T><<<p.n * p.l, kThreads, 0, stream>>>(p, cuts, rows, slices, cut_mass_shift(p.v),
                                                                         vector_ok);
    // The tempered sum's pass wherever a sequence may score at a scale other than 1.
    if (p.s.temperature || spiffy_scale(p.s.scalar) != 1.0f)
      spiffy_rows_kernel<T, true><<<p.n * p.l * slices, kThreads, 0, stream>>>(p, rows, slices, vector_ok);
    else
      spiffy_rows_kernel<T, false><<<p.n * p.l * slices, kThreads, 0, stream>>>(p, rows, slices, vector_ok);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  spiffy_materialize_kernel<<<p.n, kThreads, 0, stream>>>(p, cuts, rows, slices, pos, order, score, state);
  return cudaGetLastError();
}

// The launch of n sequences a cluster of `blocks` (the attribute lives in *cluster).
cudaLaunchConfig_t accept_cluster_config(int64_t n, unsigned blocks, cudaLaunchAttribute* cluster) {
  cluster->id = cudaLaunchAttributeClusterDimension;
  cluster->val.clusterDim.x = blocks, cluster->val.clusterDim.y = 1, cluster->val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(n * blocks)), config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = 0, config.attrs = cluster, config.numAttrs = 1;
  return config;
}

template <typename T>
cudaError_t accept_typed(const SpiffyAcceptParams& p, void* workspace, cudaStream_t stream) {
  size_t bytes = 0;
  const AcceptWorkspace ws = accept_workspace(p, workspace, &bytes);
  // Every row of both logits tensors starts 16-byte aligned (the vector loads of dllm_row.cuh).
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.root_logits) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(p.draft_logits) % 16 == 0;
  const unsigned blocks = spiffy_accept_blocks(p);
  const auto launch = [&](auto filter) {
    constexpr bool kFilter = decltype(filter)::value;
    if (blocks == 1) {
      spiffy_accept_kernel<T, false, kFilter><<<p.n, kThreads, 0, stream>>>(p, ws, 1u, vector_ok);
      return cudaGetLastError();
    }
    cudaLaunchAttribute cluster{};
    cudaLaunchConfig_t config = accept_cluster_config(p.n, blocks, &cluster);
    config.stream = stream;
    return cudaLaunchKernelEx(&config, spiffy_accept_kernel<T, true, kFilter>, p, ws, blocks, vector_ok);
  };
  return p.rule.filtered ? launch(std::true_type{}) : launch(std::false_type{});
}

// Clusters of kSize blocks of spiffy_accept_kernel<T, true, false> the current device runs at once
// (cudaOccupancyMaxActiveClusters), asked once a device; a failed query (not kept) reads as "all":
// the cluster launch itself then says whether it can run. The filtered kernel is asked nothing: it
// also runs one block an SM, its 41 KB of shared memory within any SM's.
template <typename T, unsigned kSize>
int accept_clusters_at_once() {
  static PerDevice at_once;
  return at_once.get([] {
    cudaLaunchAttribute cluster{};
    const cudaLaunchConfig_t config = accept_cluster_config(1, kSize, &cluster);
    int count = 0;
    if (cudaOccupancyMaxActiveClusters(&count, spiffy_accept_kernel<T, true, false>, &config) != cudaSuccess) {
      (void)cudaGetLastError();  // a query's failure is no launch error
      return PerDevice::Result{INT_MAX, false};
    }
    return PerDevice::Result{count, true};
  });
}

// Clusters of 8 while every sequence's cluster runs at once; else of 4, which pack the SMs more
// densely (a GPC with 14 SMs free holds one cluster of 8 but three of 4: on such a part 16
// sequences in clusters of 8 leave the last to run alone, twice the time, while clusters of 4 run
// all 16 together, each block reading twice the rows); none where neither size can run at all.
template <typename T>
unsigned accept_cluster_size(int64_t n) {
  if (accept_clusters_at_once<T, kAcceptCluster>() >= n) return kAcceptCluster;
  if (accept_clusters_at_once<T, kAcceptClusterSmall>() > 0) return kAcceptClusterSmall;
  return accept_clusters_at_once<T, kAcceptCluster>() > 0 ? kAcceptCluster : 1;
}

template <typename Launch>
cudaError_t by_dtype(LogitsType dtype, Launch&& launch) {
  switch (dtype) {
    case LogitsType::kFloat32: return launch(float{});
    case LogitsType::kBFloat16: return launch(__nv_bfloat16{});
    case LogitsType::kFloat16: return launch(__half{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

size_t spiffy_materialize_workspace_bytes(const SpiffyMaterializeParams& p) {
  return align_up(sizeof(PositionTop) * p.n * p.l) + align_up(sizeof(int32_t) * p.n * p.l) +
         align_up(sizeof(float) * p.n * p.graph.g) + align_up(static_cast<size_t>(p.n * p.graph.g)) +
         align_up(sizeof(RowSlice) * p.n * p.l * masked_row_slices(p.n * p.l, p.v, p.num_sms, p.dtype)) +
         (p.filtered ? align_up(sizeof(FilterCut) * p.n * p.l) : 0);
}

cudaError_t launch_spiffy_materialize(const SpiffyMaterializeParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  return by_dtype(p.dtype, [&](auto tag) { return materialize_typed<decltype(tag)>(p, workspace, stream); });
}

size_t spiffy_accept_workspace_bytes(const SpiffyAcceptParams& p) {
  size_t bytes = 0;
  accept_workspace(p, nullptr, &bytes);
  return bytes;
}

unsigned spiffy_accept_blocks(const SpiffyAcceptParams& p) {
  if (!p.clusters || p.n > 0x7FFFFFFF / kAcceptCluster) return 1;
  // A build without an sm_90+ image of the kernel (a JIT from compute_80's PTX) has no clusters.
  // Asked once (the first call, on an sm_90+ device, usually comes before any graph capture).
  static const bool built_for_clusters = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, spiffy_accept_kernel<float, true, false>) != cudaSuccess) {
      (void)cudaGetLastError();  // a query's failure is no launch error
      return false;
    }
    return attr.binaryVersion >= 90 && attr.ptxVersion >= 90;
  }();
  if (!built_for_clusters) return 1;
  switch (p.dtype) {
    case LogitsType::kFloat32: return accept_cluster_size<float>(p.n);
    case LogitsType::kBFloat16: return accept_cluster_size<__nv_bfloat16>(p.n);
    case LogitsType::kFloat16: return accept_cluster_size<__half>(p.n);
  }
  return 1;
}

cudaError_t launch_spiffy_accept(const SpiffyAcceptParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0 || p.l == 0) return cudaSuccess;
  return by_dtype(p.dtype, [&](auto tag) { return accept_typed<decltype(tag)>(p, workspace, stream); });
}

cudaError_t launch_spiffy_attention_mask(const SpiffyMaskParams& p, cudaStream_t stream) {
  const int64_t q_len = (1 + p.num_drafts) * p.block_size, keys = p.max_prefix + q_len;
  const int64_t row_bytes = p.packed ? (keys + 7) / 8 : keys, rows = p.n * q_len;
  if (rows * row_bytes == 0) return cudaSuccess;
  const int64_t blocks = (rows + kMaskRowsPerBlock - 1) / kMaskRowsPerBlock;
  spiffy_mask_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0, stream>>>(p, q_len, row_bytes,
                                                                                                     rows);
  return cudaGetLastError();
}

}  // namespace xkernels::cuda
