// The Spiffy ops: the C++ API (through the dispatcher) and the argument checks both kernels run.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <limits>
#include <utility>
#include <vector>

#include "checks.h"
#include "spiffy_args.h"
#include "xkernels/ops.h"
#include "xkernels/spiffy.h"

namespace xkernels {

std::tuple<at::Tensor, at::Tensor, at::Tensor> spiffy_materialize(
    const at::Tensor& logits, const at::Tensor& block_tokens, int64_t mask_id, const at::Tensor& graph_ranks,
    const at::Tensor& graph_child_ptr, const at::Tensor& graph_children, int64_t keep, const Sampling& s,
    const std::optional<at::Tensor>& errors) {
  using T = at::Tensor;
  using Opt = std::optional<at::Tensor>;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("xkernels::spiffy_materialize", "")
                       .typed<std::tuple<T, T, T>(const T&, const T&, int64_t, const T&, const T&, const T&, int64_t,
                                                  double, const Opt&, int64_t, const Opt&, double, const Opt&,
                                                  double, const Opt&, const Opt&, std::string_view)>();
  return op.call(logits, block_tokens, mask_id, graph_ranks, graph_child_ptr, graph_children, keep, s.temperature,
                 s.temperature_tensor, s.top_k, s.top_k_tensor, s.top_p, s.top_p_tensor, s.min_p, s.min_p_tensor,
                 errors, s.filter_order);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> spiffy_accept(
    const at::Tensor& root_logits, const at::Tensor& draft_logits, const at::Tensor& draft_blocks,
    const at::Tensor& node_ids, const at::Tensor& block_tokens, int64_t mask_id, int64_t num_unmask,
    std::optional<double> threshold, const Sampling& sampling, const std::optional<at::Tensor>& errors) {
  using T = at::Tensor;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("xkernels::spiffy_accept", "")
                       .typed<std::tuple<T, T, T, T, T>(const T&, const T&, const T&, const T&, const T&, int64_t,
                                                        int64_t, std::optional<double>, XK_SAMPLING_TYPES,
                                                        const std::optional<T>&, std::string_view)>();
  return op.call(root_logits, draft_logits, draft_blocks, node_ids, block_tokens, mask_id, num_unmask, threshold,
                 XK_SAMPLING_OF(sampling), errors, sampling.filter_order);
}

SamplingArgs spiffy_filter_args(int64_t n, const at::Device& device, XK_SPIFFY_FILTER_ARGS, std::string_view filter_order,
                                bool check_rows) {
  return sampling_args(n, device, temperature, temperature_tensor, top_k, top_k_tensor, top_p, top_p_tensor, min_p,
                       min_p_tensor, 0, std::nullopt, 0, std::nullopt, filter_order, check_rows);
}

at::Tensor spiffy_attention_mask(const at::Tensor& prefix_lens, int64_t num_drafts, int64_t block_size,
                                 int64_t max_prefix_len, bool packed) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("xkernels::spiffy_attention_mask", "")
                       .typed<at::Tensor(const at::Tensor&, int64_t, int64_t, int64_t, bool)>();
  return op.call(prefix_lens, num_drafts, block_size, max_prefix_len, packed);
}

namespace {

void check_int32(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.scalar_type() == at::kInt, name, " must be int32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions, got shape ", t.sizes());
}

// The graph's values: ranks (root without operations; a node's operations first, then -1 rows;
// 0 <= i < L, 0 <= j < min(V, kSpiffyMaxRank), no rank i twice), edges (child_ptr non-decreasing
// from 0 to E; every child after its parent and below G, which also rules out cycles).
void check_graph_values(const at::Tensor& ranks_t, const at::Tensor& ptr_t, const at::Tensor& children_t,
                        const SpiffyShape& s) {
  const auto ranks = ranks_t.cpu().contiguous(), ptr = ptr_t.cpu().contiguous(), ch = children_t.cpu().contiguous();
  const int32_t* r = ranks.const_data_ptr<int32_t>();
  const int64_t max_j = std::min<int64_t>(s.v, kSpiffyMaxRank);
  for (int64_t g = 0; g < s.g; ++g) {
    std::vector<bool> seen(static_cast<size_t>(s.l), false);
    bool ended = false;
    for (int64_t o = 0; o < s.k; ++o) {
      const int32_t i = r[(g * s.k + o) * 2], j = r[(g * s.k + o) * 2 + 1];
      if (i < 0 && j < 0) {
        ended = true;
        continue;
      }
      TORCH_CHECK(g > 0, "graph_ranks: the root (node 0) must have no operations");
      TORCH_CHECK(!ended, "graph_ranks: node ", g, " has an operation after a -1 row");
      TORCH_CHECK(i >= 0 && i < s.l, "graph_ranks: node ", g, " has position rank ", i,
                  " outside the block (size ", s.l, ")");
      TORCH_CHECK(j >= 0 && j < max_j, "graph_ranks: node ", g, " has vocabulary rank ", j, " outside [0, ", max_j,
                  ") (the vocabulary, at most ", kSpiffyMaxRank, " ranks)");
      TORCH_CHECK(!seen[static_cast<size_t>(i)], "graph_ranks: node ", g, " unmasks position rank ", i, " twice");
      seen[static_cast<size_t>(i)] = true;
    }
  }
  const int32_t* p = ptr.const_data_ptr<int32_t>();
  const int32_t* c = ch.const_data_ptr<int32_t>();
  TORCH_CHECK(p[0] == 0 && p[s.g] == s.e, "graph_child_ptr must run from 0 to the number of edges ", s.e);
  for (int64_t g = 0; g < s.g; ++g) {
    TORCH_CHECK(p[g] <= p[g + 1], "graph_child_ptr must be non-decreasing (node ", g, ")");
    for (int32_t e = p[g]; e < p[g + 1]; ++e)
      TORCH_CHECK(c[e] > g && c[e] < s.g, "graph_children: node ", g, " has child ", c[e],
                  "; children must come after their parents and below G = ", s.g,
                  " (topological order, so no cycles)");
  }
}

}  // namespace

SpiffyShape check_spiffy_materialize(const at::Tensor& logits, const at::Tensor& block_tokens, int64_t mask_id,
                                     const at::Tensor& graph_ranks, const at::Tensor& graph_child_ptr,
                                     const at::Tensor& graph_children, int64_t keep, bool check_values) {
  check_devices(logits, "logits", {{block_tokens, "block_tokens"}, {graph_ranks, "graph_ranks"},
                                   {graph_child_ptr, "graph_child_ptr"}, {graph_children, "graph_children"}});
  const DllmShape d = check_dllm_step(logits, block_tokens, 1, std::nullopt);
  check_int32(graph_ranks, "graph_ranks", 3);
  TORCH_CHECK(graph_ranks.size(0) >= 1 && graph_ranks.size(2) == 2,
              "graph_ranks must have shape [G, K, 2] with G >= 1, got ", graph_ranks.sizes());
  const int64_t g = graph_ranks.size(0);
  check_int32(graph_child_ptr, "graph_child_ptr", 1);
  TORCH_CHECK(graph_child_ptr.size(0) == g + 1, "graph_child_ptr must have G + 1 = ", g + 1, " entries, got ",
              graph_child_ptr.size(0));
  check_int32(graph_children, "graph_children", 1);
  TORCH_CHECK(g < std::numeric_limits<int32_t>::max() && graph_children.size(0) < std::numeric_limits<int32_t>::max(),
              "graph: too many nodes or edges");
  TORCH_CHECK(keep >= 0 && keep <= g - 1, "keep must be in [0, ", g - 1, "] (the graph's nodes besides the root), got ",
              keep);
  const SpiffyShape s{d.n, d.l, d.v, g, graph_ranks.size(1), graph_children.size(0)};
  if (check_values) {
    check_graph_values(graph_ranks, graph_child_ptr, graph_children, s);
    check_block_tokens(block_tokens, mask_id, d.v);
  }
  return s;
}

SpiffyAcceptShape check_spiffy_accept(const at::Tensor& root_logits, const at::Tensor& draft_logits,
                                      const at::Tensor& draft_blocks, const at::Tensor& node_ids,
                                      const at::Tensor& block_tokens, int64_t num_unmask,
                                      std::optional<double> threshold) {
  check_devices(root_logits, "root_logits", {{draft_logits, "draft_logits"}, {draft_blocks, "draft_blocks"},
                                             {node_ids, "node_ids"}, {block_tokens, "block_tokens"}});
  const DllmShape d = check_dllm_step(root_logits, block_tokens, num_unmask, threshold, "root_logits");
  TORCH_CHECK(draft_blocks.scalar_type() == at::kLong && draft_blocks.dim() == 3 && draft_blocks.size(0) == d.n &&
                  draft_blocks.size(2) == d.l,
              "draft_blocks must be int64 [N, K, L] with N = ", d.n, ", L = ", d.l, ", got ", draft_blocks.scalar_type(),
              " ", draft_blocks.sizes());
  const int64_t k = draft_blocks.size(1);
  TORCH_CHECK(draft_logits.scalar_type() == root_logits.scalar_type(), "draft_logits must have root_logits' dtype ",
              root_logits.scalar_type(), ", got ", draft_logits.scalar_type());
  TORCH_CHECK(draft_logits.dim() == 4 && draft_logits.size(0) == d.n && draft_logits.size(1) == k &&
                  draft_logits.size(2) == d.l && draft_logits.size(3) == d.v,
              "draft_logits must have shape [N, K, L, V] = [", d.n, ", ", k, ", ", d.l, ", ", d.v, "], got ",
              draft_logits.sizes());
  TORCH_CHECK(node_ids.scalar_type() == at::kLong && node_ids.dim() == 2 && node_ids.size(0) == d.n &&
                  node_ids.size(1) == k,
              "node_ids must be int64 [N, K] = [", d.n, ", ", k, "], got ", node_ids.scalar_type(), " ",
              node_ids.sizes());
  return SpiffyAcceptShape{d.n, d.l, d.v, k};
}

SpiffyMaterializeOutputs spiffy_materialize_outputs(const at::Tensor& logits, const at::Tensor& block_tokens,
                                                    int64_t keep) {
  const int64_t n = block_tokens.size(0), l = block_tokens.size(1);
  const auto opts = block_tokens.options();
  return {at::empty({n, keep, l}, opts), at::full({n, keep}, -1, opts),
          at::zeros({n, keep}, logits.options().dtype(at::kFloat))};
}

SpiffyAcceptOutputs spiffy_accept_outputs(const at::Tensor& block_tokens) {
  const int64_t n = block_tokens.size(0), l = block_tokens.size(1);
  const auto opts = block_tokens.options();
  return {at::zeros({n}, opts), at::full({n, l}, -1, opts), at::full({n, l}, -1, opts),
          block_tokens.contiguous().clone(), at::full({n}, -1, opts)};
}

void check_spiffy_attention_mask(const at::Tensor& prefix_lens, int64_t num_drafts, int64_t block_size,
                                 int64_t max_prefix_len) {
  TORCH_CHECK(prefix_lens.scalar_type() == at::kLong && prefix_lens.dim() == 1,
              "prefix_lens must be int64 [N], got ", prefix_lens.scalar_type(), " ", prefix_lens.sizes());
  constexpr int64_t kLimit = int64_t{1} << 31;  // each bound keeps the products below in int64
  TORCH_CHECK(num_drafts >= 0 && num_drafts < kLimit, "num_drafts must lie in [0, 2^31), got ", num_drafts);
  TORCH_CHECK(block_size >= 1 && block_size < kLimit, "block_size must lie in [1, 2^31), got ", block_size);
  TORCH_CHECK(max_prefix_len >= 0 && max_prefix_len < kLimit, "max_prefix_len must lie in [0, 2^31), got ",
              max_prefix_len);
  const int64_t q = (1 + num_drafts) * block_size;
  TORCH_CHECK(q < kLimit, "(1 + num_drafts) * block_size = ", q, " queries (num_drafts = ", num_drafts,
              ", block_size = ", block_size, ") must be below 2^31");
  TORCH_CHECK(max_prefix_len + q < kLimit, "max_prefix_len + (1 + num_drafts) * block_size = ", max_prefix_len + q,
              " keys (max_prefix_len = ", max_prefix_len, ") must be below 2^31");
}

at::Tensor spiffy_mask_output(const at::Tensor& prefix_lens, int64_t num_drafts, int64_t block_size,
                              int64_t max_prefix_len, bool packed) {
  const int64_t q = (1 + num_drafts) * block_size, k = max_prefix_len + q;
  return empty_output({prefix_lens.size(0), q, packed ? (k + 7) / 8 : k},
                      prefix_lens.options().dtype(packed ? at::kByte : at::kBool),
                      c10::str("spiffy_attention_mask: num_drafts = ", num_drafts, ", block_size = ", block_size,
                               ", max_prefix_len = ", max_prefix_len));
}

}  // namespace xkernels
