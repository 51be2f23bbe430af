// Stand-in for the CUDA header of the same name: the thread block cluster, as the kernels use it.
#pragma once
#include "../cuda_emu.h"

namespace cooperative_groups {

class cluster_group {
 public:
  // A checked rendezvous of every thread of every block of the cluster (barrier.cluster).
  void sync() const { xk_emu::cluster_barrier(); }
  unsigned block_rank() const { return xk_emu::cluster_block_rank(); }
  unsigned num_blocks() const {
    const dim3 d = xk_emu::cluster_dims();
    return d.x * d.y * d.z;
  }
  dim3 dim_blocks() const { return xk_emu::cluster_dims(); }
};

inline cluster_group this_cluster() { return cluster_group{}; }

}  // namespace cooperative_groups
