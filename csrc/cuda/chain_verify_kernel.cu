// chain_verify on CUDA, in up to four launches that never wait on the host:
//  1. row_stats:     every verification row split over the vocabulary; each
//                    block reduces its slice to softmax statistics (argmax only
//                    at T = 0) and records the draft's scaled logit.
//  2. chain_walk:    a warp per sequence merges the slices of up to 32 rows at
//                    once, tests acceptance in parallel and finds the first
//                    rejection with a ballot; writes accept_len and the tokens.
//  3. sample_slices: (T > 0) Gumbel-max over the one row per sequence that
//                    needs a sample (bonus, residual or excluded draft).
//  4. sample_finish: (T > 0) merges the slices and writes the sampled token.
// Draft ids outside [0, V) are never dereferenced: they count as rejected.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "chain_verify_launch.h"
#include "device_utils.cuh"
#include "draft_probs.cuh"
#include "row_reduce.cuh"
#include "xkernels/sampling.h"

namespace xkernels::cuda {
namespace {

// Ids 4g .. 4g+3 of a row one by one, scaled; ids past the end read as -inf.
template <typename T>
__device__ __forceinline__ void load_group(const T* row, int64_t g, int64_t v, float scale, float out[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) out[j] = 4 * g + j < v ? to_float(row[4 * g + j]) * scale : kNegInf;
}

struct Workspace {
  RowStats* row_slices;  // [n * (k+1) * row_slices]
  float* draft_logit;    // [n * k], scaled logit of each draft
  SampleJob* jobs;       // [n]
  ArgMax* sample_slices;  // [n * sample_slices]
  int row_slice_count, sample_slice_count;
};

// Every verification row, split in row_slice_count slices (row_reduce.cuh reads them).
template <typename T, bool kGreedy>
__global__ void __launch_bounds__(kThreads) row_stats_kernel(ChainVerifyParams p, Workspace w, bool vector_ok) {
  constexpr int kIds = 16 / sizeof(T);
  const int64_t rows_per_seq = p.k + 1;
  const int64_t row = blockIdx.x / w.row_slice_count;  // n * (k+1) + i
  const int slice = static_cast<int>(blockIdx.x % w.row_slice_count);
  const int64_t n = row / rows_per_seq, i = row % rows_per_seq;
  const T* logits = static_cast<const T*>(p.logits) + row * p.v;
  const float scale = kGreedy ? 1.0f : p.inv_t;
  const SliceRange range = slice_range(p.v, kIds, w.row_slice_count, slice);
  RowStats s = thread_row_stats<T, kGreedy, 4>(logits, p.v, range.begin, range.end, vector_ok, scale, -1,
                                               threadIdx.x, kThreads);
  if (threadIdx.x == 0 && i < p.k) {  // the draft's scaled logit, by the slice that holds it
    const int64_t x = p.draft[n * p.k + i];
    if (x >= kIds * range.begin && x < kIds * range.end && x < p.v)
      w.draft_logit[n * p.k + i] = to_float(logits[x]) * scale;
  }
  s = block_merge(s, stats_empty());
  if (threadIdx.x == 0) w.row_slices[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kThreads) chain_walk_kernel(ChainVerifyParams p, Workspace w) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (n >= p.n) return;
  const bool greedy = p.inv_t == 0.0f;
  const uint64_t seed = read_or(p.seed_ptr, p.seed), offset = read_or(p.offset_ptr, p.offset);
  const int64_t rows = p.k + 1;
  int64_t* out = p.out_tokens + n * rows;

  for (int64_t base = 0; base < rows; base += 32) {
    const int64_t i = base + lane;
    RowStats s = stats_empty();
    bool stop = false, point_mass = true, valid = false;
    int64_t x = -1;
    if (i < rows) {
      const RowStats* slices = w.row_slices + (n * rows + i) * w.row_slice_count;
      for (int j = 0; j < w.row_slice_count; ++j) s = stats_merge(s, slices[j]);
      point_mass = greedy || stats_degenerate(s);
      if (i == p.k) {
        stop = true;
      } else {
        x = p.draft[n * p.k + i];
        valid = x >= 0 && x < p.v;
        const ProbsPtr q = ProbsPtr{p.q, p.q_dtype} + (n * p.k + i) * p.v;
        stop = !(valid && draft_accepted(point_mass, static_cast<int32_t>(x), s, w.draft_logit[n * p.k + i],
                                         static_cast<bool>(q), q ? q[x] : 0.0f,
                                         point_mass ? 0.0f
                                                    : acceptance_coin(seed, offset, static_cast<uint32_t>(n),
                                                                      static_cast<uint32_t>(i))));
      }
    }
    const unsigned stops = __ballot_sync(kFullMask, stop);
    const int first = stops ? __ffs(static_cast<int>(stops)) - 1 : 32;
    if (lane < first && i < rows) out[i] = x;
    if (stops == 0) continue;
    if (lane == first) {
      p.accept_len[n] = i;
      SampleJob job{kSampleDone, static_cast<int32_t>(i), valid ? static_cast<int32_t>(x) : -1, s.top.idx, s};
      if (point_mass) {
        out[i] = s.top.idx;
      } else {
        job.mode = i == p.k ? kSamplePlain : (p.q ? kSampleResidual : kSampleExclude);
      }
      w.jobs[n] = job;
    }
    for (int64_t j = base + first + 1 + lane; j < rows; j += 32) out[j] = -1;
    return;
  }
}

// Q: q's element type (read only in the residual mode).
template <typename T, typename Q>
__global__ void __launch_bounds__(kThreads) sample_slices_kernel(ChainVerifyParams p, Workspace w, bool vector_ok) {
  __shared__ ArgMax start;
  const int64_t n = blockIdx.x / w.sample_slice_count;
  const int slice = static_cast<int>(blockIdx.x % w.sample_slice_count);
  const SampleJob job = w.jobs[n];
  if (job.mode == kSampleDone) return;  // the same for the whole block
  const uint64_t seed = read_or(p.seed_ptr, p.seed), offset = read_or(p.offset_ptr, p.offset);
  const uint32_t sequence = static_cast<uint32_t>(n);
  const T* logits = static_cast<const T*>(p.logits) + (n * (p.k + 1) + job.row) * p.v;
  const Q* q = job.mode == kSampleResidual ? static_cast<const Q*>(p.q) + (n * p.k + job.row) * p.v : nullptr;
  if (threadIdx.x == 0) {  // every thread starts from the score of the row's argmax (row_reduce.cuh)
    const int32_t x = job.fallback;
    start = gumbel_score(sample_log_weight(job, to_float(logits[x]) * p.inv_t, x, q ? to_float(q[x]) : 0.0f), x,
                         seed, offset,
                         sequence, static_cast<uint32_t>(job.row));
  }
  __syncthreads();

  ArgMax best = start;
  const SliceRange range = slice_range(p.v, 4, w.sample_slice_count, slice);
  // Whole groups by vector loads, several in flight; the row's last partial group id by id.
  const int64_t vector_end = vector_ok ? vector_span_end(range.begin, range.end, p.v / 4) : range.begin;
  using V = typename Quad<T>::type;
  using VQ = typename Quad<Q>::type;
  struct Group {  // raw vectors: unpacked where consumed, so that the load's wait sits there
    V a;
    VQ q;
  };
  for_each_batched<4>(
      range.begin + threadIdx.x, vector_end, kThreads,
      [&](int64_t g) {
        Group x{};
        x.a = reinterpret_cast<const V*>(logits)[g];
        if (q) x.q = reinterpret_cast<const VQ*>(q)[g];
        return x;
      },
      [&](int64_t g, const Group& x) {
        float a[4], qg[4];
        unpack<T>(x.a, p.inv_t, a);
        unpack<Q>(x.q, 1.0f, qg);
        sample_group(best, job, seed, offset, sequence, static_cast<uint32_t>(g), a, qg, 4);
      });
  for (int64_t g = vector_end + threadIdx.x; g < range.end; g += kThreads) {
    float a[4], qg[4] = {};  // q is read only in the residual mode
    load_group(logits, g, p.v, p.inv_t, a);
    if (q) load_group(q, g, p.v, 1.0f, qg);
    const int count = p.v - 4 * g < 4 ? static_cast<int>(p.v - 4 * g) : 4;
    sample_group(best, job, seed, offset, sequence, static_cast<uint32_t>(g), a, qg, count);
  }
  best = block_merge(best, argmax_empty());
  if (threadIdx.x == 0) w.sample_slices[blockIdx.x] = best;
}

__global__ void __launch_bounds__(kThreads) sample_finish_kernel(ChainVerifyParams p, Workspace w) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (n >= p.n) return;
  const SampleJob job = w.jobs[n];
  if (job.mode == kSampleDone) return;
  const ArgMax best = warp_merge_slices(w.sample_slices + n * w.sample_slice_count, w.sample_slice_count,
                                        argmax_empty());
  if (lane == 0) p.out_tokens[n * (p.k + 1) + job.row] = sample_result(job, best);
}

struct Layout {
  int row_slices, sample_slices;
  size_t row_bytes, logit_bytes, job_bytes, sample_bytes;
};

// The blocks an SM row_stats' slice plan assumes. The plan decides the order in which a row's
// float sums combine, so it must not follow the occupancy the compiler's register allocation gives
// (the kernel went from 58 registers, 4 blocks an SM at sm_90a, to 40, 6 blocks, when its read was
// pipelined): 4, the 2026-12-04 build's occupancy, keeps the H200's sums bitwise what they were, at
// about 5.5 waves of 6 blocks an SM.
constexpr int kRowStatsPlanResident = 4;

Layout layout(const ChainVerifyParams& p) {
  Layout l;
  l.row_slices = row_slice_count(p.n * (p.k + 1), p.v, p.num_sms, kRowStatsPlanResident);
  l.sample_slices = row_slice_count(p.n, p.v, p.num_sms);
  l.row_bytes = align_up(sizeof(RowStats) * p.n * (p.k + 1) * l.row_slices);
  l.logit_bytes = align_up(sizeof(float) * p.n * p.k);
  l.job_bytes = align_up(sizeof(SampleJob) * p.n);
  l.sample_bytes = align_up(sizeof(ArgMax) * p.n * l.sample_slices);
  return l;
}

template <typename T, typename Q>
cudaError_t launch_typed(const ChainVerifyParams& p, const Workspace& w, cudaStream_t stream) {
  // 16-byte row loads need every row start 16-byte aligned (row_stats); sample_slices loads 4 ids
  // of q at once (V a multiple of 4 then, so q's rows start aligned where q does).
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0 &&
                         (p.q == nullptr || reinterpret_cast<uintptr_t>(p.q) % sizeof(typename Quad<Q>::type) == 0);
  const bool greedy = p.inv_t == 0.0f;
  const int64_t row_blocks = p.n * (p.k + 1) * w.row_slice_count;
  const int64_t warp_blocks = (p.n + kWarps - 1) / kWarps;
  if (greedy)
    row_stats_kernel<T, true><<<row_blocks, kThreads, 0, stream>>>(p, w, vector_ok);
  else
    row_stats_kernel<T, false><<<row_blocks, kThreads, 0, stream>>>(p, w, vector_ok);
  chain_walk_kernel<<<warp_blocks, kThreads, 0, stream>>>(p, w);
  if (!greedy) {
    sample_slices_kernel<T, Q><<<p.n * w.sample_slice_count, kThreads, 0, stream>>>(p, w, vector_ok);
    sample_finish_kernel<<<warp_blocks, kThreads, 0, stream>>>(p, w);
  }
  return cudaGetLastError();
}

// q's element type (float32 when there is no q: nothing reads it then).
template <typename T>
cudaError_t launch_q(const ChainVerifyParams& p, const Workspace& w, cudaStream_t stream) {
  switch (p.q ? p.q_dtype : LogitsType::kFloat32) {
    case LogitsType::kFloat32: return launch_typed<T, float>(p, w, stream);
    case LogitsType::kBFloat16: return launch_typed<T, __nv_bfloat16>(p, w, stream);
    case LogitsType::kFloat16: return launch_typed<T, __half>(p, w, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

size_t chain_verify_workspace_bytes(const ChainVerifyParams& p) {
  const Layout l = layout(p);
  return l.row_bytes + l.logit_bytes + l.job_bytes + l.sample_bytes;
}

cudaError_t launch_chain_verify(const ChainVerifyParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const Layout l = layout(p);
  char* base = static_cast<char*>(workspace);
  Workspace w;
  w.row_slices = reinterpret_cast<RowStats*>(base);
  w.draft_logit = reinterpret_cast<float*>(base + l.row_bytes);
  w.jobs = reinterpret_cast<SampleJob*>(base + l.row_bytes + l.logit_bytes);
  w.sample_slices = reinterpret_cast<ArgMax*>(base + l.row_bytes + l.logit_bytes + l.job_bytes);
  w.row_slice_count = l.row_slices;
  w.sample_slice_count = l.sample_slices;
  switch (p.dtype) {
    case LogitsType::kFloat32: return launch_q<float>(p, w, stream);
    case LogitsType::kBFloat16: return launch_q<__nv_bfloat16>(p, w, stream);
    case LogitsType::kFloat16: return launch_q<__half>(p, w, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace xkernels::cuda
