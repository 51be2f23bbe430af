// dllm_step on CUDA, launches that never wait on the host:
//  0. filtered: with filters, the masked rows that sample with a filter (dllm_filtered.cuh): a
//             block a row reads it once for its candidates and raw statistics, a block a row picks
//             its token from them, and a block a row the candidates did not settle picks it whole
//             (dllm_filtered_pick: two reads of the row); the other kernels skip those rows.
//             Instantiated a logits type a file: the selection is most of this op's compile time.
//  1. slices: every other masked row split in slices over the grid; a block reduces its slice to the raw
//             row's softmax statistics and, at T > 0 (the sequence's temperature), the tempered
//             row's argmax and the Gumbel-max with the noise of the position's slot of the
//             sequence's stream, reading the slice from HBM once.
//  2. merge:  a warp per position merges its row's slices into x0 (the raw argmax at T = 0; the
//             draw, or the tempered argmax when that row has no softmax) and the confidence
//             softmax(raw)[x0]. The rule is dllm_row.cuh's (spiffy_accept's warps run it whole).
//  3. select: a thread per sequence applies the unmasking rule of xkernels/dllm.h.
#include "device_utils.cuh"
#include "dllm_kernels.cuh"
#include "dllm_row.cuh"
#include "xkernels/dllm.h"

namespace xkernels::cuda {
namespace {

// One slice of a masked row.
struct DllmSlice {
  RowStats raw;     // the raw logits (the mask token at -inf)
  ArgMax tempered;  // argmax of logits / T
  ArgMax drawn;     // Gumbel-max of logits / T
};

// Slices per row (row_reduce.cuh's plan), and the workspace: x0, chosen, the slices, and with
// filters the candidate pipeline's (DllmCandidates, in that order of its fields).
struct DllmLayout {
  int slices;
  size_t x0_bytes, chosen_bytes, slice_bytes, sums_bytes, cands_bytes, raw_bytes, settled_bytes;
  size_t total() const { return x0_bytes + chosen_bytes + slice_bytes + sums_bytes + cands_bytes + raw_bytes + settled_bytes; }
};

DllmLayout dllm_layout(const DllmParams& p) {
  DllmLayout d{};
  const auto rows = static_cast<size_t>(p.n * p.l);
  d.slices = masked_row_slices(p.n * p.l, p.v, p.num_sms, p.dtype);
  d.x0_bytes = align_up(sizeof(int64_t) * rows);
  d.chosen_bytes = align_up(rows);
  d.slice_bytes = align_up(sizeof(DllmSlice) * rows * d.slices);
  if (p.rule.filtered) {
    d.sums_bytes = align_up(sizeof(SliceSummary) * rows);
    d.cands_bytes = align_up(sizeof(Candidate) * kSliceKeep * rows);
    d.raw_bytes = align_up(sizeof(RowStats) * rows);
    d.settled_bytes = align_up(sizeof(int32_t) * rows);
  }
  return d;
}

// Blocks of dllm_slices_kernel an SM: 3 (80 registers, sm_90a) for 2-byte logits; float32 rows, whose
// draw holds 16-byte groups in flight, take 2 (at 3 they spilled).
template <typename T>
constexpr int kSlicesBlocksPerSm = sizeof(T) == 4 ? 2 : 3;

// vector_ok: every row starts 16-byte aligned (row_reduce.cuh's vector loads). The second and third
// reads of the slice (a few KB a block) come from L2.
template <typename T>
__global__ void __launch_bounds__(kThreads, kSlicesBlocksPerSm<T>) dllm_slices_kernel(DllmParams p, DllmSlice* out,
                                                                                      int slices, bool vector_ok) {
  constexpr int kIds = 16 / sizeof(T);
  const int64_t row = blockIdx.x / slices;
  const int slice = static_cast<int>(blockIdx.x % slices);
  if (p.block[row] != p.rule.mask_id || filtered_row(p, row)) return;  // the same for the whole block
  // The emulation counts a read of the row where its first slice reads.
  const auto count_pass = [&] {
    if (slice == 0) XK_ROW_PASS();
  };
  count_pass();
  const T* src = static_cast<const T*>(p.logits) + row * p.v;
  const int64_t mask = p.rule.mask_id;
  const float inv_t = p.rule.s.row(row / p.l).inv_t;
  const SliceRange range = slice_range(p.v, kIds, slices, slice);
  __shared__ ArgMax start;  // the slice's tempered argmax, then its Gumbel score
  const RowStats raw = block_merge(thread_row_stats<T, false, 4>(src, p.v, range.begin, range.end, vector_ok, 1.0f,
                                                                 mask, threadIdx.x, kThreads),
                                   stats_empty());
  // Thread 0 holds each merge and stores it at once: nothing stays live through the later passes,
  // which keeps the kernel within the 80 registers of 3 blocks an SM.
  if (threadIdx.x == 0) {
    out[blockIdx.x] = DllmSlice{raw, argmax_empty(), argmax_empty()};
    start = raw.top;  // at T = 1 the tempered argmax (x * 1 is x): no second read
  }
  if (inv_t == 0.0f) return;  // the same for the whole block
  if (inv_t != 1.0f) {
    __syncthreads();  // block_merge's buffer is reused
    count_pass();
    const ArgMax tempered = block_merge(thread_row_stats<T, true, 4>(src, p.v, range.begin, range.end, vector_ok,
                                                                     inv_t, mask, threadIdx.x, kThreads),
                                        stats_empty())
                                .top;
    if (threadIdx.x == 0) start = tempered;
  }
  const RowStream st = p.rule.s.stream(row / p.l);
  const auto slot = static_cast<uint32_t>(row % p.l);
  const uint64_t seed = st.seed, offset = st.offset_at(slot);
  const uint32_t sequence = st.sequence_at(), position = st.position_at(slot);
  // Every thread starts from the exact score of the slice's tempered argmax (its value is the weight
  // dllm_draw computes for that id), so that gumbel_group skips most ids' logs from the first one.
  if (threadIdx.x == 0) {
    out[blockIdx.x].tempered = start;
    start = gumbel_score(start.val, start.idx, seed, offset, sequence, position);
  }
  __syncthreads();
  // The slice's chunks of kIds ids as groups of 4 (kIds is a multiple of 4).
  const int64_t groups = (p.v + 3) / 4, g_begin = range.begin * (kIds / 4);
  const int64_t g_end = range.end * (kIds / 4) < groups ? range.end * (kIds / 4) : groups;
  ArgMax best = start;
  count_pass();
  dllm_draw(src, p.v, mask, inv_t, keep_all(), seed, offset, sequence, position, vector_ok, g_begin, g_end, threadIdx.x,
            kThreads, best);
  __syncthreads();  // block_merge's buffer is reused
  const ArgMax drawn = block_merge(best, argmax_empty());
  if (threadIdx.x == 0) out[blockIdx.x].drawn = drawn;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) dllm_merge_kernel(DllmParams p, const DllmSlice* slices_of, int slices,
                                                              int64_t* x0) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= p.n * p.l || filtered_row(p, row)) return;  // dllm_filtered_kernel wrote it
  if (p.block[row] != p.rule.mask_id) {
    if (lane == 0) p.confidence[row] = kNegInf, x0[row] = -1;
    return;
  }
  DllmSlice d{stats_empty(), argmax_empty(), argmax_empty()};
  if (lane < slices) d = slices_of[row * slices + lane];
  const RowStats raw = warp_merge(d.raw);
  const ArgMax tempered = warp_merge(d.tempered), drawn = warp_merge(d.drawn);
  int32_t pick = raw.top.idx;
  if (p.rule.s.row(row / p.l).inv_t != 0.0f) {
    // A tempered row without a softmax is a point mass at its argmax; else the draw (dllm_row.cuh).
    pick = !is_finite_f32(tempered.val) || drawn.val == kNegInf ? tempered.idx : drawn.idx;
  }
  if (lane == 0) {
    const T* src = static_cast<const T*>(p.logits) + row * p.v;
    x0[row] = pick;
    p.confidence[row] = dllm_confidence(raw, dllm_logit(to_float(src[pick]), pick, p.rule.mask_id));
  }
}

__global__ void dllm_select_kernel(DllmParams p, const int64_t* x0, uint8_t* chosen) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= p.n) return;
  const int64_t o = n * p.l;
  dllm_select(p.confidence + o, p.block + o, x0 + o, p.l, p.rule.mask_id, p.rule.num_unmask, p.rule.use_threshold,
              p.rule.threshold, chosen + o, p.new_block + o, p.positions + o, p.tokens + o);
}

template <typename T>
cudaError_t launch_typed(const DllmParams& p, void* workspace, cudaStream_t stream) {
  const DllmLayout d = dllm_layout(p);
  char* at = static_cast<char*>(workspace);
  int64_t* x0 = reinterpret_cast<int64_t*>(at);
  uint8_t* chosen = reinterpret_cast<uint8_t*>(at + d.x0_bytes);
  DllmSlice* slices = reinterpret_cast<DllmSlice*>(at + d.x0_bytes + d.chosen_bytes);
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
  const int64_t rows = p.n * p.l;
  if (p.rule.filtered) {
    char* c = at + d.x0_bytes + d.chosen_bytes + d.slice_bytes;
    const DllmCandidates cands{reinterpret_cast<SliceSummary*>(c), reinterpret_cast<Candidate*>(c + d.sums_bytes),
                               reinterpret_cast<RowStats*>(c + d.sums_bytes + d.cands_bytes),
                               reinterpret_cast<int32_t*>(c + d.sums_bytes + d.cands_bytes + d.raw_bytes)};
    launch_dllm_filtered<T>(p, x0, cands, vector_ok, stream);
  }
  dllm_slices_kernel<T><<<rows * d.slices, kThreads, 0, stream>>>(p, slices, d.slices, vector_ok);
  dllm_merge_kernel<T><<<(rows + kWarps - 1) / kWarps, kThreads, 0, stream>>>(p, slices, d.slices, x0);
  dllm_select_kernel<<<(p.n + 63) / 64, 64, 0, stream>>>(p, x0, chosen);
  return cudaGetLastError();
}

}  // namespace

size_t dllm_workspace_bytes(const DllmParams& p) { return dllm_layout(p).total(); }

cudaError_t launch_dllm_step(const DllmParams& p, void* workspace, cudaStream_t stream) {
  if (p.n * p.l == 0) return cudaSuccess;
  switch (p.dtype) {
    case LogitsType::kFloat32: return launch_typed<float>(p, workspace, stream);
    case LogitsType::kBFloat16: return launch_typed<__nv_bfloat16>(p, workspace, stream);
    case LogitsType::kFloat16: return launch_typed<__half>(p, workspace, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace xkernels::cuda
