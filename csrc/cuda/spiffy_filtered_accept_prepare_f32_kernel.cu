// spiffy_accept's filtered prepare kernel on float32 logits (spiffy_filtered.cuh).
#include "spiffy_filtered.cuh"

namespace xkernels::cuda {
template cudaError_t launch_filtered_accept_prepare<float>(const SpiffyAcceptParams&, const AcceptWorkspace&, bool,
                                                  cudaStream_t);
}  // namespace xkernels::cuda
