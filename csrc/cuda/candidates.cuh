// A filtered row's cut from its candidates, in two launches instead of a block per row (issue 41):
//  1. scan_slice: a block per (row, slice) reads its slice once (16-byte loads, kScanDepth chunks in
//     flight a thread; the view's excluded id reads as -inf, as RowView::a has it) and keeps its
//     argmax, optionally its total mass (for top-p without top-k), and its best kSliceKeep ids by
//     the ranking order (key desc, id asc): each warp appends the ids above its threshold to a
//     buffer by ballot and, when the buffer fills, keeps its best kWarpKeep and raises the
//     threshold to the best id it dropped. The slice notes tau, the largest key it dropped: every
//     id of the slice with a larger key is among its candidates.
//  2. select_cut: a block per row merges its slices' candidates above tau* (the largest tau), the
//     exact head of the row's ranking, from L2, and finds the cut of all three filters and the kept
//     fixed-point mass exactly as row_filter.cuh's radix path defines them (filter_cut, kept_sum).
//     It declines (returns false) where the head does not settle them: top-k beyond the head, a
//     top-p whose target the total's bound leaves on both sides of a step, min-p alone whose floor
//     does not lie above every dropped key, a row with fewer finite ids than top_k. The caller then
//     runs the radix path for that row, so results stay exact.
// Torch-free; chain_ragged_kernel.cu serves the ragged verifier's filtered rows with it.
#pragma once

#include <cstdint>

#include "device_utils.cuh"
#include "row_filter.cuh"
#include "row_reduce.cuh"
#include "xkernels/sampling.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cuda {

constexpr int kScanDepth = 4;            // 16-byte chunks in flight a thread: 16 KB a block
constexpr int kSliceChunks = kScanDepth * kThreads;  // a slice's least chunks (one round of loads)
constexpr int kMaxSlices = 32;           // slices a row; a warp merges their summaries
constexpr int kWarpSlots = 64;           // a warp's candidate buffer
constexpr int kWarpKeep = 32;            // what a full buffer keeps
constexpr int kSliceKeep = 64;           // candidates a slice hands on
constexpr int kHeadCap = kMaxSlices * kSliceKeep;  // the most a row's merged head holds

// threadIdx.x, read where a pass over a row or a candidate list starts: the indices a pass derives
// from it (threadIdx.x + u kBlock, in 64 bits; a first entry's slice and place) are then computed in
// the pass instead of hoisted out of a caller's loop by the compiler and held in registers through
// it (tree_verify's filtered walk with draft_probs spilled so, sm_90a).
__device__ __forceinline__ uint32_t pass_thread() {
#if defined(__CUDA_ARCH__)
  uint32_t t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
#else
  return threadIdx.x;
#endif
}

// An id and its order key (order_key of its scaled logit).
struct Candidate {
  uint32_t key;
  int32_t id;
};

// Whether x ranks before y: a higher key first, ties to the lower id.
__device__ __forceinline__ bool ranks_before(const Candidate& x, const Candidate& y) {
  return x.key > y.key || (x.key == y.key && x.id < y.id);
}

// What a slice hands on besides its candidates.
struct SliceSummary {
  ArgMax top;          // the slice's argmax (torch.argmax's rules)
  double mass, moment;  // with_total: sum of e_i = exp_f32(a_i - m_i) exp(m_i - top.val) and of e_i a_i
  uint32_t tau;        // the largest key the slice dropped; 0: none
  int32_t count;       // candidates written, ranked
};

// How the host splits rows of v ids of T into slices: slices a row and chunks a slice.
struct SliceLayout {
  int slices;
  int64_t chunks;  // chunks a slice (16 bytes each; an unaligned row reads the same ids one by one)
};

__host__ __device__ inline SliceLayout slice_layout(int64_t v, int ids_a_chunk) {
  const int64_t chunks = (v + ids_a_chunk - 1) / ids_a_chunk;
  int64_t per = chunks > kMaxSlices * static_cast<int64_t>(kSliceChunks) ? (chunks + kMaxSlices - 1) / kMaxSlices
                                                                         : kSliceChunks;
  const int64_t slices = chunks > 0 ? (chunks + per - 1) / per : 1;
  return SliceLayout{static_cast<int>(slices), per};
}

// Where a launch keeps its filtered rows' candidates (in its workspace): the slices' summaries and
// candidates, and whether the select step settled each row.
struct CandidateSpace {
  SliceLayout layout;
  SliceSummary* sums;  // [rows, slices]
  Candidate* cands;    // [rows, slices, kSliceKeep]
  int32_t* settled;    // [rows]
};

struct ScanShared {
  Candidate buf[kWarps][kWarpSlots];
  int32_t count[kWarps];
  uint32_t tau[kWarps];
  uint32_t slice_tau;
  double mass[kWarps], moment[kWarps];
};

// The number of entries of sorted list[0, n) that rank before e.
__device__ __forceinline__ int count_before(const Candidate* list, int n, const Candidate& e) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (ranks_before(list[mid], e)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// One warp's candidates: the buffer's fill and the threshold (both the same at every lane).
struct WarpCandidates {
  int count = 0;
  uint32_t tau = 0;  // the largest key dropped; the threshold an id must pass
};

// Sorts the warp's buffer and keeps its best `keep`; tau rises to the best key dropped.
__device__ __forceinline__ void warp_keep_best(Candidate* buf, WarpCandidates& wc, int keep) {
  const int lane = threadIdx.x % 32, n = wc.count;
  const Candidate none{0u, 0x7FFFFFFF};
  const Candidate c0 = lane < n ? buf[lane] : none, c1 = lane + 32 < n ? buf[lane + 32] : none;
  int r0 = 0, r1 = 0;
  for (int x = 0; x < n; ++x) {
    const Candidate o = buf[x];
    r0 += ranks_before(o, c0);
    r1 += ranks_before(o, c1);
  }
  __syncwarp();
  uint32_t dropped = 0;
  if (lane < n) {
    if (r0 < keep) buf[r0] = c0;
    else if (r0 == keep) dropped = c0.key;
  }
  if (lane + 32 < n) {
    if (r1 < keep) buf[r1] = c1;
    else if (r1 == keep) dropped = c1.key;
  }
  for (int d = 16; d > 0; d >>= 1) {
    const uint32_t o = __shfl_xor_sync(kFullMask, dropped, d);
    dropped = o > dropped ? o : dropped;
  }
  __syncwarp();
  wc.tau = dropped > wc.tau ? dropped : wc.tau;
  wc.count = n < keep ? n : keep;
}

// Offers one id (hit: a finite value) to the warp's buffer; every lane of the warp calls it.
__device__ __forceinline__ void offer(Candidate* buf, WarpCandidates& wc, uint32_t key, int32_t id, bool hit) {
  const int lane = threadIdx.x % 32;
  hit = hit && key > wc.tau;
  unsigned b = __ballot_sync(kFullMask, hit);
  if (b == 0) return;
  if (wc.count + __popc(b) > kWarpSlots) {
    warp_keep_best(buf, wc, kWarpKeep);
    hit = hit && key > wc.tau;
    b = __ballot_sync(kFullMask, hit);
  }
  if (hit) buf[wc.count + __popc(b & ((1u << lane) - 1u))] = Candidate{key, id};
  wc.count += __popc(b);
  __syncwarp();
}

// A thread's share of a slice's statistics.
struct SliceStats {
  ArgMax top = argmax_empty();
  float m = kNegInf;  // the largest finite value so far, the scale of mass and moment
  double mass = 0.0, moment = 0.0;
};

// Whether a chunk whose largest value (max_nan) is m can move a thread's running argmax, all of
// whose ids precede the chunk's: only a NaN over a number, a larger number, or any value over the
// empty state can (ties keep the earlier id).
__device__ __forceinline__ bool may_move(const ArgMax& top, float m) {
  return is_nan_f32(m) ? !is_nan_f32(top.val) : m > top.val || top.idx == kNoIndex;
}

// kWithTotal: a's share of the mass and moment sums, at the thread's running scale.
template <bool kWithTotal>
__device__ __forceinline__ void observe_mass(SliceStats& s, float a) {
  if (!kWithTotal || a == kNegInf) return;
  if (a > s.m) {
    const double f = s.m == kNegInf ? 0.0 : exp(static_cast<double>(s.m) - static_cast<double>(a));
    s.mass *= f;
    s.moment *= f;
    s.m = a;
  }
  const double e = exp_f32(a - s.m);
  s.mass += e;
  s.moment += e * static_cast<double>(a);
}

template <bool kWithTotal>
__device__ __forceinline__ void observe_value(SliceStats& s, float a, int32_t id) {
  argmax_observe(s.top, a, id);
  observe_mass<kWithTotal>(s, a);
}

// What scan_slice shows its caller of what it reads, before any scaling, in each thread's order of
// ids: chunk(x, c) for each 16-byte chunk c as loaded, id(i) for each id read alone. The default
// sees nothing; dllm_step folds its raw row statistics in it (over a whole row, a block-a-row
// pass's order).
struct NoReadHook {
  __device__ __forceinline__ void chunk(const uint4&, int64_t) {}
  __device__ __forceinline__ void id(int64_t) {}
};

// Pass A over chunks [begin, end) of row r (ids kIds * begin .. min(kIds * end, v)): the slice's
// summary and its best kSliceKeep candidates, ranked, into out / cands (kWithTotal: with the mass
// sums select_cut bounds top-p's total by; a kernel of its own, as they cost registers). The whole
// block. on_read: see NoReadHook.
template <typename T, bool kWithTotal, typename OnRead = NoReadHook>
__device__ void scan_slice(ScanShared& sh, const RowView<T>& r, int64_t begin, int64_t end, SliceSummary* out,
                           Candidate* cands, OnRead&& on_read = OnRead{}) {
  constexpr int kIds = 16 / sizeof(T);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  Candidate* buf = sh.buf[warp];
  WarpCandidates wc;
  SliceStats st;
  const bool vector_ok = reinterpret_cast<uintptr_t>(r.row) % 16 == 0;
  const int64_t vector_end = vector_ok ? vector_span_end(begin, end, r.v / kIds) : begin;
  const uint4* chunks = reinterpret_cast<const uint4*>(r.row);
  if (begin == 0) XK_ROW_PASS();  // the row's slices read it once between them
  // A thread's chunks c = begin + threadIdx.x + k kThreads in order of k, in rounds of kScanDepth
  // slots: the first round's loads are issued up front, and each slot's load of the next round right
  // after the slot is unpacked, so kScanDepth loads stay in flight across rounds (issuing a round
  // only after consuming the last one drained them every round). The rounds are the same at every
  // thread (the ballots below are warp-wide); the consumption order, and so every statistic, offer
  // and on_read call, is that of one round at a time.
  uint4 x[kScanDepth];
#pragma unroll
  for (int u = 0; u < kScanDepth; ++u) {
    const int64_t c = begin + u * kThreads + threadIdx.x;
    if (c < vector_end) x[u] = chunks[c];
  }
  for (int64_t c0 = begin; c0 < vector_end; c0 += kSliceChunks) {
#pragma unroll
    for (int u = 0; u < kScanDepth; ++u) {
      const int64_t c = c0 + u * kThreads + threadIdx.x;
      const bool live = c < vector_end;
      const auto id0 = static_cast<uint32_t>(kIds * c);  // the chunk's first id (ids are int32)
      float a[kIds];
      float m = kNegInf;
      if (live) {
        unpack<T>(x[u], r.scale, a);
        on_read.chunk(x[u], c);
        if (c + kSliceChunks < vector_end) x[u] = chunks[c + kSliceChunks];
        // the excluded id's place in the chunk, or -1: one 64-bit test a chunk
        const int skip = static_cast<uint64_t>(r.exclude - kIds * c) < static_cast<uint64_t>(kIds)
                             ? static_cast<int>(r.exclude - kIds * c) : -1;
#pragma unroll
        for (int j = 0; j < kIds; ++j) {
          if (j == skip) a[j] = kNegInf;
          m = max_nan(m, a[j]);
        }
        // the same argmax as observing every id: the others cannot move it (most chunks)
        if (may_move(st.top, m)) {
#pragma unroll
          for (int j = 0; j < kIds; ++j) argmax_observe(st.top, a[j], static_cast<int32_t>(id0 + j));
        }
#pragma unroll
        for (int j = 0; j < kIds; ++j) observe_mass<kWithTotal>(st, a[j]);
      } else {
#pragma unroll
        for (int j = 0; j < kIds; ++j) a[j] = kNegInf;
      }
      // most chunks hold no id above the warp's threshold: one ballot settles them
      if (__ballot_sync(kFullMask, m != kNegInf && order_key(m) > wc.tau) == 0) continue;
#pragma unroll
      for (int j = 0; j < kIds; ++j)
        offer(buf, wc, order_key(a[j]), static_cast<int32_t>(id0 + j), a[j] != kNegInf);
    }
  }
  const int64_t id_end = kIds * end < r.v ? kIds * end : r.v;
  for (int64_t b = kIds * vector_end; b < id_end; b += kThreads) {  // a partial last chunk, or an unaligned row
    const int64_t i = b + threadIdx.x;
    const float a = i < id_end ? r.a(i) : kNegInf;
    if (i < id_end) {
      observe_value<kWithTotal>(st, a, static_cast<int32_t>(i));
      on_read.id(i);
    }
    offer(buf, wc, order_key(a), static_cast<int32_t>(i), a != kNegInf);
  }
  warp_keep_best(buf, wc, kWarpSlots);  // ranks the buffer, drops nothing
  double mass = st.mass, moment = st.moment;
  if constexpr (kWithTotal) {  // to the slice's scale: the block's max, then a fixed order of sums
    const float slice_m = block_merge_all(st.top, argmax_empty()).val;
    const double f = st.m == kNegInf || !(slice_m > kNegInf) ? 0.0 : exp(static_cast<double>(st.m) - slice_m);
    mass *= f;
    moment *= f;
    for (int d = 16; d > 0; d >>= 1) {
      mass += __shfl_xor_sync(kFullMask, mass, d);
      moment += __shfl_xor_sync(kFullMask, moment, d);
    }
  }
  if (lane == 0) {
    sh.count[warp] = wc.count;
    sh.tau[warp] = wc.tau;
    sh.mass[warp] = mass;
    sh.moment[warp] = moment;
  }
  if (threadIdx.x == 0) sh.slice_tau = 0;
  __syncthreads();
  // The block's best kSliceKeep: each entry's rank among the warps' ranked buffers.
  for (int q = threadIdx.x; q < kWarps * kWarpSlots; q += kThreads) {
    const int w = q / kWarpSlots, pos = q % kWarpSlots;
    if (pos >= sh.count[w]) continue;
    const Candidate e = sh.buf[w][pos];
    int rank = pos;
    for (int o = 0; o < kWarps; ++o)
      if (o != w) rank += count_before(sh.buf[o], sh.count[o], e);
    if (rank < kSliceKeep) cands[rank] = e;
    else if (rank == kSliceKeep) atomicMax(&sh.slice_tau, e.key);
  }
  const ArgMax top = block_merge(st.top, argmax_empty());  // its barrier orders slice_tau's atomics
  if (threadIdx.x == 0) {
    uint32_t tau = sh.slice_tau;
    int total = 0;
    double m_sum = 0.0, x_sum = 0.0;
    for (int w = 0; w < kWarps; ++w) {
      tau = sh.tau[w] > tau ? sh.tau[w] : tau;
      total += sh.count[w];
      m_sum += sh.mass[w];
      x_sum += sh.moment[w];
    }
    *out = SliceSummary{top, m_sum, x_sum, tau, total < kSliceKeep ? total : kSliceKeep};
  }
}

// What select_cut finds of a row.
struct RowCut {
  ArgMax top;
  FilterCut cut;
  unsigned long long kept;  // the kept ids' fixed-point mass
  bool degenerate;          // the top is not finite: a point mass, no cut
};

struct SelectShared {
  union {
    Candidate gathered[kHeadCap];  // the slices' heads, slice after slice
    unsigned long long incl[kHeadCap];  // then the ranked head's running masses
  };
  Candidate head[kHeadCap];  // the head, ranked
  int32_t offset[kMaxSlices + 1], count[kMaxSlices];
  unsigned long long warp_sums[32];
  ArgMax top;
  uint32_t tau;
  unsigned long long total_lo, total_hi;  // bounds of the row's fixed-point mass (with_total)
};

// The relative error a float sum of e_i = e^(a_i - top) adds to total_bounds' (where the slices'
// mass are float sums, tree_verify's walk: RowStats, each term an exp2f of an FMA or an expf of a
// difference, then rescales by expf, products and sums), where each term passed at most `steps`
// roundings of each kind (rescale, product, sum). First order (x1.02 covers the rest): a term's
// relative error is within 2^-21 (steps + 2) (2 ulp a exp, 2^-24 a product or sum) + 2^-23 |top|
// (the FMA's top log2(e)) + 2^-20 (top - a_i) (the arguments' roundings, their sizes summing to at
// most top - a_i), and sum_i e_i (top - a_i) <= 40 S + v 40 e^-40 <= (40 + 2^-21) S with S >= 1 (the
// top's own term): so the float sum is S within eps S. Each fixed_mass is e_i within fix = 2^-22 +
// 2^-24 (top - a_i): the total lies within 2 (eps + fix) S 2^shift of the sum's, the truncations and
// total_bounds' own terms aside.
__device__ __forceinline__ double float_sum_error(int64_t steps, float top) {
  const double eps = 1.02 * (0x1p-21 * static_cast<double>(steps + 2) + 0x1p-23 * fabs(static_cast<double>(top)) +
                             0x1p-20 * 41.0);
  const double fix = 1.02 * (0x1p-22 + 0x1p-24 * 41.0);
  return 2.0 * (eps + fix);
}

// Bounds of the row's total fixed-point mass sum_i floor(exp_f32(a_i - top) 2^shift) from the slices'
// double sums of e_i (see SliceStats). Both are e^(a - top) within a factor exp(+-(2^-23 |a - top| +
// 2^-21)) (each exp_f32 within 2 ulp, each float difference rounded once, |a - m_i| <= |a - top|; an
// e below 2^-149 holds no mass at shift <= 62); the bound doubles that, adds the double sums'
// rounding and one unit a term for the truncations. slices <= 32, at lane 0 of warp 0.
__device__ __forceinline__ void total_bounds(const SliceSummary* sums, int slices, float top, int64_t v, int shift,
                                             int64_t float_steps, unsigned long long* lo, unsigned long long* hi) {
  double mass = 0.0, spread = 0.0;  // spread: sum e_i (top - a_i) >= 0
  for (int s = 0; s < slices; ++s) {
    const SliceSummary x = sums[s];
    if (!(x.top.val > kNegInf)) continue;  // no finite id
    const double f = exp(static_cast<double>(x.top.val) - static_cast<double>(top));
    mass += x.mass * f;
    const double d = static_cast<double>(top) * x.mass - x.moment;
    spread += (d > 0.0 ? d : 0.0) * f + fabs(static_cast<double>(top)) * x.mass * f * 0x1p-40;
  }
  const double unit = static_cast<double>(1ull << shift);
  const double rel = 0x1p-20 + 0x1p-30 + (float_steps > 0 ? float_sum_error(float_steps, top) : 0.0);
  const double err = (0x1p-22 * spread + rel * mass) * unit + static_cast<double>(v) + 2.0;
  const double center = mass * unit;
  const double l = center - err, h = center + err;
  *lo = l > 0.0 ? static_cast<unsigned long long>(l) : 0ull;
  *hi = h < 0x1p63 ? static_cast<unsigned long long>(h) + 1ull : ~0ull;
}

// Whether top-p over the whole row needs the slices' total mass: top-p without a top-k cut.
__device__ __forceinline__ bool select_needs_total(const RowSampling& rs, int64_t v) {
  return top_bits(rs, v) == TopBits::kGuide;
}

// The first j < n whose running mass incl[j] reaches target (compared in double, as first_reaching
// does), or n.
__device__ __forceinline__ int first_at_least(const unsigned long long* incl, int n, double target) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (static_cast<double>(incl[mid]) >= target) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// Pass B: the row's cut from its slices' summaries and candidates (see the top of this file), at
// every thread; false where the candidates do not settle it (the caller takes the radix path).
// float_steps: where above 0, the slices' masses are float sums (float_sum_error's steps).
__device__ inline bool select_cut(SelectShared& sh, const SliceSummary* sums, const Candidate* cands, int slices,
                           const RowSampling& rs, int64_t v, int mass_shift, RowCut* out, int64_t float_steps = 0) {
  const int lane = threadIdx.x % 32;
  if (threadIdx.x < 32) {
    const bool in = lane < slices;
    ArgMax top = warp_merge(in ? sums[lane].top : argmax_empty());
    uint32_t tau = in ? sums[lane].tau : 0u;
    for (int d = 16; d > 0; d >>= 1) {
      const uint32_t o = __shfl_xor_sync(kFullMask, tau, d);
      tau = o > tau ? o : tau;
    }
    // the slice's head: its candidates above tau*, a prefix of its ranked list
    int c = 0;
    if (in) {
      const Candidate* list = cands + lane * kSliceKeep;
      const int n = sums[lane].count;
      while (c < n && list[c].key > tau) ++c;
    }
    int before = c;
    for (int d = 1; d < 32; d <<= 1) {
      const int y = __shfl_up_sync(kFullMask, before, d);
      if (lane >= d) before += y;
    }
    if (in) {
      sh.count[lane] = c;
      sh.offset[lane] = before - c;
    }
    if (lane == 31) sh.offset[slices] = before;
    if (lane == 0) {
      sh.top = top;
      sh.tau = tau;
      if (select_needs_total(rs, v) && is_finite_f32(top.val))
        total_bounds(sums, slices, top.val, v, mass_shift, float_steps, &sh.total_lo, &sh.total_hi);
    }
  }
  __syncthreads();
  const ArgMax top = sh.top;
  *out = RowCut{top, keep_all(), 0ull, !is_finite_f32(top.val)};
  if (out->degenerate) return true;
  const int n = sh.offset[slices];
  const int tid = static_cast<int>(pass_thread());
  for (int q = tid; q < slices * kSliceKeep; q += kThreads) {
    const int s = q / kSliceKeep, pos = q % kSliceKeep;
    if (pos < sh.count[s]) sh.gathered[sh.offset[s] + pos] = cands[q];
  }
  __syncthreads();
  for (int q = tid; q < n; q += kThreads) {  // each entry's rank among the slices' heads
    int s = 0;
    while (sh.offset[s + 1] <= q) ++s;
    const Candidate e = sh.gathered[q];
    int rank = q - sh.offset[s];
    for (int o = 0; o < slices; ++o)
      if (o != s) rank += count_before(sh.gathered + sh.offset[o], sh.count[o], e);
    sh.head[rank] = e;
  }
  __syncthreads();
  // The head's running fixed-point masses (exact integers), over the gathered ids' storage.
  const auto mass = [&](int j) { return fixed_mass(key_value(sh.head[j].key) - top.val, mass_shift); };
  const int per = (n + kThreads - 1) / kThreads;
  const int lo = tid * per, hi = lo + per < n ? lo + per : n;
  unsigned long long local = 0, total;
  for (int j = lo; j < hi; ++j) local += mass(j);
  unsigned long long running = block_exclusive_scan(sh.warp_sums, local, &total);
  for (int j = lo; j < hi; ++j) sh.incl[j] = running += mass(j);
  __syncthreads();
  const bool by_k = top_bits(rs, v) == TopBits::kCount, by_p = rs.top_p < 1.0f;
  const float floor = min_p_floor(top.val, rs.min_p);  // +inf without min-p
  // no head: every finite id ties with a dropped one (a flat row)
  if (n == 0) return false;
  if (!by_k && !by_p) {  // min-p alone: the ids at or above its floor, all in the head where it lies above every dropped key
    if (!(sh.tau == 0u || floor > key_value(sh.tau))) return false;
    local = 0;
    for (int j = threadIdx.x; j < n; j += kThreads)
      if (key_value(sh.head[j].key) >= floor) local += mass(j);
    block_exclusive_scan(sh.warp_sums, local, &out->kept);
    out->cut = FilterCut{floor, 0x7FFFFFFF};
    return true;
  }
  int last = n - 1;
  if (by_k) {
    if (rs.top_k > n) return false;  // beyond the head, or fewer finite ids than top_k
    last = rs.top_k - 1;
  }
  // vLLM's order: top-p's mass over the ids min-p keeps too, where fewer. They are all in the head
  // unless every head id is at or above the floor and the ids below the head may be too.
  bool floored = false;
  if (by_p && rs.min_p_first && rs.min_p > 0.0f) {
    const uint32_t least = order_key(floor);
    int c = 0, hi = n;
    while (c < hi) {
      const int mid = (c + hi) / 2;
      if (sh.head[mid].key >= least) c = mid + 1;
      else hi = mid;
    }
    const bool whole_row = sh.tau == 0u;  // no slice dropped an id
    if (c == n && !by_k && !whole_row && !(floor > key_value(sh.tau))) return false;
    if (!by_k || c < last + 1) last = c - 1, floored = true;  // without top-k: the head's first c ids
  }
  if (by_p) {
    int j;
    if (by_k || floored) {
      j = first_at_least(sh.incl, last + 1, static_cast<double>(rs.top_p) * static_cast<double>(sh.incl[last]));
      if (j > last) return false;  // only by rounding: the radix path's answer then
    } else {  // the target from the total's bounds: settled where both reach the same id
      j = first_at_least(sh.incl, n, static_cast<double>(rs.top_p) * static_cast<double>(sh.total_lo));
      const int j_hi = first_at_least(sh.incl, n, static_cast<double>(rs.top_p) * static_cast<double>(sh.total_hi));
      if (j >= n || j_hi != j) {
        // Unsettled, but the cut lies at j or after it, below the value there (below the head when
        // j = n): a min-p floor above that moves the cut to itself all the same.
        const float below = j < n ? key_value(sh.head[j].key) : (sh.tau > 0u ? key_value(sh.tau) : -kNegInf);
        if (!(rs.min_p > 0.0f && floor > below)) return false;
        j = n - 1;  // any cut below the floor: the floor's sum follows
      }
    }
    last = j;
  }
  out->cut = FilterCut{key_value(sh.head[last].key), sh.head[last].id};
  out->kept = sh.incl[last];
  if (rs.min_p > 0.0f && floor > out->cut.val) {  // every id at or above it ranks before the cut: in the head
    local = 0;
    for (int j = threadIdx.x; j <= last; j += kThreads)
      if (key_value(sh.head[j].key) >= floor) local += mass(j);
    block_exclusive_scan(sh.warp_sums, local, &out->kept);
    out->cut = FilterCut{floor, 0x7FFFFFFF};
  }
  return true;
}

// The ids a settled cut keeps (a prefix of the ranked head, filter_keeps), copied to out in rank
// order; returns how many. The whole block, after select_cut returned true for a finite top.
__device__ inline int select_keep(SelectShared& sh, int slices, const FilterCut& cut, Candidate* out) {
  int lo = 0, hi = sh.offset[slices];
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (filter_keeps(cut, key_value(sh.head[mid].key), sh.head[mid].id)) lo = mid + 1;
    else hi = mid;
  }
  for (int j = threadIdx.x; j < lo; j += kThreads) out[j] = sh.head[j];
  return lo;
}

}  // namespace xkernels::cuda
