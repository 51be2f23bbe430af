"""Typed Python entry points of the xkernels ops."""

from typing import Optional, Tuple, Union

import torch

Seed = Union[int, torch.Tensor]


def _tensor(value, name: str):
    """Tensors pass through; other arrays (CuPy, NumPy, JAX) come in zero-copy through DLPack."""
    if value is None or isinstance(value, torch.Tensor):
        return value
    if hasattr(value, "__dlpack__"):
        return torch.from_dlpack(value)
    raise TypeError(f"{name} must be a torch.Tensor or support DLPack, got {type(value).__name__}")


def _rng(value: Seed, name: str):
    """An int goes in the int argument; a tensor overrides it at run time (CUDA-graph friendly)."""
    if isinstance(value, torch.Tensor) or hasattr(value, "__dlpack__"):
        return 0, _tensor(value, name)
    value = int(value)
    if not -(2**63) <= value < 2**64:
        raise ValueError(f"{name} must fit in 64 bits, got {value}")
    return (value - 2**64 if value >= 2**63 else value), None


def _rng_args(seed: Seed, offset: Seed):
    """The schema's (seed, offset, seed_tensor, offset_tensor) from Python ints or tensors."""
    seed_int, seed_tensor = _rng(seed, "seed")
    offset_int, offset_tensor = _rng(offset, "offset")
    return seed_int, offset_int, seed_tensor, offset_tensor


def chain_verify(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    draft_probs: Optional[torch.Tensor] = None,
    temperature: float = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Verify a chain of K draft tokens per sequence against the target's logits.

    Args:
        draft_tokens: int64 ``[N, K]``.
        target_logits: float32, bfloat16 or float16 ``[N, K+1, V]``; row ``i`` holds the
            target's next-token logits after the prefix plus the first ``i`` drafts.
        draft_probs: optional float32 ``[N, K, V]``, the distributions the drafts were
            sampled from. Without it the drafts are treated as deterministic proposals.
        temperature: 0 for greedy verification (ties go to the lowest index).
        Arrays of other libraries (CuPy, NumPy) are taken zero-copy through DLPack.
        seed, offset: the Philox stream (ints, or one-element int64 tensors on the logits'
            device that a captured CUDA graph can advance in place).

    Returns:
        ``accept_len`` int64 ``[N]`` in ``[0, K]`` and ``out_tokens`` int64 ``[N, K+1]``:
        the accepted drafts, then the correction (or bonus) token, then -1. Each sequence
        emits ``accept_len + 1`` tokens.

    At ``temperature > 0`` the emitted tokens are distributed exactly as sampling the
    target one token at a time: draft ``x_i`` is accepted when ``u * q_i(x_i) < p_i(x_i)``
    (``u < p_i(x_i)`` without draft_probs), and the first rejection draws from
    ``normalize(max(p_i - q_i, 0))`` (``p_i`` without ``x_i`` without draft_probs).
    A row whose softmax is undefined (a NaN, a +inf, or all -inf) is treated as a point
    mass at its ``torch.argmax``. Draft ids outside ``[0, V)`` raise on the CPU; on CUDA
    they are checked only with ``XKERNELS_CHECK=1`` (a host sync) and are otherwise
    rejected without being read.
    """
    return torch.ops.xkernels.chain_verify.default(
        _tensor(draft_tokens, "draft_tokens"), _tensor(target_logits, "target_logits"),
        _tensor(draft_probs, "draft_probs"), float(temperature), *_rng_args(seed, offset))


def build_info() -> dict:
    """How libxkernels was built: version, whether CUDA kernels are in, and their architectures;
    cpu_threads ("openmp": the CPU kernels use torch's intra-op threads; "one") and cpu_read (the
    CPU's greedy float32 refine read: "avx512", one fused kernel, or "sliced": GEMM then epilogue)."""
    fields = dict(item.split("=", 1) for item in torch.ops.xkernels.build_info.default().split(";"))
    fields["cuda"] = fields["cuda"] == "yes"
    return fields


def _weights(weights):
    from .refiner import RefinerWeights

    if not isinstance(weights, RefinerWeights):
        raise TypeError(f"weights must be an xkernels.RefinerWeights (see XPressRefiner.fold), got {type(weights).__name__}")
    return tuple(_tensor(w, name) for w, name in zip(weights, weights._fields))


def refine_step(
    ctx: torch.Tensor,
    prev_tokens: torch.Tensor,
    base_logits: torch.Tensor,
    weights,
    *,
    temperature: float = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One xPress refinement pass over a block of B slots whose last D are drafted.

    Args:
        ctx: float32 ``[N, B, r]``, the pass-invariant context (``XPressRefiner.prepare``).
        prev_tokens: int64 ``[N, B]``; slot ``k`` reads the token of slot ``k-1`` (slot 0 the
            token before the block).
        base_logits: float32, bfloat16 or float16 ``[N, D, V]``, the drafter's logits.
        weights: ``xkernels.RefinerWeights`` (``XPressRefiner.fold()``), float32 or bfloat16.
        temperature: 0 for greedy.
        seed, offset: the Philox stream; the Gumbel noise is keyed by (sequence, drafted slot, id).

    Returns:
        ``tokens`` int64 ``[N, D]`` = argmax(l / T + G) (argmax l at T = 0) and ``logprobs``
        float32 ``[N, D]`` = log_softmax(l / T)[token] (log_softmax(l) at T = 0), where
        ``l = base_logits + w_read z``. The ``[N, D, V]`` refined logits are never written.
    """
    return torch.ops.xkernels.refine_step.default(
        _tensor(ctx, "ctx"), _tensor(prev_tokens, "prev_tokens"), _tensor(base_logits, "base_logits"),
        *_weights(weights), float(temperature), *_rng_args(seed, offset))


def jacobi_refine(
    ctx: torch.Tensor,
    prefix_tokens: torch.Tensor,
    base_logits: torch.Tensor,
    weights,
    *,
    max_iters: int,
    temperature: float = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched Jacobi refinement with a per-sequence early stop.

    ``prefix_tokens`` int64 ``[N, F+1]`` holds the token before the block and the ``F = B - D``
    fixed slots. The iterate starts at the drafter's own sample ``x0 = argmax(s / T + G)``; every
    pass recomputes all drafted slots from the previous iterate (the same noise ``G`` each pass).
    A sequence stops after a pass that changes none of its tokens; converged sequences cost no
    further work. With ``max_iters >= D`` the result equals ``sequential_refine``.

    Returns ``tokens`` int64 ``[N, D]``, ``logprobs`` float32 ``[N, D]`` (of the last pass each
    sequence ran; the drafter's own at ``max_iters = 0``) and ``iters`` int32 ``[N]`` (passes run).
    """
    return torch.ops.xkernels.jacobi_refine.default(
        _tensor(ctx, "ctx"), _tensor(prefix_tokens, "prefix_tokens"), _tensor(base_logits, "base_logits"),
        *_weights(weights), int(max_iters), float(temperature), *_rng_args(seed, offset))


def sequential_refine(
    ctx: torch.Tensor,
    prefix_tokens: torch.Tensor,
    base_logits: torch.Tensor,
    weights,
    *,
    temperature: float = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Left-to-right refinement, one drafted slot per step (the DSpark Markov-head style decode
    that ``jacobi_refine`` converges to). Arguments and results as in ``jacobi_refine``."""
    return torch.ops.xkernels.sequential_refine.default(
        _tensor(ctx, "ctx"), _tensor(prefix_tokens, "prefix_tokens"), _tensor(base_logits, "base_logits"),
        *_weights(weights), float(temperature), *_rng_args(seed, offset))


# ---- draft trees (format: xkernels/tree.py) ----


def build_draft_tree(topk_logprobs: torch.Tensor, topk_tokens: torch.Tensor, budget: int):
    """DDTree's best-first draft tree over per-slot candidates, built on the tensors' device.

    Args:
        topk_logprobs: float32 ``[N, D, k]``, each slot's candidate log-probs sorted descending.
        topk_tokens: int64 ``[N, D, k]``, the candidates.
        budget: draft nodes to add (the tree has ``M = budget + 1`` nodes with the root).

    Returns ``(tokens, parents, num_nodes, depth)``: int64 ``[N, M]``, ``[N, M]``, ``[N]``,
    ``[N, M]``. A node's score is the sum of its path's log-probs; the tree holds the ``budget``
    best prefixes (ties: the candidate pushed first). The root's token is -1: it is the caller's
    last committed token. Fewer nodes than M (a tiny D * k) leave padding (-1, -1, 0)."""
    return torch.ops.xkernels.build_draft_tree.default(
        _tensor(topk_logprobs, "topk_logprobs"), _tensor(topk_tokens, "topk_tokens"), int(budget))


def tree_attention_mask(parents: torch.Tensor, *, num_nodes: Optional[torch.Tensor] = None,
                        layout: str = "bool") -> torch.Tensor:
    """Node ``i`` may attend to node ``j`` iff ``j`` is ``i`` or an ancestor of ``i``.

    ``layout="bool"``: bool ``[N, M, M]``; ``layout="packed"``: uint8 ``[N, M, ceil(M/8)]``, bit
    ``j % 8`` of byte ``j // 8`` (little-endian, the layout of FlashInfer's and SGLang's custom
    masks). Padding nodes (``i >= num_nodes``) see themselves only. Raises on an invalid tree."""
    if layout not in ("bool", "packed"):
        raise ValueError(f"layout must be 'bool' or 'packed', got {layout!r}")
    return torch.ops.xkernels.tree_attention_mask.default(
        _tensor(parents, "parents"), _tensor(num_nodes, "num_nodes"), layout == "packed")


def tree_positions(parents: torch.Tensor, *, num_nodes: Optional[torch.Tensor] = None) -> torch.Tensor:
    """int64 ``[N, M]``: each node's depth (root 0, padding 0), its rotary position after the prefix."""
    return torch.ops.xkernels.tree_positions.default(_tensor(parents, "parents"), _tensor(num_nodes, "num_nodes"))


def tree_verify(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    draft_probs: Optional[torch.Tensor] = None,
    without_replacement: bool = False,
    temperature: float = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
    num_nodes: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless verification of a draft tree in one pass over the rows it visits.

    Args:
        tokens, parents: int64 ``[N, M]``, the tree (``xkernels/tree.py``); tokens of real nodes
            but the root lie in ``[0, V)``.
        target_logits: ``[N, M, V]``, the target's next-token logits after each node's path.
        draft_probs: float32 ``[N, M, V]``: row ``i`` is the distribution the children of node
            ``i`` were drawn from (i.i.d., or ``without_replacement``); entries >= 0, each row is
            divided by its sum (a row summing to 0 proposes nothing: its children are rejected).
            Without it the children are deterministic proposals (top-k, a best-first tree).
        temperature, seed, offset: as in ``chain_verify``.
        num_nodes: int64 ``[N]``, nodes at or past it are padding.

    Returns ``(accept_len [N], path [N, M], out_tokens [N, M])``: the accepted drafts' count, the
    accepted nodes from the root (-1 padded), and the accepted tokens then the correction or bonus
    token (-1 padded). At ``T = 0`` the walk follows the first child whose token is the target's
    argmax; at ``T > 0`` the emitted tokens follow the target's distribution exactly (rules in
    ``csrc/include/xkernels/tree.h``). On CUDA an invalid tree or out-of-range token is handled
    memory-safely and raises only with ``XKERNELS_CHECK=1``."""
    seed_int, offset_int, seed_tensor, offset_tensor = _rng_args(seed, offset)
    return torch.ops.xkernels.tree_verify.default(
        _tensor(tokens, "tokens"), _tensor(parents, "parents"), _tensor(target_logits, "target_logits"),
        _tensor(draft_probs, "draft_probs"), bool(without_replacement), float(temperature), seed_int, offset_int,
        _tensor(num_nodes, "num_nodes"), seed_tensor, offset_tensor)


def compact_kv_(cache: torch.Tensor, path: torch.Tensor, accept_len: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """In place on ``cache [N, H, L, d]``: entries ``prefix_len + path[n, j]`` move to
    ``prefix_len + j`` for ``j = 0..accept_len[n]`` (the root and the accepted nodes of
    ``tree_verify``, now contiguous behind the prefix). Returns ``cache``."""
    torch.ops.xkernels.compact_kv_.default(cache, _tensor(path, "path"), _tensor(accept_len, "accept_len"),
                                           int(prefix_len))
    return cache


# ---- diffusion LLMs ----


def dllm_step(
    logits: torch.Tensor,
    block_tokens: torch.Tensor,
    mask_id: int,
    *,
    num_unmask: int = 1,
    threshold: Optional[float] = None,
    temperature: float = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of a masked diffusion LM's block decoding: LLaDA's low-confidence unmasking.

    Args:
        logits: float32, bfloat16 or float16 ``[N, L, V]``, the model's logits at the block's L
            positions.
        block_tokens: int64 ``[N, L]``, the block so far (``mask_id`` where still masked).
        num_unmask: how many masked positions to unmask (all if fewer are masked).
        threshold: instead, unmask every masked position whose confidence exceeds it, and at
            least the most confident one (Fast-dLLM's parallel decoding).
        temperature, seed, offset: ``x0 = argmax(logits / T + G)`` with the Gumbel noise of
            (sequence, position) from the package's Philox stream (none at ``T = 0``); a loop
            passes an offset fixed by (block, step). The mask token is never picked (its logit
            counts as -inf), so every step unmasks for real.

    Returns ``(new_block, positions, tokens, confidence)``: the block with the chosen positions
    unmasked; the chosen positions ascending and their tokens, int64 ``[N, L]``, -1 padded; and
    float32 ``[N, L]`` confidences ``softmax(logits)[x0]`` (the untempered softmax, as LLaDA and
    Fast-dLLM score it; -inf at unmasked positions, NaN for a row without a softmax, which ranks
    last). Ties go to the lower position."""
    return torch.ops.xkernels.dllm_step.default(
        _tensor(logits, "logits"), _tensor(block_tokens, "block_tokens"), int(mask_id), int(num_unmask),
        None if threshold is None else float(threshold), float(temperature), *_rng_args(seed, offset))


# ---- Spiffy ----


def spiffy_materialize(
    logits: torch.Tensor,
    block_tokens: torch.Tensor,
    mask_id: int,
    graph,
    *,
    keep: int,
    temperature: float = 0.0,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fills a Spiffy draft graph with concrete drafts and keeps the most promising.

    Args:
        logits: ``[N, L, V]`` step distribution at the root (the block as it is).
        block_tokens: int64 ``[N, L]``, the block (``mask_id`` where masked).
        graph: a :class:`xkernels.spiffy.DraftGraph` on logits' device.
        keep: how many drafts to keep (at most the graph's nodes besides the root).
        temperature: scores use ``softmax(logits / T)`` (``softmax(logits)`` at ``T = 0``).

    Node ranks (i, j) become positions and tokens: position rank i orders the masked positions
    by the untempered top-1 probability (higher first, ties to the lower position), vocabulary
    rank j orders a position's tokens by logit (ties to the lower id). A node's score is the
    geometric mean of its tokens' probabilities combined by geometric mean with its best child's
    score; nodes are kept best first from a frontier that starts at the root's children, so every
    kept node is a child of the root or of a kept node.

    Returns ``(draft_blocks [N, keep, L], node_ids [N, keep], scores [N, keep] float32)``, in the
    order kept; a slot left over when the frontier runs out holds the block itself, node -1 and
    score 0."""
    return torch.ops.xkernels.spiffy_materialize.default(
        _tensor(logits, "logits"), _tensor(block_tokens, "block_tokens"), int(mask_id), graph.ranks,
        graph.child_ptr, graph.children, int(keep), float(temperature))


def spiffy_accept(
    root_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_blocks: torch.Tensor,
    node_ids: torch.Tensor,
    block_tokens: torch.Tensor,
    mask_id: int,
    *,
    num_unmask: int = 1,
    threshold: Optional[float] = None,
    temperature: float = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Spiffy's verification: commits every step that one-step-per-call decoding would take and
    whose logits the forward already computed.

    Takes :func:`dllm_step`'s step (same ``num_unmask``, ``threshold``, ``temperature``, ``seed``;
    offset ``offset + d`` at the d-th step) from ``root_logits [N, L, V]``; while the new block
    equals a kept draft (``draft_blocks [N, K, L]`` with ``node_ids [N, K] >= 0``), takes the next
    step from that draft's logits (``draft_logits [N, K, L, V]``, computed in the same forward for
    exactly that block). Lossless at any temperature: each committed step is dllm_step's on the
    true logits of the block reached.

    Returns ``(num_steps [N], positions [N, L], tokens [N, L], new_block [N, L], continue_from
    [N])``: the steps taken, the unmasked positions and their tokens in the order committed (-1
    padded), the new block, and the draft whose logits gave the last step (-1: the root)."""
    return torch.ops.xkernels.spiffy_accept.default(
        _tensor(root_logits, "root_logits"), _tensor(draft_logits, "draft_logits"),
        _tensor(draft_blocks, "draft_blocks"), _tensor(node_ids, "node_ids"), _tensor(block_tokens, "block_tokens"),
        int(mask_id), int(num_unmask), None if threshold is None else float(threshold), float(temperature),
        *_rng_args(seed, offset))


def spiffy_attention_mask(
    num_drafts: int,
    block_size: int,
    prefix_len,
    *,
    max_prefix_len: Optional[int] = None,
    layout: str = "bool",
    device=None,
) -> torch.Tensor:
    """The attention mask of one forward over ``[prefix, real block, num_drafts draft copies]``
    (each copy ``block_size`` tokens at the block's positions): every query sees the prefix and its
    own copy of the block (bidirectionally), never another copy; so the real block never sees the
    drafts and a draft never sees the real block.

    ``prefix_len`` is an int (one sequence) or int64 ``[N]`` per sequence (keys past a sequence's
    prefix, up to ``max_prefix_len``, are padding). Returns bool ``[Q, K]`` for an int (``[N, Q,
    K]`` for a tensor), ``Q = (1 + num_drafts) * block_size``, ``K = max_prefix_len + Q``; with
    ``layout="packed"`` uint8 rows of ``ceil(K / 8)`` bytes, bit ``k % 8`` of byte ``k / 8`` (as
    tree_attention_mask)."""
    if layout not in ("bool", "packed"):
        raise ValueError(f"layout must be 'bool' or 'packed', got {layout!r}")
    single = not isinstance(prefix_len, torch.Tensor)
    lens = torch.tensor([int(prefix_len)], device=device) if single else _tensor(prefix_len, "prefix_len")
    if max_prefix_len is None:
        if not single:
            raise ValueError("spiffy_attention_mask: give max_prefix_len with a prefix_len tensor")
        max_prefix_len = int(prefix_len)
    mask = torch.ops.xkernels.spiffy_attention_mask.default(lens, int(num_drafts), int(block_size),
                                                            int(max_prefix_len), layout == "packed")
    return mask[0] if single else mask


# ---- vocabulary-parallel sampling (xkernels/distributed.py) ----


def shard_row_stats(
    logits: torch.Tensor,
    vocab_start: int,
    *,
    rows: Optional[torch.Tensor] = None,
    exclude: Optional[torch.Tensor] = None,
    draft_probs: Optional[torch.Tensor] = None,
    residual_stats: Optional[torch.Tensor] = None,
    ignore_id: int = -1,
    sample: bool = False,
    raw_stats: bool = False,
    temperature: float = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
):
    """The per-shard pass of vocabulary-parallel verification and sampling.

    ``logits [N, R, V_local]`` hold the global ids ``[vocab_start, vocab_start + V_local)`` of
    one vocabulary shard. For each selected row (``rows [N, S]``, default every row; an index
    outside ``[0, R)`` raises on the CPU, and on CUDA, unless ``XKERNELS_CHECK=1``, gets the empty
    results ``-inf, 0, -1`` without a host read) with
    ``a = logits / T`` (the logits at ``T = 0``) and ``ignore_id``'s logit counted as -inf:

    - ``row_max``, ``row_sum = sum exp(s - row_max)`` (0 when ``row_max`` is not finite) and
      ``top_id`` (torch.argmax's global id: NaN first, ties to the lowest id; -1 for an empty
      shard) of ``s = a``, or of the raw logits with ``raw_stats``;
    - with ``sample`` (needs ``T > 0``): the Gumbel-max ``(pick_score, pick_id)`` over the shard
      of ``log w + G``, ``G`` the package's noise of (sequence ``n``, position = the row, global
      id), ``w = exp(a)`` but the ids of ``exclude [N, S, E]`` (-1 padded); with ``draft_probs
      [N, Q, V_local]`` and ``residual_stats [N, S, 2]`` (the global max and sum of ``a``), rows
      below ``Q`` draw from the residual ``w = max(softmax(a) - q, 0)``. ``pick_logit`` is ``s`` at
      the pick. No pick: ``-inf, -1, -inf``. On a row without a softmax the pick is meaningless
      (the ops use the argmax there).

    The maximum over shards of ``(pick_score, -pick_id)`` is the unsharded ops' token, and the
    shards' ``(row_max, row_sum)`` combine by log-sum-exp. Returns ``(row_max, row_sum, top_id,
    pick_score, pick_id, pick_logit)``, each ``[N, S]``."""
    return torch.ops.xkernels.shard_row_stats.default(
        _tensor(logits, "logits"), int(vocab_start), _tensor(rows, "rows"), _tensor(exclude, "exclude"),
        _tensor(draft_probs, "draft_probs"), _tensor(residual_stats, "residual_stats"), int(ignore_id), bool(sample),
        bool(raw_stats), float(temperature), *_rng_args(seed, offset))
