// The draft-tree ops: the C++ API (through the dispatcher) and the argument checks both kernels run.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/any.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/ne.h>
#include <c10/util/Exception.h>

#include <limits>
#include <utility>

#include "checks.h"
#include "sampling_args.h"
#include "xkernels/ops.h"

namespace xkernels {
namespace {

template <typename Sig>
auto typed_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

using T = at::Tensor;
using Opt = std::optional<at::Tensor>;

void check_int64(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kLong, name, " must be int64, got ", t.scalar_type());
}

}  // namespace

std::tuple<T, T, T, T> build_draft_tree(const T& topk_logprobs, const T& topk_tokens, int64_t budget) {
  static auto op = typed_op<std::tuple<T, T, T, T>(const T&, const T&, int64_t)>("xkernels::build_draft_tree");
  return op.call(topk_logprobs, topk_tokens, budget);
}

std::tuple<T, T, T, T, T> build_draft_tree_with_mask(const T& topk_logprobs, const T& topk_tokens, int64_t budget,
                                                     bool packed) {
  static auto op = typed_op<std::tuple<T, T, T, T, T>(const T&, const T&, int64_t, bool)>(
      "xkernels::build_draft_tree_with_mask");
  return op.call(topk_logprobs, topk_tokens, budget, packed);
}

T tree_attention_mask(const T& parents, const Opt& num_nodes, bool packed) {
  static auto op = typed_op<T(const T&, const Opt&, bool)>("xkernels::tree_attention_mask");
  return op.call(parents, num_nodes, packed);
}

T tree_positions(const T& parents, const Opt& num_nodes) {
  static auto op = typed_op<T(const T&, const Opt&)>("xkernels::tree_positions");
  return op.call(parents, num_nodes);
}

std::tuple<T, T, T> tree_verify(const T& tokens, const T& parents, const T& target_logits, const Opt& draft_probs,
                                bool without_replacement, const Opt& num_nodes, const Sampling& sampling,
                                const Opt& errors) {
  static auto op = typed_op<std::tuple<T, T, T>(const T&, const T&, const T&, const Opt&, bool, const Opt&,
                                                XK_SAMPLING_TYPES, const Opt&, std::string_view)>("xkernels::tree_verify");
  return op.call(tokens, parents, target_logits, draft_probs, without_replacement, num_nodes,
                 XK_SAMPLING_OF(sampling), errors, sampling.filter_order);
}

void compact_kv_(const T& cache, const T& path, const T& accept_len, int64_t prefix_len) {
  static auto op = typed_op<void(const T&, const T&, const T&, int64_t)>("xkernels::compact_kv_");
  op.call(cache, path, accept_len, prefix_len);
}

DraftTreeShape check_build_draft_tree(const T& topk_logprobs, const T& topk_tokens, int64_t budget) {
  check_devices(topk_logprobs, "topk_logprobs", {{topk_tokens, "topk_tokens"}});
  TORCH_CHECK(topk_logprobs.dim() == 3, "topk_logprobs must have shape [N, D, k], got ", topk_logprobs.sizes());
  TORCH_CHECK(topk_logprobs.scalar_type() == at::kFloat, "topk_logprobs must be float32, got ",
              topk_logprobs.scalar_type());
  check_int64(topk_tokens, "topk_tokens");
  TORCH_CHECK(topk_tokens.sizes() == topk_logprobs.sizes(), "topk_tokens must have the shape of topk_logprobs ",
              topk_logprobs.sizes(), ", got ", topk_tokens.sizes());
  TORCH_CHECK(budget >= 0 && budget < std::numeric_limits<int32_t>::max(), "budget must be in [0, 2^31 - 1), got ",
              budget);
  TORCH_CHECK(topk_logprobs.size(1) < std::numeric_limits<int32_t>::max() &&
                  topk_logprobs.size(2) < std::numeric_limits<int32_t>::max(),
              "topk_logprobs: D and k must be below 2^31");
  return DraftTreeShape{topk_logprobs.size(0), topk_logprobs.size(1), topk_logprobs.size(2), budget};
}

DraftTreeOutputs draft_tree_outputs(const T& topk_tokens, const DraftTreeShape& s, std::optional<bool> mask_packed) {
  const auto sized_by = c10::str(mask_packed ? "build_draft_tree_with_mask" : "build_draft_tree",
                                 ": budget = ", s.budget, " (N = ", s.n, ")");
  const auto opts = topk_tokens.options();
  const int64_t m = s.budget + 1;
  DraftTreeOutputs out{empty_output({s.n, m}, opts, sized_by), empty_output({s.n, m}, opts, sized_by),
                       empty_output({s.n}, opts, sized_by), empty_output({s.n, m}, opts, sized_by), T()};
  if (mask_packed)
    out.mask = empty_output({s.n, m, *mask_packed ? (m + 7) / 8 : m}, opts.dtype(*mask_packed ? at::kByte : at::kBool),
                            sized_by);
  return out;
}

TreeShape check_tree(const T& parents, const Opt& num_nodes, const char* parents_name) {
  check_devices(parents, parents_name, {{num_nodes, "num_nodes"}});
  TORCH_CHECK(parents.dim() == 2, parents_name, " must have shape [N, M], got ", parents.sizes());
  check_int64(parents, parents_name);
  TORCH_CHECK(parents.size(1) >= 1, parents_name, " must hold the root (M >= 1), got ", parents.sizes());
  TORCH_CHECK(parents.size(1) < std::numeric_limits<int32_t>::max(), parents_name, ": M must be below 2^31");
  if (num_nodes.has_value()) {
    check_int64(*num_nodes, "num_nodes");
    TORCH_CHECK(num_nodes->dim() == 1 && num_nodes->size(0) == parents.size(0), "num_nodes must have shape [N] = [",
                parents.size(0), "], got ", num_nodes->sizes());
  }
  return TreeShape{parents.size(0), parents.size(1)};
}

void check_tree_values(const T& parents, const Opt& num_nodes, const char* parents_name) {
  const int64_t n = parents.size(0), m = parents.size(1);
  if (n == 0) return;
  if (num_nodes.has_value()) {
    TORCH_CHECK(!at::logical_or(at::lt(*num_nodes, 1), at::gt(*num_nodes, m)).any().item<bool>(),
                "num_nodes must lie in [1, M] = [1, ", m, "]");
  }
  // Real node i needs 0 <= parents[i] < i; the root -1.
  const auto index = at::arange(m, parents.options());
  const auto real = num_nodes.has_value() ? at::lt(index.unsqueeze(0), num_nodes->unsqueeze(1))
                                          : at::ge(index.unsqueeze(0), 0).expand({n, m});
  const auto bad_child = at::logical_or(at::lt(parents, 0), at::ge(parents, index.unsqueeze(0)));
  const auto bad = at::logical_and(real.narrow(1, 1, m - 1), bad_child.narrow(1, 1, m - 1));
  TORCH_CHECK(!bad.any().item<bool>(), parents_name,
              " is not a valid tree: a real node i > 0 needs 0 <= parent < i (nodes in topological order)");
  TORCH_CHECK(!parents.select(1, 0).ne(-1).any().item<bool>(), parents_name, "[:, 0] (the root) must be -1");
}

void check_tree_tokens(const T& tokens, const Opt& num_nodes, int64_t vocab) {
  const int64_t n = tokens.size(0), m = tokens.size(1);
  if (n == 0 || m < 2) return;
  const auto index = at::arange(1, m, tokens.options());
  const auto body = tokens.narrow(1, 1, m - 1);
  auto bad = at::logical_or(at::lt(body, 0), at::ge(body, vocab));
  if (num_nodes.has_value()) bad = at::logical_and(bad, at::lt(index.unsqueeze(0), num_nodes->unsqueeze(1)));
  TORCH_CHECK(!bad.any().item<bool>(), "tokens holds ids outside [0, ", vocab, ") at real nodes");
}

int64_t check_tree_verify(const T& tokens, const T& parents, const T& target_logits, const Opt& draft_probs,
                          const Opt& num_nodes) {
  check_devices(target_logits, "target_logits",
                {{tokens, "tokens"}, {parents, "parents"}, {draft_probs, "draft_probs"}, {num_nodes, "num_nodes"}});
  const auto shape = check_tree(parents, num_nodes, "parents");
  check_int64(tokens, "tokens");
  TORCH_CHECK(tokens.sizes() == parents.sizes(), "tokens must have the shape of parents ", parents.sizes(), ", got ",
              tokens.sizes());
  TORCH_CHECK(target_logits.dim() == 3 && target_logits.size(0) == shape.n && target_logits.size(1) == shape.m,
              "target_logits must have shape [N, M, V] = [", shape.n, ", ", shape.m, ", V], got ",
              target_logits.sizes());
  const auto dt = target_logits.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
              "target_logits must be float32, bfloat16 or float16, got ", dt);
  const int64_t v = target_logits.size(2);
  TORCH_CHECK(v > 0 && v < std::numeric_limits<int32_t>::max(), "target_logits vocabulary V must be in [1, 2^31)");
  if (draft_probs.has_value()) {
    const auto& q = *draft_probs;
    check_probs_dtype(q, "draft_probs");
    TORCH_CHECK(q.sizes() == target_logits.sizes(), "draft_probs must have shape [N, M, V] = ", target_logits.sizes(),
                ", got ", q.sizes());
  }
  return v;
}

void check_compact_kv(const T& cache, const T& path, const T& accept_len, int64_t prefix_len) {
  check_devices(cache, "cache", {{path, "path"}, {accept_len, "accept_len"}});
  TORCH_CHECK(cache.dim() == 4, "cache must have shape [N, H, L, d], got ", cache.sizes());
  check_int64(path, "path");
  check_int64(accept_len, "accept_len");
  TORCH_CHECK(path.dim() == 2 && path.size(0) == cache.size(0), "path must have shape [N, M] with N = ",
              cache.size(0), ", got ", path.sizes());
  TORCH_CHECK(accept_len.dim() == 1 && accept_len.size(0) == cache.size(0), "accept_len must have shape [N] = [",
              cache.size(0), "], got ", accept_len.sizes());
  TORCH_CHECK(prefix_len >= 0 && prefix_len < cache.size(2), "prefix_len must lie in [0, L) = [0, ", cache.size(2),
              "), got ", prefix_len);
  TORCH_CHECK(cache.stride(3) == 1, "cache must be contiguous in its last dimension");
  TORCH_CHECK(at::has_internal_overlap(cache) != at::MemOverlap::Yes,
              "cache must not be written in place where its elements share memory (an expanded, stride-0 "
              "tensor, strides ", cache.strides(), "): clone() it first");
}

}  // namespace xkernels
