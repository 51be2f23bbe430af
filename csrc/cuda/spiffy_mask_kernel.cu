// spiffy_attention_mask on CUDA: a warp per mask row, a lane per 16 bytes of it, each written from
// the row's two key intervals.
#include "device_utils.cuh"
#include "spiffy_launch.h"

namespace xkernels::cuda {
namespace {

constexpr int kMaskRowsPerBlock = kWarps;  // a warp a mask row

// Bit i set where key key0 + i lies in [begin, end): the interval clipped to the 32 keys.
__device__ __forceinline__ uint32_t interval_bits(int64_t begin, int64_t end, int64_t key0) {
  const int64_t lo = begin > key0 ? begin - key0 : 0, hi = end < key0 + 32 ? end - key0 : 32;
  if (hi <= lo) return 0u;
  const uint32_t below_hi = hi >= 32 ? 0xFFFFFFFFu : (1u << hi) - 1u;
  return below_hi & ~((1u << lo) - 1u);  // lo < hi <= 32
}

// Bit i set where key key0 + i is visible to the row (spiffy_mask_at).
__device__ __forceinline__ uint32_t mask_bits(const SpiffyMaskRow& r, int64_t key0) {
  return interval_bits(0, r.prefix_end, key0) | interval_bits(r.own_begin, r.own_end, key0);
}

// Four bytes of 0 / 1 from the low 4 bits (bit i to byte i): the shifted copies never overlap.
__device__ __forceinline__ uint32_t bits_to_bytes(uint32_t bits) { return (bits & 0xFu) * 0x00204081u & 0x01010101u; }

// Byte `at` of a row: one key (0 / 1) or, packed, 8 keys (bit b: key 8 at + b; the intervals end
// at the row's keys, so the last byte's padding bits stay 0).
__device__ __forceinline__ uint8_t mask_byte(const SpiffyMaskRow& r, int64_t at, bool packed) {
  return static_cast<uint8_t>(packed ? mask_bits(r, 8 * at) & 0xFFu : mask_bits(r, at) & 1u);
}

// 16 bytes of a row from byte `at`.
__device__ __forceinline__ uint4 mask_vector(const SpiffyMaskRow& r, int64_t at, bool packed) {
  if (packed) return uint4{mask_bits(r, 8 * at), mask_bits(r, 8 * at + 32), mask_bits(r, 8 * at + 64),
                           mask_bits(r, 8 * at + 96)};
  const uint32_t bits = mask_bits(r, at);
  return uint4{bits_to_bytes(bits), bits_to_bytes(bits >> 4), bits_to_bytes(bits >> 8), bits_to_bytes(bits >> 12)};
}

// A warp per mask row (grid-stride): bytewise up to the first 16-byte boundary, then 16-byte
// stores, then the last bytes (each fewer than 16: a lane each). A row's intervals are computed once
// a row (64-bit divisions cost tens of instructions each); a per-key loop of compares and byte
// stores made the kernel instruction-bound.
__global__ void __launch_bounds__(kThreads) spiffy_mask_kernel(SpiffyMaskParams p, int64_t q_len, int64_t row_bytes,
                                                               int64_t rows) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kMaskRowsPerBlock + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kMaskRowsPerBlock) {
    const SpiffyMaskRow r = spiffy_mask_row(row % q_len, p.block_size, p.max_prefix, p.prefix_lens[row / q_len]);
    uint8_t* out = p.mask + row * row_bytes;
    const int64_t to_boundary = static_cast<int64_t>((16u - reinterpret_cast<uintptr_t>(out) % 16u) % 16u);
    const int64_t head = to_boundary < row_bytes ? to_boundary : row_bytes;
    const int64_t tail = head + (row_bytes - head) / 16 * 16;
    if (lane < head) out[lane] = mask_byte(r, lane, p.packed);
    for (int64_t at = head + 16 * lane; at < tail; at += 16 * 32)
      *reinterpret_cast<uint4*>(out + at) = mask_vector(r, at, p.packed);
    if (tail + lane < row_bytes) out[tail + lane] = mask_byte(r, tail + lane, p.packed);
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
