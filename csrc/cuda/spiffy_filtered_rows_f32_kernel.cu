// spiffy_materialize's filtered rows on float32 logits: the scan and the radix path (spiffy_filtered_rows.cuh).
#include "spiffy_filtered_rows.cuh"

namespace xkernels::cuda {
template void launch_spiffy_filtered_scan<float>(const SpiffyMaterializeParams&, const FilteredSpace&, cudaStream_t);
template void launch_spiffy_filtered_rows<float>(const SpiffyMaterializeParams&, const FilteredSpace&, cudaStream_t);
}  // namespace xkernels::cuda
