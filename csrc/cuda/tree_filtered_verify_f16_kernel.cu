// tree_verify's walks that cut their rows (top-k, top-p, min-p) on float16 logits (tree_walk.cuh).
#include "tree_walk.cuh"

namespace xkernels::cuda {
template cudaError_t launch_verify_walk<__half, true>(const TreeVerifyParams&, const VerifyWorkspace&, bool, bool,
                                                      cudaStream_t);
}  // namespace xkernels::cuda
