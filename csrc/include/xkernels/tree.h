// Draft-tree math shared by the CPU and CUDA kernels: DDTree's best-first construction, the
// validity rule of a tree, and the acceptance rules of tree verification.
//
// Tree format: per sequence, nodes 0..M-1 in topological order; node 0 is the root (the last
// committed token); parents[0] = -1 and 0 <= parents[i] < i for the real nodes i < num_nodes.
#pragma once

#include <cmath>
#include <cstdint>

#include "xkernels/host_device.h"
#include "xkernels/sampling.h"

namespace xkernels {

// ---- best-first tree construction (DDTree) ----
//
// A node is a prefix of candidate ranks (rank c_t at slot t); its score is the sum of the
// slots' log-probs. The children of a node are the next slot's candidates, which come sorted by
// log-prob, so the best child is rank 0 and each candidate's next sibling is rank + 1. Popping
// the best frontier entry and pushing its next sibling and its first child yields the `budget`
// best prefixes (scores only fall along both moves). The frontier is ordered by score, then by
// push order (the entry pushed first wins a tie): a total order, so any exact search for the best
// entry (the CPU's heap, the CUDA kernel's warp argmax) pops the same entries, given the same float
// sums in the same order. A NaN log-prob counts as -inf, and so does a NaN sum (inf + -inf, from
// infinite log-probs): a NaN score would compare neither above nor below anything, and the pops
// would then depend on how the search is done.
struct TreeCandidate {
  float score;     // of the prefix this candidate would add
  float base;      // its parent's score
  uint32_t order;  // push order: the tie-break
  int32_t parent, slot, rank;
};

XK_HD bool candidate_before(const TreeCandidate& a, const TreeCandidate& b) {
  return a.score > b.score || (a.score == b.score && a.order < b.order);
}

XK_HD void heap_push(TreeCandidate* heap, int64_t& size, const TreeCandidate& c) {
  int64_t i = size++;
  while (i > 0) {
    const int64_t up = (i - 1) / 2;
    if (!candidate_before(c, heap[up])) break;
    heap[i] = heap[up];
    i = up;
  }
  heap[i] = c;
}

XK_HD TreeCandidate heap_pop(TreeCandidate* heap, int64_t& size) {
  const TreeCandidate top = heap[0];
  const TreeCandidate last = heap[--size];
  int64_t i = 0;
  for (;;) {
    const int64_t left = 2 * i + 1;
    if (left >= size) break;
    int64_t best = left;
    if (left + 1 < size && candidate_before(heap[left + 1], heap[left])) best = left + 1;
    if (!candidate_before(heap[best], last)) break;
    heap[i] = heap[best];
    i = best;
  }
  if (size > 0) heap[i] = last;
  return top;
}

XK_HD float tree_logprob(const float* lp, int64_t k, int32_t slot, int32_t rank) {
  const float x = lp[slot * k + rank];
  return is_nan_f32(x) ? kNegInf : x;
}

// The score of a prefix: its parent's score plus the slot's log-prob; NaN (inf - inf) as -inf.
XK_HD float tree_score(float base, float logprob) {
  const float s = base + logprob;
  return is_nan_f32(s) ? kNegInf : s;
}

// The two entries a pop of c (now node i) pushes, in push order: its next sibling (if any), then
// its first child (if any). Returns how many. (Constant indices into out: registers on a GPU.)
XK_HD int tree_successors(const TreeCandidate& c, int64_t i, const float* lp, int64_t d, int64_t k, uint32_t order,
                          TreeCandidate (&out)[2]) {
  const bool sibling = c.rank + 1 < k, child = c.slot + 1 < d;
  const TreeCandidate first_child{child ? tree_score(c.score, tree_logprob(lp, k, c.slot + 1, 0)) : 0.0f, c.score,
                                  order + (sibling ? 1u : 0u), static_cast<int32_t>(i), c.slot + 1, 0};
  out[0] = first_child;
  out[1] = first_child;
  if (sibling)
    out[0] = TreeCandidate{tree_score(c.base, tree_logprob(lp, k, c.slot, c.rank + 1)), c.base, order, c.parent,
                           c.slot, c.rank + 1};
  return (sibling ? 1 : 0) + (child ? 1 : 0);
}

// The first entry of a search (none when d, k or the budget is 0).
XK_HD int tree_first(const float* lp, int64_t d, int64_t k, int64_t budget, TreeCandidate (&out)[2]) {
  if (d == 0 || k == 0 || budget == 0) return 0;
  out[0] = TreeCandidate{tree_logprob(lp, k, 0, 0), 0.0f, 0, 0, 0, 0};
  return 1;
}

// One sequence's tree from its slots' top-k candidates lp, tok [d, k] (log-probs sorted
// descending per slot). Writes tokens, parents, depth [budget + 1] (root: token -1, parent -1,
// depth 0; nodes past the count: -1, -1, 0) and returns the node count (root included).
// heap holds budget + 1 entries (each pop pushes at most two).
XK_HD int64_t build_tree(const float* lp, const int64_t* tok, int64_t d, int64_t k, int64_t budget,
                         TreeCandidate* heap, int64_t* tokens, int64_t* parents, int64_t* depth) {
  tokens[0] = -1, parents[0] = -1, depth[0] = 0;
  int64_t nodes = 1, size = 0;
  TreeCandidate next[2];
  uint32_t order = static_cast<uint32_t>(tree_first(lp, d, k, budget, next));
  if (order) heap_push(heap, size, next[0]);
  while (nodes <= budget && size > 0) {
    const TreeCandidate c = heap_pop(heap, size);
    const int64_t i = nodes++;
    tokens[i] = tok[c.slot * k + c.rank];
    parents[i] = c.parent;
    depth[i] = c.slot + 1;
    const int count = tree_successors(c, i, lp, d, k, order, next);
    for (int j = 0; j < count; ++j) heap_push(heap, size, next[j]);
    order += static_cast<uint32_t>(count);
  }
  for (int64_t i = nodes; i <= budget; ++i) tokens[i] = -1, parents[i] = -1, depth[i] = 0;
  return nodes;
}

// ---- validity ----

// Whether node i (< num_nodes) has a valid parent.
XK_HD bool tree_parent_ok(const int64_t* parents, int64_t i) {
  return i == 0 ? parents[0] == -1 : parents[i] >= 0 && parents[i] < i;
}

// ---- verification ----
//
// The walk starts at the root; at each node it looks at the children in node order.
//  - point mass (T = 0, or a row without a softmax): move to the first child whose token is the
//    row's argmax; if none, emit the argmax.
//  - T > 0, deterministic children (no draft_probs): with r = p, child x is accepted with
//    probability r(x) / sum(r); a rejected x gets r(x) = 0 (a duplicate token is then never
//    accepted, so it cannot count twice); if none is accepted, sample from r.
//  - T > 0, children drawn i.i.d. from q (draft_probs; SpecInfer / SpecTr): x is accepted iff
//    u < r(x) / q(x) with r normalised; on rejection r <- normalize(max(r - q, 0)), and without
//    replacement also q(x) <- 0, renormalised. If none is accepted, sample from r. A draft row
//    without mass (sum 0) proposes nothing: its children are rejected, r stays.
// Child c's coin is the acceptance coin of position c (acceptance_coin(seed, offset, n, c)); the
// sample at node i is Gumbel-max with the noise of position i (word v % 4 of draw v / 4), as in
// chain_verify. A residual that is numerically empty emits the row's argmax.

// Deterministic children: u * remaining < p(x), remaining = 1 - the mass of the rejected tokens.
XK_HD bool tree_accept_plain(float u, float p_x, float remaining) { return u * remaining < p_x; }

// Sampled children in closed form. With e = exp(a - max a) (the row's softmax times its sum) and q
// the node's draft row, every residual is r_k = max(e - c_k q, 0) up to a factor: c_0 = 0, and a
// rejection at step k (r_k summing to s_k, q to z_k > 0) gives
//   max(r_k / s_k - q / z_k, 0) = max(e - (c_k + s_k / z_k) q, 0) / s_k,
// as max(max(y, 0) - d q, 0) = max(y - d q, 0) for d, q >= 0. Without replacement the rejected
// tokens leave q, but r is 0 at each of them from its rejection on (x is rejected only if
// r_k(x) / s_k < q(x) / z_k, or r_k(x) = 0 = q(x)), where max(e - c q, 0) is 0 too (c only grows):
// the same formula with the whole q holds, z_k being the mass q has left. So a step needs only
// s_k, a read-only pass over the row and q, and no residual row is ever stored. A repeated token is
// never accepted (its r is 0); it still makes its residual step.
// The residual shrinks by a factor s_k a step while e stays: e - c q cancels down to it, so c is
// kept in double and applied as two floats by two FMAs, which leaves an error near 2^-48 e + 2^-24 r
// instead of 2^-24 e (the reference renormalises r each step; this keeps up with it for residuals
// down to ~1e-12 of the row's mass, which the children drawn from q reach with that probability).
struct TreeResidual {
  double coef;  // c_k
  float sum;    // s_k, the sum of max(e - coef q, 0) over the row
  float zq;     // z_k
};

// c as hi + lo, two floats (hi finite).
struct TreeCoef {
  float hi, lo;
};

XK_HD TreeCoef tree_coef(double c) {
  const double top = 3.4028234663852886e38;  // FLT_MAX
  const float hi = static_cast<float>(c < top ? c : top);
  return TreeCoef{hi, c < top ? static_cast<float>(c - hi) : 0.0f};
}

XK_HD float tree_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return fmaf(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// Before any rejection: r = e, whose sum is the row statistics' sum.
XK_HD TreeResidual tree_residual_start(float softmax_sum, float zq) { return TreeResidual{0.0, softmax_sum, zq}; }

// max(e - c q, 0) (a NaN as 0).
XK_HD float tree_residual_weight(float e, float q, TreeCoef c) {
  const float d = tree_fma(-c.lo, q, tree_fma(-c.hi, q, e));
  return d > 0.0f ? d : 0.0f;
}

// Whether child x (e_x, q_x; `repeated`: rejected before at this node) is accepted with coin u:
// u * q(x) / zq < r(x) / sum, kept free of divisions.
XK_HD bool tree_residual_accepts(const TreeResidual& r, float u, float e_x, float q_x, bool repeated) {
  return !repeated && u * q_x * r.sum < tree_residual_weight(e_x, q_x, tree_coef(r.coef)) * r.zq;
}

// The step of a rejection (`remove`: without replacement and not repeated, so q(x) leaves q). The
// new sum comes from a pass over the row (r.sum is stale until then).
XK_HD void tree_residual_reject(TreeResidual& r, float q_x, bool remove) {
  if (r.zq > 0.0f) r.coef += static_cast<double>(r.sum) / static_cast<double>(r.zq);
  if (remove) r.zq -= q_x;
}

// Gumbel-max over ids 4g .. 4g+count-1 with log-weights w (-inf: cannot be drawn); the noise of
// position `node` (xkernels/sampling.h's gumbel_group).
XK_HD void tree_sample_group(ArgMax& best, uint64_t seed, uint64_t offset, uint32_t sequence, uint32_t node,
                             uint32_t g, const float* w, int count) {
  gumbel_group(best, seed, offset, sequence, node, g, w, count);
}

}  // namespace xkernels
