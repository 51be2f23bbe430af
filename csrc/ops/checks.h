// Argument checks shared by the CPU and CUDA kernels of each op. They look only
// at metadata, never at values on the device (no host sync).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>

namespace xkernels {

// A tensor argument and its name in messages; an empty optional is an absent argument.
struct Arg {
  const at::Tensor* tensor;
  const char* name;
  Arg(const at::Tensor& t, const char* n) : tensor(&t), name(n) {}
  Arg(const std::optional<at::Tensor>& t, const char* n) : tensor(t.has_value() ? &*t : nullptr), name(n) {}
};

// Device first, as torch's ops check it: every op checks that its tensors are on `like`'s device
// ("<name> must be on <device> like <like_name>, got <device>") before any dtype or shape, so a
// tensor on the wrong device is reported as that whatever else is wrong with it, on every device.
void check_devices(const at::Tensor& like, const char* like_name, std::initializer_list<Arg> args);

// Whether XKERNELS_CHECK=1 asks the CUDA kernels for value checks that need a
// host sync (token ids in range).
bool value_checks_enabled();

// at::empty for an output whose size the arguments in `sized_by` set (say "budget = 5"): an
// allocation that fails raises an OutOfMemoryError naming them, not only the allocator's bytes.
at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options, const std::string& sized_by);

// No vocabulary reaches it (the ops take V < 2^31 - 1): ids at or past it, or negative, are no token's.
constexpr int64_t kMaxVocab = 2147483647;

// A vocabulary shard's logits (shard_row_stats, shard_cut_histogram): float32, bfloat16 or float16,
// and global ids vocab_start .. vocab_start + V_local (the last size) below 2^31.
void check_shard_logits(const at::Tensor& logits, int64_t vocab_start);

// A cut's ids as contiguous int32, ids past int32 clamped (past every vocabulary: the cut then keeps
// every tie of its value, as the int64 id would).
at::Tensor cut_ids_int32(const at::Tensor& ids);

// The Philox seed and offset of a call: the ints, or the tensors that override
// them (checked: int64, one element, on `device`).
struct RngArgs {
  uint64_t seed;
  uint64_t offset;
  const int64_t* seed_ptr;    // null: use `seed`
  const int64_t* offset_ptr;  // null: use `offset`
};
RngArgs rng_args(int64_t seed, int64_t offset, const std::optional<at::Tensor>& seed_tensor,
                 const std::optional<at::Tensor>& offset_tensor, const at::Device& device);

struct ChainVerifyShape {
  int64_t n, k, v;
};
ChainVerifyShape check_chain_verify(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                                    const std::optional<at::Tensor>& draft_probs, double temperature);


// The weight arguments of the refine kernels' signatures (as in the schemas; their sampling
// arguments are XK_SAMPLING_ARGS, ops/sampling_args.h).
#define XK_REFINE_WEIGHT_ARGS                                                                              \
  const at::Tensor &emb, const at::Tensor &mix, const at::Tensor &w_gate, const at::Tensor &w_up,          \
      const at::Tensor &w_down, const at::Tensor &w_read

// The refine ops: N sequences, B slots (the last D drafted, F = B - D fixed),
// rank r, SwiGLU hidden H, vocabulary V.
struct RefineShape {
  int64_t n, b, d, f, r, h, v;
};

// Checks ctx, the token tensor (`tokens_name`, [N, tokens_len]), base_logits and the
// weights. The tokens are [N, B] (prev_tokens) or, with tokens_are_prefix, [N, F+1].
RefineShape check_refine(const at::Tensor& ctx, const at::Tensor& tokens, const char* tokens_name,
                         bool tokens_are_prefix, const at::Tensor& base_logits, const at::Tensor& emb,
                         const at::Tensor& mix, const at::Tensor& w_gate, const at::Tensor& w_up,
                         const at::Tensor& w_down, const at::Tensor& w_read, double temperature);

// The float32 reciprocal of the temperature that the kernels scale logits by, or 0 for greedy.
// Raises unless temperature is finite and >= 0. A positive temperature whose reciprocal
// overflows float32 (below about 2.9e-39) is greedy too: the limit of sampling as T -> 0.
float inverse_temperature(double temperature);

// The draft-tree ops (csrc/ops/tree.cpp).
struct DraftTreeShape {
  int64_t n, d, k, budget;
};
DraftTreeShape check_build_draft_tree(const at::Tensor& topk_logprobs, const at::Tensor& topk_tokens, int64_t budget);
// The outputs both kernels fill (tokens, parents, depth [N, budget + 1], num_nodes [N], and with
// mask_packed the mask of build_draft_tree_with_mask: uint8 [N, M, ceil(M/8)] packed, else bool
// [N, M, M]; undefined without); a budget too large to allocate raises naming it.
struct DraftTreeOutputs {
  at::Tensor tokens, parents, num_nodes, depth, mask;
  // The ops' returns: build_draft_tree's, and build_draft_tree_with_mask's with the mask.
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> tree() const {
    return {tokens, parents, num_nodes, depth};
  }
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> tree_and_mask() const {
    return {tokens, parents, num_nodes, depth, mask};
  }
};
DraftTreeOutputs draft_tree_outputs(const at::Tensor& topk_tokens, const DraftTreeShape& s,
                                    std::optional<bool> mask_packed = std::nullopt);

struct TreeShape {
  int64_t n, m;
};
// Metadata of a tree: parents int64 [N, M], num_nodes int64 [N] (optional).
TreeShape check_tree(const at::Tensor& parents, const std::optional<at::Tensor>& num_nodes, const char* parents_name);
// Values of a tree (reads them: a host sync on CUDA): num_nodes in [1, M], parents[:, 0] = -1 and
// 0 <= parents[i] < i for the real nodes.
void check_tree_values(const at::Tensor& parents, const std::optional<at::Tensor>& num_nodes,
                       const char* parents_name);

// tree_verify's arguments (metadata only); returns V.
int64_t check_tree_verify(const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& target_logits,
                          const std::optional<at::Tensor>& draft_probs,
                          const std::optional<at::Tensor>& num_nodes);
// The tokens of real nodes but the root lie in [0, vocab) (reads the values).
void check_tree_tokens(const at::Tensor& tokens, const std::optional<at::Tensor>& num_nodes, int64_t vocab);
// compact_kv_'s arguments (metadata only; a cache whose elements share memory, as an expanded
// tensor's do, is refused like torch's in-place ops refuse it).
void check_compact_kv(const at::Tensor& cache, const at::Tensor& path, const at::Tensor& accept_len,
                      int64_t prefix_len);

// dllm_step's arguments (metadata): logits [N, L, V] (named logits_name in messages), block_tokens
// [N, L]. The block's ids are values: check_block_tokens.
struct DllmShape {
  int64_t n, l, v;
};
DllmShape check_dllm_step(const at::Tensor& logits, const at::Tensor& block_tokens, int64_t num_unmask,
                          std::optional<double> threshold, const char* logits_name = "logits");
// The block's ids but mask_id lie in [0, V) (reads the values: a host sync on CUDA). mask_id may lie
// outside (a head without the mask token). The kernels only compare ids with mask_id and copy
// them, so unchecked ids are memory-safe.
void check_block_tokens(const at::Tensor& block_tokens, int64_t mask_id, int64_t vocab);
// The contiguous block and the outputs both kernels fill: new_block (a copy of the block),
// positions and tokens (-1), confidence.
struct DllmOutputs {
  at::Tensor block, new_block, positions, tokens, confidence;
};
DllmOutputs dllm_outputs(const at::Tensor& logits, const at::Tensor& block_tokens, const DllmShape& s);

// spiffy_materialize's arguments (metadata; with check_values the graph's and the block's values
// too, a host read).
struct SpiffyShape {
  int64_t n, l, v, g, k, e;
};
SpiffyShape check_spiffy_materialize(const at::Tensor& logits, const at::Tensor& block_tokens, int64_t mask_id,
                                     const at::Tensor& graph_ranks, const at::Tensor& graph_child_ptr,
                                     const at::Tensor& graph_children, int64_t keep, bool check_values);
// spiffy_accept's arguments (metadata only): N, L, V, and K drafts.
struct SpiffyAcceptShape {
  int64_t n, l, v, k;
};
SpiffyAcceptShape check_spiffy_accept(const at::Tensor& root_logits, const at::Tensor& draft_logits,
                                      const at::Tensor& draft_blocks, const at::Tensor& node_ids,
                                      const at::Tensor& block_tokens, int64_t num_unmask,
                                      std::optional<double> threshold);
// The outputs both kernels fill, as spiffy_materialize leaves unused slots (node -1, score 0; the
// drafts are written in full) and as spiffy_accept starts (the block, 0 steps, -1 elsewhere).
struct SpiffyMaterializeOutputs {
  at::Tensor drafts, node_ids, scores;
};
SpiffyMaterializeOutputs spiffy_materialize_outputs(const at::Tensor& logits, const at::Tensor& block_tokens,
                                                    int64_t keep);
struct SpiffyAcceptOutputs {
  at::Tensor num_steps, positions, tokens, new_block, continue_from;
};
SpiffyAcceptOutputs spiffy_accept_outputs(const at::Tensor& block_tokens);
void check_spiffy_attention_mask(const at::Tensor& prefix_lens, int64_t num_drafts, int64_t block_size,
                                 int64_t max_prefix_len);
// The mask both kernels fill, [N, Q, K] or packed [N, Q, ceil(K / 8)] (a size too large to
// allocate raises naming the arguments).
at::Tensor spiffy_mask_output(const at::Tensor& prefix_lens, int64_t num_drafts, int64_t block_size,
                              int64_t max_prefix_len, bool packed);

// Raises if any id of `tokens` lies outside [0, vocab) (reads the values).
void check_token_ids(const at::Tensor& tokens, int64_t vocab, const char* name);

// Draft probabilities of a verify op: float32, bfloat16 or float16 (the kernels read them in their
// dtype; an EAGLE drafter's are bfloat16).
void check_probs_dtype(const at::Tensor& probs, const char* name);

}  // namespace xkernels
