// The draft-tree ops on the CPU: sequences in parallel (a grain of several sequences, so small
// batches stay on one thread); tree_verify reads only the rows of the nodes it visits.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../ops/checks.h"
#include "../ops/sampling_args.h"
#include "dispatch.h"
#include "draft_probs.h"
#include "row_reduce.h"
#include "top_filter.h"
#include "xkernels/param_errors.h"
#include "xkernels/tree.h"

namespace xkernels {
namespace {

// Sequences per parallel task: the per-sequence work of the mask and build ops is small.
constexpr int64_t kTreeGrain = 8;

// build_tree's heap entries: each is a distinct prefix of candidates, so at most the number of
// prefixes (sum of k^j, j = 1..d), and at most budget + 1 (a pop pushes two); so a budget far
// beyond what d * k candidates can fill costs no scratch.
int64_t tree_heap_capacity(int64_t d, int64_t k, int64_t budget) {
  int64_t prefixes = 0, level = 1;
  for (int64_t j = 0; j < d && prefixes <= budget; ++j) {
    level = std::min(level * k, budget + 1);
    prefixes += level;
  }
  return std::max<int64_t>(1, std::min(prefixes, budget + 1));
}

// Rows [M, row bytes] of one sequence's mask, every byte written: a real node's row (i < count;
// its parent valid) is its parent's row plus itself, a padding node's itself alone.
void write_mask_rows(uint8_t* rows, const int64_t* parents, int64_t m, int64_t count, bool packed) {
  const int64_t row_bytes = packed ? (m + 7) / 8 : m;
  for (int64_t i = 0; i < m; ++i) {
    uint8_t* row = rows + i * row_bytes;
    if (i > 0 && i < count)
      std::copy_n(rows + parents[i] * row_bytes, row_bytes, row);
    else
      std::fill_n(row, row_bytes, uint8_t{0});
    if (packed)
      row[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    else
      row[i] = 1;
  }
}

// The trees and, with mask_packed, each one's mask rows right after its search, while its parents
// are in cache.
DraftTreeOutputs build_trees(const at::Tensor& topk_logprobs, const at::Tensor& topk_tokens, int64_t budget,
                             std::optional<bool> mask_packed) {
  const auto s = check_build_draft_tree(topk_logprobs, topk_tokens, budget);
  check_token_ids(topk_tokens, kMaxVocab, "topk_tokens");
  const auto lp = topk_logprobs.contiguous();
  const auto tok = topk_tokens.contiguous();
  const int64_t m = budget + 1;
  auto out = draft_tree_outputs(topk_tokens, s, mask_packed);
  const float* lpp = lp.const_data_ptr<float>();
  const int64_t* tp = tok.const_data_ptr<int64_t>();
  int64_t* tokens = out.tokens.mutable_data_ptr<int64_t>();
  int64_t* parents = out.parents.mutable_data_ptr<int64_t>();
  int64_t* num_nodes = out.num_nodes.mutable_data_ptr<int64_t>();
  int64_t* depth = out.depth.mutable_data_ptr<int64_t>();
  auto* mask = mask_packed ? static_cast<uint8_t*>(out.mask.mutable_data_ptr()) : nullptr;  // bool is one byte
  const int64_t mask_bytes = mask ? out.mask.size(1) * out.mask.size(2) : 0;
  const auto capacity = static_cast<size_t>(tree_heap_capacity(s.d, s.k, budget));
  at::parallel_for(0, s.n, kTreeGrain, [&](int64_t begin, int64_t end) {
    std::vector<TreeCandidate> heap(capacity);
    for (int64_t n = begin; n < end; ++n) {
      num_nodes[n] = build_tree(lpp + n * s.d * s.k, tp + n * s.d * s.k, s.d, s.k, budget, heap.data(),
                                tokens + n * m, parents + n * m, depth + n * m);
      if (mask) write_mask_rows(mask + n * mask_bytes, parents + n * m, m, num_nodes[n], *mask_packed);
    }
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> build_draft_tree_cpu(const at::Tensor& topk_logprobs,
                                                                                const at::Tensor& topk_tokens,
                                                                                int64_t budget) {
  return build_trees(topk_logprobs, topk_tokens, budget, std::nullopt).tree();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> build_draft_tree_with_mask_cpu(
    const at::Tensor& topk_logprobs, const at::Tensor& topk_tokens, int64_t budget, bool packed) {
  return build_trees(topk_logprobs, topk_tokens, budget, packed).tree_and_mask();
}

// The node count of each sequence.
std::vector<int64_t> node_counts(const at::Tensor& num_nodes, int64_t n, int64_t m) {
  std::vector<int64_t> out(static_cast<size_t>(n), m);
  if (num_nodes.defined()) {
    const auto c = num_nodes.contiguous();
    std::copy_n(c.const_data_ptr<int64_t>(), n, out.begin());
  }
  return out;
}

at::Tensor tree_attention_mask_cpu(const at::Tensor& parents, const std::optional<at::Tensor>& num_nodes,
                                   bool packed) {
  const auto s = check_tree(parents, num_nodes, "parents");
  check_tree_values(parents, num_nodes, "parents");
  const auto par = parents.contiguous();
  const auto counts = node_counts(num_nodes.value_or(at::Tensor()), s.n, s.m);
  const int64_t row_bytes = packed ? (s.m + 7) / 8 : s.m;
  auto mask = at::empty({s.n, s.m, row_bytes}, parents.options().dtype(packed ? at::kByte : at::kBool));
  auto* out = static_cast<uint8_t*>(mask.mutable_data_ptr());  // bool is one byte
  const int64_t* pp = par.const_data_ptr<int64_t>();
  at::parallel_for(0, s.n, kTreeGrain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      write_mask_rows(out + n * s.m * row_bytes, pp + n * s.m, s.m, counts[n], packed);
  });
  return mask;
}

at::Tensor tree_positions_cpu(const at::Tensor& parents, const std::optional<at::Tensor>& num_nodes) {
  const auto s = check_tree(parents, num_nodes, "parents");
  check_tree_values(parents, num_nodes, "parents");
  const auto par = parents.contiguous();
  const auto counts = node_counts(num_nodes.value_or(at::Tensor()), s.n, s.m);
  auto depth = at::zeros({s.n, s.m}, parents.options());
  int64_t* d = depth.mutable_data_ptr<int64_t>();
  const int64_t* pp = par.const_data_ptr<int64_t>();
  at::parallel_for(0, s.n, kTreeGrain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      for (int64_t i = 1; i < counts[n]; ++i) d[n * s.m + i] = d[n * s.m + pp[n * s.m + i]] + 1;
  });
  return depth;
}

struct VerifyArgs {
  int64_t m, v;
  bool without_replacement;
};

// A thread's row buffers, reused across sequences: the scaled (and filtered) row, the residual,
// a node's draft row converted to float (q not float32), the filter's scratch.
struct VerifyScratch {
  VerifyScratch(int64_t v, const cpu::DraftProbs& q)
      : a(static_cast<size_t>(v)), e(static_cast<size_t>(v)), q(q.converts() ? static_cast<size_t>(v) : 0) {}
  std::vector<float> a, e, q;
  cpu::FilterScratch filter;
};

// Gumbel-max over log w(v) for v < len, w given per id; -inf ids cannot be drawn. The noise of
// `node`'s slot of the sequence's stream.
template <typename W>
int32_t sample_weights(const VerifyArgs& c, const RowStream& st, int64_t node, W&& log_weight) {
  const auto slot = static_cast<uint32_t>(node);
  ArgMax best = argmax_empty();
  float w[4];
  for (int64_t g = 0; 4 * g < c.v; ++g) {
    const int count = static_cast<int>(std::min<int64_t>(4, c.v - 4 * g));
    for (int j = 0; j < count; ++j) w[j] = log_weight(4 * g + j);
    tree_sample_group(best, st.seed, st.offset_at(slot), st.sequence_at(), st.position_at(slot),
                      static_cast<uint32_t>(g), w, count);
  }
  return best.idx;
}

// Walks sequence n's tree with its parameters rs and stream st; every rule reads the node's
// filtered row p' (xkernels/reference/sampling.py): dropped ids have a = -inf, so p'(x) = 0 and
// they leave every residual.
template <typename TL>
void verify_tree(const VerifyArgs& c, const RowSampling& rs, const RowStream& st, int64_t count,
                 const int64_t* tokens, const int64_t* parents, const TL* logits, const cpu::DraftProbs& draft_probs,
                 int64_t* accept_len, int64_t* path, int64_t* out, VerifyScratch& scratch) {
  float* a = scratch.a.data();
  float* e = scratch.e.data();
  // children in node order: first_child / next_sibling lists
  std::vector<int64_t> first(static_cast<size_t>(c.m), -1), next(static_cast<size_t>(c.m), -1),
      last(static_cast<size_t>(c.m), -1);
  for (int64_t i = 1; i < count; ++i) {
    const int64_t p = parents[i];
    (last[p] < 0 ? first[p] : next[last[p]]) = i;
    last[p] = i;
  }
  const bool greedy = rs.inv_t == 0.0f;
  const bool filtered = !greedy && filters_active(rs, c.v);
  int64_t node = 0, acc = 0;
  path[0] = 0;
  for (;;) {
    cpu::scale_row(logits + node * c.v, c.v, greedy ? 1.0f : rs.inv_t, a);
    RowStats s = greedy ? RowStats{cpu::row_argmax(a, c.v), 0.0f} : cpu::row_stats(a, c.v);
    const bool point_mass = greedy || stats_degenerate(s);
    if (filtered && !point_mass) s = cpu::filter_row(a, c.v, s, rs, scratch.filter);
    int64_t chosen = -1;
    int32_t emit = s.top.idx;
    if (point_mass) {
      for (int64_t ch = first[node]; ch >= 0 && chosen < 0; ch = next[ch])
        if (tokens[ch] == s.top.idx) chosen = ch;
    } else if (!draft_probs) {
      // Deterministic children: rejected tokens leave r (their probability mass leaves `remaining`).
      std::vector<int32_t> rejected;
      float remaining = 1.0f;
      for (int64_t ch = first[node]; ch >= 0 && chosen < 0; ch = next[ch]) {
        const auto x = static_cast<int32_t>(tokens[ch]);
        if (std::find(rejected.begin(), rejected.end(), x) != rejected.end()) continue;  // r(x) = 0
        const float p_x = stats_prob(s, a[x]);
        if (tree_accept_plain(st.coin(static_cast<uint32_t>(ch)), p_x, remaining)) {
          chosen = ch;
        } else {
          rejected.push_back(x);
          remaining -= p_x;
        }
      }
      if (chosen < 0)
        emit = sample_weights(c, st, node, [&](int64_t v) {
          return std::find(rejected.begin(), rejected.end(), static_cast<int32_t>(v)) != rejected.end() ? kNegInf
                                                                                                         : a[v];
        });
    } else {
      // Children drawn from q: the residual in closed form (xkernels/tree.h's TreeResidual), from
      // e = exp(a - top), made into a row at the first rejection; a pass sums it when a test needs it.
      // read only where the node has children (a leaf's residual is p'), converted once a node
      const float* q_row = first[node] >= 0 ? draft_probs.row(node, scratch.q.data()) : nullptr;
      TreeResidual res = tree_residual_start(s.sum, q_row ? cpu::row_sum(q_row, c.v) : 0.0f);
      std::vector<int32_t> rejected;
      bool stale = false, empty = false;
      for (int64_t ch = first[node]; ch >= 0 && chosen < 0; ch = next[ch]) {
        const auto x = static_cast<int32_t>(tokens[ch]);
        if (stale) {
          res.sum = cpu::residual_sum(e, q_row, c.v, res.coef);
          stale = false;
          if (!(res.sum > 0.0f)) {
            empty = true;
            break;
          }
        }
        const bool repeated = std::find(rejected.begin(), rejected.end(), x) != rejected.end();
        const float e_x = rejected.empty() ? exp_f32(a[x] - s.top.val) : e[x];
        if (tree_residual_accepts(res, st.coin(static_cast<uint32_t>(ch)), e_x, q_row[x], repeated)) {
          chosen = ch;
          break;
        }
        if (rejected.empty()) cpu::exp_row(a, c.v, s.top.val, e);
        tree_residual_reject(res, q_row[x], c.without_replacement && !repeated);
        if (!repeated) rejected.push_back(x);
        stale = true;
      }
      if (chosen < 0 && !empty) {
        if (rejected.empty()) {
          emit = sample_weights(c, st, node, [&](int64_t v) { return a[v]; });
        } else {  // an empty residual draws nothing: the argmax below
          cpu::residual_fill(e, q_row, c.v, res.coef);
          const auto slot = static_cast<uint32_t>(node);
          emit = cpu::sample_positive(st.seed, st.offset_at(slot), st.sequence_at(), st.position_at(slot), e, c.v).idx;
        }
      }
      if (chosen < 0 && emit == kNoIndex) emit = s.top.idx;
    }
    if (chosen < 0) {
      out[acc] = emit == kNoIndex ? s.top.idx : emit;
      break;
    }
    out[acc++] = tokens[chosen];
    path[acc] = chosen;
    node = chosen;
  }
  *accept_len = acc;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_verify_cpu(
    const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& target_logits,
    const std::optional<at::Tensor>& draft_probs, bool without_replacement,
    const std::optional<at::Tensor>& num_nodes, XK_SAMPLING_ARGS, const std::optional<at::Tensor>& errors,
    std::string_view filter_order) {
  check_devices(target_logits, "target_logits", {{errors, "errors"}});  // first, as the op's own tensors
  const int64_t v = check_tree_verify(tokens, parents, target_logits, draft_probs, num_nodes);
  const int64_t n = parents.size(0), m = parents.size(1);
  check_errors(errors, n);
  // With errors the per-row values are flagged, not raised, as on CUDA.
  const SamplingArgs sampling =
      sampling_args(n, target_logits.device(), XK_SAMPLING_FORWARD, filter_order, !errors.has_value());
  check_tree_values(parents, num_nodes, "parents");
  const auto tok = tokens.contiguous(), par = parents.contiguous(), logits = target_logits.contiguous();
  const auto counts = node_counts(num_nodes.value_or(at::Tensor()), n, m);
  check_tree_tokens(tok, num_nodes, v);
  const VerifyArgs c{m, v, without_replacement};
  const SamplingView view = sampling_view(sampling);
  if (errors) or_param_errors(view, n, errors->mutable_data_ptr<int32_t>());
  const auto q = draft_probs.has_value() ? draft_probs->contiguous() : at::Tensor();
  const cpu::DraftProbs qp(q, v);
  auto accept_len = at::empty({n}, tokens.options());
  auto path = at::full({n, m}, -1, tokens.options());
  auto out = at::full({n, m}, -1, tokens.options());
  cpu::dispatch_logits(logits.scalar_type(), [&](auto tag) {
    using TL = decltype(tag);
    const TL* l = logits.const_data_ptr<TL>();
    at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
      VerifyScratch scratch(v, qp);
      for (int64_t s = begin; s < end; ++s)
        verify_tree(c, view.row(s), view.stream(s), counts[s], tok.const_data_ptr<int64_t>() + s * m,
                    par.const_data_ptr<int64_t>() + s * m, l + s * m * v, qp.rows_from(s * m),
                    accept_len.mutable_data_ptr<int64_t>() + s, path.mutable_data_ptr<int64_t>() + s * m,
                    out.mutable_data_ptr<int64_t>() + s * m, scratch);
    });
  });
  return {accept_len, path, out};
}

void compact_kv_cpu(const at::Tensor& cache, const at::Tensor& path, const at::Tensor& accept_len,
                    int64_t prefix_len) {
  check_compact_kv(cache, path, accept_len, prefix_len);
  const int64_t n = cache.size(0), heads = cache.size(1), len = cache.size(2), d = cache.size(3);
  const int64_t m = path.size(1);
  const auto p = path.contiguous(), acc = accept_len.contiguous();
  for (int64_t s = 0; s < n; ++s) {
    const int64_t a = acc.const_data_ptr<int64_t>()[s];
    TORCH_CHECK(a >= 0 && a < m, "accept_len must lie in [0, M) = [0, ", m, "), got ", a, " (sequence ", s, ")");
    const int64_t* ps = p.const_data_ptr<int64_t>() + s * m;
    for (int64_t j = 0; j <= a; ++j)
      TORCH_CHECK(ps[j] >= j && (j == 0 || ps[j] > ps[j - 1]) && prefix_len + ps[j] < len,
                  "path must be increasing from the root with prefix_len + path < L (sequence ", s, ", entry ", j, ")");
  }
  const int64_t elem = cache.element_size();
  auto* base = static_cast<char*>(cache.mutable_data_ptr());
  at::parallel_for(0, n * heads, kTreeGrain, [&](int64_t begin, int64_t end) {
    for (int64_t sh = begin; sh < end; ++sh) {
      const int64_t s = sh / heads, h = sh % heads;
      const int64_t a = acc.const_data_ptr<int64_t>()[s];
      const int64_t* ps = p.const_data_ptr<int64_t>() + s * m;
      // Increasing j: a source (path[j] >= j) is never a slot written before it.
      for (int64_t j = 1; j <= a; ++j) {
        if (ps[j] == j) continue;
        char* dst = base + (s * cache.stride(0) + h * cache.stride(1) + (prefix_len + j) * cache.stride(2)) * elem;
        const char* src = base + (s * cache.stride(0) + h * cache.stride(1) + (prefix_len + ps[j]) * cache.stride(2)) * elem;
        std::copy_n(src, d * elem, dst);
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CPU, m) {
  m.impl("build_draft_tree", &build_draft_tree_cpu);
  m.impl("build_draft_tree_with_mask", &build_draft_tree_with_mask_cpu);
  m.impl("tree_attention_mask", &tree_attention_mask_cpu);
  m.impl("tree_positions", &tree_positions_cpu);
  m.impl("tree_verify", &tree_verify_cpu);
  m.impl("compact_kv_", &compact_kv_cpu);
}

}  // namespace xkernels
