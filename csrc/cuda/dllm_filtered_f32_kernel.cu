// dllm_step's filtered rows on float32 logits (dllm_filtered.cuh).
#include "dllm_filtered.cuh"

namespace xkernels::cuda {
template void launch_dllm_filtered<float>(const DllmParams&, int64_t*, const DllmCandidates&, bool, cudaStream_t);
}  // namespace xkernels::cuda
