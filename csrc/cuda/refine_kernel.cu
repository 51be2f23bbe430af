// The xPress refine ops on CUDA. A pass is four launches that never wait on the host:
//  1. front_mix:    u = ctx + emb[prev], then the per-channel causal mix (thread per channel)
//  2. front_swiglu: z = u + w_down(silu(w_gate u) * w_up u), a block per (sequence, slot)
//  3. read:         the rank-to-vocab read split over the vocabulary across the GPU; a block
//                   streams its slice of w_read once for a group of rows and keeps, per row,
//                   the Gumbel-max pick and the softmax statistics (the logits are never stored)
//  4. finish:       merges the slices: token and log-probability per row
// Jacobi adds an update launch per pass (convergence flags live on the device), so max_iters
// passes are a fixed launch sequence a CUDA graph can capture; blocks of converged sequences,
// and of slots before a sequence's first change (final), exit at once. Token ids outside [0, V) read a zero embedding row.
#include "device_utils.cuh"
#include "refine_launch.h"

namespace xkernels::cuda {
namespace {

constexpr int kRowGroup = 8;  // rows that share one stream of w_read in a block

struct RefineWorkspace {
  float* u;              // [n, b, r] after the mix
  float* z;              // [n, d, r]
  SampledRow* partial;   // [n * d, tiles]
  int64_t* new_tokens;   // [n, d]
  float* new_logprobs;   // [n, d]
  int32_t* active;       // [n]
  int32_t* first_dirty;  // [n]: drafted slots before it read unchanged tokens (final)
  int tiles;
};

// The rows one launch sequence works on: drafted slots [d_begin, d_begin + d_count) of the
// active sequences.
struct RowSet {
  const int64_t* drafted;  // the current drafted tokens [n, d]
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

__device__ __forceinline__ int64_t prev_token(const RefineParams& p, const RowSet& rs, int64_t n, int64_t k) {
  return k < p.prefix_len ? p.prefix[n * p.prefix_len + k] : rs.drafted[n * p.d + (k - p.prefix_len)];
}

template <typename TW>
__global__ void __launch_bounds__(kThreads) front_mix_kernel(RefineParams p, RowSet rs, RefineWorkspace w) {
  const int64_t n = blockIdx.x;
  if (!is_active(rs, n)) return;
  const TW* emb = static_cast<const TW*>(p.emb);
  const TW* mix = static_cast<const TW*>(p.mix);
  const int64_t slots = p.f + rs.d_begin + rs.d_count;  // the mix of the last slot read needs all before it
  for (int64_t c = threadIdx.x; c < p.r; c += blockDim.x) {
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
}

template <typename TW>
__global__ void __launch_bounds__(kThreads) front_swiglu_kernel(RefineParams p, RowSet rs, RefineWorkspace w) {
  const int64_t n = blockIdx.x / rs.d_count, d = rs.d_begin + blockIdx.x % rs.d_count;
  if (!is_live(rs, n, d)) return;
  extern __shared__ float smem[];
  float* u = smem;
  float* hid = smem + p.r;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t c = threadIdx.x; c < p.r; c += kThreads) u[c] = w.u[(n * p.b + p.f + d) * p.r + c];
  __syncthreads();
  const TW* w_gate = static_cast<const TW*>(p.w_gate);
  const TW* w_up = static_cast<const TW*>(p.w_up);
  const TW* w_down = static_cast<const TW*>(p.w_down);
  for (int64_t j = warp; j < p.h; j += kWarps) {
    float g = 0.0f, up = 0.0f;
    for (int64_t c = lane; c < p.r; c += 32) {
      g += to_float(w_gate[j * p.r + c]) * u[c];
      up += to_float(w_up[j * p.r + c]) * u[c];
    }
    g = warp_sum(g);
    up = warp_sum(up);
    if (lane == 0) hid[j] = g / (1.0f + expf(-g)) * up;
  }
  __syncthreads();
  for (int64_t c = warp; c < p.r; c += kWarps) {
    float acc = 0.0f;
    for (int64_t j = lane; j < p.h; j += 32) acc += to_float(w_down[c * p.h + j]) * hid[j];
    acc = warp_sum(acc);
    if (lane == 0) w.z[(n * p.d + d) * p.r + c] = u[c] + acc;
  }
}

__device__ __forceinline__ uint32_t word_of(const Philox4& r, int j) {
  return j == 0 ? r.w[0] : j == 1 ? r.w[1] : j == 2 ? r.w[2] : r.w[3];
}

template <typename TB, typename TW>
__global__ void __launch_bounds__(kThreads) read_kernel(RefineParams p, RowSet rs, RefineWorkspace w) {
  __shared__ float zs[kRowGroup][kRefineMaxRank];
  __shared__ SampledRow merged[kWarps][kRowGroup];
  const int64_t rows = p.n * rs.d_count;
  const int64_t m0 = (blockIdx.x / w.tiles) * kRowGroup;
  const int tile = static_cast<int>(blockIdx.x % w.tiles);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  bool any_live = false;  // blocks of converged sequences exit at once
  for (int g = 0; g < kRowGroup; ++g) {
    const int64_t mg = m0 + g;
    any_live |= mg < rows && is_live(rs, mg / rs.d_count, rs.d_begin + mg % rs.d_count);
  }
  if (!any_live) return;

  // This lane's row (lanes < kRowGroup own one row each).
  const int64_t m = m0 + lane;
  const int64_t n = m / rs.d_count, d = rs.d_begin + m % rs.d_count;
  const bool mine = lane < kRowGroup && m < rows && is_live(rs, n, d);
  if (rs.read) {
    for (int g = 0; g < kRowGroup; ++g) {
      const int64_t mg = m0 + g;
      const int64_t ng = mg / rs.d_count, dg = rs.d_begin + mg % rs.d_count;
      const bool live = mg < rows && is_live(rs, ng, dg);
      for (int64_t c = threadIdx.x; c < p.r; c += kThreads) zs[g][c] = live ? w.z[(ng * p.d + dg) * p.r + c] : 0.0f;
    }
    __syncthreads();
  }
  const uint64_t seed = read_or(p.seed_ptr, p.seed), offset = read_or(p.offset_ptr, p.offset);
  const bool greedy = p.inv_t == 0.0f;
  const float scale = greedy ? 1.0f : p.inv_t;
  const TB* base = static_cast<const TB*>(p.base) + (mine ? (n * p.d + d) * p.v : 0);
  const TW* w_read = static_cast<const TW*>(p.w_read);
  const int64_t per = (p.v + w.tiles - 1) / w.tiles;
  const int64_t v_begin = tile * per, v_end = v_begin + per < p.v ? v_begin + per : p.v;

  SampledRow best = sampled_empty();
  for (int64_t v = v_begin + warp; v < v_end; v += kWarps) {
    float acc[kRowGroup];
#pragma unroll
    for (int g = 0; g < kRowGroup; ++g) acc[g] = 0.0f;
    if (rs.read) {
      const TW* row = w_read + v * p.r;
      for (int64_t c = lane; c < p.r; c += 32) {
        const float x = to_float(row[c]);
#pragma unroll
        for (int g = 0; g < kRowGroup; ++g) acc[g] += x * zs[g][c];
      }
#pragma unroll
      for (int g = 0; g < kRowGroup; ++g) acc[g] = warp_sum(acc[g]);
    }
    float dot = 0.0f;
#pragma unroll
    for (int g = 0; g < kRowGroup; ++g) dot = g == lane ? acc[g] : dot;
    if (mine) {
      const float a = (to_float(base[v]) + dot) * scale;
      float noise = 0.0f;
      if (!greedy) {
        noise = a + kGumbelBound >= best.pick.val
                    ? gumbel_from_word(word_of(philox_draw(seed, offset, static_cast<uint32_t>(n),
                                                           static_cast<uint32_t>(d), static_cast<uint32_t>(v / 4)),
                                               static_cast<int>(v % 4)))
                    : kNegInf;  // cannot win: skip the draw
      }
      sampled_observe(best, a, noise, static_cast<int32_t>(v));
    }
  }
  if (lane < kRowGroup) merged[warp][lane] = best;
  __syncthreads();
  if (threadIdx.x < kRowGroup && m0 + threadIdx.x < rows) {
    SampledRow r = sampled_empty();
    for (int k = 0; k < kWarps; ++k) r = sampled_merge(r, merged[k][threadIdx.x]);
    w.partial[(m0 + threadIdx.x) * w.tiles + tile] = r;
  }
}

__global__ void finish_kernel(RefineParams p, RowSet rs, RefineWorkspace w, int64_t* tokens, float* logprobs) {
  const int64_t m = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (m >= p.n * rs.d_count) return;
  const int64_t n = m / rs.d_count, d = rs.d_begin + m % rs.d_count;
  if (!is_live(rs, n, d)) return;
  SampledRow r = sampled_empty();
  for (int t = 0; t < w.tiles; ++t) r = sampled_merge(r, w.partial[m * w.tiles + t]);
  tokens[n * p.d + d] = r.pick.idx == kNoIndex ? 0 : r.pick.idx;
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

int tile_count(const RefineParams& p) {
  const int64_t groups = (p.n * p.d + kRowGroup - 1) / kRowGroup;
  const int64_t want = (4 * static_cast<int64_t>(p.num_sms) + groups - 1) / groups;
  const int64_t most = (p.v + 255) / 256;  // at least 256 vocabulary rows a tile
  const int64_t t = want < most ? want : most;
  return static_cast<int>(t < 1 ? 1 : t);
}

RefineWorkspace carve(const RefineParams& p, void* workspace) {
  RefineWorkspace w;
  w.tiles = tile_count(p);
  char* at = static_cast<char*>(workspace);
  auto take = [&](size_t bytes) {
    char* out = at;
    at += align_up(bytes);
    return out;
  };
  w.u = reinterpret_cast<float*>(take(sizeof(float) * p.n * p.b * p.r));
  w.z = reinterpret_cast<float*>(take(sizeof(float) * p.n * p.d * p.r));
  w.partial = reinterpret_cast<SampledRow*>(take(sizeof(SampledRow) * p.n * p.d * w.tiles));
  w.new_tokens = reinterpret_cast<int64_t*>(take(sizeof(int64_t) * p.n * p.d));
  w.new_logprobs = reinterpret_cast<float*>(take(sizeof(float) * p.n * p.d));
  w.active = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * p.n));
  w.first_dirty = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * p.n));
  return w;
}

// One pass over `rs`, writing tokens and logprobs [n, d] at the rows of rs.
template <typename TB, typename TW>
void pass(const RefineParams& p, const RowSet& rs, const RefineWorkspace& w, int64_t* tokens, float* logprobs,
          cudaStream_t stream) {
  const int64_t rows = p.n * rs.d_count;
  if (rs.read) {
    front_mix_kernel<TW><<<p.n, kThreads, 0, stream>>>(p, rs, w);
    const size_t smem = sizeof(float) * (p.r + p.h);
    front_swiglu_kernel<TW><<<rows, kThreads, smem, stream>>>(p, rs, w);
  }
  const int64_t groups = (rows + kRowGroup - 1) / kRowGroup;
  read_kernel<TB, TW><<<groups * w.tiles, kThreads, 0, stream>>>(p, rs, w);
  finish_kernel<<<(rows + 127) / 128, 128, 0, stream>>>(p, rs, w, tokens, logprobs);
}

enum class Op { kStep, kJacobi, kSequential };

template <typename TB, typename TW>
cudaError_t run(Op op, const RefineParams& p, int64_t max_iters, void* workspace, int64_t* tokens, float* logprobs,
                int32_t* iters, cudaStream_t stream) {
  const RefineWorkspace w = carve(p, workspace);
  switch (op) {
    case Op::kStep:
      pass<TB, TW>(p, RowSet{nullptr, nullptr, nullptr, 0, p.d, true}, w, tokens, logprobs, stream);
      break;
    case Op::kJacobi: {
      pass<TB, TW>(p, RowSet{nullptr, nullptr, nullptr, 0, p.d, false}, w, tokens, logprobs, stream);  // x0
      jacobi_init_kernel<<<(p.n + 127) / 128, 128, 0, stream>>>(w, p.n);
      const RowSet rs{tokens, w.active, w.first_dirty, 0, p.d, true};
      for (int64_t i = 0; i < max_iters; ++i) {
        pass<TB, TW>(p, rs, w, w.new_tokens, w.new_logprobs, stream);
        jacobi_update_kernel<<<(p.n + 127) / 128, 128, 0, stream>>>(p, w, tokens, logprobs, iters);
      }
      break;
    }
    case Op::kSequential:
      for (int64_t d = 0; d < p.d; ++d) pass<TB, TW>(p, RowSet{tokens, nullptr, nullptr, d, 1, true}, w, tokens, logprobs, stream);
      break;
  }
  return cudaGetLastError();
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
  const int tiles = tile_count(p);
  return align_up(sizeof(float) * p.n * p.b * p.r) + align_up(sizeof(float) * p.n * p.d * p.r) +
         align_up(sizeof(SampledRow) * p.n * p.d * tiles) + align_up(sizeof(int64_t) * p.n * p.d) +
         align_up(sizeof(float) * p.n * p.d) + 2 * align_up(sizeof(int32_t) * p.n);
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
