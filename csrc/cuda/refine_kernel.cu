// The xPress refine ops on CUDA. A pass is a fixed launch sequence that never waits on the host:
//  1. front_mix:    u = ctx + emb[prev], then the per-channel causal mix (a block per sequence and
//                   32 channels, the slots' u staged in shared memory)
//  2. front_hidden: hid = silu(w_gate u) * (w_up u), a warp per 2 hidden units for 8 rows
//  3. front_down:   z = u + w_down hid, a warp per 2 channels for 8 rows; z is stored in the weights'
//                   type, the input of the read's GEMM
//  4. the read, one of two (refine_read_plan picks; RefineReadMode in refine_launch.h):
//     - fused (bfloat16 weights, few rows): read_fused streams w_read once in tiles of 64 ids
//       (16-byte loads held in registers while the previous tile is multiplied), multiplies
//       each tile with the rows' z staged in shared memory on tensor cores (wmma, float32
//       accumulation) and runs the epilogue below on the products; a persistent grid of about
//       two blocks an SM, divided among groups of up to 64 rows; one partial result a (row, block)
//     - GEMM: the GEMM z w_read^T into float32 products, run by the caller (ReadGemmRunner:
//       cuBLAS through ATen), one for the whole vocabulary (per vocabulary slice where the
//       products pass the binding's budget), then read_epilogue: a block per (row, chunk of
//       ids), 16-byte loads of the products and 8- or 16-byte ones of the base logits, several
//       in flight
//     The epilogue adds the base logits, scales by 1/T and keeps the Gumbel-max pick and the
//     softmax statistics (observe_group; the logits are never written to HBM)
//  5. merge:        a warp per row merges its partial results (a shuffle tree)
//  6. with filters (RefineParams::filter): the rows that sample with top-k, top-p or min-p, from
//     the logits the epilogue kept: a row with top-k or top-p is read once by the candidate
//     pipeline (a grid of (row, slice) blocks, then a block a row that finds the cut from the
//     candidates and draws over the kept ids); filtered_pick, a block per row, takes the rows it does
//     not settle and min-p alone (from the row's partial results, its top and their maxima bounding
//     the cut; usually one read of the row). Either overwrites the row's merged result
// Jacobi adds an update launch per pass (convergence flags live on the device), so max_iters
// passes are a fixed launch sequence a CUDA graph can capture; blocks of converged sequences,
// and of slots before a sequence's first change (final), exit at once (the GEMMs run over every
// row). Token ids outside [0, V) read a zero embedding row.
#include <type_traits>

#include "refine_kernels.cuh"
#include "row_reduce.cuh"

namespace xkernels::cuda {
namespace {

constexpr int kMixChannels = 32;  // channels of a front_mix block
constexpr int kFrontRows = 8;     // rows of a front_hidden / front_down block (weights read once per 8 rows)
constexpr int kFrontOutputs = 2;  // units / channels of a front warp
constexpr int64_t kMaxChunkGroups = 1024;  // an epilogue block reads at most 4096 ids (16 a thread)

__device__ __forceinline__ int64_t prev_token(const RefineParams& p, const RowSet& rs, int64_t n, int64_t k) {
  return k < p.prefix_len ? p.prefix[n * p.prefix_len + k] : rs.drafted[n * p.d + (k - p.prefix_len)];
}

__device__ __forceinline__ void store(float* x, float v) { *x = v; }
__device__ __forceinline__ void store(__nv_bfloat16* x, float v) { *x = __float2bfloat16(v); }

// u[n, k, c] = sum_{j <= k} mix[c, k, j] (ctx[n, j, c] + emb[prev_j, c]) for the slots k the rows read.
template <typename TW>
__global__ void __launch_bounds__(kThreads) front_mix_kernel(RefineParams p, RowSet rs, RefineWorkspace w) {
  __shared__ float us[kRefineMaxSlots][kMixChannels];
  const int64_t chunks = (p.r + kMixChannels - 1) / kMixChannels;
  const int64_t n = blockIdx.x / chunks, c0 = blockIdx.x % chunks * kMixChannels;
  if (!is_active(rs, n)) return;
  const TW* emb = static_cast<const TW*>(p.emb);
  const TW* mix = static_cast<const TW*>(p.mix);
  const int64_t k_begin = p.f + rs.d_begin, k_end = p.f + rs.d_begin + rs.d_count;  // the slots read
  for (int64_t i = threadIdx.x; i < k_end * kMixChannels; i += kThreads) {
    const int64_t k = i / kMixChannels, c = c0 + i % kMixChannels;
    const int64_t tok = prev_token(p, rs, n, k);
    const float e = c < p.r && tok >= 0 && tok < p.v ? to_float(emb[tok * p.r + c]) : 0.0f;
    us[k][i % kMixChannels] = c < p.r ? p.ctx[(n * p.b + k) * p.r + c] + e : 0.0f;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < rs.d_count * kMixChannels; i += kThreads) {
    const int64_t k = k_begin + i / kMixChannels, c = c0 + i % kMixChannels;
    if (c >= p.r) continue;
    const TW* row = mix + (c * p.b + k) * p.b;
    float acc = 0.0f;
    for (int64_t j = 0; j <= k; ++j) acc += to_float(row[j]) * us[j][i % kMixChannels];
    w.u[(n * p.b + k) * p.r + c] = acc;
  }
}

// The rows [m0, m0 + kFrontRows) of a front block: which are live, their place in hid and z, and
// the offset of their u row. Computed once a block, a row a thread, into shared memory: every
// thread recomputing them spent more on the 64-bit divisions than on its multiply-adds.
struct FrontRows {
  bool live[kFrontRows];
  int64_t at[kFrontRows];  // row_index
  int64_t u[kFrontRows];   // w.u + u[i]: the row's u
};

// A front block: kFrontRows rows (into `rows`, a barrier) and kWarps * kFrontOutputs of the
// `outputs` (units or channels), kFrontOutputs a warp; returns this warp's first.
__device__ __forceinline__ int64_t front_block(const RefineParams& p, const RowSet& rs, int64_t outputs,
                                               FrontRows& rows) {
  // 32-bit division: output_blocks divides the grid (at most 2^31 - 1 blocks).
  const auto output_blocks = static_cast<unsigned>((outputs + kWarps * kFrontOutputs - 1) / (kWarps * kFrontOutputs));
  if (threadIdx.x < kFrontRows) {
    const int g = threadIdx.x;
    const int64_t m = static_cast<int64_t>(blockIdx.x / output_blocks) * kFrontRows + g;
    const bool live = row_live(p, rs, m);
    const int64_t at = live ? row_index(p, rs, m) : 0;
    rows.live[g] = live;
    rows.at[g] = at;
    rows.u[g] = live ? (m / rs.d_count * p.b + p.f + at % p.d) * p.r : 0;
  }
  __syncthreads();
  return (blockIdx.x % output_blocks * kWarps + threadIdx.x / 32) * kFrontOutputs;
}

// hid[j] = silu(w_gate[j] . u) * (w_up[j] . u): a warp per kFrontOutputs units (16 a block) for 8
// rows; each u value read serves both units. Each (row, unit) sum is a lane's multiply-adds over
// c = lane, lane + 32, ... and a warp_sum, as with a unit a warp.
template <typename TW>
__global__ void __launch_bounds__(kThreads) front_hidden_kernel(RefineParams p, RowSet rs, RefineWorkspace w) {
  __shared__ FrontRows rows;
  const int64_t j0 = front_block(p, rs, p.h, rows);
  if (j0 >= p.h) return;
  const int lane = threadIdx.x % 32;
  const TW* w_gate = static_cast<const TW*>(p.w_gate) + j0 * p.r;
  const TW* w_up = static_cast<const TW*>(p.w_up) + j0 * p.r;
  float g[kFrontOutputs][kFrontRows], up[kFrontOutputs][kFrontRows];
#pragma unroll
  for (int o = 0; o < kFrontOutputs; ++o)
#pragma unroll
    for (int i = 0; i < kFrontRows; ++i) g[o][i] = up[o][i] = 0.0f;
  for (int64_t c = lane; c < p.r; c += 32) {
    float wg[kFrontOutputs], wu[kFrontOutputs];
#pragma unroll
    for (int o = 0; o < kFrontOutputs; ++o) {
      const bool ok = j0 + o < p.h;
      wg[o] = ok ? to_float(w_gate[o * p.r + c]) : 0.0f;
      wu[o] = ok ? to_float(w_up[o * p.r + c]) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kFrontRows; ++i) {
      if (!rows.live[i]) continue;
      const float x = w.u[rows.u[i] + c];
#pragma unroll
      for (int o = 0; o < kFrontOutputs; ++o) {
        g[o][i] += wg[o] * x;
        up[o][i] += wu[o] * x;
      }
    }
  }
#pragma unroll
  for (int o = 0; o < kFrontOutputs; ++o) {
#pragma unroll
    for (int i = 0; i < kFrontRows; ++i) {
      const float gs = warp_sum(g[o][i]), us = warp_sum(up[o][i]);
      if (lane == 0 && rows.live[i] && j0 + o < p.h) w.hid[rows.at[i] * p.h + j0 + o] = gs / (1.0f + expf(-gs)) * us;
    }
  }
}

// z[c] = u[c] + w_down[c] . hid: a warp per kFrontOutputs channels (16 a block) for 8 rows; each hid
// value read serves both channels (each sum as with a channel a warp).
template <typename TW>
__global__ void __launch_bounds__(kThreads) front_down_kernel(RefineParams p, RowSet rs, RefineWorkspace w) {
  __shared__ FrontRows rows;
  const int64_t c0 = front_block(p, rs, p.r, rows);
  if (c0 >= p.r) return;
  const int lane = threadIdx.x % 32;
  const TW* w_down = static_cast<const TW*>(p.w_down) + c0 * p.h;
  float acc[kFrontOutputs][kFrontRows];
#pragma unroll
  for (int o = 0; o < kFrontOutputs; ++o)
#pragma unroll
    for (int i = 0; i < kFrontRows; ++i) acc[o][i] = 0.0f;
  for (int64_t j = lane; j < p.h; j += 32) {
    float wd[kFrontOutputs];
#pragma unroll
    for (int o = 0; o < kFrontOutputs; ++o) wd[o] = c0 + o < p.r ? to_float(w_down[o * p.h + j]) : 0.0f;
#pragma unroll
    for (int i = 0; i < kFrontRows; ++i) {
      if (!rows.live[i]) continue;
      const float x = w.hid[rows.at[i] * p.h + j];
#pragma unroll
      for (int o = 0; o < kFrontOutputs; ++o) acc[o][i] += wd[o] * x;
    }
  }
  TW* z = static_cast<TW*>(w.z);
#pragma unroll
  for (int o = 0; o < kFrontOutputs; ++o) {
#pragma unroll
    for (int i = 0; i < kFrontRows; ++i) {
      const float sum = warp_sum(acc[o][i]);
      if (lane == 0 && rows.live[i] && c0 + o < p.r) store(z + rows.at[i] * p.r + c0 + o, w.u[rows.u[i] + c0 + o] + sum);
    }
  }
}

// One vocabulary slice of a pass: ids [v0, v0 + len), its products (null: s alone).
struct ReadSlice {
  int64_t v0, len, first_chunk, chunks;
  const float* dots;  // [rows, len]
};

// Bytes an epilogue thread has loaded ahead: 4 groups of 4 ids at 2-byte base logits, 3 at
// float32 ones (4 spilled at 64 registers); 96 KB an SM at 4 blocks an SM.
constexpr int kEpilogueBytesAhead = 96;
constexpr int kEpilogueBlocksPerSm = 4;

// A group's 4 products and 4 base logits, each in one load.
template <typename TB>
struct EpilogueLoad {
  float4 dots;
  typename Quad<TB>::type base;
};

// A block per (row, chunk of the slice): its partial result. Thread t takes groups id0 / 4 + t,
// + kThreads, ... in that order (as every plan of the same chunks, so the sums are the same):
// where the row's products and base logits are aligned for them, whole groups by one load each
// (16 bytes of products, 8 or 16 of base logits), kEpilogueDepth groups in flight; a chunk's
// partial last group, and every group of an unaligned row, by scalar loads.
template <typename TB>
__global__ void __launch_bounds__(kThreads, kEpilogueBlocksPerSm)
    read_epilogue_kernel(RefineParams p, RowSet rs, RefineWorkspace w, RefineReadPlan plan, ReadSlice s) {
  const int64_t m = blockIdx.x / s.chunks, c = blockIdx.x % s.chunks;
  if (!row_live(p, rs, m)) return;  // the whole block
  const int64_t n = m / rs.d_count, d = rs.d_begin + m % rs.d_count;
  const int64_t id0 = s.v0 + c * plan.chunk;
  const int64_t id_end = id0 + plan.chunk < s.v0 + s.len ? id0 + plan.chunk : s.v0 + s.len;
  const TB* base = static_cast<const TB*>(p.base) + (n * p.d + d) * p.v;
  const float* dots = s.dots ? s.dots + m * s.len : nullptr;  // from id v0 (a multiple of 4, as the chunk)
  const RowNoise rn = row_noise(p, n, d);
  const bool filtered = row_filtered(p, n);
  SampledRow best = sampled_empty();
  // The base logits and products are each read once: evict-first (__ldcs), so that they pass
  // through L2 without displacing what is read again (a slice's w_read rows, where there are slices).
  const auto observe = [&](int64_t q, const float (&x)[4]) {
    if (filtered) keep_logits(p, w, m, q, x, id_end);
    observe_group(best, x, q, id_end, rn);
  };
  using BaseQuad = typename Quad<TB>::type;
  const bool vector_ok = reinterpret_cast<uintptr_t>(base) % sizeof(BaseQuad) == 0 &&
                         reinterpret_cast<uintptr_t>(dots) % sizeof(float4) == 0;
  const int64_t q0 = id0 / 4, q_whole = vector_ok ? id_end / 4 : q0, q_v0 = s.v0 / 4;
  for_each_batched<kEpilogueBytesAhead / (sizeof(float4) + sizeof(BaseQuad))>(
      q0 + threadIdx.x, q_whole, kThreads,
      [&](int64_t q) {
        EpilogueLoad<TB> l;
        l.base = __ldcs(reinterpret_cast<const BaseQuad*>(base) + q);
        l.dots = dots ? __ldcs(reinterpret_cast<const float4*>(dots) + (q - q_v0)) : float4{0.0f, 0.0f, 0.0f, 0.0f};
        return l;
      },
      [&](int64_t q, const EpilogueLoad<TB>& l) {
        float x[4];
        unpack<TB>(l.base, 1.0f, x);
        x[0] += l.dots.x, x[1] += l.dots.y, x[2] += l.dots.z, x[3] += l.dots.w;
        observe(q, x);
      });
  // This thread's groups from q_whole on, in the same order.
  int64_t q = q0 + threadIdx.x;
  if (q < q_whole) q += (q_whole - q + kThreads - 1) / kThreads * kThreads;
  for (; 4 * q < id_end; q += kThreads) {
    float x[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t id = 4 * q + j;
      x[j] = id < id_end ? to_float(__ldcs(base + id)) + (dots ? __ldcs(dots + (id - s.v0)) : 0.0f) : 0.0f;
    }
    observe(q, x);
  }
  best = block_merge(best, sampled_empty());
  if (threadIdx.x == 0) w.partial[m * plan.partials + s.first_chunk + c] = best;
}

// A warp per row: merges the row's partial results, writes its token and log-probability.
__global__ void __launch_bounds__(kThreads) merge_kernel(RefineParams p, RowSet rs, RefineWorkspace w, int64_t partials,
                                                         int64_t* tokens, float* logprobs) {
  const int64_t m = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (!row_live(p, rs, m)) return;  // the whole warp
  SampledRow r = sampled_empty();
  for (int64_t c = lane; c < partials; c += 32) r = sampled_merge(r, w.partial[m * partials + c]);
  r = warp_merge(r);
  if (lane == 0) {
    const int64_t at = row_index(p, rs, m);
    tokens[at] = sampled_token(r);
    logprobs[at] = sampled_logprob(r);
  }
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

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

size_t weight_bytes(const RefineParams& p) { return p.weight_type == WeightType::kFloat32 ? 4 : 2; }

// The rows of the launch sequences of the ops: n * d (refine_step, Jacobi) or n (a sequential step).
struct ReadSizes {
  int64_t dots, partial;  // elements
};

ReadSizes read_sizes(const RefineParams& p) {
  ReadSizes s{0, 0};
  for (int64_t rows : {p.n * p.d, p.n})
    for (bool read : {true, false}) {
      const RefineReadPlan plan = refine_read_plan(p, rows, read);
      const int64_t dots = read && !plan.fused ? rows * plan.slice : 0, partial = rows * plan.partials;
      s.dots = dots > s.dots ? dots : s.dots;
      s.partial = partial > s.partial ? partial : s.partial;
    }
  return s;
}

struct Layout {
  size_t u, hid, z, dots, partial, tokens, logprobs, flags, logits, candidates;
};

Layout layout(const RefineParams& p) {
  const ReadSizes s = read_sizes(p);
  return Layout{align_up(sizeof(float) * p.n * p.b * p.r),
                align_up(sizeof(float) * p.n * p.d * p.h),
                align_up(weight_bytes(p) * p.n * p.d * p.r),
                align_up(sizeof(float) * s.dots),
                align_up(sizeof(SampledRow) * s.partial),
                align_up(sizeof(int64_t) * p.n * p.d),
                align_up(sizeof(float) * p.n * p.d),
                align_up(sizeof(int32_t) * p.n),
                p.filter ? align_up(sizeof(float) * p.n * p.d * p.v) : 0,
                p.filter ? align_up(filtered_candidates_bytes(p, p.n * p.d)) : 0};
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
  w.z = take(l.z);
  w.dots = reinterpret_cast<float*>(take(l.dots));
  w.partial = reinterpret_cast<SampledRow*>(take(l.partial));
  w.new_tokens = reinterpret_cast<int64_t*>(take(l.tokens));
  w.new_logprobs = reinterpret_cast<float*>(take(l.logprobs));
  w.active = reinterpret_cast<int32_t*>(take(l.flags));
  w.first_dirty = reinterpret_cast<int32_t*>(take(l.flags));
  w.logits = reinterpret_cast<float*>(take(l.logits));
  w.candidates = take(l.candidates);
  return w;
}

// One pass over `rs`, writing tokens and logprobs [n, d] at the rows of rs.
template <typename TB, typename TW>
cudaError_t pass(const RefineParams& p, const ReadGemmRunner& gemm, const RowSet& rs, const RefineWorkspace& w,
                 int64_t* tokens, float* logprobs, cudaStream_t stream) {
  const int64_t rows = p.n * rs.d_count;
  const int64_t row_blocks = ceil_div(rows, kFrontRows);
  if (rs.read) {
    front_mix_kernel<TW><<<p.n * ceil_div(p.r, kMixChannels), kThreads, 0, stream>>>(p, rs, w);
    XK_RETURN_IF_FAILED(cudaGetLastError());
    front_hidden_kernel<TW><<<row_blocks * ceil_div(p.h, kWarps * kFrontOutputs), kThreads, 0, stream>>>(p, rs, w);
    XK_RETURN_IF_FAILED(cudaGetLastError());
    front_down_kernel<TW><<<row_blocks * ceil_div(p.r, kWarps * kFrontOutputs), kThreads, 0, stream>>>(p, rs, w);
    XK_RETURN_IF_FAILED(cudaGetLastError());
  }
  const RefineReadPlan plan = refine_read_plan(p, rows, rs.read);
  if (plan.fused) {
    if constexpr (std::is_same_v<TW, __nv_bfloat16>) {
      XK_RETURN_IF_FAILED(launch_read_fused<TB>(p, rs, w, plan, stream));
    } else {
      return cudaErrorInvalidValue;  // the plan fuses bfloat16 weights only
    }
  }
  for (int64_t s = 0; !plan.fused && s < plan.slices; ++s) {
    const int64_t v0 = s * plan.slice, len = plan.slice < p.v - v0 ? plan.slice : p.v - v0;
    if (rs.read) {
      // Rows of all slots are z [n * d, r]; the rows of one slot are every d-th row of it.
      const char* z = static_cast<const char*>(w.z) + weight_bytes(p) * rs.d_begin * p.r;
      const char* w_read = static_cast<const char*>(p.w_read) + weight_bytes(p) * v0 * p.r;
      const ReadGemm g{z, rs.d_count == 1 ? p.d * p.r : p.r, rows, w_read, len, p.r, p.weight_type, w.dots};
      XK_RETURN_IF_FAILED(gemm.fn(gemm.context, g, stream));
    }
    const ReadSlice slice{v0, len, s * plan.chunks_per_slice, ceil_div(len, plan.chunk), rs.read ? w.dots : nullptr};
    read_epilogue_kernel<TB><<<rows * slice.chunks, kThreads, 0, stream>>>(p, rs, w, plan, slice);
    XK_RETURN_IF_FAILED(cudaGetLastError());
  }
  merge_kernel<<<ceil_div(rows, kWarps), kThreads, 0, stream>>>(p, rs, w, plan.partials, tokens, logprobs);
  XK_RETURN_IF_FAILED(cudaGetLastError());
  if (p.filter) {
    // Rows that are not filtered (or not live) get a keep-all cut or one of stale logits, unread.
    XK_RETURN_IF_FAILED(launch_filtered_pick(p, rs, w, rows, plan.partials, tokens, logprobs, stream));
  }
  return cudaSuccess;
}

enum class Op { kStep, kJacobi, kSequential };

template <typename TB, typename TW>
cudaError_t run(Op op, const RefineParams& p, const ReadGemmRunner& gemm, int64_t max_iters, void* workspace,
                int64_t* tokens, float* logprobs, int32_t* iters, cudaStream_t stream) {
  const RefineWorkspace w = carve(p, workspace);
  switch (op) {
    case Op::kStep:
      return pass<TB, TW>(p, gemm, RowSet{nullptr, nullptr, nullptr, 0, p.d, true}, w, tokens, logprobs, stream);
    case Op::kJacobi: {
      // x0: the drafter's own sample
      XK_RETURN_IF_FAILED(pass<TB, TW>(p, gemm, RowSet{nullptr, nullptr, nullptr, 0, p.d, false}, w, tokens,
                                       logprobs, stream));
      jacobi_init_kernel<<<ceil_div(p.n, 128), 128, 0, stream>>>(w, p.n);
      XK_RETURN_IF_FAILED(cudaGetLastError());
      // Pass t finalises slot t, so pass d + 1 changes nothing: no sequence is active after it.
      const int64_t passes = max_iters < p.d + 1 ? max_iters : p.d + 1;
      const RowSet rs{tokens, w.active, w.first_dirty, 0, p.d, true};
      for (int64_t i = 0; i < passes; ++i) {
        XK_RETURN_IF_FAILED(pass<TB, TW>(p, gemm, rs, w, w.new_tokens, w.new_logprobs, stream));
        jacobi_update_kernel<<<ceil_div(p.n, 128), 128, 0, stream>>>(p, w, tokens, logprobs, iters);
        XK_RETURN_IF_FAILED(cudaGetLastError());
      }
      return cudaSuccess;
    }
    case Op::kSequential:
      for (int64_t d = 0; d < p.d; ++d)
        XK_RETURN_IF_FAILED(
            pass<TB, TW>(p, gemm, RowSet{tokens, nullptr, nullptr, d, 1, true}, w, tokens, logprobs, stream));
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}

cudaError_t dispatch(Op op, const RefineParams& p, const ReadGemmRunner& gemm, int64_t max_iters, void* workspace,
                     int64_t* tokens, float* logprobs, int32_t* iters, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const bool bf16_weights = p.weight_type == WeightType::kBFloat16;
  auto go = [&](auto base_tag) {
    using TB = decltype(base_tag);
    return bf16_weights ? run<TB, __nv_bfloat16>(op, p, gemm, max_iters, workspace, tokens, logprobs, iters, stream)
                        : run<TB, float>(op, p, gemm, max_iters, workspace, tokens, logprobs, iters, stream);
  };
  switch (p.base_type) {
    case LogitsType::kFloat32: return go(float{});
    case LogitsType::kBFloat16: return go(__nv_bfloat16{});
    case LogitsType::kFloat16: return go(__half{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

RefineReadPlan refine_read_plan(const RefineParams& p, int64_t rows, bool read) {
  // Empty and degenerate sizes still get a valid plan: every divisor below is at least 1.
  rows = rows < 1 ? 1 : rows;
  const int64_t v = p.v < 1 ? 1 : p.v, sms = p.num_sms < 1 ? 1 : p.num_sms;
  RefineReadPlan plan{};
  const bool fusable = read && p.weight_type == WeightType::kBFloat16 && p.cc_major >= 8 && p.r >= 8 &&
                       p.r % 8 == 0 && p.r <= kRefineFusedMaxRank && reinterpret_cast<uintptr_t>(p.w_read) % 16 == 0;
  plan.fused = fusable && (p.read_mode == RefineReadMode::kFused ||
                           (p.read_mode == RefineReadMode::kAuto && rows <= kRefineFusedAutoRows));
  if (plan.fused) {
    plan.m_tiles = rows > 32 ? 4 : rows > 16 ? 2 : 1;
    plan.groups = ceil_div(rows, 16 * plan.m_tiles);
    plan.tiles = ceil_div(v, kReadTile);
    // About kReadBlocksPerSm blocks an SM over all groups; a group's blocks (its partials a row)
    // never outnumber its tiles.
    const int64_t want = ceil_div(kReadBlocksPerSm * sms, plan.groups);
    plan.blocks = want < plan.tiles ? want : plan.tiles;
    plan.partials = plan.blocks;
    // z, the w_read tile, the products (two depth halves at one row tile), the base logits
    const int64_t rows_tile = 16 * plan.m_tiles, prod_rows = rows_tile > 32 ? rows_tile : 32;
    plan.smem_bytes = (rows_tile + kReadTile) * read_ld(p.r) * 2 + (prod_rows * kReadProdLd + rows_tile * kReadTile) * 4;
    return plan;
  }
  // Chunks enough for about 4 blocks an SM across the rows, each at most kMaxChunkGroups groups of 4 ids.
  const int64_t want = ceil_div(4 * sms, rows);
  int64_t groups = ceil_div(ceil_div(v, 4), want);
  groups = groups < kMaxChunkGroups ? groups : kMaxChunkGroups;
  plan.chunk = 4 * groups;
  // A slice's working set, its float32 products and its rows of w_read, fits slice_bytes: ids of
  // `fit`. Slices take as many ids as fit, in chunks no larger than the one above, so that the
  // slices (a GEMM and an epilogue launch each: small GEMMs run far below the whole read's rate)
  // are as few as the budget allows, one where the whole read fits; below one chunk a slice is one
  // chunk. Without a read there are no products and one slice covers the vocabulary.
  const int64_t id_bytes = rows * static_cast<int64_t>(sizeof(float)) + p.r * static_cast<int64_t>(weight_bytes(p));
  const int64_t fit = p.slice_bytes / (id_bytes < 1 ? 1 : id_bytes) / 4 * 4;
  if (!read || fit >= v) {
    plan.chunks_per_slice = ceil_div(v, plan.chunk);
  } else if (fit <= plan.chunk) {
    plan.chunks_per_slice = 1;
  } else {
    plan.chunks_per_slice = ceil_div(fit, plan.chunk);
    plan.chunk = fit / plan.chunks_per_slice / 4 * 4;  // >= 4: fit > the old chunk >= 4
  }
  plan.chunks = ceil_div(v, plan.chunk);
  plan.chunks_per_slice = plan.chunks_per_slice < plan.chunks ? plan.chunks_per_slice : plan.chunks;
  plan.slice = plan.chunks_per_slice * plan.chunk;
  plan.slices = ceil_div(plan.chunks, plan.chunks_per_slice);
  plan.partials = plan.chunks;
  return plan;
}

size_t refine_workspace_bytes(const RefineParams& p) {
  const Layout l = layout(p);
  return l.u + l.hid + l.z + l.dots + l.partial + l.tokens + l.logprobs + 2 * l.flags + l.logits + l.candidates;
}

cudaError_t launch_refine_step(const RefineParams& p, const ReadGemmRunner& gemm, void* workspace, int64_t* tokens,
                               float* logprobs, cudaStream_t stream) {
  return dispatch(Op::kStep, p, gemm, 0, workspace, tokens, logprobs, nullptr, stream);
}

cudaError_t launch_jacobi_refine(const RefineParams& p, const ReadGemmRunner& gemm, int64_t max_iters,
                                 void* workspace, int64_t* tokens, float* logprobs, int32_t* iters,
                                 cudaStream_t stream) {
  return dispatch(Op::kJacobi, p, gemm, max_iters, workspace, tokens, logprobs, iters, stream);
}

cudaError_t launch_sequential_refine(const RefineParams& p, const ReadGemmRunner& gemm, void* workspace,
                                     int64_t* tokens, float* logprobs, cudaStream_t stream) {
  return dispatch(Op::kSequential, p, gemm, 0, workspace, tokens, logprobs, nullptr, stream);
}

}  // namespace xkernels::cuda

