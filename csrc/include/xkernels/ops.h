// The C++ API of xkernels. Each function calls its op through the torch
// dispatcher, so CPU and CUDA tensors reach the matching kernel. Link against
// XKernels::xkernels (find_package(XKernels)); see README.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

namespace xkernels {

// The sampling arguments of the sampling ops below (chain_verify_ragged_, the refine ops,
// tree_verify, dllm_step, the Spiffy ops). Each parameter is the scalar, or the [N] tensor beside
// it where that is given (one value a sequence): temperature float32 (0: greedy), top_k int32 or
// int64 (0: off), top_p float32 in (0, 1] (1: off), min_p float32 in [0, 1] (0: off). The stream:
// seed and offset, each overridden at run time by a one-element int64 tensor on the logits' device
// (a captured CUDA graph can advance it), or int64 [N] tensors: a stream per request, keyed by
// (seed[n], offset[n] + slot) whatever the batch. filter_order: "top_k_first" applies top-k, top-p,
// then min-p; "min_p_first" (vLLM's) min-p, top-k, then top-p renormalised over what both keep; they
// differ only where min-p and top-p are both on (any other value raises). The defaults are greedy,
// unfiltered, stream 0:
//   xkernels::Sampling{.temperature = 0.8, .top_p = 0.9, .seed = 7}
// `errors`, the trailing argument of every op here that takes a Sampling: the
// asynchronous error flag, int32 [N] (contiguous, on the logits' device; N: the per-row tensors'
// length, one a sequence or request). Each row's invalid per-row values are OR-ed into its word as
// bits (xkernels/param_errors.h: 1 temperature NaN, infinite or negative, 2 top_k < 0, 4 top_p
// outside (0, 1], 8 min_p outside [0, 1]) instead of raising, on every device, with no host sync;
// those values read as off (a temperature as greedy) as on unchecked CUDA, so results are unchanged.
// Scalar values are still checked on the host. Except in chain_verify_ragged_, whose kernel sets
// the bits, it costs one small launch (a thread a row) where a per-row tensor is given.
struct Sampling {
  double temperature = 0.0;
  std::optional<at::Tensor> temperature_tensor = std::nullopt;
  int64_t top_k = 0;
  std::optional<at::Tensor> top_k_tensor = std::nullopt;
  double top_p = 1.0;
  std::optional<at::Tensor> top_p_tensor = std::nullopt;
  double min_p = 0.0;
  std::optional<at::Tensor> min_p_tensor = std::nullopt;
  int64_t seed = 0;
  std::optional<at::Tensor> seed_tensor = std::nullopt;
  int64_t offset = 0;
  std::optional<at::Tensor> offset_tensor = std::nullopt;
  std::string filter_order = "top_k_first";
};

// Speculative verification of a chain of K drafts per sequence (the scalar form: one temperature,
// no filters, the stream keyed by the batch row; chain_verify_ragged_ takes a Sampling).
//   draft_tokens  int64 [N, K]
//   target_logits float32 / bfloat16 / float16 [N, K+1, V]; row i is the
//                 target's next-token logits after the prefix and i drafts
//   draft_probs   optional float32 / bfloat16 / float16 [N, K, V], the
//                 distributions the drafts were sampled from (read in their dtype)
//   temperature   0 for greedy verification
//   seed, offset  the Philox stream; seed_tensor / offset_tensor (int64, one
//                 element, on the logits' device) override them at run time so
//                 a captured CUDA graph can advance them
// Returns (accept_len int64 [N], out_tokens int64 [N, K+1]): the accepted
// drafts, then the correction or bonus token, then -1.
std::tuple<at::Tensor, at::Tensor> chain_verify(const at::Tensor& draft_tokens,
                                                const at::Tensor& target_logits,
                                                const std::optional<at::Tensor>& draft_probs = std::nullopt,
                                                double temperature = 0.0, int64_t seed = 0, int64_t offset = 0,
                                                const std::optional<at::Tensor>& seed_tensor = std::nullopt,
                                                const std::optional<at::Tensor>& offset_tensor = std::nullopt);

// Speculative verification of chains held flat, as vLLM holds them, into caller buffers.
//   draft_tokens         int64 or int32 [T]; request n's K_n drafts are
//                        draft_tokens[cu[n-1]:cu[n]] (cu[-1] = 0)
//   cu_num_draft_tokens  int32 or int64 [N], the inclusive cumsum of K_n (K_n may be 0)
//   target_logits        float32 / bfloat16 / float16 [T + N, V]; request n's K_n + 1 rows
//                        start at cu[n-1] + n
//   draft_probs          optional float32 / bfloat16 / float16 [T, V] (read in its dtype)
//   sampling             each request's parameters and stream (slot i of request n: its i-th row)
//   block                block verification (Sun et al.) instead of token-wise
// Writes output_token_ids int32 [N, max_spec_len + 1] (-1 padded), num_emitted int32 [N]
// (accepted drafts plus the correction or bonus token) and, when given, logprobs float32
// [N, max_spec_len + 1] (log p' of each emitted token under its row's filtered distribution, NaN
// padded; not computed without it).
// errors: the asynchronous error flag, a word a request (see Sampling).
void chain_verify_ragged_(const at::Tensor& draft_tokens, const at::Tensor& cu_num_draft_tokens,
                          const at::Tensor& target_logits, int64_t max_spec_len,
                          const std::optional<at::Tensor>& draft_probs, const Sampling& sampling, bool block,
                          const at::Tensor& output_token_ids, const at::Tensor& num_emitted,
                          const std::optional<at::Tensor>& logprobs = std::nullopt,
                          const std::optional<at::Tensor>& errors = std::nullopt);

// Folded inference weights of an xPress refiner (see xkernels/refiner.py):
// emb [V, r], mix [r, B, B] (only j <= k of mix[c, k, j] is read), w_gate and
// w_up [H, r], w_down [r, H], w_read [V, r]; float32 or bfloat16, all alike.
struct RefinerWeights {
  at::Tensor emb, mix, w_gate, w_up, w_down, w_read;
};

// One refinement pass over a block of B slots whose last D are drafted.
//   ctx [N, B, r] float32, prev_tokens int64 [N, B] (slot k reads slot k-1),
//   base_logits [N, D, V] float32 / bfloat16 / float16.
// For each drafted slot l = s + w_read z: tokens = argmax(a' + Gumbel), a' = l / T filtered by
// the sequence's top_k, top_p and min_p (argmax l at T = 0), logprobs = log_softmax(a')[token].
// Per-request streams key drafted slot d of sequence n by (seed[n], offset[n] + d). Returns
// (tokens int64 [N, D], logprobs float32 [N, D]); the [N, D, V] logits are never written.
std::tuple<at::Tensor, at::Tensor> refine_step(const at::Tensor& ctx, const at::Tensor& prev_tokens,
                                               const at::Tensor& base_logits, const RefinerWeights& weights,
                                               const Sampling& sampling = {},
                                               const std::optional<at::Tensor>& errors = std::nullopt);

// Jacobi iteration of refine_step from the drafter's own sample, at most max_iters
// passes; a sequence stops after a pass that changes none of its tokens.
// prefix_tokens int64 [N, F+1]: the token before the block and the F = B - D fixed
// slots. Returns (tokens, logprobs, iters int32 [N]: passes run).
std::tuple<at::Tensor, at::Tensor, at::Tensor> jacobi_refine(
    const at::Tensor& ctx, const at::Tensor& prefix_tokens, const at::Tensor& base_logits,
    const RefinerWeights& weights, int64_t max_iters, const Sampling& sampling = {},
    const std::optional<at::Tensor>& errors = std::nullopt);

// Left-to-right refinement, one drafted slot per step: what Jacobi converges to.
std::tuple<at::Tensor, at::Tensor> sequential_refine(const at::Tensor& ctx, const at::Tensor& prefix_tokens,
                                                     const at::Tensor& base_logits, const RefinerWeights& weights,
                                                     const Sampling& sampling = {},
                                                     const std::optional<at::Tensor>& errors = std::nullopt);

// ---- Draft trees. Format: per sequence, nodes 0..M-1 in topological order, node 0 the root
// (the last committed token); parents int64 [N, M] with parents[:, 0] = -1 and
// 0 <= parents[i] < i for the real nodes i < num_nodes (int64 [N], optional: all M).

// DDTree's best-first tree over per-slot top-k candidates topk_logprobs float32 / topk_tokens
// int64 [N, D, k] (log-probs sorted descending per slot): the `budget` best prefixes by summed
// log-prob (ties to the candidate pushed first). Returns (tokens, parents, num_nodes, depth), M =
// budget + 1; the root's token is -1 (the caller's last committed token).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> build_draft_tree(const at::Tensor& topk_logprobs,
                                                                            const at::Tensor& topk_tokens,
                                                                            int64_t budget);

// build_draft_tree's outputs and, in the same op (on CUDA the same launch), the mask that
// tree_attention_mask(parents, num_nodes, packed) gives for them: (tokens, parents, num_nodes,
// depth, mask).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> build_draft_tree_with_mask(
    const at::Tensor& topk_logprobs, const at::Tensor& topk_tokens, int64_t budget, bool packed = false);

// mask[n, i, j] = node j is node i or an ancestor of it: bool [N, M, M], or packed uint8
// [N, M, ceil(M/8)] (bit j % 8 of byte j / 8). A padding node sees itself only.
at::Tensor tree_attention_mask(const at::Tensor& parents, const std::optional<at::Tensor>& num_nodes = std::nullopt,
                               bool packed = false);

// The depth of each node (root 0, padding 0), int64 [N, M]: rotary positions after the prefix.
at::Tensor tree_positions(const at::Tensor& parents, const std::optional<at::Tensor>& num_nodes = std::nullopt);

// Lossless verification of a draft tree. target_logits [N, M, V]: the target's next-token logits
// after each node's path. Greedy at T = 0; at T > 0 deterministic children (no draft_probs), or
// children drawn i.i.d. (or without_replacement) from draft_probs float32 / bfloat16 / float16 [N, M, V] (row i: the
// distribution node i's children were drawn from), verified against each row's filtered
// distribution p' (top_k, top_p, min_p). With per-request streams node i of sequence n uses slot
// offset[n] + i (a call reads slots offset .. offset + M - 1). Returns (accept_len [N], path [N, M]:
// the accepted nodes from the root, -1 padded, out_tokens [N, M]: the accepted drafts, then the
// correction or bonus token, -1 padded).
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_verify(
    const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& target_logits,
    const std::optional<at::Tensor>& draft_probs = std::nullopt, bool without_replacement = false,
    const std::optional<at::Tensor>& num_nodes = std::nullopt, const Sampling& sampling = {},
    const std::optional<at::Tensor>& errors = std::nullopt);

// In place: the K/V entries prefix_len + path[n, j] of cache [N, H, L, d] move to prefix_len + j,
// j = 0..accept_len[n] (the root and the accepted nodes, behind the prefix).
void compact_kv_(const at::Tensor& cache, const at::Tensor& path, const at::Tensor& accept_len, int64_t prefix_len);

// One step of a masked diffusion LM's block decoding (LLaDA's low-confidence rule): for each
// masked position of block_tokens [N, L], x0 drawn from the row's filtered distribution p' (the
// sequence's sampling parameters; argmax at T = 0; per request, position l draws slot offset[n] + l)
// and
// confidence = softmax(logits)[x0]; unmask the num_unmask most confident (ties to the lower
// position), or with a threshold every one above it and at least the best. Returns (new_block,
// positions, tokens: int64 [N, L], -1 padded, confidence float32 [N, L], -inf where unmasked).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dllm_step(
    const at::Tensor& logits, const at::Tensor& block_tokens, int64_t mask_id, int64_t num_unmask = 1,
    std::optional<double> threshold = std::nullopt, const Sampling& sampling = {},
    const std::optional<at::Tensor>& errors = std::nullopt);

// Spiffy (xkernels/spiffy.h has the graph format). Fills the draft graph (graph_ranks int32
// [G, K, 2], graph_child_ptr int32 [G + 1], graph_children int32 [E]) from the step distribution
// logits [N, L, V] of block_tokens [N, L], scores every node (the geometric mean of its tokens'
// probabilities under the filtered p' of sequence n's parameters, softmax(logits) at T = 0, combined with its best
// child's score by geometric mean) and keeps the best `keep` nodes such that every kept node is a child of
// the root or of a kept node. Returns (draft_blocks int64 [N, keep, L], node_ids int64 [N, keep] in
// the order kept, scores float32 [N, keep]); unused slots: the block itself, node -1, score 0.
// It draws nothing: the sampling's stream is not read.
std::tuple<at::Tensor, at::Tensor, at::Tensor> spiffy_materialize(
    const at::Tensor& logits, const at::Tensor& block_tokens, int64_t mask_id, const at::Tensor& graph_ranks,
    const at::Tensor& graph_child_ptr, const at::Tensor& graph_children, int64_t keep,
    const Sampling& sampling = {}, const std::optional<at::Tensor>& errors = std::nullopt);

// Samples dllm_step's step (num_unmask / threshold, the sampling arguments, the stream of step d as
// xkernels/dllm.h's dllm_step_stream advances it)
// from root_logits [N, L, V]; while the new block equals a kept draft (draft_blocks [N, K, L],
// node_ids [N, K] >= 0) samples the next step from that draft's logits (draft_logits [N, K, L, V]).
// Returns (num_steps [N], positions and tokens [N, L]: the unmasked positions and their tokens in
// the order committed, -1 padded; new_block [N, L]; continue_from [N]: the draft whose logits gave
// the last step, -1 for the root).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> spiffy_accept(
    const at::Tensor& root_logits, const at::Tensor& draft_logits, const at::Tensor& draft_blocks,
    const at::Tensor& node_ids, const at::Tensor& block_tokens, int64_t mask_id, int64_t num_unmask = 1,
    std::optional<double> threshold = std::nullopt, const Sampling& sampling = {},
    const std::optional<at::Tensor>& errors = std::nullopt);

// The attention mask of a forward over [prefix (max_prefix_len keys), real block, num_drafts draft
// copies] (each block_size): a query sees the prefix keys below prefix_lens[n] and its own copy of
// the block. bool [N, Q, K] (Q = (1 + num_drafts) * block_size, K = max_prefix_len + Q), or with
// packed uint8 [N, Q, ceil(K / 8)] (bit k % 8 of byte k / 8).
at::Tensor spiffy_attention_mask(const at::Tensor& prefix_lens, int64_t num_drafts, int64_t block_size,
                                 int64_t max_prefix_len, bool packed = false);

// The per-shard pass of vocabulary-parallel sampling (xkernels/distributed.py). logits [N, R, V]
// hold the global ids [vocab_start, vocab_start + V) of a vocabulary shard; rows [N, S] selects
// rows (default: all, S = R). For each selected row, with a = logits / T (logits at T = 0) and
// the id ignore_id counted as -inf: row_max, row_sum = sum exp(s - row_max) (0 when row_max is not
// finite) and top_id (torch.argmax's global id, -1 for an empty shard) of s = a, or of the raw
// logits with raw_stats. With sample (T > 0): the Gumbel-max over the shard of log w + G, G the
// package's noise of (sequence n, position row, global id), w = exp(a) but the ids of exclude
// [N, S, E] (-1 padded); with draft_probs [N, Q, V] and residual_stats [N, S, 2] (the global max
// and sum of a), rows below Q draw from w = max(softmax(a) - q, 0) instead. Returns (row_max,
// row_sum, top_id, pick_score, pick_id, pick_logit: s at the pick), all [N, S]; no pick: -inf, -1,
// -inf. Merged over shards (max score, ties to the lowest id) these give the unsharded ops' tokens.
// temperature_tensor: float32 [N], a temperature per sequence (rows at 0: greedy, no pick); seed and
// offset tensors of [N]: the per-request streams (sampling_params.h RowStream, slot = the row).
// cut_value float32 [N, S] and cut_id [N, S]: each selected row keeps only the ids x with
// filter_keeps({cut_value, cut_id}, a_x, x) (global ids) in its statistics (unless raw_stats) and
// its pick: the whole vocabulary's top-k / top-p / min-p cut, found by xkernels/distributed.py.
// errors: the asynchronous error flag (see Sampling), a word a sequence; only temperature_tensor
// has per-sequence values to flag.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> shard_row_stats(
    const at::Tensor& logits, int64_t vocab_start, const std::optional<at::Tensor>& rows = std::nullopt,
    const std::optional<at::Tensor>& exclude = std::nullopt, const std::optional<at::Tensor>& draft_probs = std::nullopt,
    const std::optional<at::Tensor>& residual_stats = std::nullopt, int64_t ignore_id = -1, bool sample = false,
    bool raw_stats = false, double temperature = 0.0, int64_t seed = 0, int64_t offset = 0,
    const std::optional<at::Tensor>& seed_tensor = std::nullopt,
    const std::optional<at::Tensor>& offset_tensor = std::nullopt,
    const std::optional<at::Tensor>& temperature_tensor = std::nullopt,
    const std::optional<at::Tensor>& cut_value = std::nullopt, const std::optional<at::Tensor>& cut_id = std::nullopt,
    const std::optional<at::Tensor>& errors = std::nullopt);

// One round of the radix select that finds a sharded row's whole-vocabulary cut (shard_cut.h):
// for each row r of logits [R, V_local] (global ids vocab_start ..), its ids' scaled logits a =
// logits * scale[r] (ignore_id's at -inf) keyed by cut_rank_key; of the keys whose digits above
// `shift` are prefix[r], each weight (cut_weight: 1 for each id above -inf, or with row_max
// float32 [R] the mass exp(a - row_max); with keep_value / keep_id only the ids that cut keeps)
// summed exactly into the bucket of the digit at `shift`. Returns int64 [R, 2, 256]: the weights'
// hi parts, then their lo parts (a weight w is floor(w 2^62) = hi 2^31 + lo). Summed over the shards
// (all-reduce), the histograms are the whole row's; xkernels/distributed.py runs the 8 rounds.
at::Tensor shard_cut_histogram(const at::Tensor& logits, const at::Tensor& scale, const at::Tensor& prefix,
                               int64_t shift, int64_t vocab_start, int64_t ignore_id = -1,
                               const std::optional<at::Tensor>& row_max = std::nullopt,
                               const std::optional<at::Tensor>& keep_value = std::nullopt,
                               const std::optional<at::Tensor>& keep_id = std::nullopt);

// The bucket each row's radix select takes from a round's all-reduced histogram hist int64 [R, P, 256]
// (P = 2: hi and lo parts; 1: a count's hi parts), given the weight before [R, 2] ranked before the
// prefix [R] and the target float64 [R] (units of 2^-62): shard_cut.h's cut_pick. Returns the new
// (prefix * 256 + bucket, before) as new tensors.
std::tuple<at::Tensor, at::Tensor> shard_cut_pick(const at::Tensor& hist, const at::Tensor& prefix,
                                                  const at::Tensor& before, const at::Tensor& target);

// Each row's `count` (<= 4096) lowest keys (cut_rank_key) among its ids above -inf, for a bounded
// top-k's whole-vocabulary cut in one all-gather (a shard's `count` lowest keys hold the row's k
// lowest for every k <= count): logits [R, V_local] scaled by scale float32 [R], ignore_id's at
// -inf. Returns (keys int64 [R, count], ascending, shard_cut.h's kCutKeepAllKey past the row's
// finite ids; weights int64 [R, count, 2], with row_max float32 [R] each key's mass exp(a -
// row_max) as cut_weight's (hi, lo), 0 for the filler; [R, 0, 2] without row_max).
std::tuple<at::Tensor, at::Tensor> shard_cut_candidates(const at::Tensor& logits, const at::Tensor& scale,
                                                        int64_t count, int64_t vocab_start, int64_t ignore_id = -1,
                                                        const std::optional<at::Tensor>& row_max = std::nullopt);

// How the library was built: version, whether CUDA kernels are compiled and
// for which architectures.
std::string build_info();

}  // namespace xkernels
