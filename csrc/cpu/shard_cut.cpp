// shard_cut_histogram, shard_cut_pick and shard_cut_candidates on the CPU. The histogram: the rows in parallel, each in chunks of ids scaled into a buffer
// (the ignored id at -inf). A chunk's candidates are first found by a float range that holds every
// value of the round's keys (one compare pair an id: after the first round few pass), then keyed,
// weighed and counted exactly (shard_cut.h); the masses come from one vector exp of the chunk.
// The candidates: one pass a row, a heap of the lowest keys, the chunk's ids first tested against
// the value of the heap's largest key.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <queue>
#include <vector>

#include "../ops/shard_cut.h"
#include "dispatch.h"
#include "row_reduce.h"
#include "xkernels/shard_cut.h"

namespace xkernels {
namespace {

constexpr int64_t kChunk = 512;  // a multiple of exp_row's 16 lanes

// [lo, hi] holds the value of every key whose digits above `shift` are prefix (a NaN end widens
// to infinity; NaNs themselves weigh 0, so the range may leave them out).
struct ValueRange {
  float lo, hi;
};
ValueRange candidate_range(uint64_t prefix, int shift) {
  const int low = shift + kCutDigitBits;
  const uint64_t first = low >= 64 ? 0 : prefix << low;
  const uint64_t last = low >= 64 ? ~uint64_t{0} : first | ((uint64_t{1} << low) - 1);
  // A key's value part is the complement of the value's order key: keys rise as values fall.
  const float hi = key_value(~static_cast<uint32_t>(first >> kCutIdBits));
  const float lo = key_value(~static_cast<uint32_t>(std::min<uint64_t>(last >> kCutIdBits, 0xFFFFFFFFu)));
  return ValueRange{lo == lo ? lo : kNegInf, hi == hi ? hi : -kNegInf};
}

struct RowJob {
  uint64_t prefix;
  int shift;
  CutWeights w;
  int64_t first;   // the row's first global id
  int64_t ignore;  // the ignored id's local index
};

// Copies of the histogram that consecutive candidates add into in turn: one copy would chain each
// add to the last through memory, as most candidates of a round share a few buckets.
constexpr int kCopies = 4;

template <typename T>
void histogram_row(const T* src, int64_t n, float scale, const RowJob& job, int64_t* out) {
  const ValueRange range = candidate_range(job.prefix, job.shift);
  const bool every = range.lo == kNegInf && range.hi == -kNegInf;
  std::array<float, kChunk> a, e;
  std::array<int32_t, kChunk> pick;
  std::array<int64_t, kCopies * 2 * kCutBuckets> copies{};
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t len = std::min(kChunk, n - c0);
    cpu::scale_row(src + c0, len, scale, a.data());
    if (job.ignore >= c0 && job.ignore < c0 + len) a[job.ignore - c0] = kNegInf;
    // The first round's range holds every value: no test (a NaN passes and weighs 0).
    const int64_t found = every ? len : cpu::indices_in_range(a.data(), len, range.lo, range.hi, pick.data());
    if (found == 0) continue;
    if (job.w.mass) {  // every id by exp_row's vector lanes (none by its scalar tail), wherever a shard starts
      const int64_t lanes = (len + 15) / 16 * 16;
      std::fill(a.begin() + len, a.begin() + lanes, kNegInf);
      cpu::exp_row(a.data(), lanes, job.w.row_max, e.data());
    }
    for (int64_t j = 0; j < found; ++j) {
      const auto i = every ? static_cast<int32_t>(j) : pick[j];
      const auto id = static_cast<int32_t>(job.first + c0 + i);
      const uint64_t key = cut_rank_key(a[i], id);
      const CutWeight cw = cut_weight(job.w, a[i], id, job.w.mass ? e[i] : 0.0f);
      const bool take = cut_candidate(key, job.prefix, job.shift);
      int64_t* h = copies.data() + (j % kCopies) * 2 * kCutBuckets + cut_digit(key, job.shift);
      h[0] += take ? cw.hi : 0;
      h[kCutBuckets] += take ? cw.lo : 0;
    }
  }
  for (int c = 0; c < kCopies; ++c) {
    for (int b = 0; b < 2 * kCutBuckets; ++b) out[b] += copies[c * 2 * kCutBuckets + b];
  }
}

at::Tensor shard_cut_histogram_cpu(const at::Tensor& logits, const at::Tensor& scale, const at::Tensor& prefix,
                                   int64_t shift, int64_t vocab_start, int64_t ignore_id,
                                   const std::optional<at::Tensor>& row_max,
                                   const std::optional<at::Tensor>& keep_value,
                                   const std::optional<at::Tensor>& keep_id) {
  const ShardCutCall c = shard_cut_histogram_call(logits, scale, prefix, shift, vocab_start, row_max, keep_value,
                                                  keep_id);
  const auto& s = c.s;
  const float* scp = c.scale.const_data_ptr<float>();
  const int64_t* pfp = c.prefix.const_data_ptr<int64_t>();
  const float* rmp = c.row_max.defined() ? c.row_max.const_data_ptr<float>() : nullptr;
  const float* kvp = c.keep_value.defined() ? c.keep_value.const_data_ptr<float>() : nullptr;
  const int32_t* kip = c.keep_id.defined() ? c.keep_id.const_data_ptr<int32_t>() : nullptr;
  int64_t* op = c.out.mutable_data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(s.v, 1));  // no thread for a tiny row
  cpu::dispatch_logits(c.logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* lp = c.logits.const_data_ptr<T>();
    at::parallel_for(0, s.r, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const RowJob job{static_cast<uint64_t>(pfp[r]), static_cast<int>(shift),
                         CutWeights{rmp != nullptr, rmp ? rmp[r] : 0.0f, kvp != nullptr,
                                    FilterCut{kvp ? kvp[r] : 0.0f, kip ? kip[r] : 0}},
                         vocab_start, ignore_id - vocab_start};
        histogram_row(lp + r * s.v, s.v, scp[r], job, op + r * 2 * kCutBuckets);
      }
    });
  });
  return c.out;
}

std::tuple<at::Tensor, at::Tensor> shard_cut_pick_cpu(const at::Tensor& hist, const at::Tensor& prefix,
                                                      const at::Tensor& before, const at::Tensor& target) {
  const ShardPickCall c = shard_cut_pick_call(hist, prefix, before, target);
  const int64_t* hp = c.hist.const_data_ptr<int64_t>();
  const double* tp = c.target.const_data_ptr<double>();
  int64_t* pp = c.prefix.mutable_data_ptr<int64_t>();
  int64_t* bp = c.before.mutable_data_ptr<int64_t>();
  at::parallel_for(0, c.r, 256, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t* hi = hp + r * c.parts * kCutBuckets;
      const int bucket = cut_pick(hi, c.parts == 2 ? hi + kCutBuckets : nullptr, bp[2 * r], bp[2 * r + 1], tp[r]);
      pp[r] = static_cast<int64_t>(static_cast<uint64_t>(pp[r]) * kCutBuckets + static_cast<uint64_t>(bucket));
    }
  });
  return {c.prefix, c.before};
}

// Row r's `count` lowest keys of ids above -inf, ascending (then kCutKeepAllKey), into keys; with
// w.mass their weights (hi, lo) into weights: each from exp_row's vector lanes, as histogram_row
// weighs it, so that both paths of filter_cuts weigh an id alike.
template <typename T>
void candidates_row(const T* src, int64_t n, float scale, const RowJob& job, int64_t count, int64_t* keys,
                    int64_t* weights) {
  std::priority_queue<uint64_t> heap;  // the lowest keys so far, the largest on top
  std::array<float, kChunk> a;
  std::array<int32_t, kChunk> pick;
  const float finite_floor = std::nextafter(kNegInf, 0.0f);
  for (int64_t c0 = 0; c0 < n && count > 0; c0 += kChunk) {
    const int64_t len = std::min(kChunk, n - c0);
    cpu::scale_row(src + c0, len, scale, a.data());
    if (job.ignore >= c0 && job.ignore < c0 + len) a[job.ignore - c0] = kNegInf;
    // Once the heap is full, an id enters only at or above its largest key's value.
    const float lo = static_cast<int64_t>(heap.size()) == count ? cut_key_value(heap.top()) : finite_floor;
    const int64_t found = cpu::indices_in_range(a.data(), len, lo, -kNegInf, pick.data());
    for (int64_t j = 0; j < found; ++j) {
      const int32_t i = pick[j];
      const uint64_t key = cut_rank_key(a[i], static_cast<int32_t>(job.first + c0 + i));
      if (static_cast<int64_t>(heap.size()) < count) {
        heap.push(key);
      } else if (key < heap.top()) {
        heap.pop();
        heap.push(key);
      }
    }
  }
  const auto found = static_cast<int64_t>(heap.size());
  std::vector<float> value((found + 15) / 16 * 16, kNegInf), e(value.size());
  for (int64_t j = found - 1; j >= 0; --j) {
    keys[j] = static_cast<int64_t>(heap.top());
    value[j] = cut_key_value(heap.top());
    heap.pop();
  }
  for (int64_t j = found; j < count; ++j) keys[j] = static_cast<int64_t>(kCutKeepAllKey);
  if (!job.w.mass) return;
  cpu::exp_row(value.data(), static_cast<int64_t>(value.size()), job.w.row_max, e.data());
  for (int64_t j = 0; j < found; ++j) {
    const CutWeight cw = cut_weight(job.w, value[j], 0, e[j]);
    weights[2 * j] = cw.hi;
    weights[2 * j + 1] = cw.lo;
  }
}

std::tuple<at::Tensor, at::Tensor> shard_cut_candidates_cpu(const at::Tensor& logits, const at::Tensor& scale,
                                                            int64_t count, int64_t vocab_start, int64_t ignore_id,
                                                            const std::optional<at::Tensor>& row_max) {
  const ShardCandidatesCall c = shard_cut_candidates_call(logits, scale, count, vocab_start, row_max);
  const float* scp = c.scale.const_data_ptr<float>();
  const float* rmp = c.row_max.defined() ? c.row_max.const_data_ptr<float>() : nullptr;
  int64_t* kp = c.keys.mutable_data_ptr<int64_t>();
  int64_t* wp = c.weights.mutable_data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(c.s.v, 1));
  cpu::dispatch_logits(c.logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* lp = c.logits.const_data_ptr<T>();
    at::parallel_for(0, c.s.r, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const RowJob job{0, 0, CutWeights{rmp != nullptr, rmp ? rmp[r] : 0.0f, false, FilterCut{}}, vocab_start,
                         ignore_id - vocab_start};
        candidates_row(lp + r * c.s.v, c.s.v, scp[r], job, count, kp + r * count, wp + r * count * 2);
      }
    });
  });
  return {c.keys, c.weights};
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CPU, m) {
  m.impl("shard_cut_histogram", &shard_cut_histogram_cpu);
  m.impl("shard_cut_pick", &shard_cut_pick_cpu);
  m.impl("shard_cut_candidates", &shard_cut_candidates_cpu);
}

}  // namespace xkernels
