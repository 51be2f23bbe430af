// The step rule of diffusion-LLM decoding (LLaDA's low-confidence unmasking), shared by the CPU
// and CUDA kernels of dllm_step.
#pragma once

#include <cstdint>

#include "xkernels/host_device.h"
#include "xkernels/sampling.h"
#include "xkernels/sampling_params.h"

namespace xkernels {

// The logit of id x as the rule sees it: the mask token is never a candidate (its logit counts as
// -inf), so every step unmasks for real.
XK_HD float dllm_logit(float a, int64_t x, int64_t mask_id) { return x == mask_id ? kNegInf : a; }

// The stream of a sequence's step `step` of a call (spiffy_accept takes several; dllm_step is step
// 0), position p at slot p. The scalar form keys step d by offset + d (then sequence, position);
// the per-request form gives step d the slots offset + d * l + p, so a call reading steps 0..d
// draws what d + 1 dllm_step calls draw with the offset advanced by l each.
XK_HD RowStream dllm_step_stream(RowStream s, int64_t step, int64_t l) {
  s.offset += static_cast<uint64_t>(s.per_request ? step * l : step);
  return s;
}

// softmax(raw)[pick] from the raw row's statistics: NaN when the row has no softmax.
XK_HD float dllm_confidence(const RowStats& raw, float raw_pick) {
  return stats_degenerate(raw) ? __builtin_nanf("") : exp_f32(raw_pick - raw.top.val) / raw.sum;
}

// Whether masked position p (confidence c) ranks before q (confidence d): higher confidence first,
// a NaN last, ties to the lower position.
XK_HD bool dllm_before(float c, int64_t p, float d, int64_t q) {
  const bool c_nan = is_nan_f32(c), d_nan = is_nan_f32(d);
  if (c_nan != d_nan) return d_nan;
  if (!c_nan && c != d) return c > d;
  return p < q;
}

// One sequence: picks the positions to unmask (the num_unmask best, or with a threshold every one
// above it and at least the best), writes new_block at them and lists them ascending in positions
// and tokens (the rest of both stays -1, as the caller filled it). chosen: scratch of l bytes.
XK_HD void dllm_select(const float* conf, const int64_t* block, const int64_t* x0, int64_t l, int64_t mask_id,
                       int64_t num_unmask, bool use_threshold, float threshold, uint8_t* chosen, int64_t* new_block,
                       int64_t* positions, int64_t* tokens) {
  int64_t masked = 0, best = -1;
  for (int64_t p = 0; p < l; ++p) {
    chosen[p] = 0;
    if (block[p] != mask_id) continue;
    ++masked;
    if (best < 0 || dllm_before(conf[p], p, conf[best], best)) best = p;
  }
  if (masked == 0) return;
  if (use_threshold) {
    for (int64_t p = 0; p < l; ++p) chosen[p] = block[p] == mask_id && conf[p] > threshold;
    chosen[best] = 1;
  } else {
    const int64_t take = num_unmask < masked ? num_unmask : masked;
    for (int64_t t = 0; t < take; ++t) {  // the best not yet chosen, take times
      int64_t pick = -1;
      for (int64_t p = 0; p < l; ++p)
        if (block[p] == mask_id && !chosen[p] && (pick < 0 || dllm_before(conf[p], p, conf[pick], pick))) pick = p;
      chosen[pick] = 1;
    }
  }
  int64_t j = 0;
  for (int64_t p = 0; p < l; ++p) {
    if (!chosen[p]) continue;
    new_block[p] = x0[p];
    positions[j] = p;
    tokens[j++] = x0[p];
  }
}

}  // namespace xkernels
