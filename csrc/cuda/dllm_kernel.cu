// dllm_step on CUDA, two launches that never wait on the host:
//  1. rows:   a block per masked position picks x0 by dllm_row.cuh (the argmax at T = 0, else
//             Gumbel-max over the tempered row with the noise of (sequence, position)); writes
//             x0 and the confidence softmax(raw)[x0].
//  2. select: a thread per sequence applies the unmasking rule of xkernels/dllm.h.
#include "device_utils.cuh"
#include "dllm_launch.h"
#include "dllm_row.cuh"
#include "xkernels/dllm.h"

namespace xkernels::cuda {
namespace {

// vector_ok: every row starts 16-byte aligned (row_reduce.cuh's vector loads).
template <typename T>
__global__ void __launch_bounds__(kThreads) dllm_rows_kernel(DllmParams p, int64_t* x0, bool vector_ok) {
  const int64_t row = blockIdx.x;
  if (p.block[row] != p.rule.mask_id) {  // the same for the whole block
    if (threadIdx.x == 0) p.confidence[row] = kNegInf, x0[row] = -1;
    return;
  }
  const uint64_t seed = read_or(p.rule.seed_ptr, p.rule.seed), offset = read_or(p.rule.offset_ptr, p.rule.offset);
  const DllmPick pick = dllm_row_pick(
      static_cast<const T*>(p.logits) + row * p.v, p.v, p.rule.mask_id, p.rule.inv_t, seed, offset,
      static_cast<uint32_t>(row / p.l), static_cast<uint32_t>(row % p.l), vector_ok, threadIdx.x, kThreads,
      [](auto s, auto empty) { return block_merge_all(s, empty); });
  if (threadIdx.x == 0) x0[row] = pick.token, p.confidence[row] = pick.confidence;
}

__global__ void dllm_select_kernel(DllmParams p, const int64_t* x0, uint8_t* chosen) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= p.n) return;
  const int64_t o = n * p.l;
  dllm_select(p.confidence + o, p.block + o, x0 + o, p.l, p.rule.mask_id, p.rule.num_unmask, p.rule.use_threshold,
              p.rule.threshold, chosen + o, p.new_block + o, p.positions + o, p.tokens + o);
}

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

template <typename T>
cudaError_t launch_typed(const DllmParams& p, void* workspace, cudaStream_t stream) {
  int64_t* x0 = static_cast<int64_t*>(workspace);
  uint8_t* chosen = static_cast<uint8_t*>(workspace) + align_up(sizeof(int64_t) * p.n * p.l);
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
  dllm_rows_kernel<T><<<p.n * p.l, kThreads, 0, stream>>>(p, x0, vector_ok);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  dllm_select_kernel<<<(p.n + 63) / 64, 64, 0, stream>>>(p, x0, chosen);
  return cudaGetLastError();
}

}  // namespace

size_t dllm_workspace_bytes(const DllmParams& p) {
  return align_up(sizeof(int64_t) * p.n * p.l) + align_up(static_cast<size_t>(p.n * p.l));
}

cudaError_t launch_dllm_step(const DllmParams& p, void* workspace, cudaStream_t stream) {
  if (p.n * p.l == 0) return cudaSuccess;
  switch (p.dtype) {
    case LogitsType::kFloat32: return launch_typed<float>(p, workspace, stream);
    case LogitsType::kBFloat16: return launch_typed<__nv_bfloat16>(p, workspace, stream);
    case LogitsType::kFloat16: return launch_typed<__half>(p, workspace, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace xkernels::cuda
