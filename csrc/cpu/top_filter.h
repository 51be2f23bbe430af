// The filtered target distribution on the CPU: top-k, top-p and min-p applied to one row of
// scaled logits without sorting the vocabulary (xkernels/reference/sampling.py states the rule).
#pragma once

#include <cstdint>
#include <vector>

#include "xkernels/sampling.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cpu {

struct FilterCandidate {
  float a;
  int32_t id;
};

// A thread's buffers, reused across rows.
struct FilterScratch {
  std::vector<FilterCandidate> candidates;
  std::vector<float> e;
};

// Sets the ids the filters drop to -inf in a (n scaled logits with statistics s, whose top is
// finite) and returns the statistics of the filtered row (the same top; the kept ids' sum).
RowStats filter_row(float* a, int64_t n, const RowStats& s, const RowSampling& r, FilterScratch& scratch);

}  // namespace xkernels::cpu
