// The Spiffy ops on CUDA: checks, allocation and the launches on the current stream (with `errors`,
// first param_errors_kernel's). The graph's values are not checked here (that would read the
// device); the kernels skip what is out of range.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops/checks.h"
#include "../ops/spiffy_args.h"
#include "binding.h"
#include "param_errors_binding.h"
#include "spiffy_launch.h"

namespace xkernels {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> spiffy_materialize_cuda(
    const at::Tensor& logits, const at::Tensor& block_tokens, int64_t mask_id, const at::Tensor& graph_ranks,
    const at::Tensor& graph_child_ptr, const at::Tensor& graph_children, int64_t keep, XK_SPIFFY_FILTER_ARGS,
    const std::optional<at::Tensor>& errors, std::string_view filter_order) {
  check_devices(logits, "logits", {{errors, "errors"}});  // first, as the op's own tensors
  const auto s = check_spiffy_materialize(logits, block_tokens, mask_id, graph_ranks, graph_child_ptr, graph_children,
                                          keep, value_checks_enabled());
  check_errors(errors, s.n);
  const SamplingArgs sampling =
      spiffy_filter_args(s.n, logits.device(), XK_SPIFFY_FILTER_FORWARD, filter_order, !errors.has_value());
  const c10::cuda::CUDAGuard guard(logits.device());
  cuda::flag_param_errors(sampling, errors, "spiffy_materialize");
  const auto l = logits.contiguous(), block = block_tokens.contiguous();
  const auto ranks = graph_ranks.contiguous(), ptr = graph_child_ptr.contiguous(), children = graph_children.contiguous();
  auto [drafts, node_ids, scores] = spiffy_materialize_outputs(l, block, keep);
  cuda::SpiffyMaterializeParams p{};
  p.logits = l.const_data_ptr();
  p.dtype = cuda::logits_type(l);
  p.block = block.const_data_ptr<int64_t>();
  p.graph = GraphView{ranks.const_data_ptr<int32_t>(), ptr.const_data_ptr<int32_t>(),
                      children.const_data_ptr<int32_t>(), s.g, s.k, s.e};
  p.n = s.n, p.l = s.l, p.v = s.v, p.mask_id = mask_id, p.keep = keep;
  p.s = sampling_view(sampling);
  p.filtered = sampling.may_sample() && sampling.any_filter(s.v);
  p.drafts = drafts.mutable_data_ptr<int64_t>();
  p.node_ids = node_ids.mutable_data_ptr<int64_t>();
  p.scores = scores.mutable_data_ptr<float>();
  p.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  auto ws = cuda::workspace(cuda::spiffy_materialize_workspace_bytes(p), l);
  cuda::check_launch(cuda::launch_spiffy_materialize(p, ws.mutable_data_ptr(), cuda::stream()), "spiffy_materialize");
  return {drafts, node_ids, scores};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> spiffy_accept_cuda(
    const at::Tensor& root_logits, const at::Tensor& draft_logits, const at::Tensor& draft_blocks,
    const at::Tensor& node_ids, const at::Tensor& block_tokens, int64_t mask_id, int64_t num_unmask,
    std::optional<double> threshold, XK_SAMPLING_ARGS, const std::optional<at::Tensor>& errors,
    std::string_view filter_order) {
  check_devices(root_logits, "root_logits", {{errors, "errors"}});  // first, as the op's own tensors
  const auto s = check_spiffy_accept(root_logits, draft_logits, draft_blocks, node_ids, block_tokens, num_unmask,
                                     threshold);
  if (value_checks_enabled()) check_block_tokens(block_tokens, mask_id, s.v);
  check_errors(errors, s.n);
  const SamplingArgs sampling =
      sampling_args(s.n, root_logits.device(), XK_SAMPLING_FORWARD, filter_order, !errors.has_value());
  const c10::cuda::CUDAGuard guard(root_logits.device());
  cuda::flag_param_errors(sampling, errors, "spiffy_accept");
  const auto root = root_logits.contiguous(), drafts = draft_logits.contiguous();
  const auto blocks = draft_blocks.contiguous(), ids = node_ids.contiguous();
  auto [num_steps, positions, tokens, new_block, continue_from] = spiffy_accept_outputs(block_tokens);
  cuda::SpiffyAcceptParams p{};
  p.root_logits = root.const_data_ptr();
  p.draft_logits = drafts.const_data_ptr();
  p.dtype = cuda::logits_type(root);
  p.drafts = blocks.const_data_ptr<int64_t>();
  p.node_ids = ids.const_data_ptr<int64_t>();
  p.n = s.n, p.l = s.l, p.v = s.v, p.k = s.k;
  p.rule = cuda::dllm_rule(mask_id, num_unmask, threshold, sampling, s.v);
  p.new_block = new_block.mutable_data_ptr<int64_t>();
  p.positions = positions.mutable_data_ptr<int64_t>();
  p.tokens = tokens.mutable_data_ptr<int64_t>();
  p.num_steps = num_steps.mutable_data_ptr<int64_t>();
  p.continue_from = continue_from.mutable_data_ptr<int64_t>();
  p.clusters = at::cuda::getCurrentDeviceProperties()->major >= 9;
  auto ws = cuda::workspace(cuda::spiffy_accept_workspace_bytes(p), root);
  cuda::check_launch(cuda::launch_spiffy_accept(p, ws.mutable_data_ptr(), cuda::stream()), "spiffy_accept");
  return {num_steps, positions, tokens, new_block, continue_from};
}

at::Tensor spiffy_attention_mask_cuda(const at::Tensor& prefix_lens, int64_t num_drafts, int64_t block_size,
                                      int64_t max_prefix_len, bool packed) {
  check_spiffy_attention_mask(prefix_lens, num_drafts, block_size, max_prefix_len);
  const c10::cuda::CUDAGuard guard(prefix_lens.device());
  const auto lens = prefix_lens.contiguous();
  const int64_t n = lens.size(0);
  auto mask = spiffy_mask_output(lens, num_drafts, block_size, max_prefix_len, packed);
  const cuda::SpiffyMaskParams p{lens.const_data_ptr<int64_t>(), n, num_drafts, block_size, max_prefix_len, packed,
                                 static_cast<uint8_t*>(mask.mutable_data_ptr())};
  cuda::check_launch(cuda::launch_spiffy_attention_mask(p, cuda::stream()), "spiffy_attention_mask");
  return mask;
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CUDA, m) {
  m.impl("spiffy_materialize", &spiffy_materialize_cuda);
  m.impl("spiffy_accept", &spiffy_accept_cuda);
  m.impl("spiffy_attention_mask", &spiffy_attention_mask_cuda);
}

}  // namespace xkernels
