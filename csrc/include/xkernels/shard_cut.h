// The whole-vocabulary cut of a row sharded over ranks (xkernels.distributed's filters), found by a
// radix select whose histograms each shard fills from its own ids and the ranks all-reduce. Shared
// by the CPU and CUDA kernels of shard_cut_histogram and shard_cut_pick;
// xkernels/reference/shard_cut.py states the same in PyTorch.
//
// Each id gets a 63-bit key, ascending in the ranking (a higher scaled logit first, ties to the
// lower id): the order-preserving bits of its value, complemented, above its 31-bit global id. A
// round histograms one 8-bit digit of the keys that share the prefix the rounds before chose, so 8
// rounds end at one id: the cut itself, ties included, with no pass in id order.
//
// Where a top-k's k is bounded (k <= count, known on the host), each shard's `count` lowest keys
// (shard_cut_candidates) hold the whole row's k lowest: one all-gather of them gives the cut, and
// top-p within it, with no rounds.
//
// Between the rounds, each row's bucket is picked from the all-reduced histogram (cut_pick) on the
// device: the first whose cumulative weight, compared as a float64 number, reaches the target.
//
// Weights are summed exactly, as integers, so the histograms, and the cut, do not depend on the
// order of the sums, the number of shards or the device: a weight w in [0, 1] is floor(w 2^62) =
// hi 2^31 + lo, the two parts summed apart (each sum stays below 2^62 for fewer than 2^31 ids).
#pragma once

#include <cstdint>

#include "xkernels/host_device.h"
#include "xkernels/sampling_params.h"

namespace xkernels {

constexpr int kCutDigitBits = 8;
constexpr int kCutBuckets = 1 << kCutDigitBits;
constexpr int kCutIdBits = 31;
constexpr int kCutTopShift = 56;  // the first round's digit: key bits 63..56
constexpr int64_t kCutWeightOne = int64_t{1} << 31;  // w = 1 as its hi part (lo 0)
constexpr int kCutCandidatesMax = 4096;  // shard_cut_candidates' count: a CUDA block sorts them in shared memory

// The key of scaled logit a at global id `id` (< 2^31). -0 is keyed as +0: they tie, as values.
XK_HD uint64_t cut_rank_key(float a, int32_t id) {
  const uint32_t ascending = order_key(a == 0.0f ? 0.0f : a);
  return (static_cast<uint64_t>(~ascending) << kCutIdBits) | static_cast<uint32_t>(id);
}

// The key past every id above -inf (-inf's, at the largest id): shard_cut_candidates' filler, and
// as a cut it keeps every id.
constexpr uint64_t kCutKeepAllKey = (static_cast<uint64_t>(~0x007FFFFFu) << kCutIdBits) | 0x7FFFFFFFu;

// The scaled logit a key was made from (+0 for -0).
XK_HD float cut_key_value(uint64_t key) { return key_value(~static_cast<uint32_t>(key >> kCutIdBits)); }

// Whether key is a candidate of the round at `shift` (the keys whose digits above it are prefix),
// and the bucket it falls in.
XK_HD bool cut_candidate(uint64_t key, uint64_t prefix, int shift) {
  return shift + kCutDigitBits >= 64 || (key >> (shift + kCutDigitBits)) == prefix;
}
XK_HD int cut_digit(uint64_t key, int shift) { return static_cast<int>((key >> shift) & (kCutBuckets - 1)); }

// One row's weights: a count of the ids above -inf (mass false), or their softmax masses
// exp(a - row_max) (mass true); with a keep cut, only the ids it keeps (filter_keeps) weigh.
struct CutWeights {
  bool mass;
  float row_max;
  bool has_keep;
  FilterCut keep;
};

struct CutWeight {
  int64_t hi, lo;
};

// The weight of scaled logit a at global id `id`, split; e = exp(a - row_max) where w.mass (the
// kernel's own exp, so that every round of one device weighs an id alike). A NaN weighs 0; a mass
// is clamped to [0, 1] (an a above row_max, which a row's true max rules out, cannot overflow).
XK_HD CutWeight cut_weight(const CutWeights& w, float a, int32_t id, float e) {
  if (!(a > kNegInf) || (w.has_keep && !filter_keeps(w.keep, a, id))) return CutWeight{0, 0};
  if (!w.mass) return CutWeight{kCutWeightOne, 0};
  if (!(e > 0.0f)) return CutWeight{0, 0};  // NaN too
  if (!(e < 1.0f)) return CutWeight{kCutWeightOne, 0};
  const auto fixed = static_cast<int64_t>(static_cast<double>(e) * 4611686018427387904.0);  // 2^62, exact
  return CutWeight{fixed >> 31, fixed & 0x7FFFFFFF};
}

// A weight's parts as one float64 number in units of 2^-62: hi 2^31 + lo, each converted once.
XK_HD double cut_weight_value(int64_t hi, int64_t lo, bool has_lo) {
  const double value = static_cast<double>(hi) * 2147483648.0;  // 2^31: exact
  return has_lo ? value + static_cast<double>(lo) : value;
}

// One row of shard_cut_pick: the number of buckets of hist (hi[256], and lo[256] or null for a
// count's) whose cumulative weight after `before` stays below target, at most 255; before becomes
// the weight ranked before that bucket (before_lo is left as it is without lo). The sums wrap as
// unsigned (torch's int64 sums wrap too), so no input overflows.
XK_HD int cut_pick(const int64_t* hi, const int64_t* lo, int64_t& before_hi, int64_t& before_lo, double target) {
  auto h = static_cast<uint64_t>(before_hi), l = static_cast<uint64_t>(before_lo);
  int bucket = 0;
  for (int b = 0; b < kCutBuckets; ++b) {
    h += static_cast<uint64_t>(hi[b]);
    if (lo) l += static_cast<uint64_t>(lo[b]);
    bucket += cut_weight_value(static_cast<int64_t>(h), static_cast<int64_t>(l), lo != nullptr) < target;
  }
  bucket = bucket < kCutBuckets - 1 ? bucket : kCutBuckets - 1;
  h = static_cast<uint64_t>(before_hi), l = static_cast<uint64_t>(before_lo);
  for (int b = 0; b < bucket; ++b) {
    h += static_cast<uint64_t>(hi[b]);
    if (lo) l += static_cast<uint64_t>(lo[b]);
  }
  before_hi = static_cast<int64_t>(h);
  before_lo = static_cast<int64_t>(l);
  return bucket;
}

}  // namespace xkernels
