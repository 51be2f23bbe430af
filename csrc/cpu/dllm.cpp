// dllm_step on the CPU: the masked positions' rows in parallel (each: a Gumbel-max pick over the
// tempered, filtered logits and the softmax statistics of the raw ones), then each sequence's
// selection.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../ops/checks.h"
#include "../ops/sampling_args.h"
#include "dispatch.h"
#include "dllm_row.h"
#include "xkernels/dllm.h"
#include "xkernels/param_errors.h"

namespace xkernels {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dllm_step_cpu(
    const at::Tensor& logits, const at::Tensor& block_tokens, int64_t mask_id, int64_t num_unmask,
    std::optional<double> threshold, XK_SAMPLING_ARGS, const std::optional<at::Tensor>& errors,
    std::string_view filter_order) {
  check_devices(logits, "logits", {{errors, "errors"}});  // first, as the op's own tensors
  const auto s = check_dllm_step(logits, block_tokens, num_unmask, threshold);
  check_block_tokens(block_tokens, mask_id, s.v);
  check_errors(errors, s.n);
  // With errors the per-row values are flagged, not raised, as on CUDA.
  const SamplingArgs sampling =
      sampling_args(s.n, logits.device(), XK_SAMPLING_FORWARD, filter_order, !errors.has_value());
  const SamplingView view = sampling_view(sampling);
  if (errors) or_param_errors(view, s.n, errors->mutable_data_ptr<int32_t>());
  const auto l = logits.contiguous();
  auto [block, new_block, positions, tokens, confidence] = dllm_outputs(logits, block_tokens, s);
  std::vector<int64_t> x0(static_cast<size_t>(s.n * s.l), -1);
  const int64_t* b = block.const_data_ptr<int64_t>();
  float* conf = confidence.mutable_data_ptr<float>();
  cpu::dispatch_logits(l.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* lp = l.const_data_ptr<T>();
    at::parallel_for(0, s.n * s.l, 1, [&](int64_t begin, int64_t end) {
      cpu::DllmScratch scratch(s.v);
      for (int64_t row = begin; row < end; ++row) {
        if (b[row] != mask_id) {
          conf[row] = kNegInf;
          continue;
        }
        const int64_t n = row / s.l;
        const auto r = cpu::dllm_row(lp + row * s.v, s.v, mask_id, view.row(n), view.stream(n),
                                     static_cast<uint32_t>(row % s.l), scratch);
        x0[row] = r.x0;
        conf[row] = r.confidence;
      }
    });
  });
  const double thr = threshold.value_or(0.0);
  at::parallel_for(0, s.n, 16, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> chosen(static_cast<size_t>(s.l));
    for (int64_t n = begin; n < end; ++n)
      dllm_select(conf + n * s.l, b + n * s.l, x0.data() + n * s.l, s.l, mask_id, num_unmask,
                  threshold.has_value(), static_cast<float>(thr), chosen.data(),
                  new_block.mutable_data_ptr<int64_t>() + n * s.l, positions.mutable_data_ptr<int64_t>() + n * s.l,
                  tokens.mutable_data_ptr<int64_t>() + n * s.l);
  });
  return {new_block, positions, tokens, confidence};
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CPU, m) { m.impl("dllm_step", &dllm_step_cpu); }

}  // namespace xkernels
