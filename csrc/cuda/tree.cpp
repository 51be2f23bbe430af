// The draft-tree ops on CUDA: checks, allocation and the launches on the current stream (tree_verify's
// with `errors`: first param_errors_kernel's).
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>

#include "../ops/checks.h"
#include "../ops/sampling_args.h"
#include "binding.h"
#include "param_errors_binding.h"
#include "tree_launch.h"

namespace xkernels {
namespace {

// The trees and, with mask_packed, their masks, written by the same launch.
DraftTreeOutputs build_trees_cuda(const at::Tensor& topk_logprobs, const at::Tensor& topk_tokens, int64_t budget,
                                  std::optional<bool> mask_packed) {
  const auto s = check_build_draft_tree(topk_logprobs, topk_tokens, budget);
  if (value_checks_enabled()) check_token_ids(topk_tokens, kMaxVocab, "topk_tokens");  // else copied as they are
  const c10::cuda::CUDAGuard guard(topk_logprobs.device());
  const auto lp = topk_logprobs.contiguous(), tok = topk_tokens.contiguous();
  auto out = draft_tree_outputs(tok, s, mask_packed);
  cuda::TreeBuildParams p{lp.const_data_ptr<float>(), tok.const_data_ptr<int64_t>(), s.n, s.d, s.k, budget,
                          out.tokens.mutable_data_ptr<int64_t>(), out.parents.mutable_data_ptr<int64_t>(),
                          out.depth.mutable_data_ptr<int64_t>(), out.num_nodes.mutable_data_ptr<int64_t>()};
  if (mask_packed) p.mask = static_cast<uint8_t*>(out.mask.mutable_data_ptr()), p.packed = *mask_packed;
  auto scratch = cuda::workspace(cuda::tree_build_workspace_bytes(p), lp);
  cuda::check_launch(cuda::launch_build_draft_tree(p, scratch.mutable_data_ptr(), cuda::stream()),
                     mask_packed ? "build_draft_tree_with_mask" : "build_draft_tree");
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> build_draft_tree_cuda(const at::Tensor& topk_logprobs,
                                                                                 const at::Tensor& topk_tokens,
                                                                                 int64_t budget) {
  return build_trees_cuda(topk_logprobs, topk_tokens, budget, std::nullopt).tree();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> build_draft_tree_with_mask_cuda(
    const at::Tensor& topk_logprobs, const at::Tensor& topk_tokens, int64_t budget, bool packed) {
  return build_trees_cuda(topk_logprobs, topk_tokens, budget, packed).tree_and_mask();
}

// The mask (packed or bool) or, with want_depth, the positions.
at::Tensor tree_walk_cuda(const at::Tensor& parents, const std::optional<at::Tensor>& num_nodes, bool packed,
                          bool want_depth) {
  const auto s = check_tree(parents, num_nodes, "parents");
  if (value_checks_enabled()) check_tree_values(parents, num_nodes, "parents");
  const c10::cuda::CUDAGuard guard(parents.device());
  const auto par = parents.contiguous();
  const auto nn = num_nodes.has_value() ? num_nodes->contiguous() : at::Tensor();
  cuda::TreeMaskParams p{par.const_data_ptr<int64_t>(), nn.defined() ? nn.const_data_ptr<int64_t>() : nullptr,
                         s.n, s.m, packed, nullptr, nullptr};
  at::Tensor out;
  if (want_depth) {
    out = at::empty({s.n, s.m}, par.options());
    p.depth = out.mutable_data_ptr<int64_t>();
  } else {
    out = at::empty({s.n, s.m, packed ? (s.m + 7) / 8 : s.m}, par.options().dtype(packed ? at::kByte : at::kBool));
    p.mask = static_cast<uint8_t*>(out.mutable_data_ptr());
  }
  cuda::check_launch(cuda::launch_tree_mask(p, cuda::stream()), want_depth ? "tree_positions" : "tree_attention_mask");
  return out;
}

at::Tensor tree_attention_mask_cuda(const at::Tensor& parents, const std::optional<at::Tensor>& num_nodes,
                                    bool packed) {
  return tree_walk_cuda(parents, num_nodes, packed, false);
}

at::Tensor tree_positions_cuda(const at::Tensor& parents, const std::optional<at::Tensor>& num_nodes) {
  return tree_walk_cuda(parents, num_nodes, false, true);
}

// XKERNELS_TREE_CLUSTERS=0 walks a block a sequence where the walk would run a cluster of blocks
// (1, unset or empty: clusters where the device runs them), read at each call so that one process
// can test or time both; any other value raises, naming the variable.
bool tree_clusters_from_env() {
  const char* v = std::getenv("XKERNELS_TREE_CLUSTERS");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "1") == 0) return true;
  TORCH_CHECK(std::strcmp(v, "0") == 0, "XKERNELS_TREE_CLUSTERS must be 0 or 1, got '", v, "'");
  return false;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_verify_cuda(
    const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& target_logits,
    const std::optional<at::Tensor>& draft_probs, bool without_replacement,
    const std::optional<at::Tensor>& num_nodes, XK_SAMPLING_ARGS, const std::optional<at::Tensor>& errors,
    std::string_view filter_order) {
  check_devices(target_logits, "target_logits", {{errors, "errors"}});  // first, as the op's own tensors
  const int64_t v = check_tree_verify(tokens, parents, target_logits, draft_probs, num_nodes);
  const int64_t n = parents.size(0), m = parents.size(1);
  check_errors(errors, n);
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const SamplingArgs sampling =
      sampling_args(n, target_logits.device(), XK_SAMPLING_FORWARD, filter_order, !errors.has_value());
  if (value_checks_enabled()) {
    check_tree_values(parents, num_nodes, "parents");
    check_tree_tokens(tokens, num_nodes, v);
  }
  cuda::flag_param_errors(sampling, errors, "tree_verify");
  const auto tok = tokens.contiguous(), par = parents.contiguous(), logits = target_logits.contiguous();
  const auto nn = num_nodes.has_value() ? num_nodes->contiguous() : at::Tensor();
  const auto q = draft_probs.has_value() ? draft_probs->contiguous() : at::Tensor();  // read in its dtype
  auto accept_len = at::empty({n}, tok.options()), path = at::empty({n, m}, tok.options());
  auto out = at::empty({n, m}, tok.options());
  cuda::TreeVerifyParams p{};
  p.tokens = tok.const_data_ptr<int64_t>(), p.parents = par.const_data_ptr<int64_t>();
  p.num_nodes = nn.defined() ? nn.const_data_ptr<int64_t>() : nullptr;
  p.logits = logits.const_data_ptr();
  p.dtype = cuda::logits_type(logits);
  p.q = q.defined() ? q.const_data_ptr() : nullptr;
  p.q_dtype = q.defined() ? cuda::logits_type(q) : cuda::LogitsType::kFloat32;  // checked dtype
  p.without_replacement = without_replacement;
  p.n = n, p.m = m, p.v = v;
  p.s = sampling_view(sampling);
  p.may_sample = sampling.may_sample();
  p.filtered = p.may_sample && sampling.any_filter(v);
  p.accept_len = accept_len.mutable_data_ptr<int64_t>(), p.path = path.mutable_data_ptr<int64_t>();
  p.out_tokens = out.mutable_data_ptr<int64_t>();
  p.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  p.max_smem = static_cast<int>(at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin);
  p.clusters = at::cuda::getCurrentDeviceProperties()->major >= 9 && tree_clusters_from_env();
  auto scratch = cuda::workspace(cuda::tree_verify_workspace_bytes(p), logits);
  cuda::check_launch(cuda::launch_tree_verify(p, scratch.mutable_data_ptr(), cuda::stream()), "tree_verify");
  return {accept_len, path, out};
}

void compact_kv_cuda(const at::Tensor& cache, const at::Tensor& path, const at::Tensor& accept_len,
                     int64_t prefix_len) {
  check_compact_kv(cache, path, accept_len, prefix_len);
  const c10::cuda::CUDAGuard guard(cache.device());
  const auto p_path = path.contiguous(), p_acc = accept_len.contiguous();
  cuda::CompactKvParams p{static_cast<char*>(cache.mutable_data_ptr()), cache.stride(0), cache.stride(1),
                          cache.stride(2), cache.size(0), cache.size(1), cache.size(2), cache.size(3),
                          static_cast<int64_t>(cache.element_size()), p_path.const_data_ptr<int64_t>(),
                          p_acc.const_data_ptr<int64_t>(), path.size(1), prefix_len};
  cuda::check_launch(cuda::launch_compact_kv(p, cuda::stream()), "compact_kv_");
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CUDA, m) {
  m.impl("build_draft_tree", &build_draft_tree_cuda);
  m.impl("build_draft_tree_with_mask", &build_draft_tree_with_mask_cuda);
  m.impl("tree_attention_mask", &tree_attention_mask_cuda);
  m.impl("tree_positions", &tree_positions_cuda);
  m.impl("tree_verify", &tree_verify_cuda);
  m.impl("compact_kv_", &compact_kv_cuda);
}

}  // namespace xkernels
