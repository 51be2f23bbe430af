// spiffy_materialize's filtered rows on float16 logits: the scan and the radix path (spiffy_filtered_rows.cuh).
#include "spiffy_filtered_rows.cuh"

namespace xkernels::cuda {
template void launch_spiffy_filtered_scan<__half>(const SpiffyMaterializeParams&, const FilteredSpace&, cudaStream_t);
template void launch_spiffy_filtered_rows<__half>(const SpiffyMaterializeParams&, const FilteredSpace&, cudaStream_t);
}  // namespace xkernels::cuda
