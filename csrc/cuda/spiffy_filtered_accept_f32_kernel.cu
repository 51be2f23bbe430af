// spiffy_accept's filtered walk on float32 logits, a block a sequence (spiffy_filtered.cuh).
#include "spiffy_filtered.cuh"

namespace xkernels::cuda {
template cudaError_t launch_filtered_accept_walk<float, false>(const SpiffyAcceptParams&, const AcceptWorkspace&,
                                                               unsigned, bool, cudaStream_t);
}  // namespace xkernels::cuda
