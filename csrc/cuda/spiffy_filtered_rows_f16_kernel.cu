// spiffy_materialize's first pass for the filtered rows on float16 logits (spiffy_filtered.cuh).
#include "spiffy_filtered.cuh"

namespace xkernels::cuda {
template void launch_spiffy_filtered_rows<__half>(const SpiffyMaterializeParams&, FilterCut*, RowSlice*, int,
                                                  bool, cudaStream_t);
}  // namespace xkernels::cuda
