// The Spiffy ops on CUDA, one launch each, never waiting on the host.
//  materialize: a block per sequence. Its warps reduce the masked positions' rows (softmax
//               statistics and top tokens); then the ranking, the node scores and the kept set
//               (one block-wide argmax per kept node) follow xkernels/spiffy.h.
//  accept:      a block per sequence walks the steps: its warps compute dllm_step's row rule on
//               the logits of the block reached, thread 0 applies the selection and looks for a
//               kept draft equal to the new block.
//  mask:        a thread per output byte.
#include "device_utils.cuh"
#include "spiffy_launch.h"

namespace xkernels::cuda {
namespace {

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

// The warp's merge of each lane's top tokens: kSpiffyMaxRank rounds of a warp argmax over the
// lanes' next candidates; the winning lane moves to its next one. Every lane returns the result.
__device__ TopTokens warp_merge_top(const TopTokens& mine) {
  TopTokens out;
  top_clear(out);
  int cursor = 0;
#pragma unroll
  for (int j = 0; j < kSpiffyMaxRank; ++j) {
    float v = kNegInf;
    int32_t i = kNoIndex;
#pragma unroll
    for (int c = 0; c < kSpiffyMaxRank; ++c)
      if (c == cursor) v = mine.val[c], i = mine.idx[c];
    const ArgMax best = warp_merge(ArgMax{v, i});
    out.val[j] = best.val, out.idx[j] = best.idx;
    if (best.idx == i && i != kNoIndex) ++cursor;
  }
  return out;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) spiffy_materialize_kernel(SpiffyMaterializeParams p, PositionTop* pos,
                                                                      int32_t* order, float* score, uint8_t* state) {
  __shared__ int64_t masked_shared;
  const int64_t n = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t* block = p.block + n * p.l;
  pos += n * p.l, order += n * p.l, score += n * p.graph.g, state += n * p.graph.g;
  for (int64_t q = warp; q < p.l; q += kWarps) {
    if (block[q] != p.mask_id) continue;  // the same for the whole warp
    const T* src = static_cast<const T*>(p.logits) + (n * p.l + q) * p.v;
    RowStats raw = stats_empty(), scaled = stats_empty();
    TopTokens top;
    top_clear(top);
    for (int64_t x = lane; x < p.v; x += 32) {
      const float a = dllm_logit(to_float(src[x]), x, p.mask_id);
      stats_observe(raw, a, static_cast<int32_t>(x));
      if (p.scale != 1.0f) stats_observe(scaled, a * p.scale, static_cast<int32_t>(x));
      top_observe(top, a, static_cast<int32_t>(x));
    }
    raw = warp_merge(raw);
    const float scaled_sum = p.scale != 1.0f ? warp_merge(scaled).sum : raw.sum;
    top = warp_merge_top(top);
    if (lane == 0) position_top(top, raw, scaled_sum, p.scale, pos[q]);
  }
  __syncthreads();
  if (threadIdx.x == 0) masked_shared = spiffy_rank_positions(pos, block, p.l, p.mask_id, order);
  __syncthreads();
  const GraphView& gr = p.graph;
  for (int64_t g = threadIdx.x; g < gr.g; g += kThreads) {
    score[g] = g == 0 ? kNegInf : spiffy_local_log(gr.ranks + g * gr.k * 2, gr.k, pos, order, masked_shared);
    state[g] = kNodeOut;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    spiffy_combine_scores(gr, score);
    spiffy_expand(gr, 0, score, state);
  }
  __syncthreads();
  for (int64_t r = 0; r < p.keep; ++r) {
    ArgMax best = argmax_empty();
    for (int64_t g = threadIdx.x; g < gr.g; g += kThreads)
      if (state[g] == kNodeFrontier) argmax_observe(best, score[g], static_cast<int32_t>(g));
    best = block_merge(best, argmax_empty());
    if (threadIdx.x == 0) {
      int64_t* draft = p.drafts + (n * p.keep + r) * p.l;
      if (best.idx == kNoIndex) {
        for (int64_t q = 0; q < p.l; ++q) draft[q] = block[q];
      } else {
        state[best.idx] = kNodeKept;
        spiffy_expand(gr, best.idx, score, state);
        spiffy_fill(gr.ranks + best.idx * gr.k * 2, gr.k, pos, order, block, p.l, draft);
        p.node_ids[n * p.keep + r] = best.idx;
        p.scores[n * p.keep + r] = exp_f32(best.val);
      }
    }
    __syncthreads();  // state, and block_merge's buffer
  }
}

// dllm_step's rule on one row, by a warp; lane 0 returns the pick and its confidence.
template <typename T>
__device__ void dllm_row_warp(const T* src, int64_t v, int64_t mask_id, float inv_t, uint64_t seed, uint64_t offset,
                              uint32_t sequence, uint32_t position, int64_t* x0, float* conf) {
  const int lane = threadIdx.x % 32;
  const auto logit = [&](int64_t x) { return dllm_logit(to_float(src[x]), x, mask_id); };
  RowStats raw = stats_empty();
  for (int64_t x = lane; x < v; x += 32) stats_observe(raw, logit(x), static_cast<int32_t>(x));
  raw = warp_merge(raw);
  int32_t pick = raw.top.idx;
  if (inv_t != 0.0f) {
    RowStats st = stats_empty();
    for (int64_t x = lane; x < v; x += 32) stats_observe(st, logit(x) * inv_t, static_cast<int32_t>(x));
    st = warp_merge(st);
    pick = st.top.idx;
    if (!stats_degenerate(st)) {
      const SampleJob job{kSamplePlain, static_cast<int32_t>(position), -1, st.top.idx, st};
      ArgMax best = argmax_empty();
      for (int64_t g = lane; 4 * g < v; g += 32) {
        float a[4];
        const int count = v - 4 * g < 4 ? static_cast<int>(v - 4 * g) : 4;
#pragma unroll
        for (int j = 0; j < 4; ++j) a[j] = j < count ? logit(4 * g + j) * inv_t : kNegInf;
        sample_group(best, job, seed, offset, sequence, static_cast<uint32_t>(g), a, nullptr, count);
      }
      pick = sample_result(job, warp_merge(best));
    }
  }
  if (lane == 0) *x0 = pick, *conf = dllm_confidence(raw, logit(pick));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) spiffy_accept_kernel(SpiffyAcceptParams p, float* conf, int64_t* x0,
                                                                 uint8_t* chosen) {
  __shared__ int64_t cur, steps, committed;
  __shared__ bool done;
  const int64_t n = blockIdx.x;
  const int warp = threadIdx.x / 32;
  int64_t* state = p.new_block + n * p.l;
  conf += n * p.l, x0 += n * p.l, chosen += n * p.l;
  const uint64_t seed = read_or(p.rule.seed_ptr, p.rule.seed), offset = read_or(p.rule.offset_ptr, p.rule.offset);
  if (threadIdx.x == 0) cur = -1, steps = 0, committed = 0;
  for (;;) {
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t masked = 0;
      for (int64_t q = 0; q < p.l; ++q) masked += state[q] == p.rule.mask_id;
      // The second stop guards the outputs: only a row without a softmax can pick the mask token.
      done = masked == 0 || committed + masked > p.l;
    }
    __syncthreads();
    if (done) break;
    const T* logits = cur < 0 ? static_cast<const T*>(p.root_logits) + n * p.l * p.v
                              : static_cast<const T*>(p.draft_logits) + (n * p.k + cur) * p.l * p.v;
    for (int64_t q = warp; q < p.l; q += kWarps) {
      if (state[q] != p.rule.mask_id) {
        if (threadIdx.x % 32 == 0) conf[q] = kNegInf;
        continue;
      }
      dllm_row_warp(logits + q * p.v, p.v, p.rule.mask_id, p.rule.inv_t, seed, offset + static_cast<uint64_t>(steps),
                    static_cast<uint32_t>(n), static_cast<uint32_t>(q), x0 + q, conf + q);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      dllm_select(conf, state, x0, p.l, p.rule.mask_id, p.rule.num_unmask, p.rule.use_threshold, p.rule.threshold,
                  chosen, state, p.positions + n * p.l + committed, p.tokens + n * p.l + committed);
      for (int64_t q = 0; q < p.l; ++q) committed += chosen[q];
      ++steps;
      const int64_t m = spiffy_match(state, p.drafts + n * p.k * p.l, p.node_ids + n * p.k, p.k, p.l);
      if (m < 0) {
        done = true;
      } else {
        cur = m;
      }
    }
    __syncthreads();
    if (done) break;
  }
  if (threadIdx.x == 0) p.num_steps[n] = steps, p.continue_from[n] = cur;
}

__global__ void spiffy_mask_kernel(SpiffyMaskParams p, int64_t q_len, int64_t row_bytes, int64_t total) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t byte = i % row_bytes, row = i / row_bytes;
    const SpiffyMaskRow r = spiffy_mask_row(row % q_len, p.block_size, p.max_prefix, p.prefix_lens[row / q_len]);
    if (!p.packed) {
      p.mask[i] = spiffy_mask_at(r, byte);
      continue;
    }
    const int64_t keys = p.max_prefix + q_len;
    uint8_t bits = 0;
    for (int b = 0; b < 8 && 8 * byte + b < keys; ++b)
      bits |= static_cast<uint8_t>(spiffy_mask_at(r, 8 * byte + b)) << b;
    p.mask[i] = bits;
  }
}

template <typename T>
cudaError_t materialize_typed(const SpiffyMaterializeParams& p, void* workspace, cudaStream_t stream) {
  char* at = static_cast<char*>(workspace);
  auto* pos = reinterpret_cast<PositionTop*>(at);
  at += align_up(sizeof(PositionTop) * p.n * p.l);
  auto* order = reinterpret_cast<int32_t*>(at);
  at += align_up(sizeof(int32_t) * p.n * p.l);
  auto* score = reinterpret_cast<float*>(at);
  at += align_up(sizeof(float) * p.n * p.graph.g);
  auto* state = reinterpret_cast<uint8_t*>(at);
  spiffy_materialize_kernel<T><<<p.n, kThreads, 0, stream>>>(p, pos, order, score, state);
  return cudaGetLastError();
}

template <typename T>
cudaError_t accept_typed(const SpiffyAcceptParams& p, void* workspace, cudaStream_t stream) {
  char* at = static_cast<char*>(workspace);
  auto* conf = reinterpret_cast<float*>(at);
  at += align_up(sizeof(float) * p.n * p.l);
  auto* x0 = reinterpret_cast<int64_t*>(at);
  at += align_up(sizeof(int64_t) * p.n * p.l);
  spiffy_accept_kernel<T><<<p.n, kThreads, 0, stream>>>(p, conf, x0, reinterpret_cast<uint8_t*>(at));
  return cudaGetLastError();
}

template <typename Launch>
cudaError_t by_dtype(LogitsType dtype, Launch&& launch) {
  switch (dtype) {
    case LogitsType::kFloat32: return launch(float{});
    case LogitsType::kBFloat16: return launch(__nv_bfloat16{});
    case LogitsType::kFloat16: return launch(__half{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

size_t spiffy_materialize_workspace_bytes(const SpiffyMaterializeParams& p) {
  return align_up(sizeof(PositionTop) * p.n * p.l) + align_up(sizeof(int32_t) * p.n * p.l) +
         align_up(sizeof(float) * p.n * p.graph.g) + align_up(static_cast<size_t>(p.n * p.graph.g));
}

cudaError_t launch_spiffy_materialize(const SpiffyMaterializeParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  return by_dtype(p.dtype, [&](auto tag) { return materialize_typed<decltype(tag)>(p, workspace, stream); });
}

size_t spiffy_accept_workspace_bytes(const SpiffyAcceptParams& p) {
  return align_up(sizeof(float) * p.n * p.l) + align_up(sizeof(int64_t) * p.n * p.l) +
         align_up(static_cast<size_t>(p.n * p.l));
}

cudaError_t launch_spiffy_accept(const SpiffyAcceptParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0 || p.l == 0) return cudaSuccess;
  return by_dtype(p.dtype, [&](auto tag) { return accept_typed<decltype(tag)>(p, workspace, stream); });
}

cudaError_t launch_spiffy_attention_mask(const SpiffyMaskParams& p, cudaStream_t stream) {
  const int64_t q_len = (1 + p.num_drafts) * p.block_size, keys = p.max_prefix + q_len;
  const int64_t row_bytes = p.packed ? (keys + 7) / 8 : keys, total = p.n * q_len * row_bytes;
  if (total == 0) return cudaSuccess;
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  spiffy_mask_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0, stream>>>(p, q_len, row_bytes,
                                                                                                     total);
  return cudaGetLastError();
}

}  // namespace xkernels::cuda
