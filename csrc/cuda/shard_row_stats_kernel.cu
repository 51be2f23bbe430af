// shard_row_stats on CUDA: a block per selected row reduces the shard row's softmax statistics
// (global ids; the ids outside the row's cut at -inf), then, when sampling, its Gumbel-max in the
// sequence's stream, each id scored with the noise of its global id (word id % 4 of Philox draw
// id / 4, as every kernel of the package keys them), so the merged picks of all shards are the
// unsharded ops' tokens. Both passes read the row through row_reduce.cuh's reader. One launch, no
// host reads.
#include "device_utils.cuh"
#include "row_reduce.cuh"
#include "shard_row_stats_launch.h"

namespace xkernels::cuda {
namespace {

// 3 blocks an SM (at most 85 registers) keep the statistics read's 16-byte loads, 4 a thread, at
// ~6.5 MB in flight over the chip.
template <typename T>
__global__ void __launch_bounds__(kThreads, 3) shard_row_stats_kernel(ShardRowStatsParams p) {
  constexpr int kIds = 16 / sizeof(T);
  const int64_t entry = blockIdx.x, n = entry / p.s;
  const int64_t row = p.rows ? p.rows[entry] : entry % p.s;
  if (row < 0 || row >= p.r || p.v == 0) {  // a bad row index (unchecked: no host sync) or an empty shard
    if (threadIdx.x == 0) {
      p.row_max[entry] = kNegInf, p.row_sum[entry] = 0.0f, p.top_id[entry] = -1;
      p.pick_score[entry] = kNegInf, p.pick_id[entry] = -1, p.pick_logit[entry] = kNegInf;
    }
    return;
  }
  const float inv_t = p.s_args.row(n).inv_t;  // 0: greedy
  const T* src = static_cast<const T*>(p.logits) + (n * p.r + row) * p.v;
  const bool has_cut = p.cut_value && inv_t != 0.0f;  // a greedy row keeps its argmax
  const FilterCut cut{has_cut ? p.cut_value[entry] : 0.0f, has_cut ? p.cut_id[entry] : 0};
  const bool scale_stats = !p.raw_stats && inv_t != 0.0f;
  const bool cut_stats = has_cut && scale_stats;
  const int64_t first = p.vocab_start, ignore = p.ignore_id - p.vocab_start, chunks = (p.v + kIds - 1) / kIds;
  const auto kept = [&](float a, int64_t x) {
    return !cut_stats || filter_keeps(cut, a, static_cast<int32_t>(first + x)) ? a : kNegInf;
  };
  // row_reduce.cuh's read (local ids; the ignored id at -inf): 16-byte loads, 4 in flight a thread,
  // when every row starts 16-byte aligned.
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
  RowStats st = stats_empty();
  for_each_row_value<T, 4>(
      src, p.v, 0, chunks, vector_ok, scale_stats ? inv_t : 1.0f, ignore, threadIdx.x, kThreads,
      [&](float (&a)[kIds], int32_t x) {
#pragma unroll
        for (int j = 0; j < kIds; ++j) a[j] = kept(a[j], x + j);
        observe_chunk_in_order<false>(st, a, x);
      },
      [&](float a, int32_t x) { stats_observe(st, kept(a, x), x); });
  st = block_merge(st, stats_empty());
  if (threadIdx.x == 0) {
    p.row_max[entry] = st.top.val;
    p.row_sum[entry] = stats_degenerate(st) ? 0.0f : st.sum;
    p.top_id[entry] = first + st.top.idx;  // a row of v > 0 ids always has a top
  }
  if (!p.sample || inv_t == 0.0f) {
    if (threadIdx.x == 0) p.pick_score[entry] = kNegInf, p.pick_id[entry] = -1, p.pick_logit[entry] = kNegInf;
    return;
  }
  const bool residual = p.draft_probs && row < p.q;
  const int64_t* ex = p.exclude ? p.exclude + entry * p.e : nullptr;
  const float* q = residual ? p.draft_probs + (n * p.q + row) * p.v : nullptr;
  RowStats global = stats_empty();  // the residual's (max, sum) over the whole vocabulary
  if (residual) global = RowStats{ArgMax{p.residual_stats[2 * entry], 0}, p.residual_stats[2 * entry + 1]};
  // The log-weight of local id x (global id `id`, scaled logit a): -inf where it cannot be drawn.
  const auto log_weight = [&](float a, int64_t x, int32_t id) {
    bool drawable = a != kNegInf && (!has_cut || filter_keeps(cut, a, id));
    for (int64_t k = 0; drawable && k < p.e; ++k) drawable = ex[k] != id;
    if (!drawable) return kNegInf;
    if (!q) return a;
    const float r = stats_prob(global, a) - q[x];
    return r > 0.0f ? log_f32(r) : kNegInf;
  };
  const RowStream stream = p.s_args.stream(n);
  const auto slot = static_cast<uint32_t>(row);
  const uint64_t seed = stream.seed, offset = stream.offset_at(slot);
  const uint32_t sequence = stream.sequence_at(), position = stream.position_at(slot);
  // Each id's score on its own (gumbel_score: the word of its own group); an id whose weight plus
  // the largest noise cannot reach the best so far draws nothing, as sample_group skips it.
  ArgMax best = argmax_empty();
  const auto score = [&](float a, int64_t x) {
    const auto id = static_cast<int32_t>(first + x);
    const float w = log_weight(a, x, id);
    if (w == kNegInf || w + kGumbelBound < best.val) return;
    const ArgMax c = gumbel_score(w, id, seed, offset, sequence, position);
    if (argmax_before(c.val, c.idx, best.val, best.idx)) best = c;
  };
  for_each_row_value<T, 2>(
      src, p.v, 0, chunks, vector_ok, inv_t, ignore, threadIdx.x, kThreads,
      [&](const float (&a)[kIds], int32_t x) {
#pragma unroll
        for (int j = 0; j < kIds; ++j) score(a[j], x + j);
      },
      score);
  __syncthreads();
  best = block_merge(best, argmax_empty());
  if (threadIdx.x == 0) {
    const bool picked = best.val != kNegInf;
    const int64_t x = best.idx - first;
    p.pick_score[entry] = best.val;
    p.pick_id[entry] = picked ? best.idx : -1;
    p.pick_logit[entry] = picked ? to_float(src[x]) * (p.raw_stats ? 1.0f : inv_t) : kNegInf;
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
