// The Spiffy ops on the CPU. spiffy_materialize: the masked positions' rows in parallel (softmax
// statistics and top tokens), then per sequence the ranking, scores and selection of
// xkernels/spiffy.h. spiffy_accept: per sequence, dllm_step's rule on the logits of the state
// reached, for as long as that state is a kept draft. spiffy_attention_mask: the rule per row.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "../ops/checks.h"
#include "../ops/spiffy_args.h"
#include "dispatch.h"
#include "dllm_row.h"
#include "xkernels/param_errors.h"
#include "xkernels/spiffy.h"

namespace xkernels {
namespace {

// The per-position summary of every masked row (others untouched): the log probabilities are
// under the sequence's step distribution p' (tempered and filtered; softmax(raw) when greedy), a
// token the filters drop at -inf.
template <typename T>
void position_tops(const T* logits, const int64_t* block, int64_t rows, int64_t l, int64_t v, int64_t mask_id,
                   const SamplingView& view, PositionTop* out) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    cpu::DllmScratch scratch(v);
    for (int64_t row = begin; row < end; ++row) {
      if (block[row] != mask_id) continue;
      RowStats raw_stats;
      const float* a = cpu::masked_row_stats(logits + row * v, v, mask_id, scratch.raw.data(), raw_stats);
      TopTokens top;
      top_clear(top);
      for (int64_t x = 0; x < v; ++x) top_observe(top, dllm_logit(a[x], x, mask_id), static_cast<int32_t>(x));
      const RowSampling rs = view.row(row / l);
      const float scale = spiffy_scale(rs);
      const bool filtered = rs.inv_t != 0.0f && filters_active(rs, v) && !stats_degenerate(raw_stats);
      float scaled_sum = raw_stats.sum;
      if (scale != 1.0f || filtered) {
        float* scaled = scratch.scaled.data();
        RowStats st = cpu::masked_scaled_row(logits + row * v, v, mask_id, scale, scaled);
        if (filtered && !stats_degenerate(st)) st = cpu::filter_row(scaled, v, st, rs, scratch.filter);
        scaled_sum = st.sum;
      }
      position_top(top, raw_stats, scaled_sum, scale, out[row]);
      if (filtered)
        for (int j = 0; j < kSpiffyMaxRank; ++j)
          if (out[row].token[j] >= 0 && scratch.scaled[out[row].token[j]] == kNegInf) out[row].logp[j] = kNegInf;
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> spiffy_materialize_cpu(
    const at::Tensor& logits, const at::Tensor& block_tokens, int64_t mask_id, const at::Tensor& graph_ranks,
    const at::Tensor& graph_child_ptr, const at::Tensor& graph_children, int64_t keep, XK_SPIFFY_FILTER_ARGS,
    const std::optional<at::Tensor>& errors, std::string_view filter_order) {
  check_devices(logits, "logits", {{errors, "errors"}});  // first, as the op's own tensors
  const auto s = check_spiffy_materialize(logits, block_tokens, mask_id, graph_ranks, graph_child_ptr, graph_children,
                                          keep, /*check_values=*/true);
  check_errors(errors, s.n);
  // With errors the per-row values are flagged, not raised, as on CUDA.
  const SamplingArgs sampling =
      spiffy_filter_args(s.n, logits.device(), XK_SPIFFY_FILTER_FORWARD, filter_order, !errors.has_value());
  const SamplingView view = sampling_view(sampling);
  if (errors) or_param_errors(view, s.n, errors->mutable_data_ptr<int32_t>());
  const auto l = logits.contiguous();
  const auto block = block_tokens.contiguous();
  const auto ranks = graph_ranks.contiguous(), ptr = graph_child_ptr.contiguous(), children = graph_children.contiguous();
  const GraphView gr{ranks.const_data_ptr<int32_t>(), ptr.const_data_ptr<int32_t>(),
                     children.const_data_ptr<int32_t>(), s.g, s.k, s.e};
  auto [drafts, node_ids, scores] = spiffy_materialize_outputs(logits, block, keep);
  const int64_t* b = block.const_data_ptr<int64_t>();
  std::vector<PositionTop> pos(static_cast<size_t>(s.n * s.l));
  cpu::dispatch_logits(l.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    position_tops(l.const_data_ptr<T>(), b, s.n * s.l, s.l, s.v, mask_id, view, pos.data());
  });
  at::parallel_for(0, s.n, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> order(static_cast<size_t>(s.l));
    std::vector<float> score(static_cast<size_t>(s.g));
    std::vector<uint8_t> state(static_cast<size_t>(s.g));
    for (int64_t n = begin; n < end; ++n) {
      const PositionTop* pn = pos.data() + n * s.l;
      const int64_t* bn = b + n * s.l;
      const int64_t masked = spiffy_rank_positions(pn, bn, s.l, mask_id, order.data());
      score[0] = kNegInf;
      for (int64_t g = 1; g < s.g; ++g) score[g] = spiffy_local_log(gr.ranks + g * s.k * 2, s.k, pn, order.data(), masked);
      spiffy_combine_scores(gr, score.data());
      std::fill(state.begin(), state.end(), kNodeOut);
      spiffy_expand(gr, 0, score.data(), state.data());
      for (int64_t r = 0; r < keep; ++r) {
        int64_t best = -1;
        for (int64_t g = 1; g < s.g; ++g)
          if (state[g] == kNodeFrontier && (best < 0 || score[g] > score[best])) best = g;
        int64_t* draft = drafts.mutable_data_ptr<int64_t>() + (n * keep + r) * s.l;
        if (best < 0) {
          std::copy(bn, bn + s.l, draft);
          continue;
        }
        state[best] = kNodeKept;
        spiffy_expand(gr, best, score.data(), state.data());
        spiffy_fill(gr.ranks + best * s.k * 2, s.k, pn, order.data(), bn, s.l, draft);
        node_ids.mutable_data_ptr<int64_t>()[n * keep + r] = best;
        scores.mutable_data_ptr<float>()[n * keep + r] = std::exp(score[best]);
      }
    }
  });
  return {drafts, node_ids, scores};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> spiffy_accept_cpu(
    const at::Tensor& root_logits, const at::Tensor& draft_logits, const at::Tensor& draft_blocks,
    const at::Tensor& node_ids, const at::Tensor& block_tokens, int64_t mask_id, int64_t num_unmask,
    std::optional<double> threshold, XK_SAMPLING_ARGS, const std::optional<at::Tensor>& errors,
    std::string_view filter_order) {
  check_devices(root_logits, "root_logits", {{errors, "errors"}});  // first, as the op's own tensors
  const auto s = check_spiffy_accept(root_logits, draft_logits, draft_blocks, node_ids, block_tokens, num_unmask,
                                     threshold);
  check_block_tokens(block_tokens, mask_id, s.v);
  check_errors(errors, s.n);
  const SamplingArgs sampling =
      sampling_args(s.n, root_logits.device(), XK_SAMPLING_FORWARD, filter_order, !errors.has_value());
  const SamplingView view = sampling_view(sampling);
  if (errors) or_param_errors(view, s.n, errors->mutable_data_ptr<int32_t>());
  const float thr = static_cast<float>(threshold.value_or(0.0));
  const auto root = root_logits.contiguous(), drafts = draft_logits.contiguous();
  const auto blocks = draft_blocks.contiguous(), ids = node_ids.contiguous();
  auto [num_steps, positions, tokens, new_block, continue_from] = spiffy_accept_outputs(block_tokens);
  cpu::dispatch_logits(root.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    at::parallel_for(0, s.n, 1, [&](int64_t begin, int64_t end) {
      cpu::DllmScratch scratch(s.v);
      std::vector<float> conf(static_cast<size_t>(s.l));
      std::vector<int64_t> x0(static_cast<size_t>(s.l));
      std::vector<uint8_t> chosen(static_cast<size_t>(s.l));
      for (int64_t n = begin; n < end; ++n) {
        int64_t* state = new_block.mutable_data_ptr<int64_t>() + n * s.l;
        const RowSampling rs = view.row(n);
        const RowStream stream = view.stream(n);
        int64_t committed = 0, cur = -1, steps = 0;
        for (;;) {
          const int64_t masked = std::count(state, state + s.l, mask_id);
          // The second stop guards the outputs: only a row without a softmax can pick the mask token.
          if (masked == 0 || committed + masked > s.l) break;
          const T* lp = cur < 0 ? root.const_data_ptr<T>() + n * s.l * s.v
                                : drafts.const_data_ptr<T>() + (n * s.k + cur) * s.l * s.v;
          const RowStream step_stream = dllm_step_stream(stream, steps, s.l);
          for (int64_t p = 0; p < s.l; ++p) {
            conf[p] = kNegInf;
            if (state[p] != mask_id) continue;
            const auto r =
                cpu::dllm_row(lp + p * s.v, s.v, mask_id, rs, step_stream, static_cast<uint32_t>(p), scratch);
            x0[p] = r.x0, conf[p] = r.confidence;
          }
          int64_t* pos_out = positions.mutable_data_ptr<int64_t>() + n * s.l + committed;
          dllm_select(conf.data(), state, x0.data(), s.l, mask_id, num_unmask, threshold.has_value(), thr,
                      chosen.data(), state, pos_out, tokens.mutable_data_ptr<int64_t>() + n * s.l + committed);
          committed += std::count(chosen.begin(), chosen.end(), 1);
          ++steps;
          const int64_t m = spiffy_match(state, blocks.const_data_ptr<int64_t>() + n * s.k * s.l,
                                         ids.const_data_ptr<int64_t>() + n * s.k, s.k, s.l);
          if (m < 0) break;
          cur = m;
        }
        num_steps.mutable_data_ptr<int64_t>()[n] = steps;
        continue_from.mutable_data_ptr<int64_t>()[n] = cur;
      }
    });
  });
  return {num_steps, positions, tokens, new_block, continue_from};
}

// Sets bits [begin, end) of a packed row (bit k % 8 of byte k / 8).
void set_bits(uint8_t* row, int64_t begin, int64_t end) {
  for (; begin < end && begin % 8; ++begin) row[begin / 8] |= static_cast<uint8_t>(1u << (begin % 8));
  const int64_t full = (end - begin) / 8;
  if (full > 0) std::memset(row + begin / 8, 0xFF, static_cast<size_t>(full)), begin += 8 * full;
  for (; begin < end; ++begin) row[begin / 8] |= static_cast<uint8_t>(1u << (begin % 8));
}

at::Tensor spiffy_attention_mask_cpu(const at::Tensor& prefix_lens, int64_t num_drafts, int64_t block_size,
                                     int64_t max_prefix_len, bool packed) {
  check_spiffy_attention_mask(prefix_lens, num_drafts, block_size, max_prefix_len);
  const auto lens = prefix_lens.contiguous();
  const int64_t n = lens.size(0), q = (1 + num_drafts) * block_size, k = max_prefix_len + q;
  const int64_t* len = lens.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(len[i] >= 0 && len[i] <= max_prefix_len, "prefix_lens[", i, "] = ", len[i], " must be in [0, ",
                max_prefix_len, "] (max_prefix_len)");
  const int64_t row_bytes = packed ? (k + 7) / 8 : k;
  auto mask = spiffy_mask_output(lens, num_drafts, block_size, max_prefix_len, packed);
  uint8_t* m = static_cast<uint8_t*>(mask.mutable_data_ptr());
  at::parallel_for(0, n * q, std::max<int64_t>(1, 65536 / std::max<int64_t>(row_bytes, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const SpiffyMaskRow r = spiffy_mask_row(row % q, block_size, max_prefix_len, len[row / q]);
      uint8_t* out = m + row * row_bytes;
      if (packed) {
        std::memset(out, 0, static_cast<size_t>(row_bytes));
        set_bits(out, 0, r.prefix_end);
        set_bits(out, r.own_begin, r.own_end);
      } else {  // one pass: [prefix | padding | other copies | own copy | other copies]
        std::memset(out, 1, static_cast<size_t>(r.prefix_end));
        std::memset(out + r.prefix_end, 0, static_cast<size_t>(r.own_begin - r.prefix_end));
        std::memset(out + r.own_begin, 1, static_cast<size_t>(r.own_end - r.own_begin));
        std::memset(out + r.own_end, 0, static_cast<size_t>(k - r.own_end));
      }
    }
  });
  return mask;
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CPU, m) {
  m.impl("spiffy_materialize", &spiffy_materialize_cpu);
  m.impl("spiffy_accept", &spiffy_accept_cpu);
  m.impl("spiffy_attention_mask", &spiffy_attention_mask_cpu);
}

}  // namespace xkernels
