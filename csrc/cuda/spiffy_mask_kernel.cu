// spiffy_attention_mask on CUDA: a warp per mask row, a lane per output byte.
#include "device_utils.cuh"
#include "spiffy_launch.h"

namespace xkernels::cuda {
namespace {

constexpr int kMaskRowsPerBlock = kWarps;  // a warp a mask row

// A warp per mask row (grid-stride), its lanes over the row's bytes: the row's intervals are
// computed once a row, not once a byte (64-bit divisions cost tens of instructions each).
__global__ void __launch_bounds__(kThreads) spiffy_mask_kernel(SpiffyMaskParams p, int64_t q_len, int64_t row_bytes,
                                                               int64_t rows) {
  const int lane = threadIdx.x % 32;
  const int64_t keys = p.max_prefix + q_len;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kMaskRowsPerBlock + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kMaskRowsPerBlock) {
    const SpiffyMaskRow r = spiffy_mask_row(row % q_len, p.block_size, p.max_prefix, p.prefix_lens[row / q_len]);
    uint8_t* out = p.mask + row * row_bytes;
    for (int64_t byte = lane; byte < row_bytes; byte += 32) {
      if (!p.packed) {
        out[byte] = spiffy_mask_at(r, byte);
        continue;
      }
      uint8_t bits = 0;
      for (int b = 0; b < 8 && 8 * byte + b < keys; ++b)
        bits |= static_cast<uint8_t>(spiffy_mask_at(r, 8 * byte + b)) << b;
      out[byte] = bits;
    }
  }
}

}  // namespace

cudaError_t launch_spiffy_attention_mask(const SpiffyMaskParams& p, cudaStream_t stream) {
  const int64_t q_len = (1 + p.num_drafts) * p.block_size, keys = p.max_prefix + q_len;
  const int64_t row_bytes = p.packed ? (keys + 7) / 8 : keys, rows = p.n * q_len;
  if (rows * row_bytes == 0) return cudaSuccess;
  const int64_t blocks = (rows + kMaskRowsPerBlock - 1) / kMaskRowsPerBlock;
  spiffy_mask_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0, stream>>>(p, q_len, row_bytes,
                                                                                                     rows);
  return cudaGetLastError();
}

}  // namespace xkernels::cuda
