// tree_verify's walks that do not cut their rows (tree_walk.cuh).
#include "tree_walk.cuh"

namespace xkernels::cuda {
template cudaError_t launch_verify_walk<float, false>(const TreeVerifyParams&, const VerifyWorkspace&, bool, bool,
                                                      cudaStream_t);
template cudaError_t launch_verify_walk<__nv_bfloat16, false>(const TreeVerifyParams&, const VerifyWorkspace&, bool,
                                                              bool, cudaStream_t);
template cudaError_t launch_verify_walk<__half, false>(const TreeVerifyParams&, const VerifyWorkspace&, bool, bool,
                                                       cudaStream_t);
}  // namespace xkernels::cuda
