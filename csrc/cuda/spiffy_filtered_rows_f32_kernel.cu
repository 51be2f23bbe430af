// spiffy_materialize's first pass for the filtered rows on float32 logits (spiffy_filtered.cuh).
#include "spiffy_filtered.cuh"

namespace xkernels::cuda {
template void launch_spiffy_filtered_rows<float>(const SpiffyMaterializeParams&, FilterCut*, RowSlice*, int,
                                                 bool, cudaStream_t);
}  // namespace xkernels::cuda
