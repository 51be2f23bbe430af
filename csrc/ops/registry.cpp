// The schemas of every xkernels op. Kernels register per dispatch key in
// csrc/cpu and csrc/cuda; fake kernels live in Python (xkernels/_fake.py).
#include <torch/library.h>

#include <string>

#include "refine_read.h"
#include "xkernels/ops.h"

#ifndef XK_VERSION
#define XK_VERSION "unknown"
#endif
#ifndef XK_CUDA_ARCHS
#define XK_CUDA_ARCHS ""
#endif

namespace xkernels {

std::string build_info() {
#ifdef XK_WITH_CUDA
  const char* cuda = "yes";
#else
  const char* cuda = "no";
#endif
#ifdef _OPENMP
  const char* threads = "openmp";  // at::parallel_for forks torch's threads
#else
  const char* threads = "one";
#endif
  return std::string("version=") + XK_VERSION + ";cuda=" + cuda + ";cuda_archs=" + XK_CUDA_ARCHS +
         ";cpu_threads=" + threads + ";cpu_read=" + (cpu_read_fused() ? "avx512" : "sliced");
}

TORCH_LIBRARY(xkernels, m) {
  m.set_python_module("xkernels._fake");
  m.def("build_info() -> str", &build_info);
  m.def(
      "chain_verify(Tensor draft_tokens, Tensor target_logits, Tensor? draft_probs=None, "
      "float temperature=0.0, int seed=0, int offset=0, Tensor? seed_tensor=None, "
      "Tensor? offset_tensor=None) -> (Tensor accept_len, Tensor out_tokens)");
  m.def(
      "chain_verify_ragged_(Tensor draft_tokens, Tensor cu_num_draft_tokens, Tensor target_logits, "
      "int max_spec_len, Tensor? draft_probs, float temperature, Tensor? temperature_tensor, int top_k, "
      "Tensor? top_k_tensor, float top_p, Tensor? top_p_tensor, float min_p, Tensor? min_p_tensor, int seed, "
      "Tensor? seed_tensor, int offset, Tensor? offset_tensor, bool block, Tensor(a!) output_token_ids, "
      "Tensor(b!) num_emitted, Tensor(c!)? logprobs, Tensor(d!)? errors=None, "
      "str filter_order=\"top_k_first\") -> ()");
  m.def(
      "refine_step(Tensor ctx, Tensor prev_tokens, Tensor base_logits, Tensor emb, Tensor mix, Tensor w_gate, "
      "Tensor w_up, Tensor w_down, Tensor w_read, "
      "float temperature=0.0, Tensor? temperature_tensor=None, int top_k=0, Tensor? top_k_tensor=None, "
      "float top_p=1.0, Tensor? top_p_tensor=None, float min_p=0.0, Tensor? min_p_tensor=None, int seed=0, "
      "Tensor? seed_tensor=None, int offset=0, Tensor? offset_tensor=None, Tensor(a!)? errors=None, "
      "str filter_order=\"top_k_first\") "
      "-> (Tensor tokens, Tensor logprobs)");
  m.def(
      "jacobi_refine(Tensor ctx, Tensor prefix_tokens, Tensor base_logits, Tensor emb, Tensor mix, "
      "Tensor w_gate, Tensor w_up, Tensor w_down, Tensor w_read, int max_iters, "
      "float temperature=0.0, Tensor? temperature_tensor=None, int top_k=0, Tensor? top_k_tensor=None, "
      "float top_p=1.0, Tensor? top_p_tensor=None, float min_p=0.0, Tensor? min_p_tensor=None, int seed=0, "
      "Tensor? seed_tensor=None, int offset=0, Tensor? offset_tensor=None, Tensor(a!)? errors=None, "
      "str filter_order=\"top_k_first\") "
      "-> (Tensor tokens, Tensor logprobs, Tensor iters)");
  m.def(
      "sequential_refine(Tensor ctx, Tensor prefix_tokens, Tensor base_logits, Tensor emb, Tensor mix, "
      "Tensor w_gate, Tensor w_up, Tensor w_down, Tensor w_read, "
      "float temperature=0.0, Tensor? temperature_tensor=None, int top_k=0, Tensor? top_k_tensor=None, "
      "float top_p=1.0, Tensor? top_p_tensor=None, float min_p=0.0, Tensor? min_p_tensor=None, int seed=0, "
      "Tensor? seed_tensor=None, int offset=0, Tensor? offset_tensor=None, Tensor(a!)? errors=None, "
      "str filter_order=\"top_k_first\") "
      "-> (Tensor tokens, Tensor logprobs)");
  m.def(
      "build_draft_tree(Tensor topk_logprobs, Tensor topk_tokens, int budget) "
      "-> (Tensor tokens, Tensor parents, Tensor num_nodes, Tensor depth)");
  m.def(
      "build_draft_tree_with_mask(Tensor topk_logprobs, Tensor topk_tokens, int budget, bool packed=False) "
      "-> (Tensor tokens, Tensor parents, Tensor num_nodes, Tensor depth, Tensor mask)");
  m.def("tree_attention_mask(Tensor parents, Tensor? num_nodes=None, bool packed=False) -> Tensor");
  m.def("tree_positions(Tensor parents, Tensor? num_nodes=None) -> Tensor");
  m.def(
      "tree_verify(Tensor tokens, Tensor parents, Tensor target_logits, Tensor? draft_probs=None, "
      "bool without_replacement=False, Tensor? num_nodes=None, float temperature=0.0, "
      "Tensor? temperature_tensor=None, int top_k=0, Tensor? top_k_tensor=None, float top_p=1.0, "
      "Tensor? top_p_tensor=None, float min_p=0.0, Tensor? min_p_tensor=None, int seed=0, Tensor? seed_tensor=None, "
      "int offset=0, Tensor? offset_tensor=None, Tensor(a!)? errors=None, str filter_order=\"top_k_first\") "
      "-> (Tensor accept_len, Tensor path, Tensor out_tokens)");
  m.def("compact_kv_(Tensor(a!) cache, Tensor path, Tensor accept_len, int prefix_len) -> ()");
  m.def(
      "dllm_step(Tensor logits, Tensor block_tokens, int mask_id, int num_unmask, float? threshold, "
      "float temperature, Tensor? temperature_tensor, int top_k, Tensor? top_k_tensor, float top_p, "
      "Tensor? top_p_tensor, float min_p, Tensor? min_p_tensor, int seed, Tensor? seed_tensor, int offset, "
      "Tensor? offset_tensor, Tensor(a!)? errors=None, str filter_order=\"top_k_first\") "
      "-> (Tensor new_block, Tensor positions, Tensor tokens, Tensor confidence)");
  m.def(
      "spiffy_materialize(Tensor logits, Tensor block_tokens, int mask_id, Tensor graph_ranks, "
      "Tensor graph_child_ptr, Tensor graph_children, int keep, float temperature, Tensor? temperature_tensor, "
      "int top_k, Tensor? top_k_tensor, float top_p, Tensor? top_p_tensor, float min_p, Tensor? min_p_tensor, "
      "Tensor(a!)? errors=None, str filter_order=\"top_k_first\") "
      "-> (Tensor draft_blocks, Tensor node_ids, Tensor scores)");
  m.def(
      "spiffy_accept(Tensor root_logits, Tensor draft_logits, Tensor draft_blocks, Tensor node_ids, "
      "Tensor block_tokens, int mask_id, int num_unmask, float? threshold, float temperature, "
      "Tensor? temperature_tensor, int top_k, Tensor? top_k_tensor, float top_p, Tensor? top_p_tensor, "
      "float min_p, Tensor? min_p_tensor, int seed, Tensor? seed_tensor, int offset, Tensor? offset_tensor, "
      "Tensor(a!)? errors=None, str filter_order=\"top_k_first\") -> (Tensor num_steps, Tensor positions, "
      "Tensor tokens, Tensor new_block, Tensor continue_from)");
  m.def(
      "spiffy_attention_mask(Tensor prefix_lens, int num_drafts, int block_size, int max_prefix_len, "
      "bool packed=False) -> Tensor");
  m.def(
      "shard_row_stats(Tensor logits, int vocab_start, Tensor? rows=None, Tensor? exclude=None, "
      "Tensor? draft_probs=None, Tensor? residual_stats=None, int ignore_id=-1, bool sample=False, "
      "bool raw_stats=False, float temperature=0.0, int seed=0, int offset=0, Tensor? seed_tensor=None, "
      "Tensor? offset_tensor=None, Tensor? temperature_tensor=None, Tensor? cut_value=None, Tensor? cut_id=None, "
      "Tensor(a!)? errors=None) -> (Tensor row_max, Tensor row_sum, Tensor top_id, Tensor pick_score, "
      "Tensor pick_id, Tensor pick_logit)");
  m.def(
      "shard_cut_histogram(Tensor logits, Tensor scale, Tensor prefix, int shift, int vocab_start, "
      "int ignore_id=-1, Tensor? row_max=None, Tensor? keep_value=None, Tensor? keep_id=None) -> Tensor");
  m.def("shard_cut_pick(Tensor hist, Tensor prefix, Tensor before, Tensor target) -> (Tensor prefix, Tensor before)");
  m.def(
      "shard_cut_candidates(Tensor logits, Tensor scale, int count, int vocab_start, int ignore_id=-1, "
      "Tensor? row_max=None) -> (Tensor keys, Tensor weights)");
}

}  // namespace xkernels
