// What the files of the refine CUDA kernels share (refine_kernel.cu's split, so that no translation
// unit compiles for long): the launch's rows and workspace, and the epilogue's per-id rule. The
// fused read is refine_read_fused_kernel.cu's, the filtered rows' pick refine_filtered_pick_kernel.cu's;
// refine_kernel.cu runs the passes.
#pragma once

#include "device_utils.cuh"
#include "refine_launch.h"
#include "row_filter.cuh"

namespace xkernels::cuda {

// The fused read: a step reads a tile of 64 ids (4 wmma column tiles, a warp pair each), and a
// thread issues at most 8 loads of 16 bytes a step (the tile at the largest rank): 32 KB in flight
// a block, 64 KB an SM at two blocks an SM.
constexpr int kReadTile = 64;
constexpr int kReadTileGroups = kReadTile / 4;  // Philox groups of a tile
constexpr int kReadLoads = kReadTile * static_cast<int>(kRefineFusedMaxRank) * 2 / 16 / kThreads;
constexpr int kReadBlocksPerSm = 2;
constexpr int kReadProdLd = kReadTile + 4;  // floats a row of a tile's products in shared memory

// bfloat16 elements a row of z or of a w_read tile takes in shared memory: r rounded up to the
// wmma depth (16) plus 8, so that consecutive rows start 4 banks apart (conflict-free fragment loads).
__host__ __device__ __forceinline__ int read_ld(int64_t r) { return static_cast<int>((r + 15) / 16 * 16 + 8); }

struct RefineWorkspace {
  float* u;              // [n, b, r] after the mix
  float* hid;            // [n, d, h]
  void* z;               // [n, d, r] in the weights' type
  float* dots;           // [rows, slice] products of one GEMM slice
  SampledRow* partial;   // [rows, partials] of the launch
  int64_t* new_tokens;   // [n, d]
  float* new_logprobs;   // [n, d]
  int32_t* active;       // [n]
  int32_t* first_dirty;  // [n]: drafted slots before it read unchanged tokens (final)
  float* logits;         // [rows, v] of a launch with filters: filtered rows' logits
  void* candidates;      // a launch with filters: its filtered rows' candidates (filtered_candidates_bytes)
};

// The rows one launch sequence works on: drafted slots [d_begin, d_begin + d_count) of the
// active sequences; either every slot (d_begin = 0, d_count = d) or one.
struct RowSet {
  const int64_t* drafted;      // the current drafted tokens [n, d]
  const int32_t* active;       // null: every sequence
  const int32_t* first_dirty;  // null: every slot of the range
  int64_t d_begin, d_count;
  bool read;  // false: the drafter's own sample, s alone
};

__device__ __forceinline__ bool is_active(const RowSet& rs, int64_t n) { return !rs.active || rs.active[n]; }

// Whether row (n, drafted slot d) is computed in this launch.
__device__ __forceinline__ bool is_live(const RowSet& rs, int64_t n, int64_t d) {
  return is_active(rs, n) && (!rs.first_dirty || d >= rs.first_dirty[n]);
}

__device__ __forceinline__ bool row_live(const RefineParams& p, const RowSet& rs, int64_t m) {
  return m < p.n * rs.d_count && is_live(rs, m / rs.d_count, rs.d_begin + m % rs.d_count);
}

// Row m of the launch and its place in hid, z [n, d, .].
__device__ __forceinline__ int64_t row_index(const RefineParams& p, const RowSet& rs, int64_t m) {
  return m / rs.d_count * p.d + rs.d_begin + m % rs.d_count;
}

// How row (sequence n, drafted slot d) scales and draws: its sequence's temperature, and the
// Philox key of its slot in its sequence's stream.
struct RowNoise {
  float scale;
  bool greedy;
  uint64_t seed, offset;
  uint32_t sequence, position;
};

__device__ __forceinline__ RowNoise row_noise(const RefineParams& p, int64_t n, int64_t d) {
  const float inv_t = p.s.row(n).inv_t;
  const RowStream st = p.s.stream(n);
  const auto slot = static_cast<uint32_t>(d);
  return RowNoise{inv_t == 0.0f ? 1.0f : inv_t, inv_t == 0.0f, st.seed, st.offset_at(slot), st.sequence_at(),
                  st.position_at(slot)};
}

// Whether sequence n's rows sample with a filter (their logits are kept for the cut pass).
__device__ __forceinline__ bool row_filtered(const RefineParams& p, int64_t n) {
  if (!p.filter) return false;
  const RowSampling r = p.s.row(n);
  return r.inv_t != 0.0f && filters_active(r, p.v);
}

// Keeps logits x of ids 4q + j (those below v) of launch row m, a filtered row.
__device__ __forceinline__ void keep_logits(const RefineParams& p, const RefineWorkspace& w, int64_t m, int64_t q,
                                            const float (&x)[4], int64_t v) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (4 * q + j < v) w.logits[m * p.v + 4 * q + j] = x[j];
}

// The epilogue of vocabulary ids 4q + j (j < 4; those below v) of one row, given their logits
// x[j] = base logit + product: a = x * scale, then the Gumbel-max pick and softmax statistics.
// The four ids share one Philox draw, drawn only if one of them can still win.
__device__ __forceinline__ void observe_group(SampledRow& best, const float (&x)[4], int64_t q, int64_t v,
                                              const RowNoise& rn) {
  const float scale = rn.scale;
  const bool greedy = rn.greedy;
  float a[4];
  bool live = false;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t id = 4 * q + j;
    a[j] = id < v ? x[j] * scale : kNegInf;
    live |= id < v && a[j] + kGumbelBound >= best.pick.val;
  }
  Philox4 r{{0, 0, 0, 0}};
  if (!greedy && live) r = philox_draw(rn.seed, rn.offset, rn.sequence, rn.position, static_cast<uint32_t>(q));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (4 * q + j >= v) continue;
    const float noise = greedy ? 0.0f : live ? gumbel_from_word(r.w[j]) : kNegInf;
    sampled_observe(best, a[j], noise, static_cast<int32_t>(4 * q + j));
  }
}

#define XK_RETURN_IF_FAILED(...)                  \
  do {                                            \
    const cudaError_t err_ = (__VA_ARGS__);       \
    if (err_ != cudaSuccess) return err_;         \
  } while (0)

// The fused read of a pass (plan.fused; refine_read_fused_kernel.cu, for float, __nv_bfloat16 and
// __half base logits).
template <typename TB>
cudaError_t launch_read_fused(const RefineParams& p, const RowSet& rs, const RefineWorkspace& w,
                              const RefineReadPlan& plan, cudaStream_t stream);

// Bytes of RefineWorkspace::candidates for launches of up to `rows` rows (refine_filtered_pick_kernel.cu).
size_t filtered_candidates_bytes(const RefineParams& p, int64_t rows);

// filtered_pick over the `rows` rows of a pass (refine_filtered_pick_kernel.cu).
cudaError_t launch_filtered_pick(const RefineParams& p, const RowSet& rs, const RefineWorkspace& w, int64_t rows,
                                 int64_t partials, int64_t* tokens, float* logprobs, cudaStream_t stream);

}  // namespace xkernels::cuda
