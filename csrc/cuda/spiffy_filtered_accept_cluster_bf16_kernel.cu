// spiffy_accept's filtered walk on bfloat16 logits, a cluster a sequence (spiffy_filtered.cuh).
#include "spiffy_filtered.cuh"

namespace xkernels::cuda {
template cudaError_t launch_filtered_accept_walk<__nv_bfloat16, true>(const SpiffyAcceptParams&, const AcceptWorkspace&,
                                                                      unsigned, bool, cudaStream_t);
}  // namespace xkernels::cuda
