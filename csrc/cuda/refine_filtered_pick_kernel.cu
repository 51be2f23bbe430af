// refine's filtered rows on CUDA (refine_kernel.cu's comment, step 6), from the float32 logits the
// epilogue kept, in place of the row's merged result:
//  a. filtered_scan_kernel: a block per (row, slice) of a row with top-k or top-p reads its slice
//     once (candidates.cuh's scan_slice): its best kSliceKeep ids and its top;
//     min_p_slices_kernel: a block per (row, slice) of a row with min-p alone draws over its
//     slice's ids at or above the floor (the row's top from the epilogue's partial results), the
//     Gumbel-max and softmax statistics of the kept ids, as the epilogue's partial results are;
//  b. filtered_select_kernel: a block per row with top-k or top-p finds the cut from its slices'
//     candidates (select_cut: the radix path's cut and kept fixed-point mass, exactly) and draws
//     over the kept ids (the noise observe_group gives them); a row with min-p alone merges its
//     slices' draws in slice order; it notes the rows it settles;
//  c. filtered_pick_kernel: a block per row the pipeline did not settle (top-k beyond the
//     candidates, ties at the cut, flat rows, top-p's target within its total's bounds of a step,
//     rows without a finite top) finds the row's cut (row_filter.cuh) and draws over the ids it
//     keeps.
// Min-p alone's token is filtered_pick's (the same noise a kept id); its log-probability sums the
// kept mass slice by slice, in a fixed order, where filtered_pick summed it in its block's order:
// the two differ in the last bits.
#include "candidates.cuh"
#include "refine_kernels.cuh"

namespace xkernels::cuda {
namespace {

SliceLayout layout_of(const RefineParams& p) { return slice_layout(p.v, 4); }  // float32 logits

size_t sums_bytes(const RefineParams& p, int64_t rows) {
  return align_up(sizeof(SliceSummary) * static_cast<size_t>(rows) * layout_of(p).slices);
}

size_t cands_bytes(const RefineParams& p, int64_t rows) {
  return align_up(sizeof(Candidate) * kSliceKeep * static_cast<size_t>(rows) * layout_of(p).slices);
}

size_t settled_bytes(int64_t rows) { return align_up(sizeof(int32_t) * static_cast<size_t>(rows)); }

// Where a launch's candidates live in RefineWorkspace::candidates (rows: the launch's), and after
// them min-p alone's draws, a SampledRow a (row, slice).
CandidateSpace carve_candidates(const RefineParams& p, void* base, int64_t rows, SampledRow** min_p_draws) {
  char* at = static_cast<char*>(base);
  *min_p_draws = reinterpret_cast<SampledRow*>(at + sums_bytes(p, rows) + cands_bytes(p, rows) + settled_bytes(rows));
  return CandidateSpace{layout_of(p), reinterpret_cast<SliceSummary*>(at),
                        reinterpret_cast<Candidate*>(at + sums_bytes(p, rows)),
                        reinterpret_cast<int32_t*>(at + sums_bytes(p, rows) + cands_bytes(p, rows))};
}

// Whether the candidates serve launch row m: live, filtered, with top-k or top-p.
__device__ __forceinline__ bool pipeline_row(const RefineParams& p, const RowSet& rs, int64_t m) {
  return row_live(p, rs, m) && row_filtered(p, m / rs.d_count) && top_bits(p.s.row(m / rs.d_count), p.v) != TopBits::kNone;
}

// Whether launch row m filters by min-p alone (its slices draw over the ids at or above the floor).
__device__ __forceinline__ bool min_p_row(const RefineParams& p, const RowSet& rs, int64_t m) {
  return row_live(p, rs, m) && row_filtered(p, m / rs.d_count) && top_bits(p.s.row(m / rs.d_count), p.v) == TopBits::kNone;
}

// The merge of launch row m's partial results (the epilogue's), at every thread: its top is the
// largest a of the kept logits.
__device__ __forceinline__ SampledRow merged_partials(const RefineWorkspace& w, int64_t m, int64_t partials) {
  const SampledRow* partial = w.partial + m * partials;
  SampledRow merged = sampled_empty();
  for (int64_t c = threadIdx.x; c < partials; c += kThreads) merged = sampled_merge(merged, partial[c]);
  return block_merge_all(merged, sampled_empty());
}

// The noise observe_group gives id i of a row (its group's Philox draw, word i % 4).
__device__ __forceinline__ float id_noise(const RowNoise& rn, int64_t i) {
  const Philox4 r = philox_draw(rn.seed, rn.offset, rn.sequence, rn.position, static_cast<uint32_t>(i / 4));
  const int j = static_cast<int>(i % 4);
  return gumbel_from_word(j == 0 ? r.w[0] : j == 1 ? r.w[1] : j == 2 ? r.w[2] : r.w[3]);
}

// The draw over the ids above a cut's bin, in the cut's gather pass (row_filter.cuh's hook): the
// pick, with the candidates' after it, of the filtered row; above_floor, the draw over those at or
// above min-p's floor (+inf without), for a cut min-p moves to a higher bin.
struct RefineHook {
  static constexpr bool kActive = true;
  RowNoise rn;
  float floor;
  SampledRow best, above_floor;
  __device__ __forceinline__ void begin() { best = above_floor = sampled_empty(); }
  __device__ __forceinline__ void observe(int64_t i, float a) {
    const auto noise = id_noise(rn, i);
    sampled_observe(best, a, noise, static_cast<int32_t>(i));
    if (a >= floor) sampled_observe(above_floor, a, noise, static_cast<int32_t>(i));
  }
};

// The least key filtered_pick_kernel's first pass gathers, from the maxima of the row's partial
// results (one a block or chunk of the epilogue, each an id's value), ranked: with top-k, the
// top_k-th largest of them (or their least, when there are fewer), so that at least that many ids
// are gathered; for top-p alone, the first at which their masses reach top_p of the row's sum (a
// guess: each is one id's mass). The pass checks that what it gathers holds the cut.
__device__ uint32_t prefix_least_key(CutShared& sh, const SampledRow* partial, int64_t partials, float top,
                                     float sum, const RowSampling& rs, int64_t v, int mass_shift) {
  const int n = static_cast<int>(partials < kCutCandidates ? partials : kCutCandidates);  // any of them bound top-k
  for (int j = threadIdx.x; j < n; j += kThreads) {
    sh.cand.key[j] = order_key(partial[j].stats.top.val);
    sh.cand.id[j] = j;
  }
  rank_first(sh, n);
  int j = n - 1;
  if (top_bits(rs, v) == TopBits::kCount) {
    j = rs.top_k < n ? rs.top_k - 1 : n - 1;
  } else {
    unsigned long long before;
    const double target = static_cast<double>(rs.top_p) * static_cast<double>(sum) * static_cast<double>(1ull << mass_shift);
    const int hit = first_reaching(sh, n, 0, target,
                                   [&](int i) { return fixed_mass(key_value(sh.cand.key[i]) - top, mass_shift); }, &before);
    if (hit >= 0) j = hit;
  }
  const uint32_t least = sh.cand.key[j];
  __syncthreads();  // read before the gather overwrites cand
  return least;
}

// a. Block (row, slice) of a pipeline row scans its slice (rows of the other kWithTotal exit: a
// launch for each, as the mass sums of top-p alone cost registers).
template <bool kWithTotal>
__global__ void __launch_bounds__(kThreads, 4) filtered_scan_kernel(RefineParams p, RowSet rs, RefineWorkspace w,
                                                                    CandidateSpace c) {
  __shared__ ScanShared sh;
  const int64_t m = blockIdx.x / c.layout.slices, slice = blockIdx.x % c.layout.slices;
  if (!pipeline_row(p, rs, m) || select_needs_total(p.s.row(m / rs.d_count), p.v) != kWithTotal) return;
  const RowView<float> r{w.logits + m * p.v, p.v, p.s.row(m / rs.d_count).inv_t};  // not greedy: filtered
  const int64_t begin = slice * c.layout.chunks;
  scan_slice<float, kWithTotal>(sh, r, begin, begin + c.layout.chunks, c.sums + blockIdx.x,
                                c.cands + static_cast<int64_t>(blockIdx.x) * kSliceKeep);
}

// a'. Block (row, slice) of a row with min-p alone: the Gumbel-max and softmax statistics of its
// slice's ids at or above the floor (observe_group's noise), into draws[blockIdx.x]. A row without
// a finite top leaves nothing (filtered_select_kernel does not settle it).
__global__ void __launch_bounds__(kThreads, 4) min_p_slices_kernel(RefineParams p, RowSet rs, RefineWorkspace w,
                                                                   SliceLayout layout, int64_t partials,
                                                                   SampledRow* draws) {
  const int64_t m = blockIdx.x / layout.slices, slice = blockIdx.x % layout.slices;
  if (!min_p_row(p, rs, m)) return;  // the whole block
  const float t = merged_partials(w, m, partials).stats.top.val;
  if (!is_finite_f32(t)) return;  // the whole block
  if (slice == 0) XK_ROW_PASS();
  const int64_t n = m / rs.d_count;
  const RowNoise rn = row_noise(p, n, rs.d_begin + m % rs.d_count);
  const FilterCut cut{min_p_floor(t, p.s.row(n).min_p), 0x7FFFFFFF};
  const float* row = w.logits + m * p.v;
  const int64_t groups = (p.v + 3) / 4, begin = slice * layout.chunks;  // a chunk: 4 floats, a group
  const int64_t end = begin + layout.chunks < groups ? begin + layout.chunks : groups;
  SampledRow best = sampled_empty();
  const auto observe_kept = [&](int64_t q, float (&x)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (!filter_keeps(cut, x[j] * rn.scale, static_cast<int32_t>(4 * q + j))) x[j] = kNegInf;
    observe_group(best, x, q, p.v, rn);
  };
  // Every row starts 16-byte aligned where v is a multiple of 4: groups by 16-byte loads, kScanDepth
  // in flight a thread (16 KB a block), as the scan's; else id by id.
  const bool vector_ok = p.v % 4 == 0 && reinterpret_cast<uintptr_t>(w.logits) % 16 == 0;
  const int64_t vector_end = vector_ok ? end : begin;
  for_each_batched<kScanDepth>(
      begin + threadIdx.x, vector_end, kThreads, [&](int64_t q) { return reinterpret_cast<const uint4*>(row)[q]; },
      [&](int64_t q, const uint4& chunk) {
        float x[4];
        unpack<float>(chunk, 1.0f, x);
        observe_kept(q, x);
      });
  for (int64_t q = vector_end + threadIdx.x; q < end; q += kThreads) {
    float x[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = 4 * q + j < p.v ? row[4 * q + j] : kNegInf;
    observe_kept(q, x);
  }
  best = block_merge(best, sampled_empty());
  if (threadIdx.x == 0) draws[blockIdx.x] = best;
}

// b. A block per filtered row (it notes whether it settled each one): where a pipeline row's
// candidates settle the cut (and the row has a finite top), the Gumbel-max pick over the kept ids,
// all among them, and its log-probability from the kept fixed-point mass: what filtered_pick's draw
// from a gather gives. A row with min-p alone and a finite top: its slices' draws merged in slice
// order, the pick and log-probability of the kept ids (filtered_pick's pick).
__global__ void __launch_bounds__(kThreads) filtered_select_kernel(RefineParams p, RowSet rs, RefineWorkspace w,
                                                                   CandidateSpace c, int mass_shift,
                                                                   int64_t partials, const SampledRow* draws,
                                                                   int64_t* tokens, float* logprobs) {
  __shared__ SelectShared sh;
  const int64_t m = blockIdx.x;
  if (!row_live(p, rs, m)) return;  // the whole block
  const int64_t n = m / rs.d_count, d = rs.d_begin + m % rs.d_count;
  if (!row_filtered(p, n)) return;
  bool settled = false;
  if (min_p_row(p, rs, m)) {
    settled = is_finite_f32(merged_partials(w, m, partials).stats.top.val);  // else min_p_slices_kernel drew nothing
    if (settled) {
      const int slices = c.layout.slices;  // <= kMaxSlices <= kThreads
      const SampledRow mine = static_cast<int>(threadIdx.x) < slices ? draws[m * slices + threadIdx.x] : sampled_empty();
      const SampledRow best = block_merge(mine, sampled_empty());
      if (threadIdx.x == 0) {
        const int64_t at = row_index(p, rs, m);
        tokens[at] = sampled_token(best);
        logprobs[at] = sampled_logprob(best);
      }
    }
  } else if (pipeline_row(p, rs, m)) {
    const int64_t first = m * c.layout.slices;
    RowCut cut;
    settled = select_cut(sh, c.sums + first, c.cands + first * kSliceKeep, c.layout.slices, p.s.row(n), p.v,
                         mass_shift, &cut) &&
              !cut.degenerate;  // no finite top: filtered_pick keeps the merged result
    if (settled) {
      const RowNoise rn = row_noise(p, n, d);
      SampledRow best = sampled_empty();
      for (int j = threadIdx.x; j < sh.offset[c.layout.slices]; j += kThreads) {  // the ranked head
        const float a = key_value(sh.head[j].key);
        const int32_t id = sh.head[j].id;
        if (filter_keeps(cut.cut, a, id)) sampled_observe(best, a, id_noise(rn, id), id);
      }
      best = block_merge(best, sampled_empty());
      if (threadIdx.x == 0) {
        const int64_t at = row_index(p, rs, m);
        tokens[at] = sampled_token(best);
        logprobs[at] = best.pick_a - cut.top.val - log_f32(fixed_sum_value(cut.kept, mass_shift));
      }
    }
  }
  if (threadIdx.x == 0) c.settled[m] = settled;
}

// c. A block per filtered row of the launch (those `settled` marks exit): the Gumbel-max pick over the ids its cut keeps (the
// noise of the fused epilogue) and its log-probability, overwriting the row's merged result. The
// row's top comes from its partial results, so one read of the logits the epilogue kept usually
// picks it: min-p alone draws in it; top-k and top-p gather the ranking's first ids in it
// (prefix_least_key), and where those hold the cut, rank them and draw from them. Where they do not
// (top_k above the partials and their gather, too many ids at the bound, top-p's guess short),
// that read has noted the top key bits, and the cut's radix passes follow (its gather draws too;
// where min-p moves the cut, over the ids above its floor, which the gather sums: the kept sum), a
// draw pass after them where the gather does not hold the final cut (a second radix level).
// A row without a softmax (a NaN, +inf, or all -inf) keeps the merged result (no cut, as the
// reference). One block an SM: the selection with the draw in its gather takes the registers.
__global__ void __launch_bounds__(kThreads, 1) filtered_pick_kernel(RefineParams p, RowSet rs, RefineWorkspace w,
                                                                    const int32_t* settled, int64_t partials,
                                                                    int mass_shift, int64_t* tokens, float* logprobs) {
  __shared__ CutShared sh;
  const int64_t m = blockIdx.x;
  if (!row_live(p, rs, m)) return;  // the whole block
  const int64_t n = m / rs.d_count, d = rs.d_begin + m % rs.d_count;
  if (!row_filtered(p, n) || (settled && settled[m])) return;
  const RowSampling samp = p.s.row(n);
  const RowNoise rn = row_noise(p, n, d);
  const RowView<float> r{w.logits + m * p.v, p.v, rn.scale};
  const SampledRow* partial = w.partial + m * partials;
  const SampledRow merged = merged_partials(w, m, partials);
  const float t = merged.stats.top.val;  // the epilogue's top: the largest a of the kept logits
  if (!is_finite_f32(t)) return;  // the whole block
  const TopBits bits = top_bits(samp, p.v);  // kNone: min-p alone
  const bool cut_filters = bits != TopBits::kNone;
  const float floor = min_p_floor(t, samp.min_p);
  FilterCut cut{floor, 0x7FFFFFFF};  // min-p alone
  unsigned long long kept = kMassUnknown;
  // Drawn from cand: the kept ids are those of cand[0, ranked) the cut keeps (and a hook's).
  int ranked = -1;
  if (cut_filters) {
    const uint32_t least = prefix_least_key(sh, partial, partials, t, merged.stats.sum, samp, p.v, mass_shift);
    unsigned long long total = 0;
    const int got = gather_ranking_prefix(sh, r, t, least, bits, mass_shift, bits != TopBits::kCount, total);
    if (got <= kCutCandidates) {
      rank_first(sh, got);
      if (prefix_cut(sh, got, t, samp, p.v, total, mass_shift, &cut, &kept)) ranked = got;
    }
  }
  SampledRow best = sampled_empty();
  bool drawn = ranked >= 0;
  if (!drawn && cut_filters) {
    RefineHook hook{rn, floor, sampled_empty(), sampled_empty()};
    cut = filter_cut(sh, r, t, samp, mass_shift, &kept, hook);
    ranked = sh.hooked_n;
    const uint32_t bin = sh.hooked_bin;
    drawn = ranked >= 0 && hook_holds_cut(cut, bin, samp.min_p > 0.0f);
    if (drawn && bin != kAllRanked) best = hook_floor_draw(cut, bin) ? hook.above_floor : hook.best;
  }
  for (int j = threadIdx.x; drawn && j < ranked; j += kThreads) {
    const float a = key_value(sh.cand.key[j]);
    const int32_t id = sh.cand.id[j];
    if (filter_keeps(cut, a, id)) sampled_observe(best, a, id_noise(rn, id), id);
  }
  if (!drawn) {
    XK_ROW_PASS();
    for (int64_t q = threadIdx.x; 4 * q < p.v; q += kThreads) {
      float x[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t id = 4 * q + j;
        const float l = id < p.v ? r.row[id] : kNegInf;
        x[j] = filter_keeps(cut, l * rn.scale, static_cast<int32_t>(id)) ? l : kNegInf;
      }
      observe_group(best, x, q, p.v, rn);
    }
  }
  __syncthreads();  // the candidates are read before block_merge's buffer, and kept_sum, reuse shared memory
  best = block_merge(best, sampled_empty());
  // Drawn from a gather, the row's statistics are those of the kept ids: their sum from the cut.
  const float sum = drawn ? kept_sum(r, cut, t, kept, mass_shift) : 0.0f;
  if (threadIdx.x == 0) {
    const int64_t at = row_index(p, rs, m);
    tokens[at] = sampled_token(best);
    logprobs[at] = drawn ? best.pick_a - t - log_f32(sum) : sampled_logprob(best);
  }
}

}  // namespace

size_t filtered_candidates_bytes(const RefineParams& p, int64_t rows) {
  return sums_bytes(p, rows) + cands_bytes(p, rows) + settled_bytes(rows) +
         align_up(sizeof(SampledRow) * static_cast<size_t>(rows) * layout_of(p).slices);
}

cudaError_t launch_filtered_pick(const RefineParams& p, const RowSet& rs, const RefineWorkspace& w, int64_t rows,
                                 int64_t partials, int64_t* tokens, float* logprobs, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int shift = cut_mass_shift(p.v);
  // The workspace holds the candidates of p.n * p.d rows, laid out for them.
  SampledRow* draws = nullptr;
  const CandidateSpace c = carve_candidates(p, w.candidates, p.n * p.d, &draws);
  const int32_t* settled = nullptr;
  if (!p.pick_only && rows * c.layout.slices <= 0x7FFFFFFF) {  // a grid's limit; beyond it filtered_pick takes every row
    const auto blocks = static_cast<unsigned>(rows * c.layout.slices);
    filtered_scan_kernel<false><<<blocks, kThreads, 0, stream>>>(p, rs, w, c);
    filtered_scan_kernel<true><<<blocks, kThreads, 0, stream>>>(p, rs, w, c);
    min_p_slices_kernel<<<blocks, kThreads, 0, stream>>>(p, rs, w, c.layout, partials, draws);
    filtered_select_kernel<<<rows, kThreads, 0, stream>>>(p, rs, w, c, shift, partials, draws, tokens, logprobs);
    settled = c.settled;
  }
  filtered_pick_kernel<<<rows, kThreads, 0, stream>>>(p, rs, w, settled, partials, shift, tokens, logprobs);
  return cudaGetLastError();
}

}  // namespace xkernels::cuda
