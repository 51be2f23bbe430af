// shard_row_stats on CUDA: a block per selected row reduces the shard row's softmax statistics
// (global ids), then, when sampling, its Gumbel-max over groups of 4 global ids (one Philox draw
// each, as every kernel of the package keys them), so the merged picks of all shards are the
// unsharded ops' tokens. One launch, no host reads.
#include "device_utils.cuh"
#include "row_reduce.cuh"
#include "shard_row_stats_launch.h"

namespace xkernels::cuda {
namespace {

// 3 blocks an SM (at most 85 registers; it needs about 75) keep the statistics read's 16-byte loads, 4 a
// thread, at ~6.5 MB in flight over the chip. 4 blocks (64 registers) would spill the sampling part.
template <typename T>
__global__ void __launch_bounds__(kThreads, 3) shard_row_stats_kernel(ShardRowStatsParams p) {
  const int64_t entry = blockIdx.x, n = entry / p.s;
  const int64_t row = p.rows ? p.rows[entry] : entry % p.s;
  if (row < 0 || row >= p.r || p.v == 0) {  // a bad row index (unchecked: no host sync) or an empty shard
    if (threadIdx.x == 0) {
      p.row_max[entry] = kNegInf, p.row_sum[entry] = 0.0f, p.top_id[entry] = -1;
      p.pick_score[entry] = kNegInf, p.pick_id[entry] = -1, p.pick_logit[entry] = kNegInf;
    }
    return;
  }
  const T* src = static_cast<const T*>(p.logits) + (n * p.r + row) * p.v;
  const float stats_scale = p.raw_stats || p.inv_t == 0.0f ? 1.0f : p.inv_t;
  // The statistics by row_reduce.cuh's read (local ids; the ignored id at -inf): 16-byte loads, 4 in
  // flight a thread, when every row starts 16-byte aligned.
  constexpr int kIds = 16 / sizeof(T);
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
  RowStats st = block_merge(thread_row_stats<T, false, 4>(src, p.v, 0, (p.v + kIds - 1) / kIds, vector_ok,
                                                          stats_scale, p.ignore_id - p.vocab_start, threadIdx.x,
                                                          kThreads),
                            stats_empty());
  if (threadIdx.x == 0) {
    p.row_max[entry] = st.top.val;
    p.row_sum[entry] = stats_degenerate(st) ? 0.0f : st.sum;
    p.top_id[entry] = p.vocab_start + st.top.idx;  // a row of v > 0 ids always has a top
  }
  if (!p.sample) {
    if (threadIdx.x == 0) p.pick_score[entry] = kNegInf, p.pick_id[entry] = -1, p.pick_logit[entry] = kNegInf;
    return;
  }
  const bool residual = p.draft_probs && row < p.q;
  const float* q = residual ? p.draft_probs + (n * p.q + row) * p.v : nullptr;
  const RowStats global = residual ? RowStats{ArgMax{p.residual_stats[2 * entry], 0}, p.residual_stats[2 * entry + 1]}
                                   : stats_empty();
  const SampleJob job{residual ? kSampleResidual : kSamplePlain, static_cast<int32_t>(row), -1, 0, global};
  const int64_t* ex = p.exclude ? p.exclude + entry * p.e : nullptr;
  const uint64_t seed = read_or(p.seed_ptr, p.seed), offset = read_or(p.offset_ptr, p.offset);
  ArgMax best = argmax_empty();
  const int64_t g_end = (p.vocab_start + p.v + 3) / 4;
  for (int64_t g = p.vocab_start / 4 + threadIdx.x; g < g_end; g += kThreads) {
    float a[4], qg[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t id = 4 * g + j, x = id - p.vocab_start;
      bool drawable = x >= 0 && x < p.v && id != p.ignore_id;
      for (int64_t k = 0; drawable && k < p.e; ++k) drawable = ex[k] != id;
      a[j] = drawable ? to_float(src[x]) * p.inv_t : kNegInf;  // -inf: never drawn, in both modes
      qg[j] = drawable && residual ? q[x] : 0.0f;
    }
    sample_group(best, job, seed, offset, static_cast<uint32_t>(n), static_cast<uint32_t>(g), a,
                 residual ? qg : nullptr, 4);
  }
  __syncthreads();
  best = block_merge(best, argmax_empty());
  if (threadIdx.x == 0) {
    const bool picked = best.val != kNegInf;
    const int64_t x = best.idx - p.vocab_start;
    p.pick_score[entry] = best.val;
    p.pick_id[entry] = picked ? best.idx : -1;
    p.pick_logit[entry] = picked ? to_float(src[x]) * (p.raw_stats ? 1.0f : p.inv_t) : kNegInf;
  }
}

template <typename T>
cudaError_t launch_typed(const ShardRowStatsParams& p, cudaStream_t stream) {
  shard_row_stats_kernel<T><<<p.n * p.s, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_shard_row_stats(const ShardRowStatsParams& p, cudaStream_t stream) {
  if (p.n * p.s == 0) return cudaSuccess;
  switch (p.dtype) {
    case LogitsType::kFloat32: return launch_typed<float>(p, stream);
    case LogitsType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream);
    case LogitsType::kFloat16: return launch_typed<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace xkernels::cuda
