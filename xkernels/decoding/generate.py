"""Decoding loops composed from the xkernels ops, one sequence at a time.

Modes:
    "ar"          plain autoregressive decoding with the KV cache (the baseline)
    "drafter"     dFlash: the drafter proposes a block, chain_verify checks it in one target call
    "sequential"  the drafter plus sequential_refine (xPress refinement decoded slot by slot)
    "jacobi"      the drafter plus jacobi_refine with `iters` passes (xPress)
    "tree"        DDTree: a best-first draft tree over the drafter's per-slot top-k marginals
                  (build_draft_tree), verified in one target call under the tree's attention mask
                  (tree_attention_mask, tree_positions, tree_verify); the KV cache keeps the
                  accepted path (compact_kv_)
    "tree-jacobi" the same over the refined marginals of the final Jacobi iterate

Every mode emits exactly the tokens "ar" would at T = 0, and the same distribution at T > 0 (a
tree is a deterministic function of the context, so it is verified without draft_probs).
"""

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from ..models.hf import as_target
from ..models.target import KVCache, TargetLM
from ..ops import (build_draft_tree, chain_verify, jacobi_refine, refine_step, sequential_refine,
                   tree_attention_mask, tree_verify)

MODES = ("ar", "drafter", "sequential", "jacobi", "tree", "tree-jacobi")
TREE_MODES = ("tree", "tree-jacobi")


@dataclass
class Stats:
    mode: str
    new_tokens: int = 0
    target_calls: int = 0  # forwards after the prefill
    refine_passes: int = 0
    accept_lens: List[int] = field(default_factory=list)
    seconds: float = 0.0
    parts: Dict[str, float] = field(default_factory=dict)  # seconds per part of a block (speculative modes)

    @property
    def tau(self) -> float:
        """Tokens committed per target call, the bonus token included."""
        return self.new_tokens / max(self.target_calls, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / max(self.seconds, 1e-9)


# The drafts of block `step` and its verification draw from separate Philox streams: both key
# their noise by (sequence, slot or row, vocabulary id), so one offset would make the residual
# sample at row d reuse the noise that chose draft d, and the sample would no longer follow the
# residual given the rejection.
def _draft_offset(step: int) -> int:
    return 2 * step + 1


def _verify_offset(step: int) -> int:
    return 2 * step


def _next_token(logits_row: torch.Tensor, temperature: float, seed: int, offset: int) -> int:
    """The argmax, or a sample of softmax(l / T): chain_verify with no drafts emits just the bonus."""
    no_drafts = torch.empty(1, 0, dtype=torch.int64, device=logits_row.device)
    _, out = chain_verify(no_drafts, logits_row.float().view(1, 1, -1), temperature=temperature, seed=seed,
                          offset=offset)
    return int(out[0, 0])


def _decode_ar(target, prompt, max_new_tokens, temperature, seed, stats):
    cache = target.new_cache()
    logits, _ = target(prompt, cache)
    out = []
    while True:
        out.append(_next_token(logits[0, -1], temperature, seed, len(out)))
        if len(out) == max_new_tokens:
            return out
        logits, _ = target(torch.tensor([[out[-1]]], device=prompt.device), cache)
        stats.target_calls += 1


def _propose(mode, base_logits, h, tokens, refiner, weights, iters, temperature, seed, step, stats):
    """Draft tokens [1, D'] and, at T > 0, the distributions [1, D', V] they were drawn from."""
    if mode == "drafter":
        if temperature == 0:
            return base_logits.argmax(-1), None
        q = torch.softmax(base_logits.float() / temperature, -1)
        g = torch.Generator(device=q.device).manual_seed(seed * 1_000_003 + step)
        return torch.multinomial(q[0], 1, generator=g).view(1, -1), q

    ctx = refiner.prepare(h).float()
    before = tokens[-2] if len(tokens) > 1 else tokens[-1]  # slot 0 (the anchor) reads the token before it
    prefix = torch.tensor([[before, tokens[-1]]], device=base_logits.device)
    rng = dict(temperature=temperature, seed=seed, offset=_draft_offset(step))
    converged = True
    if mode == "sequential":
        drafts, _ = sequential_refine(ctx, prefix, base_logits, weights, **rng)
        stats.refine_passes += drafts.shape[1]
    else:
        drafts, _, passes = jacobi_refine(ctx, prefix, base_logits, weights, max_iters=iters, **rng)
        stats.refine_passes += int(passes[0])
        converged = int(passes[0]) < iters  # it stopped on a pass that changed nothing
    if temperature == 0:
        return drafts, None
    prev = torch.cat([prefix, drafts[:, :-1]], dim=1)
    if not converged:
        # A slot's draft follows q(. | the drafts before it) only where Jacobi has settled: a check pass
        # from the final drafts (same noise) agrees up to the first unsettled slot, whose check sample
        # is itself a proper draft; verify up to there.
        check, _ = refine_step(ctx, prev, base_logits, weights, **rng)
        stats.refine_passes += 1
        differ = (check != drafts)[0].nonzero()
        keep = int(differ[0]) + 1 if len(differ) else drafts.shape[1]
        drafts = check[:, :keep]  # prev is right for these slots: it differs from check only later
    d = drafts.shape[1]
    refined = base_logits[:, :d].float() + refiner.delta(ctx, prev)[:, 1 : d + 1].float()
    return drafts, torch.softmax(refined / temperature, -1)


def _tree_marginals(mode, base_logits, h, tokens, refiner, weights, iters, temperature, seed, step, stats):
    """Per-slot logits [1, D, V] the tree is built over: the drafter's, or the refiner's at the final
    Jacobi iterate (each slot conditioned on the iterate's tokens before it)."""
    if mode == "tree":
        return base_logits
    ctx = refiner.prepare(h).float()
    before = tokens[-2] if len(tokens) > 1 else tokens[-1]
    prefix = torch.tensor([[before, tokens[-1]]], device=base_logits.device)
    drafts, _, passes = jacobi_refine(ctx, prefix, base_logits, weights, max_iters=iters, temperature=temperature,
                                      seed=seed, offset=_draft_offset(step))
    stats.refine_passes += int(passes[0])
    prev = torch.cat([prefix, drafts[:, :-1]], dim=1)
    return base_logits.float() + refiner.delta(ctx, prev)[:, 1:].float()


def _tree_block(target, anchor, marginals, cache, layers, tree_budget, tree_topk, temperature, seed, step):
    """One tree step: build, one target call, verify, keep the accepted path in the cache.
    Returns (emitted tokens, accepted count, hidden states [1, accepted+1, ...] of the kept nodes)."""
    lp, tok = torch.log_softmax(marginals.float(), -1).topk(min(tree_topk, marginals.shape[-1]), -1)
    tokens, parents, num_nodes, depth = build_draft_tree(lp, tok, tree_budget)
    m = int(num_nodes[0])  # the one host sync of the build: how many nodes the forward takes
    tokens, parents, depth = tokens[:, :m].clone(), parents[:, :m], depth[0, :m]
    tokens[0, 0] = anchor
    prefix_len = cache.length
    logits, hidden = target(tokens, cache, hidden_layers=layers, tree_mask=tree_attention_mask(parents)[0],
                            tree_depth=depth)
    accept_len, path, out = tree_verify(tokens, parents, logits.float(), temperature=temperature, seed=seed,
                                        offset=_verify_offset(step))
    # The block's second host read: the accepted length and the emitted tokens together.
    row = torch.cat([accept_len, out[0]]).tolist()
    accepted, emitted = row[0], row[1 : row[0] + 2]
    cache.keep_path(prefix_len, path, accept_len, kept=accepted + 1)
    return emitted, accepted, torch.cat(hidden, dim=-1)[:, path[0, : accepted + 1]]


def _decode_speculative(mode, target, drafter, refiner, prompt, max_new_tokens, iters, temperature, seed,
                        draft_len, stats, tree_budget=15, tree_topk=8):
    layers = drafter.cfg.target_layers
    block = drafter.cfg.block_size
    weights = refiner.fold().to(torch.float32) if refiner is not None else None
    cache = target.new_cache()
    context = KVCache(len(drafter.layers))  # the drafter's injected keys and values, grown in place
    device = prompt.device

    def commit_context(features, first):
        for i, (k, v) in enumerate(drafter.context(features, torch.arange(first, first + features.shape[1],
                                                                          device=device))):
            context.append(i, k, v)

    # The target sees every committed token but the newest (the anchor), whose features are unknown.
    tokens = prompt[0].tolist()
    start = len(tokens)
    if start > 1:
        _, hidden = target(prompt[:, :-1], cache, hidden_layers=layers)
        commit_context(torch.cat(hidden, dim=-1), 0)
    else:
        commit_context(torch.zeros(1, 0, len(layers) * target.cfg.dim, device=device,
                                   dtype=target.lm_head.weight.dtype), 0)
    masks = torch.full((1, block - 1), drafter.cfg.mask_token_id, device=device)
    step = 0
    clock = _PartClock(stats)
    while len(tokens) - start < max_new_tokens:
        anchor = tokens[-1]
        anchor_ids = torch.tensor([[anchor]], device=device)
        h = drafter(target.embed(torch.cat([anchor_ids, masks], 1)), list(zip(context.k, context.v)),
                    start=len(tokens) - 1)
        base_logits = target.lm_head(h[:, 1:]).float()
        clock.lap("drafter")
        if mode in TREE_MODES:
            marginals = _tree_marginals(mode, base_logits, h, tokens, refiner, weights, iters, temperature, seed, step,
                                        stats)
            clock.lap("refinement")
            emitted, accepted, kept_hidden = _tree_block(target, anchor, marginals, cache, layers, tree_budget,
                                                         tree_topk, temperature, seed, step)
            clock.lap("verification")
        else:
            drafts, q = _propose(mode, base_logits, h, tokens, refiner, weights, iters, temperature, seed, step, stats)
            drafts, q = drafts[:, :draft_len], None if q is None else q[:, :draft_len]
            clock.lap("refinement")
            logits, hidden = target(torch.cat([anchor_ids, drafts], 1), cache, hidden_layers=layers)
            accept_len, out = chain_verify(drafts, logits.float(), draft_probs=q, temperature=temperature, seed=seed,
                                           offset=_verify_offset(step))
            # The one host read of the block: the accepted length and the emitted tokens together.
            row = torch.cat([accept_len, out[0]]).tolist()
            accepted, emitted = row[0], row[1 : row[0] + 2]
            # The anchor and the accepted drafts are committed: the target keeps their cache entries
            # and the drafter their injected keys and values.
            cache.crop(cache.length - drafts.shape[1] + accepted)
            kept_hidden = torch.cat(hidden, dim=-1)[:, : accepted + 1]
            clock.lap("verification")
        commit_context(kept_hidden, len(tokens) - 1)
        tokens += emitted
        stats.target_calls += 1
        stats.accept_lens.append(accepted)
        step += 1
        clock.lap("bookkeeping")
    return tokens[start : start + max_new_tokens]


class _PartClock:
    """Adds the wall time since the last lap to stats.parts[name] (CPU time: the work is synchronous
    there; on a GPU the parts are the host's view)."""

    def __init__(self, stats):
        self.stats, self.last = stats, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.stats.parts[name] = self.stats.parts.get(name, 0.0) + now - self.last
        self.last = now


# Below this many target parameters one decoding step is a few milliseconds of small operations:
# a thread pool cannot pay for itself there, and on a busy machine every parallel region waits for
# a descheduled pool thread (2 threads were 47x slower than 1 under one competing process).
SMALL_MODEL_PARAMS = 50_000_000


def decode_threads(target, num_threads: Optional[int] = None) -> int:
    """The intra-op threads the loop runs with: num_threads, else XKERNELS_NUM_THREADS, else 1 for a
    target under SMALL_MODEL_PARAMS parameters and torch's setting for a larger one."""
    if num_threads is None and os.environ.get("XKERNELS_NUM_THREADS"):
        num_threads = int(os.environ["XKERNELS_NUM_THREADS"])
    if num_threads is not None:
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        return num_threads
    model = getattr(target, "model", target)  # an HFTarget wraps the transformers model
    params = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else 0
    return 1 if params < SMALL_MODEL_PARAMS else torch.get_num_threads()


@contextlib.contextmanager
def _intra_op_threads(n: int):
    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n != before:
            torch.set_num_threads(before)


@torch.inference_mode()
def generate(target, prompt_ids: Sequence[int], max_new_tokens: int, *, mode: str = "ar", drafter=None,
             refiner=None, iters: int = 4, temperature: float = 0.0, seed: int = 0,
             draft_len: Optional[int] = None, tree_budget: int = 15, tree_topk: int = 8,
             num_threads: Optional[int] = None):
    """Continue prompt_ids by max_new_tokens tokens. Returns (tokens, Stats).

    target is a TargetLM or a transformers causal LM (adapted by xkernels.models.hf.HFTarget,
    which checks before decoding that it has what the loop needs).

    draft_len verifies only the first drafts of each block (all B-1 by default): the target's
    verification costs grow with the tokens it checks, so on a CPU fewer can pay off. The tree modes
    verify tree_budget draft nodes (plus the anchor) built from each slot's tree_topk candidates.
    num_threads: torch's intra-op threads during the call (see decode_threads: 1 for small models
    unless set here or by XKERNELS_NUM_THREADS); the previous setting is restored after."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "ar" and drafter is None:
        raise ValueError(f"mode {mode!r} needs a drafter")
    if mode in ("sequential", "jacobi", "tree-jacobi") and refiner is None:
        raise ValueError(f"mode {mode!r} needs a refiner")
    if mode in TREE_MODES and tree_budget < 1:
        raise ValueError(f"tree_budget must be >= 1, got {tree_budget}")
    target = as_target(target, drafter if mode != "ar" else None)
    if mode in TREE_MODES and not isinstance(target, TargetLM):
        raise ValueError(f"mode {mode!r} needs a target that takes a tree attention mask (xkernels' TargetLM); "
                         f"{type(target).__name__} does not")
    device = target.lm_head.weight.device
    prompt = torch.as_tensor(list(prompt_ids), dtype=torch.int64, device=device).view(1, -1)
    if prompt.shape[1] < 1 or max_new_tokens < 1:
        raise ValueError("the prompt and max_new_tokens must be non-empty")
    stats = Stats(mode)
    with _intra_op_threads(decode_threads(target, num_threads)):
        began = time.perf_counter()
        if mode == "ar":
            out = _decode_ar(target, prompt, max_new_tokens, temperature, seed, stats)
            stats.target_calls += 1  # the prefill's logits give the first token; count it like a step
        else:
            out = _decode_speculative(mode, target, drafter, refiner, prompt, max_new_tokens, iters, temperature,
                                      seed, draft_len or drafter.cfg.block_size - 1, stats, tree_budget, tree_topk)
        stats.seconds = time.perf_counter() - began
    stats.new_tokens = len(out)
    return out, stats
