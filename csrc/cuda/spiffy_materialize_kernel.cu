// spiffy_materialize on CUDA, never waiting on the host: every masked row split over the grid
// (softmax statistics and top tokens of each slice); the filtered rows' cuts and kept sums from
// their candidates (spiffy_filtered.cuh: scan, select, the radix path for the rows select does not
// settle); then a block per sequence: its warps merge each row's slices; then the ranking, the node
// scores and the kept set (one block-wide argmax per kept node) follow xkernels/spiffy.h.
#include "spiffy_filtered.cuh"

namespace xkernels::cuda {
namespace {

// Pass 1 of materialize: every masked row split in `slices` slices over the grid (row_reduce.cuh
// reads them; at kScaled the tempered sum comes in the same pass). Rows that are not masked are
// skipped.
template <typename T, bool kScaled>
__global__ void __launch_bounds__(kThreads) spiffy_rows_kernel(SpiffyMaterializeParams p, RowSlice* out, int slices,
                                                               bool vector_ok) {
  constexpr int kIds = 16 / sizeof(T);
  const int64_t row = blockIdx.x / slices;  // n * l + position
  const int slice = static_cast<int>(blockIdx.x % slices);
  if (p.block[row] != p.mask_id) return;  // the same for the whole block
  if (slice == 0) XK_ROW_PASS();  // the emulation counts a read of the row where its first slice reads
  const RowSlice s =
      reduce_row_slice<T, kScaled, 4>(static_cast<const T*>(p.logits) + row * p.v, p.v, slice_range(p.v, kIds, slices, slice),
                                      p.mask_id, spiffy_scale(p.s.row(row / p.l)), vector_ok, [](float, int32_t) {});
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// A block per masked row finds the cut of a filtered one from its slices' candidates (its top, at
// least, where it cannot), and notes whether it did; every other row keeps every id.
__global__ void __launch_bounds__(kThreads) spiffy_select_kernel(SpiffyMaterializeParams p, FilteredSpace f,
                                                                 int mass_shift) {
  __shared__ SelectShared sh;
  const int64_t row = blockIdx.x;
  if (!filtered_row(p, row)) {  // the whole block
    if (threadIdx.x == 0) f.rows[row] = FilteredRow{keep_all(), 0.0f, 0.0f, 1};
    return;
  }
  const int64_t first = row * f.layout.slices;
  RowCut cut;
  const bool settled = select_cut(sh, f.sums + first, f.cands + first * kSliceKeep, f.layout.slices, p.s.row(row / p.l),
                                  p.v, mass_shift, &cut);
  if (threadIdx.x != 0) return;
  // a row without a softmax is scored as it is (the filtered reference's rule)
  const FilterCut kept = settled && !cut.degenerate ? cut.cut : keep_all();
  f.rows[row] = FilteredRow{kept, fixed_sum_value(cut.kept, mass_shift), cut.top.val, settled};
}

// Pass 2: a block per sequence. Its warps merge the slices of each masked row (a lane a slice).
__global__ void __launch_bounds__(kThreads)
    spiffy_materialize_kernel(SpiffyMaterializeParams p, const FilteredRow* filtered, const RowSlice* rows, int slices,
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
      const FilteredRow f = filtered ? filtered[n * p.l + q] : FilteredRow{keep_all(), 0.0f, 0.0f, 1};
      const FilterCut cut = f.cut;  // a token it drops has probability 0
      position_top(top, raw, cut_active(cut) ? f.kept_sum : scaled_sum, scale, pos[q]);
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

// The workspace: the positions' top tokens, their order, the node scores and states, the rows'
// slices; then, where some sequence may filter, each row's cut and its candidates' slices.
struct Workspace {
  int slices;                // spiffy_rows_kernel's a row
  SliceLayout layout;        // the candidates' slices
  size_t order, score, state, rows, filtered, sums, cands;  // byte offsets
  size_t bytes;
};

Workspace workspace_of(const SpiffyMaterializeParams& p) {
  const auto rows = static_cast<size_t>(p.n * p.l);
  Workspace w{};
  w.slices = masked_row_slices(p.n * p.l, p.v, p.num_sms, p.dtype);
  w.layout = slice_layout(p.v, p.dtype == LogitsType::kFloat32 ? 4 : 8);
  w.order = align_up(sizeof(PositionTop) * rows);
  w.score = w.order + align_up(sizeof(int32_t) * rows);
  w.state = w.score + align_up(sizeof(float) * p.n * p.graph.g);
  w.rows = w.state + align_up(static_cast<size_t>(p.n * p.graph.g));
  w.filtered = w.rows + align_up(sizeof(RowSlice) * rows * w.slices);
  const size_t cand_slices = p.filtered ? rows * w.layout.slices : 0;
  w.sums = w.filtered + (p.filtered ? align_up(sizeof(FilteredRow) * rows) : 0);
  w.cands = w.sums + align_up(sizeof(SliceSummary) * cand_slices);
  w.bytes = w.cands + sizeof(Candidate) * kSliceKeep * cand_slices;
  return w;
}

template <typename T>
cudaError_t materialize_typed(const SpiffyMaterializeParams& p, void* workspace, cudaStream_t stream) {
  char* base = static_cast<char*>(workspace);
  const Workspace w = workspace_of(p);
  auto* pos = reinterpret_cast<PositionTop*>(base);
  auto* order = reinterpret_cast<int32_t*>(base + w.order);
  auto* score = reinterpret_cast<float*>(base + w.score);
  auto* state = reinterpret_cast<uint8_t*>(base + w.state);
  auto* rows = reinterpret_cast<RowSlice*>(base + w.rows);
  const FilteredSpace f{w.layout, reinterpret_cast<SliceSummary*>(base + w.sums),
                        reinterpret_cast<Candidate*>(base + w.cands), reinterpret_cast<FilteredRow*>(base + w.filtered)};
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
  if (p.l > 0) {  // an empty grid is a launch error
    const auto blocks = static_cast<unsigned>(p.n * p.l * w.slices);
    // The tempered sum's pass wherever a sequence may score at a scale other than 1.
    if (p.s.temperature || spiffy_scale(p.s.scalar) != 1.0f)
      spiffy_rows_kernel<T, true><<<blocks, kThreads, 0, stream>>>(p, rows, w.slices, vector_ok);
    else
      spiffy_rows_kernel<T, false><<<blocks, kThreads, 0, stream>>>(p, rows, w.slices, vector_ok);
    if (p.filtered) {
      const int shift = cut_mass_shift(p.v);
      launch_spiffy_filtered_scan<T>(p, f, stream);
      spiffy_select_kernel<<<static_cast<unsigned>(p.n * p.l), kThreads, 0, stream>>>(p, f, shift);
      launch_spiffy_filtered_rows<T>(p, f, stream);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  spiffy_materialize_kernel<<<p.n, kThreads, 0, stream>>>(p, p.filtered ? f.rows : nullptr, rows, w.slices, pos,
                                                          order, score, state);
  return cudaGetLastError();
}

}  // namespace

size_t spiffy_materialize_workspace_bytes(const SpiffyMaterializeParams& p) { return workspace_of(p).bytes; }

cudaError_t launch_spiffy_materialize(const SpiffyMaterializeParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  if (p.filtered && p.n * p.l * workspace_of(p).layout.slices > 0x7FFFFFFF) return cudaErrorInvalidValue;  // the scan's grid
  return by_dtype(p.dtype, [&](auto tag) { return materialize_typed<decltype(tag)>(p, workspace, stream); });
}

}  // namespace xkernels::cuda
