// The filtered target distribution's cut on CUDA, by one block per row (of any multiple of 32
// threads up to 1024, blockDim.x, so kernels of 256 and of 512 threads share it): radix
// selection over the order-preserving bits of the scaled logits (radix_cut: about 2 passes a cut,
// top-k's first one fused into the statistics pass, top-p's guided by it; min-p without a pass).
// Masses are summed in 64-bit fixed point, so the cut does not depend on the order of the atomics.
// Every filtering kernel runs it inside its own reads of a row: chain_ragged_kernel.cu (the rows
// candidates.cuh does not settle), tree_walk.cuh (the walk's visited rows), dllm_row.cuh (dllm_step's
// and spiffy_accept's filtered rows), spiffy_filtered.cuh and refine_filtered_pick_kernel.cu;
// tests/cuda_emu/row_cut_kernel.cu runs it alone.
#pragma once

#include <cstdint>

#include "device_utils.cuh"
#include "row_reduce.cuh"
#include "xkernels/sampling.h"
#include "xkernels/sampling_params.h"

// A pass over a row starts (RowView's loops, the sample's): the CUDA emulation counts them, so its
// tests hold the pass counts bench/floors.md states; nothing on a GPU.
#ifndef XK_ROW_PASS
#define XK_ROW_PASS()
#endif

namespace xkernels::cuda {

__device__ __forceinline__ int block_threads() { return static_cast<int>(blockDim.x); }

// Keeps every id.
__device__ __forceinline__ FilterCut keep_all() { return FilterCut{kNegInf, 0x7FFFFFFF}; }

// exp(gap) (<= 1) in fixed point with `shift` fractional bits, truncated: exact in double.
__device__ __forceinline__ unsigned long long fixed_mass(float gap, int shift) {
  return static_cast<unsigned long long>(static_cast<double>(exp_f32(gap)) * static_cast<double>(1ull << shift));
}

// A fixed-point sum of fixed_mass's as the float the rows' states hold.
__device__ __forceinline__ float fixed_sum_value(unsigned long long sum, int shift) {
  return static_cast<float>(static_cast<double>(sum) / static_cast<double>(1ull << shift));
}

// The fractional bits of fixed_mass for rows of v ids: v masses of at most 1 sum below 2^62.
__host__ __device__ inline int cut_mass_shift(int64_t v) {
  int bits = 0;
  for (; v > 0; v >>= 1) ++bits;
  return 62 - bits;
}

// Loads a thread keeps in flight in a pass over a row (one load at a time left a block hundreds of
// L2 round trips a pass over a 304 KB row): single ids in the passes whose float sums must keep
// their order, 16-byte chunks in those that only count, gather or take a maximum. Deeper costs
// registers in the passes with large bodies (the selection's, the sample's): 16 ids and 8 chunks
// spilled chain_ragged_kernel (255 registers); 4 chunks took row_cut_kernel to 168 registers, one
// block an SM instead of two (sm_90a).
constexpr int kIdDepth = 8;
constexpr int kChunkDepth = 2;

template <typename T>
struct RowView {
  const T* row;
  int64_t v;
  float scale;
  int64_t exclude = -1;  // an id whose logit counts as -inf (dllm_step's mask token); -1: none
  // The scaled logit of id i, loaded as x.
  __device__ __forceinline__ float value(int64_t i, T x) const { return i == exclude ? kNegInf : to_float(x) * scale; }
  __device__ __forceinline__ float a(int64_t i) const { return value(i, row[i]); }

  // f(i, a(i), extra(i)) for the ids i = threadIdx.x, + blockDim.x, ... below v in that order (a plain
  // loop's ids and order, so a thread's float sums round as they did), kIdDepth times kScale ids
  // loaded at once.
  template <int kScale = 1, typename Extra, typename F>
  __device__ __forceinline__ void for_each_in_order(const Extra& extra, const F& f) const {
    XK_ROW_PASS();
    using E = decltype(extra(int64_t{0}));
    struct Loaded {
      T x;
      E e;
    };
    for_each_batched<kIdDepth * kScale>(
        threadIdx.x, v, block_threads(), [&](int64_t i) { return Loaded{row[i], extra(i)}; },
        [&](int64_t i, const Loaded& l) { f(i, value(i, l.x), l.e); });
  }
  template <int kScale = 1, typename F>
  __device__ __forceinline__ void for_each_in_order(const F& f) const {
    for_each_in_order<kScale>([](int64_t) { return 0; }, [&](int64_t i, float a, int) { f(i, a); });
  }

  // f(i, a(i)) for a thread's share of the ids, in no fixed order (for order-independent results:
  // integer counts and fixed-point masses, gathers that are ranked afterwards, maxima ranked by id):
  // 16-byte chunks, kChunkDepth in flight, where the row starts 16-byte aligned (a strided row
  // need not), else for_each_in_order.
  template <typename F>
  __device__ __forceinline__ void for_each_any_order(const F& f) const {
    if (reinterpret_cast<uintptr_t>(row) % 16 != 0) return for_each_in_order(f);
    XK_ROW_PASS();
    constexpr int kIds = 16 / sizeof(T);
    for_each_row_value<T, kChunkDepth>(
        row, v, 0, (v + kIds - 1) / kIds, true, scale, exclude, threadIdx.x, block_threads(),
        [&](const float (&a)[kIds], int32_t id) {
#pragma unroll
          for (int j = 0; j < kIds; ++j) f(id + j, a[j]);
        },
        [&](float a, int32_t id) { f(id, a); });
  }
};

constexpr int kCutBins = 2048;        // 11 bits a level: key bits 31-21, 20-10, then 9-0
constexpr int kCutCandidates = 2048;  // the ids one bin may hold to be ranked in shared memory

// The shared memory of one block's selection: a level's histogram and the ids of a chosen bin.
struct CutShared {
  struct Histogram {
    union {
      uint32_t count[kCutBins];
      float guide[kCutBins];  // the statistics pass's guide to top-p's first level (observe_top_bits)
    };
    unsigned long long mass[kCutBins];
  };
  struct Candidates {
    uint32_t key[kCutCandidates];
    int32_t id[kCutCandidates];
  };
  Histogram hist;
  Candidates cand;
  unsigned long long warp_sums[32];  // a warp's
  uint32_t warp_counts[32];
  unsigned long long found_before;
  uint32_t n_cand, ranked_bin;
  int32_t found, ranked_n;
  // Where a cut hook may finish its draw without a pass (see NoCutHook): the cut's first-level bin
  // hooked_bin (kAllRanked: cand holds every kept id), cand[0, hooked_n) ranked; hooked_n < 0: no claim.
  uint32_t hooked_bin;
  int32_t hooked_n;
};

// What radix_cut finds of its first level in CutShared when it starts.
enum class FirstLevel {
  kNone,    // nothing: it takes a pass
  kCounts,  // the counts of every finite id (observe_top_bits: top-k over the whole row)
  kFed,     // the counts and masses of the ids `within` keeps, and those of first-level bin ranked_bin
            // ranked in cand[0, ranked_n) (top-k's gather fed them to top-p)
  kRanked,  // every id `within` keeps, ranked in cand[0, ranked_n) (top-k's gather took them all)
  kGuided,  // observe_top_bits' guide of every finite id: the first level's pass gathers the bin it
            // points at (top-p over the whole row)
};

// The block's exclusive prefix sum of one value a thread, in thread order; *total gets the sum.
// warp_sums: the block's shared scratch of a value a warp.
__device__ __forceinline__ unsigned long long block_exclusive_scan(unsigned long long (&warp_sums)[32],
                                                                   unsigned long long x, unsigned long long* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned long long inclusive = x;
  for (int d = 1; d < 32; d <<= 1) {
    const unsigned long long y = __shfl_up_sync(kFullMask, inclusive, d);
    if (lane >= d) inclusive += y;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  unsigned long long before = 0, sum = 0;
  for (int w = 0; w < block_threads() / 32; ++w) {
    if (w < warp) before += warp_sums[w];
    sum += warp_sums[w];
  }
  __syncthreads();  // warp_sums are read before a next scan writes them
  *total = sum;
  return before + inclusive - x;
}
__device__ __forceinline__ unsigned long long block_exclusive_scan(CutShared& sh, unsigned long long x,
                                                                   unsigned long long* total) {
  return block_exclusive_scan(sh.warp_sums, x, total);
}

// The first position i < n (n <= blockDim.x * 8) of a sequence in ranking order at which the running
// sum base + value(0) + ... + value(i) reaches target (compared in double; the sums themselves are
// exact integers), or -1; *before gets the running sum before it. Threads take consecutive runs.
template <typename F>
__device__ int first_reaching(CutShared& sh, int n, unsigned long long base, double target, const F& value,
                              unsigned long long* before) {
  const int per = (n + block_threads() - 1) / block_threads();
  const int lo = threadIdx.x * per, hi = lo + per < n ? lo + per : n;
  unsigned long long local = 0;
  for (int i = lo; i < hi; ++i) local += value(i);
  if (threadIdx.x == 0) sh.found = 0x7FFFFFFF;
  unsigned long long total;
  unsigned long long running = base + block_exclusive_scan(sh, local, &total);
  int hit = -1;
  for (int i = lo; i < hi; ++i) {
    const unsigned long long v = value(i);
    if (static_cast<double>(running + v) >= target) {
      hit = i;
      break;
    }
    running += v;
  }
  if (hit >= 0) atomicMin(&sh.found, hit);
  __syncthreads();
  if (hit >= 0 && hit == sh.found) sh.found_before = running;
  __syncthreads();
  const int pos = sh.found;
  *before = sh.found_before;
  __syncthreads();  // read before a next call resets them
  return pos == 0x7FFFFFFF ? -1 : pos;
}

// Sorts the first n2 (a power of two, <= kCutCandidates) candidates into ranking order (a higher key
// first, ties to the lower id): a bitonic sort in shared memory.
__device__ __forceinline__ void rank_candidates(CutShared& sh, int n2) {
  uint32_t* key = sh.cand.key;
  int32_t* id = sh.cand.id;
  block_bitonic_sort(
      n2, [&](int j, int i) { return key[j] > key[i] || (key[j] == key[i] && id[j] < id[i]); },
      [&](int i, int j) {
        const uint32_t k = key[i];
        key[i] = key[j];
        key[j] = k;
        const int32_t x = id[i];
        id[i] = id[j];
        id[j] = x;
      });
}

// Sorts cand[0, n) (n <= kCutCandidates) into ranking order, padding it to a power of two.
__device__ __forceinline__ void rank_first(CutShared& sh, int n) {
  int n2 = 1;
  while (n2 < n) n2 <<= 1;
  for (int j = n + threadIdx.x; j < n2; j += block_threads()) {  // rank last
    sh.cand.key[j] = 0;
    sh.cand.id[j] = 0x7FFFFFFF;
  }
  __syncthreads();
  rank_candidates(sh, n2);
}

// The largest value of first-level bin d (key bits 31-21): finite for the bins of finite values.
__device__ __forceinline__ float bin_ceiling(uint32_t d) { return key_value((d << 21) | 0x1FFFFFu); }

// The first-level bin (in key order) where the guide's masses relative to `top` reach top_p of
// theirs, bins below `least_bin` left out (below a min-p floor that top-p renormalises within), or
// -1; in sh.hist.mass as fixed point meanwhile. A guess only: the guide's float sums round in the
// order of the atomics, a bin of a huge width may underflow them, and least_bin counts whole.
__device__ inline int guided_bin(CutShared& sh, float top, float top_p, int mass_shift, uint32_t least_bin) {
  const int per = kCutBins / block_threads();
  const double most = static_cast<double>(1ull << 62) / kCutBins;  // the bins' sum stays below 2^62
  unsigned long long local = 0;
  for (int d = threadIdx.x * per; d < (threadIdx.x + 1) * per; ++d) {
    const double m = static_cast<double>(sh.hist.guide[d]) *
                     exp(static_cast<double>(bin_ceiling(d)) - static_cast<double>(top)) *
                     static_cast<double>(1ull << mass_shift);
    const bool counted = m > 0.0 && static_cast<uint32_t>(d) >= least_bin;  // NaN (an overflowed bin) reads as 0
    const unsigned long long f = counted ? (m < most ? static_cast<unsigned long long>(m) : static_cast<unsigned long long>(most)) : 0ull;
    sh.hist.mass[d] = f;
    local += f;
  }
  unsigned long long total;
  block_exclusive_scan(sh, local, &total);  // its barrier orders the writes before the reads below
  unsigned long long before;
  const int pos = first_reaching(sh, kCutBins, 0, static_cast<double>(top_p) * static_cast<double>(total),
                                 [&](int pos) { return sh.hist.mass[kCutBins - 1 - pos]; }, &before);
  return pos < 0 ? -1 : kCutBins - 1 - pos;
}

// kept's value when the cut's kept mass is not known without a pass.
constexpr unsigned long long kMassUnknown = ~0ull;

// ranked_bin's value when cand[0, ranked_n) holds every id the cut keeps, not one bin's.
constexpr uint32_t kAllRanked = 0xFFFFFFFFu;

// What a cut's gather passes show a caller that draws from the cut row, so that its draw needs no
// pass of its own (dllm_step's filtered rows): begin() where a first-level gather pass of bin d
// starts, observe(i, a) for each id that pass sees in the bins above d and `within` keeps. Where the
// cut is then ranked from that gather, radix_cut sets sh.hooked_bin = d and sh.hooked_n: the ids the
// final cut keeps are those observed since the last begin() and those of cand[0, hooked_n) it keeps,
// when the final cut lies in first-level bin hooked_bin; hooked_bin kAllRanked: cand[0, hooked_n)
// holds every kept id. Where min-p moves the cut above hooked_bin, the kept ids are the observed ones
// at or above its floor (hook_holds_cut, hook_floor_draw: the hooks keep that draw apart). No pass,
// no claim (hooked_n = -1). NoCutHook compiles away.
struct NoCutHook {
  static constexpr bool kActive = false;
  __device__ __forceinline__ void begin() {}
  __device__ __forceinline__ void observe(int64_t, float) {}
};

// The cut of the smallest prefix of the ranking, among the ids `within` keeps, whose count reaches
// k (by_mass false) or whose mass reaches top_p of theirs (by_mass true). keep_all() when no prefix
// reaches it (fewer finite ids than k). Each level is a pass over the row that histograms the next
// key bits of the ids in the bins chosen so far and chooses the bin where the running sum reaches
// the target; once that bin holds at most kCutCandidates ids, one more pass gathers them and they
// are ranked in shared memory (kGuided: the first pass gathers the guide's bin, so when the cut is
// in it, one pass in all). So a cut usually costs 2 passes, at most 4 (3 levels, then an
// ordered pass over more than kCutCandidates ids of one value).
// first: what the first level finds in sh. feed (top-k followed by top-p): when the cut is found
// from the first level's gather, that pass gathers the ids of the bins above too where they all fit
// the buffer, and leaves every kept id ranked (FirstLevel::kRanked: top-p takes no pass); else it
// histograms the first level of the top-p cut within it and leaves the kept ids of the gathered bin
// ranked (FirstLevel::kFed). Either way ranked_n >= 0.
// *kept gets the fixed-point mass of the ids the cut keeps within `within` (the kept sum, so the
// caller needs no pass for it), or kMassUnknown where the cut was not found by ranked candidates.
// floor_mass (or null): the first pass this call makes also sums the fixed-point masses of the ids
// at or above `floor` into it (min-p's kept sum where min-p moves the cut); kMassUnknown where it
// makes none.
template <typename T, typename Hook>
__device__ FilterCut radix_cut(CutShared& sh, const RowView<T>& r, float top, const FilterCut& within, bool by_mass,
                               uint32_t k, float top_p, int mass_shift, FirstLevel first, bool feed,
                               unsigned long long* kept, Hook& hook, float floor = 0.0f,
                               unsigned long long* floor_mass = nullptr) {
  *kept = kMassUnknown;
  if (floor_mass) *floor_mass = kMassUnknown;
  unsigned long long above_floor = 0;  // this thread's share of floor_mass, in the first pass
  // After the first pass: its floor sum, once (every thread takes part: the scan's barriers).
  const auto finish_floor = [&]() {
    if (floor_mass == nullptr || *floor_mass != kMassUnknown) return;
    unsigned long long total;
    block_exclusive_scan(sh, above_floor, &total);
    *floor_mass = total;
  };
  // The hook's bin of the claim this call may make: a kFed call ranks the previous call's gather.
  uint32_t hooked = kAllRanked;
  if constexpr (Hook::kActive) {
    if (first == FirstLevel::kFed) hooked = sh.ranked_bin;
    __syncthreads();  // ranked_bin is read before it is written
    if (threadIdx.x == 0) sh.hooked_n = -1;
  }
  const auto mass_of = [&](uint32_t key) { return fixed_mass(key_value(key) - top, mass_shift); };
  if (first == FirstLevel::kRanked) {  // by mass: the ranked ids' prefix, no pass
    const int n = sh.ranked_n;
    const auto id_mass = [&](int j) { return mass_of(sh.cand.key[j]); };
    unsigned long long local = 0, total = 0, before_j;
    for (int x = threadIdx.x; x < n; x += block_threads()) local += id_mass(x);
    block_exclusive_scan(sh, local, &total);
    const int j = first_reaching(sh, n, 0, static_cast<double>(top_p) * static_cast<double>(total), id_mass, &before_j);
    if (j < 0) return within;  // only by rounding
    *kept = before_j + id_mass(j);
    if constexpr (Hook::kActive) {
      if (threadIdx.x == 0) sh.hooked_bin = kAllRanked, sh.hooked_n = j + 1;
      __syncthreads();
    }
    return FilterCut{key_value(sh.cand.key[j]), sh.cand.id[j]};
  }
  uint32_t mask = 0, prefix = 0, count = 0;
  unsigned long long before = 0;
  double target = 0.0;
  const auto in_bins = [&](int64_t i, float a, uint32_t& key) {
    if (a == kNegInf || !filter_keeps(within, a, static_cast<int32_t>(i))) return false;
    key = order_key(a);
    return (key & mask) == prefix;
  };
  uint32_t guided = 0xFFFFFFFFu;  // kGuided: the first-level bin whose ids the first pass gathers
  for (int level = 0; level < 3; ++level) {
    const int shift = level == 0 ? 21 : (level == 1 ? 10 : 0);
    const uint32_t bins = level == 2 ? 1024u : 2048u;
    if (level > 0 || first == FirstLevel::kNone || first == FirstLevel::kGuided) {
      if (level == 0 && first == FirstLevel::kGuided) {
        const int g = guided_bin(sh, top, top_p, mass_shift, within.val == kNegInf ? 0u : order_key(within.val) >> 21);
        if (g >= 0) guided = static_cast<uint32_t>(g);
        if (threadIdx.x == 0) sh.n_cand = 0;
        if constexpr (Hook::kActive) {
          hook.begin();
          hooked = guided;
        }
      }
      for (int d = threadIdx.x; d < kCutBins; d += block_threads()) {
        sh.hist.count[d] = 0;
        sh.hist.mass[d] = 0;
      }
      __syncthreads();
      r.for_each_any_order([&](int64_t i, float a) {
        if (floor_mass && a >= floor) above_floor += fixed_mass(a - top, mass_shift);
        uint32_t key;
        if (!in_bins(i, a, key)) return;
        const uint32_t d = (key >> shift) & (bins - 1);
        atomicAdd(&sh.hist.count[d], 1u);
        if (by_mass) atomicAdd(&sh.hist.mass[d], fixed_mass(key_value(key) - top, mass_shift));  // key_value: a
        if constexpr (Hook::kActive)
          if (level == 0 && guided != 0xFFFFFFFFu && (key >> 21) > guided) hook.observe(i, a);
        if (level == 0 && d == guided) {  // ranked after, if the cut is in it
          const uint32_t slot = atomicAdd(&sh.n_cand, 1u);
          if (slot < static_cast<uint32_t>(kCutCandidates)) {
            sh.cand.key[slot] = key;
            sh.cand.id[slot] = static_cast<int32_t>(i);
          }
        }
      });
      __syncthreads();
      finish_floor();
    }
    const auto bin_sum = [&](int pos) -> unsigned long long {  // bins in ranking order: the highest first
      const uint32_t d = bins - 1 - static_cast<uint32_t>(pos);
      return by_mass ? sh.hist.mass[d] : sh.hist.count[d];
    };
    if (level == 0) {
      unsigned long long local = 0, total = 0;
      const int per = kCutBins / block_threads();
      for (int pos = threadIdx.x * per; pos < (threadIdx.x + 1) * per; ++pos) local += bin_sum(pos);
      block_exclusive_scan(sh, local, &total);
      target = by_mass ? static_cast<double>(top_p) * static_cast<double>(total) : static_cast<double>(k);
    }
    const int pos = first_reaching(sh, static_cast<int>(bins), before, target, bin_sum, &before);
    if (pos < 0) return keep_all();  // fewer ids than k, or only by rounding
    const uint32_t d = bins - 1 - static_cast<uint32_t>(pos);
    count = sh.hist.count[d];
    prefix |= d << shift;
    mask |= (bins - 1) << shift;
    const bool ranked = level == 0 && first == FirstLevel::kFed && d == sh.ranked_bin;
    const bool gathered = level == 0 && d == guided;  // the guide was right
    const bool fed = level == 0 && feed;
    // fed, and bin d with the bins above it fits the buffer: they are all gathered and ranked
    const bool whole = fed && before + count <= static_cast<uint32_t>(kCutCandidates);
    const uint32_t n = whole ? static_cast<uint32_t>(before) + count : count;  // the ids to rank
    __syncthreads();  // the bin is read before a fed histogram is cleared
    if (ranked || n <= static_cast<uint32_t>(kCutCandidates)) {
      unsigned long long above = 0;  // by count: the mass of the ids ranked before the chosen bin
      if (!ranked) {
        if (!gathered) {
          if (threadIdx.x == 0) sh.n_cand = 0;
          if (fed && !whole)
            for (int b = threadIdx.x; b < kCutBins; b += block_threads()) {
              sh.hist.count[b] = 0;
              sh.hist.mass[b] = 0;
            }
          __syncthreads();
          if constexpr (Hook::kActive) {
            hook.begin();
            hooked = level == 0 && !whole ? d : kAllRanked;
          }
          r.for_each_any_order([&](int64_t i, float a) {  // the candidates' slots are ranked after
            if (floor_mass && a >= floor) above_floor += fixed_mass(a - top, mass_shift);
            if (a == kNegInf) return;
            const uint32_t key = order_key(a);
            if (fed && !whole && (key >> 21) >= d) {  // these rank within the cut, but those of bin d after it
              atomicAdd(&sh.hist.count[key >> 21], 1u);
              atomicAdd(&sh.hist.mass[key >> 21], mass_of(key));
            }
            if (!filter_keeps(within, a, static_cast<int32_t>(i))) return;
            if (!by_mass && !whole && (key & mask) > prefix) above += mass_of(key);
            if constexpr (Hook::kActive)
              if (level == 0 && !whole && (key >> 21) > d) hook.observe(i, a);
            if (whole ? (key >> 21) < d : (key & mask) != prefix) return;
            const uint32_t slot = atomicAdd(&sh.n_cand, 1u);
            if (slot < static_cast<uint32_t>(kCutCandidates)) {
              sh.cand.key[slot] = key;
              sh.cand.id[slot] = static_cast<int32_t>(i);
            }
          });
          finish_floor();
        }
        rank_first(sh, static_cast<int>(n));
      }
      const auto id_sum = [&](int j) -> unsigned long long { return by_mass ? mass_of(sh.cand.key[j]) : 1ull; };
      unsigned long long before_j;
      const int j = first_reaching(sh, static_cast<int>(n), whole ? 0ull : before, target, id_sum, &before_j);
      const FilterCut cut = j < 0 ? keep_all() : FilterCut{key_value(sh.cand.key[j]), sh.cand.id[j]};
      // The claim: a gather of this level-0 bin (or the ranked one of the call before) holds the cut.
      if (Hook::kActive && threadIdx.x == 0 && level == 0 && j >= 0 && (ranked || gathered || hooked == d || whole))
        sh.hooked_bin = whole ? kAllRanked : d, sh.hooked_n = j + 1;
      if (by_mass) {  // before_j: the masses of every id ranked before candidate j, exact integers
        if (j >= 0) *kept = before_j + mass_of(sh.cand.key[j]);
      } else {
        for (int x = threadIdx.x; x <= j; x += block_threads()) above += mass_of(sh.cand.key[x]);
        unsigned long long total;
        block_exclusive_scan(sh, above, &total);
        if (j >= 0) *kept = total;
      }
      if (whole) {
        if (j >= 0 && threadIdx.x == 0) {
          sh.ranked_bin = kAllRanked;
          sh.ranked_n = j + 1;
        }
      } else if (fed && j >= 0) {  // bin d keeps its ids ranked up to j
        unsigned long long dropped = 0, total = 0;
        for (int x = j + 1 + threadIdx.x; x < static_cast<int>(count); x += block_threads()) dropped += mass_of(sh.cand.key[x]);
        block_exclusive_scan(sh, dropped, &total);
        if (threadIdx.x == 0) {
          sh.hist.count[d] = static_cast<uint32_t>(j + 1);
          sh.hist.mass[d] -= total;
          sh.ranked_bin = d;
          sh.ranked_n = j + 1;
        }
      }
      __syncthreads();  // read before a next cut writes the histogram
      return cut;
    }
  }
  // Every key bit fixed, more than kCutCandidates ids of one value: the lower ids are kept first.
  const float value = key_value(prefix);
  const unsigned long long each = by_mass ? fixed_mass(value - top, mass_shift) : 1ull;
  const auto reaches = [&](uint32_t n) { return static_cast<double>(before + n * each) >= target; };
  const double guess = ceil((target - static_cast<double>(before)) / static_cast<double>(each));
  uint32_t need = guess < 1.0 ? 1u : (guess > static_cast<double>(count) ? count : static_cast<uint32_t>(guess));
  while (need > 1u && reaches(need - 1u)) --need;
  while (need < count && !reaches(need)) ++need;
  if (need == count) return FilterCut{value, 0x7FFFFFFF};
  if (threadIdx.x == 0) sh.found = -1;
  __syncthreads();
  uint32_t running = 0;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  XK_ROW_PASS();
  for (int64_t base = 0; base < r.v; base += block_threads()) {
    const int64_t i = base + threadIdx.x;
    uint32_t key;
    const bool hit = i < r.v && in_bins(i, r.a(i), key);
    const unsigned ballot = __ballot_sync(kFullMask, hit);
    if (lane == 0) sh.warp_counts[warp] = __popc(ballot);
    __syncthreads();
    uint32_t ahead = running;
    for (int w = 0; w < warp; ++w) ahead += sh.warp_counts[w];
    ahead += __popc(ballot & ((1u << lane) - 1u));
    if (hit && ahead + 1 == need) sh.found = static_cast<int32_t>(i);
    for (int w = 0; w < block_threads() / 32; ++w) running += sh.warp_counts[w];
    __syncthreads();
    if (sh.found >= 0) break;
  }
  const FilterCut cut{value, sh.found};
  __syncthreads();
  return cut;
}

// The least float min-p keeps (a - top >= log(min_p), in float, as the filters test it), or +inf
// without min-p; found without a pass over the row: a - top only grows with a, so min-p keeps the
// values at or above the smallest float that passes, found by stepping the keys from top +
// log(min_p) (a few steps: rounding).
__device__ __forceinline__ float min_p_floor(float top, float min_p) {
  if (!(min_p > 0.0f)) return -kNegInf;
  const float min_gap = log_f32(min_p);
  uint32_t key = order_key(top + min_gap);
  while (key_value(key) - top < min_gap) ++key;       // stops at top, or at +inf, at the latest
  while (key_value(key - 1) - top >= min_gap) --key;  // stops above -inf
  return key_value(key);
}

// Whether a cut hook's claim on first-level bin `bin` (hooked_bin) holds the row's final cut:
// the cut lies in that bin (or every kept id is ranked), or min-p moved it above: its kept ids, those
// at or above its floor, all lie in bins above `bin`, which the hook saw (a hook's floor draw).
__device__ __forceinline__ bool hook_holds_cut(const FilterCut& cut, uint32_t bin, bool min_p) {
  const uint32_t cut_bin = order_key(cut.val) >> 21;
  return bin == kAllRanked || cut_bin == bin || (min_p && cut_bin > bin);
}
__device__ __forceinline__ bool hook_floor_draw(const FilterCut& cut, uint32_t bin) {
  return bin != kAllRanked && order_key(cut.val) >> 21 > bin;
}

// What the statistics pass of a row notes of the ids' top key bits for its cut: top-k's first-level
// counts (exact: they do not depend on the row's top), which save top-k its first pass; or, for
// top-p without a top-k cut, a guide to the first level by mass (each bin's masses relative to its
// own ceiling, as the top is not known yet), which lets that level's pass gather the bin of the cut.
enum class TopBits { kNone, kCount, kGuide };

__device__ __forceinline__ TopBits top_bits(const RowSampling& rs, int64_t v) {
  if (rs.top_k > 0 && rs.top_k < v) return TopBits::kCount;
  return rs.top_p < 1.0f ? TopBits::kGuide : TopBits::kNone;
}

// Zeroes the first level's counts and guide; a __syncthreads must follow before observe_top_bits.
__device__ __forceinline__ void clear_top_bits(CutShared& sh) {
  for (int d = threadIdx.x; d < kCutBins; d += block_threads()) sh.hist.count[d] = 0;
}

// Notes one scaled logit of the row in the first level.
__device__ __forceinline__ void observe_top_bits(CutShared& sh, float a, TopBits bits) {
  if (bits == TopBits::kNone || a == kNegInf) return;
  const uint32_t d = order_key(a) >> 21;
  if (bits == TopBits::kCount)
    atomicAdd(&sh.hist.count[d], 1u);
  else
    atomicAdd(&sh.hist.guide[d], exp_f32(a - bin_ceiling(d)));
}

// The row's largest scaled logit, at every thread, in one pass that also notes its top key bits
// for the cut (`bits`, cleared first): the first read of a row whose statistics are not needed.
template <typename T>
__device__ float row_top_noting_bits(CutShared& sh, const RowView<T>& r, TopBits bits) {
  if (bits != TopBits::kNone) clear_top_bits(sh);
  __syncthreads();
  ArgMax top = argmax_empty();
  r.for_each_any_order([&](int64_t i, float a) {  // the argmax ranks ties by id: any order
    argmax_observe(top, a, static_cast<int32_t>(i));
    observe_top_bits(sh, a, bits);
  });
  return block_merge_all(top, argmax_empty()).val;  // its barriers complete the top bits
}

// The first pass of a filtered row whose top is known before it is read (the refine ops' epilogue
// merged it): notes the row's top key bits for the cut as row_top_noting_bits does, and gathers into
// cand every finite id of key `least` or more, the ranking's first ids (unranked). total: with
// sum_mass, every finite id's fixed-point mass (top-p's target without top-k), else 0. Returns how
// many ids it gathered, kCutCandidates + 1 where they did not fit.
template <typename T>
__device__ int gather_ranking_prefix(CutShared& sh, const RowView<T>& r, float top, uint32_t least, TopBits bits,
                                     int mass_shift, bool sum_mass, unsigned long long& total) {
  if (bits != TopBits::kNone) clear_top_bits(sh);
  if (threadIdx.x == 0) sh.n_cand = 0;
  __syncthreads();
  unsigned long long mass = 0;
  r.for_each_any_order([&](int64_t i, float a) {
    observe_top_bits(sh, a, bits);
    if (a == kNegInf) return;
    if (sum_mass) mass += fixed_mass(a - top, mass_shift);
    const uint32_t key = order_key(a);
    if (key < least) return;
    const uint32_t slot = atomicAdd(&sh.n_cand, 1u);
    if (slot < static_cast<uint32_t>(kCutCandidates)) {
      sh.cand.key[slot] = key;
      sh.cand.id[slot] = static_cast<int32_t>(i);
    }
  });
  block_exclusive_scan(sh, mass, &total);  // its barriers complete the gather and the top bits
  const uint32_t n = sh.n_cand;
  __syncthreads();  // read before a cut resets it
  return n <= static_cast<uint32_t>(kCutCandidates) ? static_cast<int>(n) : kCutCandidates + 1;
}

// How many of the ranked cand[0, n) are at or above `floor` (a binary search: they are ranked).
__device__ __forceinline__ int count_at_least(const CutShared& sh, int n, float floor) {
  const uint32_t least = order_key(floor);
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (sh.cand.key[mid] >= least) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The cut of all three filters (as filter_cut's) from the ranking's first n ids, ranked in
// cand[0, n) (n <= kCutCandidates), given `total`, every finite id's fixed-point mass (read for top-p
// without top-k only): false where those ids do not hold the cut (fewer than top_k; without top-k,
// less than top_p of the row's mass). *kept: the kept ids' fixed-point mass.
__device__ inline bool prefix_cut(CutShared& sh, int n, float top, const RowSampling& rs, int64_t v,
                                  unsigned long long total, int mass_shift, FilterCut* cut, unsigned long long* kept) {
  const bool by_k = top_bits(rs, v) == TopBits::kCount, by_p = rs.top_p < 1.0f;
  if (by_k && n < rs.top_k) return false;
  int within = by_k ? static_cast<int>(rs.top_k) : n;  // the ids top-k keeps
  const float floor = min_p_floor(top, rs.min_p);      // +inf without min-p
  // vLLM's order: top-p's mass over the ids min-p keeps too, where fewer (all ranked here unless
  // every one of the n is at or above the floor: then, without top-k, it may go past them)
  bool floored = false;
  if (by_p && rs.min_p_first && rs.min_p > 0.0f) {
    const int c = count_at_least(sh, n, floor);
    if (c == n && !by_k) return false;
    if (c < within) within = c, floored = true;
  }
  const auto mass = [&](int j) { return fixed_mass(key_value(sh.cand.key[j]) - top, mass_shift); };
  unsigned long long local = 0, within_mass;
  for (int j = threadIdx.x; j < within; j += block_threads()) local += mass(j);
  block_exclusive_scan(sh, local, &within_mass);
  int last = within - 1;
  *kept = within_mass;
  if (by_p) {
    unsigned long long before;
    const bool whole = by_k || floored;  // the ids top-p renormalises over are the first `within`
    const double target = static_cast<double>(rs.top_p) * static_cast<double>(whole ? within_mass : total);
    const int j = first_reaching(sh, within, 0, target, mass, &before);
    if (j < 0 && !whole) return false;
    if (j >= 0) last = j, *kept = before + mass(j);  // j < 0 with them: only by rounding, their cut
  }
  *cut = FilterCut{key_value(sh.cand.key[last]), sh.cand.id[last]};
  if (rs.min_p > 0.0f && floor > cut->val) {  // min-p keeps the ids at or above its floor, all ranked here
    local = 0;
    for (int j = threadIdx.x; j <= last; j += block_threads())
      if (key_value(sh.cand.key[j]) >= floor) local += mass(j);
    block_exclusive_scan(sh, local, kept);
    *cut = FilterCut{floor, 0x7FFFFFFF};
  }
  return true;
}

// The cut of all three filters (top-k, then top-p within it, then min-p) of a row whose largest
// scaled logit `top` is finite; the statistics pass has noted the top key bits as top_bits says.
// *kept: as radix_cut's, for the ids all three keep. Where min-p moves the cut (its floor is found
// without a pass), the ids at or above its floor, which the first radix pass sums (unknown where
// none ran: min-p alone, or a top-k past the row's finite ids without top-p).
template <typename T, typename Hook = NoCutHook>
__device__ FilterCut filter_cut(CutShared& sh, const RowView<T>& r, float top, const RowSampling& rs, int mass_shift,
                                unsigned long long* kept, Hook&& hook = Hook{}) {
  FilterCut cut = keep_all();
  *kept = kMassUnknown;
  const bool top_p = rs.top_p < 1.0f;
  const float floor = min_p_floor(top, rs.min_p);
  unsigned long long floor_mass = kMassUnknown;
  unsigned long long* floor_sum = rs.min_p > 0.0f ? &floor_mass : nullptr;  // in the first radix pass
  if (threadIdx.x == 0) sh.ranked_n = -1, sh.hooked_n = -1;  // no claim without a radix cut (min-p alone)
  __syncthreads();
  const TopBits bits = top_bits(rs, r.v);
  if (bits == TopBits::kCount)
    cut = radix_cut(sh, r, top, keep_all(), false, static_cast<uint32_t>(rs.top_k), 1.0f, mass_shift,
                    FirstLevel::kCounts, top_p, kept, hook, floor, floor_sum);
  if (floor_mass != kMassUnknown) floor_sum = nullptr;  // top-p's passes leave it
  if (top_p) {
    FirstLevel first = bits == TopBits::kGuide ? FirstLevel::kGuided
                       : sh.ranked_n < 0       ? FirstLevel::kNone
                       : sh.ranked_bin == kAllRanked ? FirstLevel::kRanked
                                                     : FirstLevel::kFed;
    // vLLM's order: top-p within the ids min-p keeps too, where its floor ranks above top-k's cut.
    // top-k's ranked ids and fed histogram count ids below the floor: a fresh first level then.
    if (rs.min_p_first && rs.min_p > 0.0f && floor > cut.val) {
      cut = FilterCut{floor, 0x7FFFFFFF};
      if (first != FirstLevel::kGuided) first = FirstLevel::kNone;
    }
    cut = radix_cut(sh, r, top, cut, true, 0u, rs.top_p, mass_shift, first, false, kept, hook, floor, floor_sum);
  }
  if (rs.min_p > 0.0f) {
    const FilterCut narrowed = floor > cut.val ? FilterCut{floor, 0x7FFFFFFF} : cut;
    if (narrowed.val != cut.val || narrowed.idx != cut.idx) *kept = floor_mass;  // every id above the floor
    cut = narrowed;
  }
  return cut;
}

// The filtered row's sum of exp(a - top) over the ids `cut` keeps, at every thread of the block:
// filter_cut's fixed-point kept sum where it is known, else a pass that sums the kept ids'
// fixed-point masses (exact integers, so the sum does not depend on the order: min-p alone's kept
// sum is the candidates' select_cut's, bitwise).
template <typename T>
__device__ float kept_sum(const RowView<T>& r, const FilterCut& cut, float top, unsigned long long kept,
                          int mass_shift) {
  if (kept == kMassUnknown) {
    struct Scratch {
      unsigned long long warp_sums[32];
    };
    __shared__ Scratch sh;
    unsigned long long local = 0;
    r.for_each_in_order([&](int64_t i, float a) {
      if (a != kNegInf && filter_keeps(cut, a, static_cast<int32_t>(i))) local += fixed_mass(a - top, mass_shift);
    });
    block_exclusive_scan(sh.warp_sums, local, &kept);
  }
  return fixed_sum_value(kept, mass_shift);
}

}  // namespace xkernels::cuda
