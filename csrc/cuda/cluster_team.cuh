// The blocks that work on one item together (a Spiffy sequence's walk, a tree sequence's walk): a
// thread block cluster on sm_90+ (co-scheduled, so its blocks may wait for each other), or one
// block. Shared by spiffy_kernels.cuh and tree_walk.cuh.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

namespace xkernels::cuda {

// The block's rank in its team (0 without kCluster).
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
    __trap();  // never launched: the launchers take one block an item below sm_90 (has_cluster_image)
#endif
  } else {
    __syncthreads();
  }
}

// Whether the device code loaded for `kernel` (a cluster variant) is an sm_90+ image: a build
// without one (a JIT from compute_80's PTX) has no clusters. A failed query reads as no.
template <typename... P>
bool has_cluster_image(void (*kernel)(P...)) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();  // a query's failure is no launch error
    return false;
  }
  return attr.binaryVersion >= 90 && attr.ptxVersion >= 90;
}

// A launch of `grid` blocks in clusters of `size` (the attribute lives in *cluster).
inline cudaLaunchConfig_t cluster_config(unsigned grid, unsigned block, size_t smem, cudaStream_t stream,
                                         unsigned size, cudaLaunchAttribute* cluster) {
  cluster->id = cudaLaunchAttributeClusterDimension;
  cluster->val.clusterDim.x = size, cluster->val.clusterDim.y = 1, cluster->val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid), config.blockDim = dim3(block), config.dynamicSmemBytes = smem, config.stream = stream;
  config.attrs = cluster, config.numAttrs = 1;
  return config;
}

}  // namespace xkernels::cuda
