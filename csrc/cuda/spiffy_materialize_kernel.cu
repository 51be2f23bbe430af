// spiffy_materialize on CUDA: two launches, never waiting on the host. Every masked row split over
// the grid (softmax statistics and top tokens of each slice; the rows of filtering sequences a block
// a row, spiffy_filtered_rows_kernel.cu), then a block per sequence: its warps merge each row's
// slices; then the ranking, the node scores and the kept set (one block-wide argmax per kept node)
// follow xkernels/spiffy.h.
#include "spiffy_kernels.cuh"

namespace xkernels::cuda {
namespace {

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
    if (cuts) launch_spiffy_filtered_rows<T>(p, cuts, rows, slices, vector_ok, stream);
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

}  // namespace xkernels::cuda
