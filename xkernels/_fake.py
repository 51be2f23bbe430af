"""Fake (meta) kernels: output shapes and dtypes of each op, for FakeTensor and torch.compile.

They live in Python only; the library declares this module with set_python_module.
"""

import torch

from .reference.sampling import check_filter_order


def _same_device(like_name, like, **tensors):
    """Raises unless every given tensor is on like's device. A meta tensor among CPU ones sends the
    call here, not to the CPU kernel (the dispatcher picks the Meta kernel), and outputs never
    written would come back; the real kernels check the same on their own device."""
    for name, t in tensors.items():
        if t is not None:
            torch._check(t.device == like.device,
                         lambda: f"{name} must be on {like.device} like {like_name}, got {t.device}")


_PROBS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _probs_dtype(draft_probs):
    """The verify ops' draft probabilities: float32, bfloat16 or float16 (the kernels read each)."""
    if draft_probs is not None:
        torch._check(draft_probs.dtype in _PROBS_DTYPES,
                     lambda: f"draft_probs must be float32, bfloat16 or float16, got {draft_probs.dtype}")


def _errors(errors, n):
    """The asynchronous error flag's buffer, when given: int32 [N] (its device checked with the others)."""
    if errors is not None:
        torch._check(errors.dtype == torch.int32 and errors.dim() == 1 and errors.shape[0] == n,
                     lambda: f"errors must be int32 [N] = [{n}], got {errors.dtype} {list(errors.shape)}")


@torch.library.register_fake("xkernels::chain_verify")
def _chain_verify_fake(draft_tokens, target_logits, draft_probs=None, temperature=0.0, seed=0, offset=0,
                       seed_tensor=None, offset_tensor=None):
    _same_device("target_logits", target_logits, draft_tokens=draft_tokens, draft_probs=draft_probs, seed=seed_tensor,
                 offset=offset_tensor)
    _probs_dtype(draft_probs)
    torch._check(draft_tokens.dim() == 2, lambda: "draft_tokens must have shape [N, K]")
    torch._check(target_logits.dim() == 3, lambda: "target_logits must have shape [N, K+1, V]")
    n, k = draft_tokens.shape
    torch._check(target_logits.shape[0] == n and target_logits.shape[1] == k + 1,
                 lambda: "target_logits must have shape [N, K+1, V]")
    accept_len = draft_tokens.new_empty((n,))
    out_tokens = draft_tokens.new_empty((n, k + 1))
    return accept_len, out_tokens


@torch.library.register_fake("xkernels::chain_verify_ragged_")
def _chain_verify_ragged_fake(draft_tokens, cu_num_draft_tokens, target_logits, max_spec_len, draft_probs, temperature,
                              temperature_tensor, top_k, top_k_tensor, top_p, top_p_tensor, min_p, min_p_tensor, seed,
                              seed_tensor, offset, offset_tensor, block, output_token_ids, num_emitted, logprobs,
                              errors=None, filter_order="top_k_first"):
    _same_device("target_logits", target_logits, draft_tokens=draft_tokens, cu_num_draft_tokens=cu_num_draft_tokens,
                 draft_probs=draft_probs, temperature=temperature_tensor, top_k=top_k_tensor, top_p=top_p_tensor,
                 min_p=min_p_tensor, seed=seed_tensor, offset=offset_tensor, output_token_ids=output_token_ids,
                 num_emitted=num_emitted, logprobs=logprobs, errors=errors)
    _probs_dtype(draft_probs)
    torch._check(draft_tokens.dim() == 1, lambda: "draft_tokens must have shape [T]")
    torch._check(target_logits.dim() == 2, lambda: "target_logits must have shape [T + N, V]")
    _errors(errors, cu_num_draft_tokens.shape[0])
    check_filter_order(filter_order)
    return None  # logprobs and errors may be None: the kernels then neither compute nor write them


_WEIGHTS = ("emb", "mix", "w_gate", "w_up", "w_down", "w_read")


def _refine_outputs(ctx, base_logits, tokens_like, tokens_name, weights, temperature_tensor, top_k_tensor,
                    top_p_tensor, min_p_tensor, seed_tensor, offset_tensor, errors, filter_order):
    _same_device("ctx", ctx, base_logits=base_logits, **{tokens_name: tokens_like}, **dict(zip(_WEIGHTS, weights)),
                 temperature=temperature_tensor, top_k=top_k_tensor, top_p=top_p_tensor, min_p=min_p_tensor,
                 seed=seed_tensor, offset=offset_tensor, errors=errors)
    torch._check(ctx.dim() == 3 and base_logits.dim() == 3, lambda: "ctx and base_logits must be 3-D")
    n, d = base_logits.shape[0], base_logits.shape[1]
    _errors(errors, ctx.shape[0])
    check_filter_order(filter_order)
    return tokens_like.new_empty((n, d)), ctx.new_empty((n, d))


@torch.library.register_fake("xkernels::refine_step")
def _refine_step_fake(ctx, prev_tokens, base_logits, emb, mix, w_gate, w_up, w_down, w_read, temperature=0.0,
                      temperature_tensor=None, top_k=0, top_k_tensor=None, top_p=1.0, top_p_tensor=None, min_p=0.0,
                      min_p_tensor=None, seed=0, seed_tensor=None, offset=0, offset_tensor=None, errors=None,
                      filter_order="top_k_first"):
    return _refine_outputs(ctx, base_logits, prev_tokens, "prev_tokens", (emb, mix, w_gate, w_up, w_down, w_read),
                           temperature_tensor, top_k_tensor, top_p_tensor, min_p_tensor, seed_tensor, offset_tensor,
                           errors, filter_order)


@torch.library.register_fake("xkernels::jacobi_refine")
def _jacobi_refine_fake(ctx, prefix_tokens, base_logits, emb, mix, w_gate, w_up, w_down, w_read, max_iters,
                        temperature=0.0, temperature_tensor=None, top_k=0, top_k_tensor=None, top_p=1.0,
                        top_p_tensor=None, min_p=0.0, min_p_tensor=None, seed=0, seed_tensor=None, offset=0,
                        offset_tensor=None, errors=None, filter_order="top_k_first"):
    tokens, logprobs = _refine_outputs(ctx, base_logits, prefix_tokens, "prefix_tokens",
                                       (emb, mix, w_gate, w_up, w_down, w_read), temperature_tensor, top_k_tensor,
                                       top_p_tensor, min_p_tensor, seed_tensor, offset_tensor, errors, filter_order)
    return tokens, logprobs, prefix_tokens.new_empty((ctx.shape[0],), dtype=torch.int32)


@torch.library.register_fake("xkernels::sequential_refine")
def _sequential_refine_fake(ctx, prefix_tokens, base_logits, emb, mix, w_gate, w_up, w_down, w_read,
                            temperature=0.0, temperature_tensor=None, top_k=0, top_k_tensor=None, top_p=1.0,
                            top_p_tensor=None, min_p=0.0, min_p_tensor=None, seed=0, seed_tensor=None, offset=0,
                            offset_tensor=None, errors=None, filter_order="top_k_first"):
    return _refine_outputs(ctx, base_logits, prefix_tokens, "prefix_tokens", (emb, mix, w_gate, w_up, w_down, w_read),
                           temperature_tensor, top_k_tensor, top_p_tensor, min_p_tensor, seed_tensor, offset_tensor,
                           errors, filter_order)


@torch.library.register_fake("xkernels::build_draft_tree")
def _build_draft_tree_fake(topk_logprobs, topk_tokens, budget):
    _same_device("topk_logprobs", topk_logprobs, topk_tokens=topk_tokens)
    torch._check(topk_logprobs.dim() == 3, lambda: "topk_logprobs must have shape [N, D, k]")
    n, m = topk_logprobs.shape[0], budget + 1
    return (topk_tokens.new_empty((n, m)), topk_tokens.new_empty((n, m)), topk_tokens.new_empty((n,)),
            topk_tokens.new_empty((n, m)))


@torch.library.register_fake("xkernels::build_draft_tree_with_mask")
def _build_draft_tree_with_mask_fake(topk_logprobs, topk_tokens, budget, packed=False):
    tokens, parents, num_nodes, depth = _build_draft_tree_fake(topk_logprobs, topk_tokens, budget)
    return tokens, parents, num_nodes, depth, _tree_attention_mask_fake(parents, None, packed)


@torch.library.register_fake("xkernels::tree_attention_mask")
def _tree_attention_mask_fake(parents, num_nodes=None, packed=False):
    _same_device("parents", parents, num_nodes=num_nodes)
    torch._check(parents.dim() == 2, lambda: "parents must have shape [N, M]")
    n, m = parents.shape
    if packed:
        return parents.new_empty((n, m, (m + 7) // 8), dtype=torch.uint8)
    return parents.new_empty((n, m, m), dtype=torch.bool)


@torch.library.register_fake("xkernels::tree_positions")
def _tree_positions_fake(parents, num_nodes=None):
    _same_device("parents", parents, num_nodes=num_nodes)
    torch._check(parents.dim() == 2, lambda: "parents must have shape [N, M]")
    return parents.new_empty(parents.shape)


@torch.library.register_fake("xkernels::tree_verify")
def _tree_verify_fake(tokens, parents, target_logits, draft_probs=None, without_replacement=False, num_nodes=None,
                      temperature=0.0, temperature_tensor=None, top_k=0, top_k_tensor=None, top_p=1.0,
                      top_p_tensor=None, min_p=0.0, min_p_tensor=None, seed=0, seed_tensor=None, offset=0,
                      offset_tensor=None, errors=None, filter_order="top_k_first"):
    _same_device("target_logits", target_logits, tokens=tokens, parents=parents, draft_probs=draft_probs,
                 num_nodes=num_nodes, temperature=temperature_tensor, top_k=top_k_tensor, top_p=top_p_tensor,
                 min_p=min_p_tensor, seed=seed_tensor, offset=offset_tensor, errors=errors)
    _probs_dtype(draft_probs)
    torch._check(parents.dim() == 2, lambda: "parents must have shape [N, M]")
    n, m = parents.shape
    _errors(errors, n)
    check_filter_order(filter_order)
    return tokens.new_empty((n,)), tokens.new_empty((n, m)), tokens.new_empty((n, m))


@torch.library.register_fake("xkernels::compact_kv_")
def _compact_kv_fake(cache, path, accept_len, prefix_len):
    _same_device("cache", cache, path=path, accept_len=accept_len)
    return None


@torch.library.register_fake("xkernels::dllm_step")
def _dllm_step_fake(logits, block_tokens, mask_id, num_unmask, threshold, temperature, temperature_tensor, top_k,
                    top_k_tensor, top_p, top_p_tensor, min_p, min_p_tensor, seed, seed_tensor, offset, offset_tensor,
                    errors=None, filter_order="top_k_first"):
    _same_device("logits", logits, block_tokens=block_tokens, temperature=temperature_tensor, top_k=top_k_tensor,
                 top_p=top_p_tensor, min_p=min_p_tensor, seed=seed_tensor, offset=offset_tensor, errors=errors)
    torch._check(logits.dim() == 3, lambda: "logits must have shape [N, L, V]")
    n, length = logits.shape[0], logits.shape[1]
    _errors(errors, n)
    check_filter_order(filter_order)
    return (block_tokens.new_empty((n, length)), block_tokens.new_empty((n, length)),
            block_tokens.new_empty((n, length)), logits.new_empty((n, length), dtype=torch.float32))


@torch.library.register_fake("xkernels::spiffy_materialize")
def _spiffy_materialize_fake(logits, block_tokens, mask_id, graph_ranks, graph_child_ptr, graph_children, keep,
                             temperature, temperature_tensor, top_k, top_k_tensor, top_p, top_p_tensor, min_p,
                             min_p_tensor, errors=None, filter_order="top_k_first"):
    _same_device("logits", logits, block_tokens=block_tokens, graph_ranks=graph_ranks, graph_child_ptr=graph_child_ptr,
                 graph_children=graph_children, temperature=temperature_tensor, top_k=top_k_tensor,
                 top_p=top_p_tensor, min_p=min_p_tensor, errors=errors)
    torch._check(logits.dim() == 3, lambda: "logits must have shape [N, L, V]")
    n, length = logits.shape[0], logits.shape[1]
    _errors(errors, n)
    check_filter_order(filter_order)
    return (block_tokens.new_empty((n, keep, length)), block_tokens.new_empty((n, keep)),
            logits.new_empty((n, keep), dtype=torch.float32))


@torch.library.register_fake("xkernels::spiffy_accept")
def _spiffy_accept_fake(root_logits, draft_logits, draft_blocks, node_ids, block_tokens, mask_id, num_unmask,
                        threshold, temperature, temperature_tensor, top_k, top_k_tensor, top_p, top_p_tensor, min_p,
                        min_p_tensor, seed, seed_tensor, offset, offset_tensor, errors=None,
                        filter_order="top_k_first"):
    _same_device("root_logits", root_logits, draft_logits=draft_logits, draft_blocks=draft_blocks, node_ids=node_ids,
                 block_tokens=block_tokens, temperature=temperature_tensor, top_k=top_k_tensor, top_p=top_p_tensor,
                 min_p=min_p_tensor, seed=seed_tensor, offset=offset_tensor, errors=errors)
    torch._check(root_logits.dim() == 3, lambda: "root_logits must have shape [N, L, V]")
    n, length = root_logits.shape[0], root_logits.shape[1]
    _errors(errors, n)
    check_filter_order(filter_order)
    return (block_tokens.new_empty((n,)), block_tokens.new_empty((n, length)), block_tokens.new_empty((n, length)),
            block_tokens.new_empty((n, length)), block_tokens.new_empty((n,)))


@torch.library.register_fake("xkernels::spiffy_attention_mask")
def _spiffy_attention_mask_fake(prefix_lens, num_drafts, block_size, max_prefix_len, packed=False):
    q = (1 + num_drafts) * block_size
    k = max_prefix_len + q
    return prefix_lens.new_empty((prefix_lens.shape[0], q, (k + 7) // 8 if packed else k),
                                 dtype=torch.uint8 if packed else torch.bool)


@torch.library.register_fake("xkernels::shard_row_stats")
def _shard_row_stats_fake(logits, vocab_start, rows=None, exclude=None, draft_probs=None, residual_stats=None,
                          ignore_id=-1, sample=False, raw_stats=False, temperature=0.0, seed=0, offset=0,
                          seed_tensor=None, offset_tensor=None, temperature_tensor=None, cut_value=None, cut_id=None,
                          errors=None):
    _same_device("logits", logits, rows=rows, exclude=exclude, draft_probs=draft_probs, residual_stats=residual_stats,
                 seed=seed_tensor, offset=offset_tensor, temperature=temperature_tensor, cut_value=cut_value,
                 cut_id=cut_id, errors=errors)
    torch._check(logits.dim() == 3, lambda: "logits must have shape [N, R, V_local]")
    _errors(errors, logits.shape[0])
    shape = (logits.shape[0], logits.shape[1] if rows is None else rows.shape[1])
    f = lambda: logits.new_empty(shape, dtype=torch.float32)  # noqa: E731
    i = lambda: logits.new_empty(shape, dtype=torch.int64)  # noqa: E731
    return f(), f(), i(), f(), i(), f()


@torch.library.register_fake("xkernels::shard_cut_histogram")
def _shard_cut_histogram_fake(logits, scale, prefix, shift, vocab_start, ignore_id=-1, row_max=None, keep_value=None,
                              keep_id=None):
    _same_device("logits", logits, scale=scale, prefix=prefix, row_max=row_max, keep_value=keep_value,
                 keep_id=keep_id)
    torch._check(logits.dim() == 2, lambda: "logits must have shape [R, V_local]")
    return logits.new_empty((logits.shape[0], 2, 256), dtype=torch.int64)


@torch.library.register_fake("xkernels::shard_cut_candidates")
def _shard_cut_candidates_fake(logits, scale, count, vocab_start, ignore_id=-1, row_max=None):
    _same_device("logits", logits, scale=scale, row_max=row_max)
    torch._check(logits.dim() == 2, lambda: "logits must have shape [R, V_local]")
    torch._check(0 <= count <= 4096, lambda: f"count must be in [0, 4096], got {count}")
    rows = logits.shape[0]
    weights = (rows, count if row_max is not None else 0, 2)
    return logits.new_empty((rows, count), dtype=torch.int64), logits.new_empty(weights, dtype=torch.int64)


@torch.library.register_fake("xkernels::shard_cut_pick")
def _shard_cut_pick_fake(hist, prefix, before, target):
    _same_device("hist", hist, prefix=prefix, before=before, target=target)
    torch._check(hist.dim() == 3, lambda: "hist must have shape [R, P, 256]")
    return prefix.new_empty((hist.shape[0],)), before.new_empty((hist.shape[0], 2))
