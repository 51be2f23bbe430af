// The xPress refine ops on CUDA. A pass is five launches that never wait on the host:
//  1. front_mix:    u = ctx + emb[prev], then the per-channel causal mix (thread per channel)
//  2. front_hidden: hid = silu(w_gate u) * (w_up u), a block per (row, 64 hidden units)
//  3. front_down:   z = u + w_down hid, a block per (row, 64 channels)
//  4. read:         the rank-to-vocab read split over the vocabulary across the GPU, keeping per
//                   row the Gumbel-max pick and the softmax statistics (the logits are never
//                   stored). bfloat16 weights: tensor cores (wmma, bf16 in, fp32 accumulate), a
//                   block streams its slice of w_read for up to 64 rows. Otherwise CUDA cores: a
//                   block streams its slice for 8 rows, a warp takes 4 vocabulary ids at a time
//                   and one transposed reduction gives each lane one (row, id) dot product.
//  5. finish:       merges the slices: token and log-probability per row
// Jacobi adds an update launch per pass (convergence flags live on the device), so max_iters
// passes are a fixed launch sequence a CUDA graph can capture; blocks of converged sequences,
// and of slots before a sequence's first change (final), exit at once. Token ids outside [0, V)
// read a zero embedding row.
#include <mma.h>

#include <type_traits>

#include "device_utils.cuh"
#include "refine_launch.h"

namespace xkernels::cuda {
namespace {

constexpr int kRowGroup = 8;        // rows of a CUDA-core read block
constexpr int kFrontThreads = 64;   // channels (front_mix) or units (front_hidden, front_down) a block
constexpr int kMmaWarps = 4;        // warps of a tensor-core read block
constexpr int kMmaMaxRows = 64;     // rows of a tensor-core read block, at most
constexpr int kZElems = 16 * 1024;  // bf16 z staged per tensor-core block (32 KB): rows * r <= this

struct RefineWorkspace {
  float* u;              // [n, b, r] after the mix
  float* hid;            // [n, d, h]
  float* z;              // [n, d, r]
  SampledRow* partial;   // [rows, tiles] of the launch
  int64_t* new_tokens;   // [n, d]
  float* new_logprobs;   // [n, d]
  int32_t* active;       // [n]
  int32_t* first_dirty;  // [n]: drafted slots before it read unchanged tokens (final)
};

// The rows one launch sequence works on: drafted slots [d_begin, d_begin + d_count) of the
// active sequences.
struct RowSet {
  const int64_t* drafted;      // the current drafted tokens [n, d]
  const int32_t* active;       // null: every sequence
  const int32_t* first_dirty;  // null: every slot of the range
  int64_t d_begin, d_count;
  bool read;  // false: the drafter's own sample, s alone
};

// How the read of one launch is split.
struct ReadPlan {
  bool mma;        // tensor cores
  int rows_block;  // rows a block reads
  int tiles;       // vocabulary slices
};

__device__ __forceinline__ bool is_active(const RowSet& rs, int64_t n) { return !rs.active || rs.active[n]; }

// Whether row (n, drafted slot d) is computed in this launch.
__device__ __forceinline__ bool is_live(const RowSet& rs, int64_t n, int64_t d) {
  return is_active(rs, n) && (!rs.first_dirty || d >= rs.first_dirty[n]);
}

__device__ __forceinline__ bool row_live(const RefineParams& p, const RowSet& rs, int64_t m) {
  return m < p.n * rs.d_count && is_live(rs, m / rs.d_count, rs.d_begin + m % rs.d_count);
}

__device__ __forceinline__ int64_t prev_token(const RefineParams& p, const RowSet& rs, int64_t n, int64_t k) {
  return k < p.prefix_len ? p.prefix[n * p.prefix_len + k] : rs.drafted[n * p.d + (k - p.prefix_len)];
}

template <typename TW>
__global__ void __launch_bounds__(kFrontThreads) front_mix_kernel(RefineParams p, RowSet rs, RefineWorkspace w) {
  const int64_t chunks = (p.r + kFrontThreads - 1) / kFrontThreads;
  const int64_t n = blockIdx.x / chunks, c = blockIdx.x % chunks * kFrontThreads + threadIdx.x;
  if (!is_active(rs, n) || c >= p.r) return;
  const TW* emb = static_cast<const TW*>(p.emb);
  const TW* mix = static_cast<const TW*>(p.mix);
  const int64_t slots = p.f + rs.d_begin + rs.d_count;  // the mix of the last slot read needs all before it
  float u[kRefineMaxSlots];
  for (int64_t k = 0; k < slots; ++k) {
    const int64_t tok = prev_token(p, rs, n, k);
    const float e = tok >= 0 && tok < p.v ? to_float(emb[tok * p.r + c]) : 0.0f;
    u[k] = p.ctx[(n * p.b + k) * p.r + c] + e;
  }
  for (int64_t k = 0; k < slots; ++k) {
    const TW* row = mix + (c * p.b + k) * p.b;
    float acc = 0.0f;
    for (int64_t j = 0; j <= k; ++j) acc += to_float(row[j]) * u[j];
    w.u[(n * p.b + k) * p.r + c] = acc;
  }
}

// Row m of the launch and its place in u [n, b, r] and hid, z [n, d, r].
struct FrontRow {
  int64_t n, d;
  bool live;
};

__device__ __forceinline__ FrontRow front_row(const RefineParams& p, const RowSet& rs, int64_t m) {
  const int64_t n = m / rs.d_count, d = rs.d_begin + m % rs.d_count;
  return FrontRow{n, d, is_live(rs, n, d)};
}

// hid[j] = silu(w_gate[j] . u) * (w_up[j] . u): a warp per unit, 64 units a block.
template <typename TW>
__global__ void __launch_bounds__(kThreads) front_hidden_kernel(RefineParams p, RowSet rs, RefineWorkspace w) {
  const int64_t chunks = (p.h + kFrontThreads - 1) / kFrontThreads;
  const FrontRow row = front_row(p, rs, blockIdx.x / chunks);
  if (!row.live) return;
  const int64_t j0 = blockIdx.x % chunks * kFrontThreads;
  const float* u = w.u + (row.n * p.b + p.f + row.d) * p.r;
  const TW* w_gate = static_cast<const TW*>(p.w_gate);
  const TW* w_up = static_cast<const TW*>(p.w_up);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t j = j0 + warp; j < p.h && j < j0 + kFrontThreads; j += kWarps) {
    float g = 0.0f, up = 0.0f;
    for (int64_t c = lane; c < p.r; c += 32) {
      g += to_float(w_gate[j * p.r + c]) * u[c];
      up += to_float(w_up[j * p.r + c]) * u[c];
    }
    g = warp_sum(g);
    up = warp_sum(up);
    if (lane == 0) w.hid[(row.n * p.d + row.d) * p.h + j] = g / (1.0f + expf(-g)) * up;
  }
}

// z[c] = u[c] + w_down[c] . hid: a warp per channel, 64 channels a block.
template <typename TW>
__global__ void __launch_bounds__(kThreads) front_down_kernel(RefineParams p, RowSet rs, RefineWorkspace w) {
  const int64_t chunks = (p.r + kFrontThreads - 1) / kFrontThreads;
  const FrontRow row = front_row(p, rs, blockIdx.x / chunks);
  if (!row.live) return;
  const int64_t c0 = blockIdx.x % chunks * kFrontThreads;
  const float* hid = w.hid + (row.n * p.d + row.d) * p.h;
  const TW* w_down = static_cast<const TW*>(p.w_down);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t c = c0 + warp; c < p.r && c < c0 + kFrontThreads; c += kWarps) {
    float acc = 0.0f;
    for (int64_t j = lane; j < p.h; j += 32) acc += to_float(w_down[c * p.h + j]) * hid[j];
    acc = warp_sum(acc);
    if (lane == 0) w.z[(row.n * p.d + row.d) * p.r + c] = w.u[(row.n * p.b + p.f + row.d) * p.r + c] + acc;
  }
}

// The epilogue of vocabulary ids 4q + j (j in [first, first + count)) of one row:
// a = (s + dot[j]) * scale, then the Gumbel-max pick and softmax statistics. The four ids share
// one Philox draw, drawn only if one of them can still win.
template <typename TB>
__device__ __forceinline__ void observe_ids(SampledRow& best, const TB* s, const float* dot, int64_t q, int first,
                                            int count, int64_t v, float scale, bool greedy, uint64_t seed,
                                            uint64_t offset, uint32_t n, uint32_t d) {
  float a[4];
  bool live = false;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t id = 4 * q + j;
    const bool mine = j >= first && j < first + count && id < v;
    a[j] = mine ? (to_float(s[id]) + dot[j]) * scale : kNegInf;
    live |= mine && a[j] + kGumbelBound >= best.pick.val;
  }
  Philox4 r{{0, 0, 0, 0}};
  if (!greedy && live) r = philox_draw(seed, offset, n, d, static_cast<uint32_t>(q));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (j < first || j >= first + count || 4 * q + j >= v) continue;
    const float noise = greedy ? 0.0f : live ? gumbel_from_word(r.w[j]) : kNegInf;
    sampled_observe(best, a[j], noise, static_cast<int32_t>(4 * q + j));
  }
}

// One step of the transposed warp reduction of 2 * kHalf values a lane: the lanes with bit
// kHalf set keep the upper half, their partners the lower, and each adds its partner's copy.
template <int kHalf>
__device__ __forceinline__ void transpose_reduce_step(float* acc, int lane) {
  const bool upper = lane & kHalf;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? acc[i] : acc[i + kHalf];
    const float keep = upper ? acc[i + kHalf] : acc[i];
    acc[i] = keep + __shfl_xor_sync(kFullMask, send, kHalf);
  }
}

__device__ __forceinline__ SampledRow shfl_sampled(const SampledRow& s, int delta) {
  SampledRow o;
  o.pick = shfl_argmax(s.pick, delta);
  o.pick_a = __shfl_xor_sync(kFullMask, s.pick_a, delta);
  o.stats = RowStats{shfl_argmax(s.stats.top, delta), __shfl_xor_sync(kFullMask, s.stats.sum, delta)};
  return o;
}

// The vocabulary slice of `tile`, in groups of 4 ids [q_begin, q_end).
struct Slice {
  int64_t q_begin, q_end;
};

__device__ __forceinline__ Slice slice_of(int64_t v, int tiles, int tile, int64_t align_groups) {
  const int64_t groups = (v + 3) / 4;
  const int64_t per = ((groups + tiles - 1) / tiles + align_groups - 1) / align_groups * align_groups;
  const int64_t begin = per * tile;
  return Slice{begin < groups ? begin : groups, begin + per < groups ? begin + per : groups};
}

// CUDA cores: 8 rows a block, a warp per 4 vocabulary ids.
template <typename TB, typename TW>
__global__ void __launch_bounds__(kThreads) read_simt_kernel(RefineParams p, RowSet rs, RefineWorkspace w,
                                                             int tiles) {
  __shared__ float zs[kRowGroup][kRefineMaxRank];
  __shared__ SampledRow merged[kWarps][kRowGroup];
  const int64_t m0 = blockIdx.x / tiles * kRowGroup;
  const int tile = static_cast<int>(blockIdx.x % tiles);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  bool any_live = false;  // blocks of converged sequences exit at once
  for (int g = 0; g < kRowGroup; ++g) any_live |= row_live(p, rs, m0 + g);
  if (!any_live) return;
  if (rs.read) {
    for (int g = 0; g < kRowGroup; ++g) {
      const int64_t m = m0 + g;
      const bool live = row_live(p, rs, m);
      const float* z = live ? w.z + ((m / rs.d_count) * p.d + rs.d_begin + m % rs.d_count) * p.r : nullptr;
      for (int64_t c = threadIdx.x; c < p.r; c += kThreads) zs[g][c] = live ? z[c] : 0.0f;
    }
    __syncthreads();
  }
  // After the transposed reduction lane l holds the dot product of row l / 4 and id 4q + l % 4.
  const int g = lane / 4, j = lane % 4;
  const int64_t m = m0 + g;
  const bool mine = row_live(p, rs, m);
  const int64_t n = m / rs.d_count, d = rs.d_begin + m % rs.d_count;
  const uint64_t seed = read_or(p.seed_ptr, p.seed), offset = read_or(p.offset_ptr, p.offset);
  const bool greedy = p.inv_t == 0.0f;
  const float scale = greedy ? 1.0f : p.inv_t;
  const TB* base = static_cast<const TB*>(p.base) + (mine ? (n * p.d + d) * p.v : 0);
  const TW* w_read = static_cast<const TW*>(p.w_read);
  const Slice slice = slice_of(p.v, tiles, tile, 1);

  SampledRow best = sampled_empty();
  for (int64_t q = slice.q_begin + warp; q < slice.q_end; q += kWarps) {
    float dot = 0.0f;
    if (rs.read) {
      float acc[32];  // acc[4 * row + id]
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
      for (int64_t c = lane; c < p.r; c += 32) {
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const float x = 4 * q + jj < p.v ? to_float(w_read[(4 * q + jj) * p.r + c]) : 0.0f;
#pragma unroll
          for (int gg = 0; gg < kRowGroup; ++gg) acc[4 * gg + jj] += x * zs[gg][c];
        }
      }
      // 31 shuffles in all; lane l ends with the warp's sum of acc[l].
      transpose_reduce_step<16>(acc, lane);
      transpose_reduce_step<8>(acc, lane);
      transpose_reduce_step<4>(acc, lane);
      transpose_reduce_step<2>(acc, lane);
      transpose_reduce_step<1>(acc, lane);
      dot = acc[0];
    }
    const float dots[4] = {dot, dot, dot, dot};  // only id j is this lane's
    if (mine) observe_ids(best, base, dots, q, j, 1, p.v, scale, greedy, seed, offset, static_cast<uint32_t>(n),
                          static_cast<uint32_t>(d));
  }
  // Merge the 4 lanes of a row, then the warps.
  best = sampled_merge(best, shfl_sampled(best, 1));
  best = sampled_merge(best, shfl_sampled(best, 2));
  if (j == 0) merged[warp][g] = best;
  __syncthreads();
  if (threadIdx.x < kRowGroup && row_live(p, rs, m0 + threadIdx.x)) {
    SampledRow r = sampled_empty();
    for (int k = 0; k < kWarps; ++k) r = sampled_merge(r, merged[k][threadIdx.x]);
    w.partial[(m0 + threadIdx.x) * tiles + tile] = r;
  }
}

// Tensor cores (bfloat16 weights, r a multiple of 16): up to 64 rows a block (z staged in
// shared memory as bf16), a warp per 16 vocabulary ids; the 16 x 16 accumulator tiles go
// through shared memory to the epilogue, where lane l takes row l / 2 and 8 of the 16 ids.
template <typename TB>
__global__ void __launch_bounds__(kMmaWarps * 32) read_mma_kernel(RefineParams p, RowSet rs, RefineWorkspace w,
                                                                  int tiles, int rows_block) {
  namespace wmma = nvcuda::wmma;
  constexpr int kMaxTiles = kMmaMaxRows / 16;
  __shared__ __align__(32) __nv_bfloat16 zs[kZElems];
  __shared__ __align__(32) float stage[kMmaWarps][16 * 16];
  __shared__ __align__(32) __nv_bfloat16 tail[kMmaWarps][16 * 16];
  __shared__ SampledRow merged[kMmaWarps][kMmaMaxRows];
  const int blocks_m = static_cast<int>((p.n * rs.d_count + rows_block - 1) / rows_block);
  const int64_t m0 = static_cast<int64_t>(blockIdx.x % blocks_m) * rows_block;  // row blocks of a slice are adjacent (L2)
  const int tile = static_cast<int>(blockIdx.x / blocks_m);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int m_tiles = rows_block / 16;

  bool any_live = false;
  for (int i = 0; i < rows_block; ++i) any_live |= row_live(p, rs, m0 + i);
  if (!any_live) return;
  for (int64_t i = threadIdx.x; i < rows_block * p.r; i += kMmaWarps * 32) {
    const int64_t m = m0 + i / p.r;
    const float x = row_live(p, rs, m) ? w.z[((m / rs.d_count) * p.d + rs.d_begin + m % rs.d_count) * p.r + i % p.r]
                                       : 0.0f;
    zs[i] = __float2bfloat16(x);
  }
  __syncthreads();

  const uint64_t seed = read_or(p.seed_ptr, p.seed), offset = read_or(p.offset_ptr, p.offset);
  const bool greedy = p.inv_t == 0.0f;
  const float scale = greedy ? 1.0f : p.inv_t;
  const __nv_bfloat16* w_read = static_cast<const __nv_bfloat16*>(p.w_read);
  const Slice slice = slice_of(p.v, tiles, tile, 4);  // whole 16-id tiles
  const int row_in_tile = lane / 2, half = lane % 2;
  SampledRow best[kMaxTiles];
#pragma unroll
  for (int t = 0; t < kMaxTiles; ++t) best[t] = sampled_empty();

  for (int64_t q0 = slice.q_begin + 4 * warp; q0 < slice.q_end; q0 += 4 * kMmaWarps) {
    const int64_t v0 = 4 * q0;
    const bool full = v0 + 16 <= p.v;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kMaxTiles];
#pragma unroll
    for (int t = 0; t < kMaxTiles; ++t)
      if (t < m_tiles) wmma::fill_fragment(acc[t], 0.0f);
#pragma unroll 4  // four B fragments in flight a warp: the N = 1 read is a stream of w_read
    for (int64_t k = 0; k < p.r; k += 16) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
      if (full) {
        wmma::load_matrix_sync(b, w_read + v0 * p.r + k, static_cast<unsigned>(p.r));
      } else {  // the last, partial tile: ids past V read as zero
        for (int i = lane; i < 256; i += 32) {
          const int64_t id = v0 + i / 16;
          tail[warp][i] = id < p.v ? w_read[id * p.r + k + i % 16] : __float2bfloat16(0.0f);
        }
        __syncwarp();
        wmma::load_matrix_sync(b, tail[warp], 16);
      }
#pragma unroll
      for (int t = 0; t < kMaxTiles; ++t) {
        if (t >= m_tiles) continue;
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::load_matrix_sync(a, zs + t * 16 * p.r + k, static_cast<unsigned>(p.r));
        wmma::mma_sync(acc[t], a, b, acc[t]);
      }
      if (!full) __syncwarp();  // tail is rewritten by the next k step
    }
#pragma unroll
    for (int t = 0; t < kMaxTiles; ++t) {
      if (t >= m_tiles) continue;
      wmma::store_matrix_sync(stage[warp], acc[t], 16, wmma::mem_row_major);
      __syncwarp();
      const int64_t m = m0 + t * 16 + row_in_tile;
      if (row_live(p, rs, m)) {
        const uint32_t n = static_cast<uint32_t>(m / rs.d_count), d = static_cast<uint32_t>(rs.d_begin + m % rs.d_count);
        const TB* base = static_cast<const TB*>(p.base) + (n * p.d + d) * p.v;
        const float* dot = stage[warp] + row_in_tile * 16 + 8 * half;
        const int64_t q = q0 + 2 * half;
        observe_ids(best[t], base, dot, q, 0, 4, p.v, scale, greedy, seed, offset, n, d);
        observe_ids(best[t], base, dot + 4, q + 1, 0, 4, p.v, scale, greedy, seed, offset, n, d);
      }
      __syncwarp();
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxTiles; ++t) {
    if (t >= m_tiles) continue;
    const SampledRow r = sampled_merge(best[t], shfl_sampled(best[t], 1));
    if (half == 0) merged[warp][t * 16 + row_in_tile] = r;
  }
  __syncthreads();
  if (threadIdx.x < rows_block && row_live(p, rs, m0 + threadIdx.x)) {
    SampledRow r = sampled_empty();
    for (int k = 0; k < kMmaWarps; ++k) r = sampled_merge(r, merged[k][threadIdx.x]);
    w.partial[(m0 + threadIdx.x) * tiles + tile] = r;
  }
}

__global__ void finish_kernel(RefineParams p, RowSet rs, RefineWorkspace w, int tiles, int64_t* tokens,
                              float* logprobs) {
  const int64_t m = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (!row_live(p, rs, m)) return;
  const int64_t n = m / rs.d_count, d = rs.d_begin + m % rs.d_count;
  SampledRow r = sampled_empty();
  for (int t = 0; t < tiles; ++t) r = sampled_merge(r, w.partial[m * tiles + t]);
  tokens[n * p.d + d] = sampled_token(r);
  logprobs[n * p.d + d] = sampled_logprob(r);
}

__global__ void jacobi_init_kernel(RefineWorkspace w, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) w.active[i] = 1, w.first_dirty[i] = 0;
}

// After a pass: adopt the recomputed tokens of active sequences, count the pass, stop the
// sequences whose tokens did not change, and mark the slots after the first change dirty.
__global__ void jacobi_update_kernel(RefineParams p, RefineWorkspace w, int64_t* tokens, float* logprobs,
                                     int32_t* iters) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= p.n || !w.active[n]) return;
  int64_t first_change = -1;
  for (int64_t d = w.first_dirty[n]; d < p.d; ++d) {
    const int64_t i = n * p.d + d;
    if (first_change < 0 && tokens[i] != w.new_tokens[i]) first_change = d;
    tokens[i] = w.new_tokens[i];
    logprobs[i] = w.new_logprobs[i];
  }
  iters[n] += 1;
  w.active[n] = first_change >= 0 ? 1 : 0;
  if (first_change >= 0) w.first_dirty[n] = static_cast<int32_t>(first_change + 1);
}

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int clamp_tiles(int64_t want, int64_t most) {
  const int64_t t = want < most ? want : most;
  return static_cast<int>(t < 1 ? 1 : t);
}

ReadPlan read_plan(const RefineParams& p, int64_t rows, bool read) {
  // An empty launch still gets a valid plan: every division below is by a count derived from rows.
  rows = rows < 1 ? 1 : rows;
  ReadPlan plan;
  plan.mma = read && p.weight_type == WeightType::kBFloat16 && p.r % 16 == 0 && p.cc_major >= 8 &&
             reinterpret_cast<uintptr_t>(p.w_read) % 32 == 0;
  if (plan.mma) {
    // As many 16-row tiles as the rows need, at most 4 and at most what the z stage holds.
    const int64_t by_stage = kZElems / p.r / 16, by_rows = ceil_div(rows, 16);
    int64_t tiles_m = by_stage < by_rows ? by_stage : by_rows;
    tiles_m = tiles_m < kMmaMaxRows / 16 ? tiles_m : kMmaMaxRows / 16;
    plan.rows_block = static_cast<int>(16 * tiles_m);
    // Two waves of 8 blocks an SM; a slice keeps at least one 16-id tile per warp.
    plan.tiles = clamp_tiles(ceil_div(16 * static_cast<int64_t>(p.num_sms), ceil_div(rows, plan.rows_block)),
                             ceil_div(p.v, 16 * kMmaWarps));
  } else {
    plan.rows_block = kRowGroup;
    plan.tiles = clamp_tiles(ceil_div(8 * static_cast<int64_t>(p.num_sms), ceil_div(rows, kRowGroup)),
                             ceil_div(p.v, 256));
  }
  return plan;
}

// Slices per row that the partial buffer must hold: the most any launch of the ops uses
// (rows = n * d for refine_step and Jacobi, n for a sequential step).
int64_t partial_rows_times_tiles(const RefineParams& p) {
  int64_t most = 0;
  for (int64_t rows : {p.n * p.d, p.n})
    for (bool read : {true, false}) {
      const int64_t x = rows * read_plan(p, rows, read).tiles;
      most = x > most ? x : most;
    }
  return most;
}

struct Layout {
  size_t u, hid, z, partial, tokens, logprobs, flags;
};

Layout layout(const RefineParams& p) {
  return Layout{align_up(sizeof(float) * p.n * p.b * p.r),
                align_up(sizeof(float) * p.n * p.d * p.h),
                align_up(sizeof(float) * p.n * p.d * p.r),
                align_up(sizeof(SampledRow) * partial_rows_times_tiles(p)),
                align_up(sizeof(int64_t) * p.n * p.d),
                align_up(sizeof(float) * p.n * p.d),
                align_up(sizeof(int32_t) * p.n)};
}

RefineWorkspace carve(const RefineParams& p, void* workspace) {
  const Layout l = layout(p);
  char* at = static_cast<char*>(workspace);
  auto take = [&](size_t bytes) {
    char* out = at;
    at += bytes;
    return out;
  };
  RefineWorkspace w;
  w.u = reinterpret_cast<float*>(take(l.u));
  w.hid = reinterpret_cast<float*>(take(l.hid));
  w.z = reinterpret_cast<float*>(take(l.z));
  w.partial = reinterpret_cast<SampledRow*>(take(l.partial));
  w.new_tokens = reinterpret_cast<int64_t*>(take(l.tokens));
  w.new_logprobs = reinterpret_cast<float*>(take(l.logprobs));
  w.active = reinterpret_cast<int32_t*>(take(l.flags));
  w.first_dirty = reinterpret_cast<int32_t*>(take(l.flags));
  return w;
}

#define XK_RETURN_IF_LAUNCH_FAILED()                 \
  do {                                               \
    const cudaError_t err_ = cudaGetLastError();     \
    if (err_ != cudaSuccess) return err_;            \
  } while (0)

// One pass over `rs`, writing tokens and logprobs [n, d] at the rows of rs.
template <typename TB, typename TW>
cudaError_t pass(const RefineParams& p, const RowSet& rs, const RefineWorkspace& w, int64_t* tokens,
                 float* logprobs, cudaStream_t stream) {
  const int64_t rows = p.n * rs.d_count;
  if (rs.read) {
    front_mix_kernel<TW><<<p.n * ceil_div(p.r, kFrontThreads), kFrontThreads, 0, stream>>>(p, rs, w);
    XK_RETURN_IF_LAUNCH_FAILED();
    front_hidden_kernel<TW><<<rows * ceil_div(p.h, kFrontThreads), kThreads, 0, stream>>>(p, rs, w);
    XK_RETURN_IF_LAUNCH_FAILED();
    front_down_kernel<TW><<<rows * ceil_div(p.r, kFrontThreads), kThreads, 0, stream>>>(p, rs, w);
    XK_RETURN_IF_LAUNCH_FAILED();
  }
  const ReadPlan plan = read_plan(p, rows, rs.read);
  const int64_t blocks = ceil_div(rows, plan.rows_block) * plan.tiles;
  if constexpr (std::is_same_v<TW, __nv_bfloat16>) {
    if (plan.mma) {
      read_mma_kernel<TB><<<blocks, kMmaWarps * 32, 0, stream>>>(p, rs, w, plan.tiles, plan.rows_block);
      XK_RETURN_IF_LAUNCH_FAILED();
    }
  }
  if (!plan.mma) {
    read_simt_kernel<TB, TW><<<blocks, kThreads, 0, stream>>>(p, rs, w, plan.tiles);
    XK_RETURN_IF_LAUNCH_FAILED();
  }
  finish_kernel<<<ceil_div(rows, 128), 128, 0, stream>>>(p, rs, w, plan.tiles, tokens, logprobs);
  XK_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

enum class Op { kStep, kJacobi, kSequential };

template <typename TB, typename TW>
cudaError_t run(Op op, const RefineParams& p, int64_t max_iters, void* workspace, int64_t* tokens, float* logprobs,
                int32_t* iters, cudaStream_t stream) {
  const RefineWorkspace w = carve(p, workspace);
  switch (op) {
    case Op::kStep:
      return pass<TB, TW>(p, RowSet{nullptr, nullptr, nullptr, 0, p.d, true}, w, tokens, logprobs, stream);
    case Op::kJacobi: {
      cudaError_t err = pass<TB, TW>(p, RowSet{nullptr, nullptr, nullptr, 0, p.d, false}, w, tokens, logprobs,
                                     stream);  // x0
      if (err != cudaSuccess) return err;
      jacobi_init_kernel<<<ceil_div(p.n, 128), 128, 0, stream>>>(w, p.n);
      XK_RETURN_IF_LAUNCH_FAILED();
      // Pass t finalises slot t, so pass d + 1 changes nothing: no sequence is active after it.
      const int64_t passes = max_iters < p.d + 1 ? max_iters : p.d + 1;
      const RowSet rs{tokens, w.active, w.first_dirty, 0, p.d, true};
      for (int64_t i = 0; i < passes; ++i) {
        if ((err = pass<TB, TW>(p, rs, w, w.new_tokens, w.new_logprobs, stream)) != cudaSuccess) return err;
        jacobi_update_kernel<<<ceil_div(p.n, 128), 128, 0, stream>>>(p, w, tokens, logprobs, iters);
        XK_RETURN_IF_LAUNCH_FAILED();
      }
      return cudaSuccess;
    }
    case Op::kSequential:
      for (int64_t d = 0; d < p.d; ++d) {
        const cudaError_t err =
            pass<TB, TW>(p, RowSet{tokens, nullptr, nullptr, d, 1, true}, w, tokens, logprobs, stream);
        if (err != cudaSuccess) return err;
      }
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}

cudaError_t dispatch(Op op, const RefineParams& p, int64_t max_iters, void* workspace, int64_t* tokens,
                     float* logprobs, int32_t* iters, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const bool bf16_weights = p.weight_type == WeightType::kBFloat16;
  switch (p.base_type) {
    case LogitsType::kFloat32:
      return bf16_weights ? run<float, __nv_bfloat16>(op, p, max_iters, workspace, tokens, logprobs, iters, stream)
                          : run<float, float>(op, p, max_iters, workspace, tokens, logprobs, iters, stream);
    case LogitsType::kBFloat16:
      return bf16_weights
                 ? run<__nv_bfloat16, __nv_bfloat16>(op, p, max_iters, workspace, tokens, logprobs, iters, stream)
                 : run<__nv_bfloat16, float>(op, p, max_iters, workspace, tokens, logprobs, iters, stream);
    case LogitsType::kFloat16:
      return bf16_weights ? run<__half, __nv_bfloat16>(op, p, max_iters, workspace, tokens, logprobs, iters, stream)
                          : run<__half, float>(op, p, max_iters, workspace, tokens, logprobs, iters, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

size_t refine_workspace_bytes(const RefineParams& p) {
  const Layout l = layout(p);
  return l.u + l.hid + l.z + l.partial + l.tokens + l.logprobs + 2 * l.flags;
}

cudaError_t launch_refine_step(const RefineParams& p, void* workspace, int64_t* tokens, float* logprobs,
                               cudaStream_t stream) {
  return dispatch(Op::kStep, p, 0, workspace, tokens, logprobs, nullptr, stream);
}

cudaError_t launch_jacobi_refine(const RefineParams& p, int64_t max_iters, void* workspace, int64_t* tokens,
                                 float* logprobs, int32_t* iters, cudaStream_t stream) {
  return dispatch(Op::kJacobi, p, max_iters, workspace, tokens, logprobs, iters, stream);
}

cudaError_t launch_sequential_refine(const RefineParams& p, void* workspace, int64_t* tokens, float* logprobs,
                                     cudaStream_t stream) {
  return dispatch(Op::kSequential, p, 0, workspace, tokens, logprobs, nullptr, stream);
}

}  // namespace xkernels::cuda
