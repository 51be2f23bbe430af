// spiffy_accept's filtered prepare kernel on bfloat16 logits (spiffy_filtered.cuh).
#include "spiffy_filtered.cuh"

namespace xkernels::cuda {
template cudaError_t launch_filtered_accept_prepare<__nv_bfloat16>(const SpiffyAcceptParams&, const AcceptWorkspace&, bool,
                                                  cudaStream_t);
}  // namespace xkernels::cuda
