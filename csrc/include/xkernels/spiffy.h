// Spiffy's draft graphs, shared by the CPU and CUDA kernels of spiffy_materialize, spiffy_accept
// and spiffy_attention_mask.
//
// A graph has nodes 0..G-1 in topological order (every child after its parents); node 0 is the
// root, the block as it is. ranks int32 [G, K, 2] lists each node's unmask operations (i, j):
// "the masked position of confidence rank i, with its token of probability rank j", -1 padded.
// Children in CSR: child_ptr int32 [G + 1], children int32 [E]. The helpers skip what is out of
// range (an edge index outside [0, E), a child not after its parent or not below G), so a CUDA
// kernel stays memory-safe on a graph it cannot check.
#pragma once

#include <cstdint>

#include "xkernels/dllm.h"
#include "xkernels/host_device.h"
#include "xkernels/sampling.h"
#include "xkernels/sampling_params.h"

namespace xkernels {

// A graph's tensors (K: operations per node, E: edges).
struct GraphView {
  const int32_t* ranks;  // [g, k, 2]
  const int32_t* child_ptr;
  const int32_t* children;
  int64_t g, k, e;
};

// The valid range of node g's edges.
XK_HD int64_t edge_begin(const GraphView& gr, int64_t g) {
  const int64_t b = gr.child_ptr[g];
  return b < 0 ? 0 : b;
}
XK_HD int64_t edge_end(const GraphView& gr, int64_t g) {
  const int64_t e = gr.child_ptr[g + 1];
  return e > gr.e ? gr.e : e;
}
XK_HD bool child_ok(const GraphView& gr, int64_t g, int32_t c) { return c > g && c < gr.g; }

// Vocabulary ranks a graph may use (j < kSpiffyMaxRank): each position keeps its top tokens.
constexpr int kSpiffyMaxRank = 8;

// The best kSpiffyMaxRank tokens of a row (fewer when V is smaller: the rest keep kNoIndex), in argmax order (higher first, ties to the lower id).
struct TopTokens {
  float val[kSpiffyMaxRank];
  int32_t idx[kSpiffyMaxRank];
};

XK_HD void top_clear(TopTokens& t) {
  for (int j = 0; j < kSpiffyMaxRank; ++j) t.val[j] = kNegInf, t.idx[j] = kNoIndex;
}

// Inserts (v, i) if it beats the last kept token. Fully unrolled so that a GPU keeps t in registers.
XK_HD void top_observe(TopTokens& t, float v, int32_t i) {
  if (!argmax_before(v, i, t.val[kSpiffyMaxRank - 1], t.idx[kSpiffyMaxRank - 1])) return;
  t.val[kSpiffyMaxRank - 1] = v, t.idx[kSpiffyMaxRank - 1] = i;
#pragma unroll
  for (int j = kSpiffyMaxRank - 1; j > 0; --j) {
    if (!argmax_before(t.val[j], t.idx[j], t.val[j - 1], t.idx[j - 1])) break;
    const float fv = t.val[j];
    const int32_t fi = t.idx[j];
    t.val[j] = t.val[j - 1], t.idx[j] = t.idx[j - 1];
    t.val[j - 1] = fv, t.idx[j - 1] = fi;
  }
}

// The scale of the logits spiffy_materialize scores a sequence by: 1/T, or 1 when greedy (the
// untempered softmax).
XK_HD float spiffy_scale(const RowSampling& r) { return r.inv_t == 0.0f ? 1.0f : r.inv_t; }

// What spiffy_materialize keeps of a masked position's row: the untempered probability of its best
// token (the position's confidence, as dllm_step scores it) and the top tokens with their log
// probabilities under the scoring temperature.
struct PositionTop {
  float confidence;
  float logp[kSpiffyMaxRank];
  int32_t token[kSpiffyMaxRank];
};

// From a row's top tokens (raw values), its raw statistics and the tempered sum (sum of
// exp((a - top) * scale)); a degenerate row gets a NaN confidence and no tokens.
XK_HD void position_top(const TopTokens& top, const RowStats& raw, float scaled_sum, float scale, PositionTop& out) {
  const bool bad = stats_degenerate(raw);
  out.confidence = bad ? __builtin_nanf("") : 1.0f / raw.sum;
  const float log_sum = log_f32(scaled_sum);
  for (int j = 0; j < kSpiffyMaxRank; ++j) {
    const bool ok = !bad && top.idx[j] != kNoIndex;
    out.token[j] = ok ? top.idx[j] : -1;
    out.logp[j] = ok ? (top.val[j] - raw.top.val) * scale - log_sum : kNegInf;
  }
}

// Orders the masked positions by confidence (dllm_before: higher first, NaN last, ties to the lower
// position) into order[0..masked); returns how many are masked.
XK_HD int64_t spiffy_rank_positions(const PositionTop* pos, const int64_t* block, int64_t l, int64_t mask_id,
                                    int32_t* order) {
  int64_t masked = 0;
  for (int64_t p = 0; p < l; ++p) {
    if (block[p] != mask_id) continue;
    int64_t k = masked++;
    for (; k > 0 && dllm_before(pos[p].confidence, p, pos[order[k - 1]].confidence, order[k - 1]); --k)
      order[k] = order[k - 1];
    order[k] = static_cast<int32_t>(p);
  }
  return masked;
}

// The mean log probability of node g's tokens (log of the geometric mean), or -inf when the node
// cannot be filled: a rank beyond the masked positions or the row's tokens, or a token of
// probability 0.
XK_HD float spiffy_local_log(const int32_t* ranks, int64_t k, const PositionTop* pos, const int32_t* order,
                             int64_t masked) {
  float sum = 0.0f;
  int64_t count = 0;
  for (int64_t o = 0; o < k; ++o) {
    const int32_t i = ranks[2 * o], j = ranks[2 * o + 1];
    if (i < 0) break;
    if (i >= masked || j < 0 || j >= kSpiffyMaxRank) return kNegInf;
    const PositionTop& t = pos[order[i]];
    if (t.token[j] < 0 || !(t.logp[j] > kNegInf)) return kNegInf;
    sum += t.logp[j];
    ++count;
  }
  return count ? sum / static_cast<float>(count) : kNegInf;
}

XK_HD bool spiffy_usable(float score) { return score > kNegInf; }  // false for -inf and NaN

// Turns local log scores into the pruning scores, children first: a node's score is the mean of
// its local score and its best usable child's score (the geometric mean of the two
// probabilities: a node is worth its most promising continuation; averaging over every child
// instead penalised nodes with many rare children, bench/results/2026-11-30-spiffy-cpu.md).
XK_HD void spiffy_combine_scores(const GraphView& gr, float* score) {
  for (int64_t g = gr.g - 1; g >= 1; --g) {
    if (!spiffy_usable(score[g])) continue;
    float best = kNegInf;
    for (int64_t e = edge_begin(gr, g); e < edge_end(gr, g); ++e) {
      const int32_t c = gr.children[e];
      if (child_ok(gr, g, c) && spiffy_usable(score[c]) && score[c] > best) best = score[c];
    }
    if (best > kNegInf) score[g] = 0.5f * (score[g] + best);
  }
}

// Node states during selection.
enum : uint8_t { kNodeOut = 0, kNodeFrontier = 1, kNodeKept = 2 };

// Marks the usable children of node g not yet seen as selectable.
XK_HD void spiffy_expand(const GraphView& gr, int64_t g, const float* score, uint8_t* state) {
  for (int64_t e = edge_begin(gr, g); e < edge_end(gr, g); ++e) {
    const int32_t c = gr.children[e];
    if (child_ok(gr, g, c) && state[c] == kNodeOut && spiffy_usable(score[c])) state[c] = kNodeFrontier;
  }
}

// Writes the draft of node g: the block with each of its operations applied.
XK_HD void spiffy_fill(const int32_t* ranks, int64_t k, const PositionTop* pos, const int32_t* order,
                       const int64_t* block, int64_t l, int64_t* draft) {
  for (int64_t p = 0; p < l; ++p) draft[p] = block[p];
  for (int64_t o = 0; o < k && ranks[2 * o] >= 0; ++o) {
    const int32_t p = order[ranks[2 * o]];
    draft[p] = pos[p].token[ranks[2 * o + 1]];
  }
}

// The first kept draft equal to block (all l tokens), or -1.
XK_HD int64_t spiffy_match(const int64_t* block, const int64_t* drafts, const int64_t* node_ids, int64_t k,
                           int64_t l) {
  for (int64_t d = 0; d < k; ++d) {
    if (node_ids[d] < 0) continue;
    int64_t p = 0;
    while (p < l && drafts[d * l + p] == block[p]) ++p;
    if (p == l) return d;
  }
  return -1;
}

// spiffy_attention_mask's rule over queries [real block, draft 0, ...] (each l rows) and keys
// [prefix (max_prefix), real block, draft 0, ...]: query q sees the prefix keys below prefix_len
// (clamped to [0, max_prefix]) and the keys of its own copy of the block. Two key ranges per row.
struct SpiffyMaskRow {
  int64_t prefix_end, own_begin, own_end;
};

XK_HD SpiffyMaskRow spiffy_mask_row(int64_t q, int64_t l, int64_t max_prefix, int64_t prefix_len) {
  const int64_t end = prefix_len < 0 ? 0 : prefix_len > max_prefix ? max_prefix : prefix_len;
  const int64_t own = max_prefix + q / l * l;
  return SpiffyMaskRow{end, own, own + l};
}

XK_HD bool spiffy_mask_at(const SpiffyMaskRow& row, int64_t key) {
  return key < row.prefix_end || (key >= row.own_begin && key < row.own_end);
}

}  // namespace xkernels
