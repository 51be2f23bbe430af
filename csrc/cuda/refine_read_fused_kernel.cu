// refine's fused read on CUDA (refine_kernel.cu's comment, step 4): read_fused_kernel streams w_read
// once in tiles of 64 ids and runs the epilogue on its tensor-core products.
#include <mma.h>

#include "per_device.h"
#include "refine_kernels.cuh"

namespace xkernels::cuda {
namespace {

// The fused read of a group of kMTiles * 16 rows (block b: group b % groups, the b / groups-th of
// the group's blocks, which reads tiles part, part + blocks, ...): see refine_kernel.cu's comment.
// Per step: store the tile loaded into registers (w_read, and the base logits of the thread's ids)
// to shared memory; issue the next tile's loads; multiply; then run the epilogue on the products
// while those loads are in flight. Warp (col, half) multiplies column tile col (16 ids) with: at
// one row tile, half of the depth (the epilogue adds the two halves); else row tiles half, half + 2.
template <typename TB, int kMTiles>
__global__ void __launch_bounds__(kThreads, kReadBlocksPerSm) read_fused_kernel(RefineParams p, RowSet rs,
                                                                                RefineWorkspace w,
                                                                                RefineReadPlan plan) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // bfloat16 wmma (the plan requires cc_major >= 8)
  namespace wmma = nvcuda::wmma;
  constexpr int kRows = 16 * kMTiles;
  constexpr bool kSplitK = kMTiles == 1;
  constexpr int kAccs = kSplitK ? 1 : kMTiles / 2;
  constexpr int kRowThreads = kThreads / kRows;  // epilogue threads of a row: consecutive lanes
  constexpr int kGroups = kReadTileGroups / kRowThreads;  // Philox groups a thread observes a step
  static_assert(kMTiles == 1 || kMTiles == 2 || kMTiles == 4, "row tiles: 1, 2 or 4");
  extern __shared__ __align__(128) uint8_t read_smem[];
  __shared__ int any_live;
  const int ld = read_ld(p.r), row_chunks = static_cast<int>(p.r / 8);
  __nv_bfloat16* zs = reinterpret_cast<__nv_bfloat16*>(read_smem);  // [kRows][ld]
  __nv_bfloat16* ws = zs + kRows * ld;                              // [kReadTile][ld]
  float* prod = reinterpret_cast<float*>(ws + kReadTile * ld);      // [max(kRows, 32)][kReadProdLd]
  float* base_s = prod + (kRows > 32 ? kRows : 32) * kReadProdLd;   // [kRows][kReadTile]
  const int64_t group = blockIdx.x % plan.groups, part = blockIdx.x / plan.groups, m0 = group * kRows;

  // z of the group's rows (zero for padding and finished rows; a block whose rows have all
  // finished exits here), and zero depth padding (r to a multiple of 16) in the w_read tile.
  if (threadIdx.x == 0) any_live = 0;
  __syncthreads();
  const __nv_bfloat16* z = static_cast<const __nv_bfloat16*>(w.z);
  for (int i = threadIdx.x; i < kRows * (ld / 8); i += kThreads) {
    const int row = i / (ld / 8), c = i % (ld / 8);
    const bool live = row_live(p, rs, m0 + row);
    if (live && c == 0) atomicOr(&any_live, 1);
    uint4 v{0u, 0u, 0u, 0u};
    if (live && c < row_chunks) v = *reinterpret_cast<const uint4*>(z + row_index(p, rs, m0 + row) * p.r + 8 * c);
    *reinterpret_cast<uint4*>(zs + row * ld + 8 * c) = v;
  }
  const int pad_chunks = (ld - 8) / 8 - row_chunks;  // 0 or 1
  for (int i = threadIdx.x; i < kReadTile * pad_chunks; i += kThreads)
    *reinterpret_cast<uint4*>(ws + i * ld + 8 * row_chunks) = uint4{0u, 0u, 0u, 0u};
  __syncthreads();
  if (!any_live) return;  // the whole block

  // The epilogue's row of this thread and its ids: groups ej, ej + kRowThreads, ... of each tile.
  const int em = threadIdx.x / kRowThreads, ej = threadIdx.x % kRowThreads;
  const int64_t m = m0 + em;
  const bool live = row_live(p, rs, m);
  const uint32_t n = live ? static_cast<uint32_t>(m / rs.d_count) : 0;
  const uint32_t d = live ? static_cast<uint32_t>(rs.d_begin + m % rs.d_count) : 0;
  const TB* base = static_cast<const TB*>(p.base) + (static_cast<int64_t>(n) * p.d + d) * p.v;

  // A tile's rows of w_read are contiguous: its 16-byte chunk c lies 8c elements past the tile's first id.
  uint4 loaded[kReadLoads];     // chunks threadIdx.x + i * kThreads of the next tile
  TB loaded_base[4 * kGroups];  // the next tile's base logits of this thread's ids
  auto fetch = [&](int64_t tile) {
    const int64_t id0 = tile * kReadTile;
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.w_read) + id0 * p.r);
    const int64_t ids = p.v - id0 < kReadTile ? p.v - id0 : kReadTile;
    const int chunks = static_cast<int>(ids) * row_chunks;
#pragma unroll
    for (int i = 0; i < kReadLoads; ++i) {
      const int c = threadIdx.x + i * kThreads;
      loaded[i] = c < chunks ? src[c] : uint4{0u, 0u, 0u, 0u};
    }
#pragma unroll
    for (int i = 0; i < 4 * kGroups; ++i) {
      const int id = 4 * (ej + i / 4 * kRowThreads) + i % 4;
      loaded_base[i] = live && id < ids ? base[id0 + id] : TB{};
    }
  };

  const int warp = threadIdx.x / 32, col = warp % 4, half = warp / 4;
  const int k_steps = (ld - 8) / 16;
  const int k_begin = kSplitK && half ? k_steps / 2 : 0, k_end = kSplitK && !half ? k_steps / 2 : k_steps;
  SampledRow best = sampled_empty();
  fetch(part);  // part < plan.tiles: the plan gives a group at most one block a tile
  for (int64_t tile = part; tile < plan.tiles; tile += plan.blocks) {
#pragma unroll
    for (int i = 0; i < kReadLoads; ++i) {
      const int c = threadIdx.x + i * kThreads;
      if (c < kReadTile * row_chunks)
        *reinterpret_cast<uint4*>(ws + c / row_chunks * ld + 8 * (c % row_chunks)) = loaded[i];
    }
#pragma unroll
    for (int i = 0; i < 4 * kGroups; ++i)
      base_s[em * kReadTile + 4 * (ej + i / 4 * kRowThreads) + i % 4] = to_float(loaded_base[i]);
    __syncthreads();  // the tile is in shared memory; the previous step's products are consumed
    if (tile + plan.blocks < plan.tiles) fetch(tile + plan.blocks);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kAccs];
#pragma unroll
    for (int a = 0; a < kAccs; ++a) wmma::fill_fragment(acc[a], 0.0f);
    for (int k = k_begin; k < k_end; ++k) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
      wmma::load_matrix_sync(b, ws + col * 16 * ld + k * 16, static_cast<unsigned>(ld));
#pragma unroll
      for (int a = 0; a < kAccs; ++a) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> za;
        wmma::load_matrix_sync(za, zs + (kSplitK ? 0 : half + 2 * a) * 16 * ld + k * 16, static_cast<unsigned>(ld));
        wmma::mma_sync(acc[a], za, b, acc[a]);
      }
    }
#pragma unroll
    for (int a = 0; a < kAccs; ++a)  // at one row tile, rows 16..31 hold the second half of the depth
      wmma::store_matrix_sync(prod + (half + 2 * a) * 16 * kReadProdLd + col * 16, acc[a], kReadProdLd,
                              wmma::mem_row_major);
    __syncthreads();  // the products are in shared memory; the tile may be overwritten

    if (live) {
      // Read a step at a time (cached loads) rather than held across the multiply: at 4 row tiles
      // the kernel sits at its 128-register bound.
      const RowNoise rn = row_noise(p, n, d);
      const bool filtered = row_filtered(p, n);
#pragma unroll
      for (int i = 0; i < kGroups; ++i) {
        const int g = ej + i * kRowThreads;
        const float4 dot = *reinterpret_cast<const float4*>(prod + em * kReadProdLd + 4 * g);
        const float4 dot2 = kSplitK ? *reinterpret_cast<const float4*>(prod + (16 + em) * kReadProdLd + 4 * g) : dot;
        const float4 b = *reinterpret_cast<const float4*>(base_s + em * kReadTile + 4 * g);
        float x[4] = {b.x + (kSplitK ? dot.x + dot2.x : dot.x), b.y + (kSplitK ? dot.y + dot2.y : dot.y),
                      b.z + (kSplitK ? dot.z + dot2.z : dot.z), b.w + (kSplitK ? dot.w + dot2.w : dot.w)};
        if (filtered) keep_logits(p, w, m, tile * kReadTileGroups + g, x, p.v);
        observe_group(best, x, tile * kReadTileGroups + g, p.v, rn);
      }
    }
  }
  best = warp_merge<kRowThreads>(best);
  if (ej == 0 && live) w.partial[m * plan.partials + part] = best;
#endif
}

// The fused read of a pass (plan.fused), at the plan's row tiles.
template <typename TB, int kMTiles>
cudaError_t launch_read_fused_tiles(const RefineParams& p, const RowSet& rs, const RefineWorkspace& w,
                                    const RefineReadPlan& plan, cudaStream_t stream) {
  // Above 48 KB of dynamic shared memory a kernel must opt in: once a device, to the device's limit.
  static PerDevice opted_in;
  XK_RETURN_IF_FAILED(opt_in_max_dynamic_smem(opted_in, read_fused_kernel<TB, kMTiles>));
  read_fused_kernel<TB, kMTiles><<<plan.groups * plan.blocks, kThreads, plan.smem_bytes, stream>>>(p, rs, w, plan);
  return cudaGetLastError();
}
}  // namespace


template <typename TB>
cudaError_t launch_read_fused(const RefineParams& p, const RowSet& rs, const RefineWorkspace& w,
                              const RefineReadPlan& plan, cudaStream_t stream) {
  switch (plan.m_tiles) {
    case 1: return launch_read_fused_tiles<TB, 1>(p, rs, w, plan, stream);
    case 2: return launch_read_fused_tiles<TB, 2>(p, rs, w, plan, stream);
    case 4: return launch_read_fused_tiles<TB, 4>(p, rs, w, plan, stream);
  }
  return cudaErrorInvalidValue;
}


template cudaError_t launch_read_fused<float>(const RefineParams&, const RowSet&, const RefineWorkspace&,
                                              const RefineReadPlan&, cudaStream_t);
template cudaError_t launch_read_fused<__nv_bfloat16>(const RefineParams&, const RowSet&, const RefineWorkspace&,
                                                      const RefineReadPlan&, cudaStream_t);
template cudaError_t launch_read_fused<__half>(const RefineParams&, const RowSet&, const RefineWorkspace&,
                                               const RefineReadPlan&, cudaStream_t);

}  // namespace xkernels::cuda
