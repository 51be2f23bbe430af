#include "top_filter.h"

#include <algorithm>
#include <array>
#include <limits>

#include "row_reduce.h"

namespace xkernels::cpu {
namespace {

bool ranks_before(const FilterCandidate& x, const FilterCandidate& y) {
  return x.a > y.a || (x.a == y.a && x.id < y.id);
}

constexpr FilterCut kKeepAll{kNegInf, std::numeric_limits<int32_t>::max()};

// The first min(k, finite ids) ids of the ranking, best first: a streaming selection keeping the
// best k seen in a heap whose root is the worst of them. Ids come in increasing order, so an id
// equal to the root's value ranks after it and is skipped. A block of 16 ids is looked at one by
// one only if its largest value beats the root; past the first thousands of ids almost none does,
// so the pass costs about one vectorised max a block.
void top_k_candidates(const float* a, int64_t n, int32_t k, std::vector<FilterCandidate>& heap) {
  heap.clear();
  int64_t v = 0;
  for (; v < n && static_cast<int64_t>(heap.size()) < k; ++v) {
    if (a[v] == kNegInf) continue;
    heap.push_back({a[v], static_cast<int32_t>(v)});
    std::push_heap(heap.begin(), heap.end(), ranks_before);
  }
  if (static_cast<int64_t>(heap.size()) == k) {
    const auto offer = [&](int64_t i) {
      if (!(a[i] > heap.front().a)) return;
      std::pop_heap(heap.begin(), heap.end(), ranks_before);
      heap.back() = {a[i], static_cast<int32_t>(i)};
      std::push_heap(heap.begin(), heap.end(), ranks_before);
    };
    constexpr int64_t kBlock = 16;
    for (; v < n && v % kBlock != 0; ++v) offer(v);
    for (; v + kBlock <= n; v += kBlock) {
      float block_max = a[v];
      for (int64_t j = 1; j < kBlock; ++j) block_max = std::max(block_max, a[v + j]);  // no NaN here
      if (block_max > heap.front().a)
        for (int64_t j = 0; j < kBlock; ++j) offer(v + j);
    }
    for (; v < n; ++v) offer(v);
  }
  std::sort_heap(heap.begin(), heap.end(), ranks_before);
}

// How many of the ranked candidates the smallest prefix whose mass reaches top_p of theirs holds.
size_t top_p_prefix(const std::vector<FilterCandidate>& ranked, float top, float top_p) {
  double total = 0.0;
  for (const auto& c : ranked) total += exp_f32(c.a - top);
  const double target = static_cast<double>(top_p) * total;
  double mass = 0.0;
  for (size_t j = 0; j < ranked.size(); ++j) {
    mass += exp_f32(ranked[j].a - top);
    if (mass >= target) return j + 1;
  }
  return ranked.size();
}

// top-p over the ids with a - top >= min_gap (all finite ids where min_gap is -inf; min-p's ids in
// vLLM's order): the mass of each 1/8-nat band of distance below the top (one band for everything
// past 32 nats) in one pass, then only the band where the cumulative mass reaches the target is
// ranked. Bands follow the ranking, since the distance top - a only falls as a rises.
FilterCut top_p_cut(const float* a, int64_t n, float top, float top_p, float min_gap, FilterScratch& scratch) {
  constexpr int kBands = 257;
  constexpr float kPerNat = 8.0f;
  const auto band = [&](float x) {
    const float d = top - x;
    return d < (kBands - 1) / kPerNat ? static_cast<int>(d * kPerNat) : kBands - 1;
  };
  scratch.e.resize(n);
  float* e = scratch.e.data();
  exp_row(a, n, top, e);
  if (min_gap != kNegInf)
    for (int64_t v = 0; v < n; ++v)
      if (!(a[v] - top >= min_gap)) e[v] = 0.0f;
  std::array<double, kBands> mass{};
  for (int64_t v = 0; v < n; ++v)
    if (e[v] > 0.0f) mass[band(a[v])] += e[v];
  double total = 0.0;
  for (double m : mass) total += m;
  const double target = static_cast<double>(top_p) * total;
  double before = 0.0;
  int b = 0;
  for (; b < kBands && before + mass[b] < target; ++b) before += mass[b];
  if (b == kBands) return kKeepAll;  // rounding: no band reaches the target
  auto& ranked = scratch.candidates;
  ranked.clear();
  for (int64_t v = 0; v < n; ++v)
    if (e[v] > 0.0f && band(a[v]) == b) ranked.push_back({a[v], static_cast<int32_t>(v)});
  std::sort(ranked.begin(), ranked.end(), ranks_before);
  double cum = before;
  for (const auto& c : ranked) {
    cum += exp_f32(c.a - top);
    if (cum >= target) return FilterCut{c.a, c.id};
  }
  return FilterCut{ranked.back().a, ranked.back().id};
}

}  // namespace

RowStats filter_row(float* a, int64_t n, const RowStats& s, const RowSampling& r, FilterScratch& scratch) {
  const float top = s.top.val;
  const float min_gap = r.min_p > 0.0f ? log_f32(r.min_p) : kNegInf;  // keep a - top >= log(min_p)
  FilterCut cut = kKeepAll;
  size_t kept = 0;  // with top-k: the kept ids are the first `kept` candidates
  if (r.top_k > 0 && r.top_k < n) {
    top_k_candidates(a, n, r.top_k, scratch.candidates);
    if (r.min_p_first && r.top_p < 1.0f)  // vLLM's order: top-p within the ids min-p keeps too (the top always)
      while (!(scratch.candidates.back().a - top >= min_gap)) scratch.candidates.pop_back();
    kept = r.top_p < 1.0f ? top_p_prefix(scratch.candidates, top, r.top_p) : scratch.candidates.size();
    cut = FilterCut{scratch.candidates[kept - 1].a, scratch.candidates[kept - 1].id};
  } else if (r.top_p < 1.0f) {
    cut = top_p_cut(a, n, top, r.top_p, r.min_p_first ? min_gap : kNegInf, scratch);
  }
  for (int64_t v = 0; v < n; ++v) {
    const bool keep = filter_keeps(cut, a[v], static_cast<int32_t>(v)) && a[v] - top >= min_gap;
    a[v] = keep ? a[v] : kNegInf;
  }
  if (kept == 0) return row_stats(a, n);
  float sum = 0.0f;
  for (size_t j = 0; j < kept; ++j) {
    const float gap = scratch.candidates[j].a - top;
    if (gap >= min_gap) sum += exp_f32(gap);
  }
  return RowStats{s.top, sum};
}

}  // namespace xkernels::cpu
