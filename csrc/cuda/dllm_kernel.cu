// dllm_step on CUDA, two launches that never wait on the host:
//  1. rows:   a block per masked position reduces the raw row's softmax statistics and picks
//             x0 (the argmax at T = 0, else Gumbel-max over the tempered row with the noise of
//             (sequence, position)); writes x0 and the confidence softmax(raw)[x0].
//  2. select: a thread per sequence applies the unmasking rule of xkernels/dllm.h.
#include "device_utils.cuh"
#include "dllm_launch.h"
#include "xkernels/dllm.h"

namespace xkernels::cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(kThreads) dllm_rows_kernel(DllmParams p, int64_t* x0) {
  __shared__ RowStats shared_stats;
  const int64_t row = blockIdx.x;
  if (p.block[row] != p.rule.mask_id) {  // the same for the whole block
    if (threadIdx.x == 0) p.confidence[row] = kNegInf, x0[row] = -1;
    return;
  }
  const T* src = static_cast<const T*>(p.logits) + row * p.v;
  const auto logit = [&](int64_t x) { return dllm_logit(to_float(src[x]), x, p.rule.mask_id); };
  RowStats raw = stats_empty();
  for (int64_t x = threadIdx.x; x < p.v; x += kThreads) stats_observe(raw, logit(x), static_cast<int32_t>(x));
  raw = block_merge(raw, stats_empty());
  int32_t pick = raw.top.idx;
  if (p.rule.inv_t != 0.0f) {
    __syncthreads();  // block_merge's buffer is reused
    RowStats st = stats_empty();
    for (int64_t x = threadIdx.x; x < p.v; x += kThreads)
      stats_observe(st, logit(x) * p.rule.inv_t, static_cast<int32_t>(x));
    st = block_merge(st, stats_empty());
    if (threadIdx.x == 0) shared_stats = st;
    __syncthreads();
    st = shared_stats;
    if (stats_degenerate(st)) {
      pick = st.top.idx;
    } else {
      const uint64_t seed = read_or(p.rule.seed_ptr, p.rule.seed), offset = read_or(p.rule.offset_ptr, p.rule.offset);
      const SampleJob job{kSamplePlain, static_cast<int32_t>(row % p.l), -1, st.top.idx, st};
      ArgMax best = argmax_empty();
      for (int64_t g = threadIdx.x; 4 * g < p.v; g += kThreads) {
        float a[4];
        const int count = p.v - 4 * g < 4 ? static_cast<int>(p.v - 4 * g) : 4;
#pragma unroll
        for (int j = 0; j < 4; ++j) a[j] = j < count ? logit(4 * g + j) * p.rule.inv_t : kNegInf;
        sample_group(best, job, seed, offset, static_cast<uint32_t>(row / p.l), static_cast<uint32_t>(g), a, nullptr,
                     count);
      }
      best = block_merge(best, argmax_empty());
      pick = sample_result(job, best);
    }
  }
  if (threadIdx.x == 0) {
    x0[row] = pick;
    p.confidence[row] = dllm_confidence(raw, logit(pick));
  }
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
  dllm_rows_kernel<T><<<p.n * p.l, kThreads, 0, stream>>>(p, x0);
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
