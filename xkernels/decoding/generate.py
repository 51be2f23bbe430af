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
from typing import Dict, List, Optional, Sequence, Union

import torch

from ..models.hf import as_target
from .draft_length import CostModel, DraftLengthRule, measured_cost_model
from ..models.target import KVCache, Linear, TargetLM
from ..ops import (build_draft_tree, chain_verify, jacobi_refine, refine_step, sequential_refine,
                   tree_attention_mask, tree_verify)
from . import tensor_parallel

MODES = ("ar", "drafter", "sequential", "jacobi", "tree", "tree-jacobi")
TREE_MODES = ("tree", "tree-jacobi")


@dataclass
class Stats:
    mode: str
    new_tokens: int = 0
    target_calls: int = 0  # forwards after the prefill
    draft_calls: int = 0  # blocks that ran the drafter (the others were plain ar steps: draft_len="auto")
    refine_passes: int = 0
    _device_passes: List[torch.Tensor] = field(default_factory=list, repr=False)  # read once, at the end
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


def _next_token(logits_row: torch.Tensor, temperature: float, seed: int, offset: int, tp=None) -> int:
    """The argmax, or a sample of softmax(l / T): chain_verify with no drafts emits just the bonus.
    tp: the VocabShard of a vocabulary-parallel target (logits_row is its shard)."""
    if tp is not None:
        return tp.next_token(logits_row, temperature, seed, offset)
    no_drafts = torch.empty(1, 0, dtype=torch.int64, device=logits_row.device)
    _, out = chain_verify(no_drafts, logits_row.float().view(1, 1, -1), temperature=temperature, seed=seed,
                          offset=offset)
    return int(out[0, 0])


def _decode_ar(target, prompt, max_new_tokens, temperature, seed, stats, tp=None):
    cache = target.new_cache()
    logits, _ = target(prompt, cache)
    out = []
    while True:
        out.append(_next_token(logits[0, -1], temperature, seed, len(out), tp))
        if len(out) == max_new_tokens:
            return out
        logits, _ = target(torch.tensor([[out[-1]]], device=prompt.device), cache)
        stats.target_calls += 1


def _propose(mode, base_logits, h, tokens, refiner, weights, iters, temperature, seed, step, stats,
             with_confidence=False, tp=None):
    """Draft tokens [1, D'], at T > 0 the distributions [1, D', V] they were drawn from (else None),
    and, with_confidence, each slot's confidence [1, D'] for the draft length rule (else None): the
    largest probability of its draft distribution. At T > 0 that is a function of the distribution, never of the token drawn
    from it (a choice that read the drawn token would bias which drafts get verified)."""
    if mode == "drafter":
        if tp is not None:  # T = 0 (generate checks): the sharded argmax and its probability 1 / sum
            _, total, top = tp.stats(base_logits)
            return top, None, 1 / total if with_confidence else None
        if temperature == 0:
            if not with_confidence:
                return base_logits.argmax(-1), None, None
            confidence, drafts = torch.softmax(base_logits, -1).max(-1)
            return drafts, None, confidence
        q = torch.softmax(base_logits.float() / temperature, -1)
        g = torch.Generator(device=q.device).manual_seed(seed * 1_000_003 + step)
        return torch.multinomial(q[0], 1, generator=g).view(1, -1), q, q.amax(-1) if with_confidence else None

    ctx = refiner.prepare(h.to(refiner.w2.weight.dtype)).float()
    before = tokens[-2] if len(tokens) > 1 else tokens[-1]  # slot 0 (the anchor) reads the token before it
    prefix = torch.tensor([[before, tokens[-1]]], device=base_logits.device)
    rng = dict(temperature=temperature, seed=seed, offset=_draft_offset(step))
    names = ("sequential_refine", "jacobi_refine", "refine_step")
    run_sequential, run_jacobi, run_step = ((sequential_refine, jacobi_refine, refine_step) if tp is None
                                            else (tp.refine(name) for name in names))
    if mode == "sequential":
        drafts, logprobs = run_sequential(ctx, prefix, base_logits, weights, **rng)
        stats.refine_passes += drafts.shape[1]
    else:
        drafts, logprobs, passes = run_jacobi(ctx, prefix, base_logits, weights, max_iters=iters, **rng)
        stats._device_passes.append(passes)
    if temperature == 0:
        return drafts, None, logprobs.exp() if with_confidence else None  # the argmax's probability
    # Whether Jacobi stopped on a pass that changed nothing: a host read that only sampling needs.
    converged = mode == "sequential" or int(passes[0]) < iters
    prev = torch.cat([prefix, drafts[:, :-1]], dim=1)
    if not converged:
        # A slot's draft follows q(. | the drafts before it) only where Jacobi has settled: a check pass
        # from the final drafts (same noise) agrees up to the first unsettled slot, whose check sample
        # is itself a proper draft; verify up to there.
        check, _ = run_step(ctx, prev, base_logits, weights, **rng)
        stats.refine_passes += 1
        differ = (check != drafts)[0].nonzero()
        keep = int(differ[0]) + 1 if len(differ) else drafts.shape[1]
        drafts = check[:, :keep]  # prev is right for these slots: it differs from check only later
    d = drafts.shape[1]
    delta = refiner.delta(ctx, prev) if tp is None else tp.delta(refiner, ctx, prev)
    refined = base_logits[:, :d].float() + delta[:, 1 : d + 1].float()
    if tp is not None:
        q, top_p = tp.softmax(refined, temperature)
        return drafts, q, top_p if with_confidence else None
    q = torch.softmax(refined / temperature, -1)
    return drafts, q, q.amax(-1) if with_confidence else None


def _tree_marginals(mode, base_logits, h, tokens, refiner, weights, iters, temperature, seed, step, stats, tp=None):
    """Per-slot logits [1, D, V] the tree is built over: the drafter's, or the refiner's at the final
    Jacobi iterate (each slot conditioned on the iterate's tokens before it)."""
    if mode == "tree":
        return base_logits
    ctx = refiner.prepare(h.to(refiner.w2.weight.dtype)).float()
    before = tokens[-2] if len(tokens) > 1 else tokens[-1]
    prefix = torch.tensor([[before, tokens[-1]]], device=base_logits.device)
    run_jacobi = jacobi_refine if tp is None else tp.refine("jacobi_refine")
    drafts, _, passes = run_jacobi(ctx, prefix, base_logits, weights, max_iters=iters, temperature=temperature,
                                   seed=seed, offset=_draft_offset(step))
    stats._device_passes.append(passes)
    prev = torch.cat([prefix, drafts[:, :-1]], dim=1)
    delta = refiner.delta(ctx, prev) if tp is None else tp.delta(refiner, ctx, prev)
    return base_logits.float() + delta[:, 1:].float()


def _tree_block(target, anchor, marginals, cache, layers, tree_budget, tree_topk, temperature, seed, step,
                rule=None, spent=0.0, tp=None):
    """One tree step: build, one target call, verify, keep the accepted path in the cache. With a
    DraftLengthRule the tree is cut to its best first nodes (a prefix of a best-first tree is a
    tree), each node counting its path's probability under the marginals as expected tokens.
    Returns (emitted tokens, accepted count, hidden states [1, accepted+1, ...] of the kept nodes)."""
    if tp is None:
        logprobs = torch.log_softmax(marginals.float(), -1)
        lp, tok = logprobs.topk(min(tree_topk, marginals.shape[-1]), -1)
    else:  # the marginals are this rank's shard (and rule is None: tp needs a fixed draft_len)
        lp, tok = tp.topk_logprobs(marginals, min(tree_topk, tp.vocab))
    tokens, parents, num_nodes, depth = build_draft_tree(lp, tok, tree_budget)
    m = int(num_nodes[0])  # the one host sync of the build: how many nodes the forward takes
    if rule is not None:  # the tree is a function of the marginals, so its nodes' probabilities may be read
        node_p = logprobs[0, (depth[0, 1:m] - 1).clamp(min=0), tokens[0, 1:m]].exp().tolist()
        node_parents = parents[0, 1:m].tolist()
        m = rule.choose_nodes(node_p, node_parents, spent) + 1
    tokens, parents, depth = tokens[:, :m].clone(), parents[:, :m], depth[0, :m]
    tokens[0, 0] = anchor
    prefix_len = cache.length
    logits, hidden = target(tokens, cache, hidden_layers=layers, tree_mask=tree_attention_mask(parents)[0],
                            tree_depth=depth)
    verify = tree_verify if tp is None else tp.tree_verify
    accept_len, path, out = verify(tokens, parents, logits.float(), temperature=temperature, seed=seed,
                                   offset=_verify_offset(step))
    # The block's second host read: the accepted length, the emitted tokens and the path together.
    row = torch.cat([accept_len, out[0], path[0]]).tolist()
    accepted, emitted, kept = row[0], row[1 : row[0] + 2], set(row[out.shape[1] + 1 :][: row[0] + 1])
    if rule is not None:  # a node was tried if its parent was accepted
        for node in range(1, m):
            if node_parents[node - 1] in kept:
                rule.observe(node_p[node - 1], node in kept)
    cache.keep_path(prefix_len, path, accept_len, kept=accepted + 1)
    return emitted, accepted, torch.cat(hidden, dim=-1)[:, path[0, : accepted + 1]]


def _decode_speculative(mode, target, drafter, refiner, prompt, max_new_tokens, iters, temperature, seed,
                        draft_len, stats, tree_budget=15, tree_topk=8, cost=None, draft_dtype=torch.float32,
                        tp=None):
    layers = drafter.cfg.target_layers
    block = drafter.cfg.block_size
    weights = refiner.fold().to(torch.float32) if refiner is not None else None
    if tp is not None and weights is not None:
        weights = tp.weights(weights)
    cache = target.new_cache()
    context = KVCache(len(drafter.layers))  # the drafter's injected keys and values, grown in place
    device = prompt.device
    rule = DraftLengthRule(cost) if cost is not None else None
    pending = []  # target features of committed tokens not yet in the drafter's context

    def commit_context():
        features = torch.cat(pending, dim=1)
        first = context.length
        positions = torch.arange(first, first + features.shape[1], device=device)
        for i, (k, v) in enumerate(drafter.context(features.to(draft_dtype), positions)):
            context.append(i, k, v)
        pending.clear()

    # The target sees every committed token but the newest (the anchor), whose features are unknown.
    tokens = prompt[0].tolist()
    start = len(tokens)
    if start > 1:
        _, hidden = target(prompt[:, :-1], cache, hidden_layers=layers)
        pending.append(torch.cat(hidden, dim=-1))
    else:
        pending.append(torch.zeros(1, 0, len(layers) * target.cfg.dim, device=device,
                                   dtype=target.lm_head.weight.dtype))
    masks = torch.full((1, block - 1), drafter.cfg.mask_token_id, device=device)
    step = 0
    clock = _PartClock(stats)
    while len(tokens) - start < max_new_tokens:
        anchor = tokens[-1]
        anchor_ids = torch.tensor([[anchor]], device=device)
        if rule is not None and not rule.draft_now():
            # A plain ar step (the rule found drafting not worth its cost here): no drafter call.
            logits, hidden = target(anchor_ids, cache, hidden_layers=layers)
            emitted, accepted = [_next_token(logits[0, -1], temperature, seed, _verify_offset(step), tp)], 0
            pending.append(torch.cat(hidden, dim=-1))
            clock.lap("verification")
        else:
            if pending:
                commit_context()
                clock.lap("bookkeeping")
            stats.draft_calls += 1
            h = drafter(target.embed(torch.cat([anchor_ids, masks], 1)).to(draft_dtype),
                        list(zip(context.k, context.v)), start=len(tokens) - 1)
            head = target.lm_head
            base_logits = head(h[:, 1:] if isinstance(head, Linear) else h[:, 1:].to(head.weight.dtype)).float()
            spent = clock.lap("drafter")
            if mode in TREE_MODES:
                marginals = _tree_marginals(mode, base_logits, h, tokens, refiner, weights, iters, temperature, seed,
                                            step, stats, tp)
                spent += clock.lap("refinement")
                emitted, accepted, kept_hidden = _tree_block(target, anchor, marginals, cache, layers, tree_budget,
                                                             tree_topk, temperature, seed, step, rule, spent, tp)
                clock.lap("verification")
            else:
                drafts, q, confidence = _propose(mode, base_logits, h, tokens, refiner, weights, iters, temperature,
                                                 seed, step, stats, with_confidence=rule is not None, tp=tp)
                k = min(draft_len, drafts.shape[1])
                if rule is not None:
                    confidence = confidence[0, :k].tolist()
                    k = rule.choose(confidence, spent + clock.lap("refinement"))
                drafts, q = drafts[:, :k], None if q is None else q[:, :k]
                clock.lap("refinement")
                logits, hidden = target(torch.cat([anchor_ids, drafts], 1), cache, hidden_layers=layers)
                verify = chain_verify if tp is None else tp.chain_verify
                accept_len, out = verify(drafts, logits.float(), draft_probs=q, temperature=temperature,
                                         seed=seed, offset=_verify_offset(step))
                # The one host read of the block: the accepted length and the emitted tokens together.
                row = torch.cat([accept_len, out[0]]).tolist()
                accepted, emitted = row[0], row[1 : row[0] + 2]
                if rule is not None:
                    for i in range(min(accepted + 1, k)):
                        rule.observe(confidence[i], i < accepted)
                # The anchor and the accepted drafts are committed: the target keeps their cache entries
                # and the drafter their injected keys and values.
                cache.crop(cache.length - drafts.shape[1] + accepted)
                kept_hidden = torch.cat(hidden, dim=-1)[:, : accepted + 1]
                clock.lap("verification")
            pending.append(kept_hidden)
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

    def lap(self, name: str) -> float:
        """Seconds since the last lap, also added to the part `name`."""
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        self.stats.parts[name] = self.stats.parts.get(name, 0.0) + seconds
        return seconds


def default_draft_dtype(target) -> torch.dtype:
    """bfloat16 for a float32 xkernels TargetLM on a CPU with native bfloat16 products (its head reads
    the drafter's states in their dtype), else the target's dtype."""
    weight = target.lm_head.weight
    if weight.device.type == "cpu" and weight.dtype == torch.float32 and isinstance(target, TargetLM):
        try:
            if torch.ops.mkldnn._is_mkldnn_bf16_supported():
                return torch.bfloat16
        except (AttributeError, RuntimeError):  # a torch build without oneDNN's query
            pass
    return weight.dtype


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
             draft_len: Union[int, str, None] = "auto", tree_budget: int = 15, tree_topk: int = 8,
             num_threads: Optional[int] = None, cost_model: Optional[CostModel] = None,
             draft_dtype: Optional[torch.dtype] = None, tp_group=None):
    """Continue prompt_ids by max_new_tokens tokens. Returns (tokens, Stats).

    target is a TargetLM or a transformers causal LM (adapted by xkernels.models.hf.HFTarget,
    which checks before decoding that it has what the loop needs).

    draft_len: "auto" (the default) chooses per block how many drafts to verify, and whether to draft
    at all, from the drafts' own probabilities and a cost model of the target on this machine
    (xkernels.decoding.draft_length; cost_model pins one, else it is measured once per target and
    thread count, before the clock of the first call starts); an int verifies the first draft_len
    drafts of every block (None: all B-1). The tree modes build trees of tree_budget draft nodes
    (plus the anchor) from each slot's tree_topk candidates; "auto" verifies the tree's best nodes
    only, an int all of them.
    draft_dtype: the dtype the drafter computes in (its weights are converted once and kept);
    default bfloat16 on a CPU with native bfloat16 products (the head over the block's slots runs
    in half the float32 time here), else the target's. The drafter only proposes, so its precision never changes
    the output, only how often drafts are accepted.
    num_threads: torch's intra-op threads during the call (see decode_threads: 1 for small models
    unless set here or by XKERNELS_NUM_THREADS); the previous setting is restored after.
    tp_group: a torch.distributed group over which the target's LM head (and the refiner's readout)
    is sharded by vocabulary rows (xkernels.decoding.tensor_parallel; every rank of the group calls
    generate with the same arguments and gets the same tokens as one process; every mode but
    "drafter" at T > 0; draft_len must be fixed)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "ar" and drafter is None:
        raise ValueError(f"mode {mode!r} needs a drafter")
    if mode in ("sequential", "jacobi", "tree-jacobi") and refiner is None:
        raise ValueError(f"mode {mode!r} needs a refiner")
    if mode in TREE_MODES and tree_budget < 1:
        raise ValueError(f"tree_budget must be >= 1, got {tree_budget}")
    if not (draft_len is None or draft_len == "auto" or (isinstance(draft_len, int) and draft_len >= 0)):
        raise ValueError(f"draft_len must be 'auto', None or an int >= 0, got {draft_len!r}")
    target = as_target(target, drafter if mode != "ar" else None)
    tp = None
    if tp_group is not None:
        if mode not in tensor_parallel.TP_MODES or (mode == "drafter" and temperature != 0):
            raise ValueError(f"tp_group supports modes {tensor_parallel.TP_MODES} ('drafter' at T = 0), got {mode!r}"
                             f" at T = {temperature}")
        if mode != "ar" and draft_len == "auto":  # its rule reads timings: ranks would verify different drafts
            raise ValueError("tp_group needs a fixed draft_len (an int or None), not 'auto'")
        target, tp = tensor_parallel.shard_target(target, tp_group)
    if mode in TREE_MODES and not isinstance(target, TargetLM):
        raise ValueError(f"mode {mode!r} needs a target that takes a tree attention mask (xkernels' TargetLM); "
                         f"{type(target).__name__} does not")
    device = target.lm_head.weight.device
    prompt = torch.as_tensor(list(prompt_ids), dtype=torch.int64, device=device).view(1, -1)
    if prompt.shape[1] < 1 or max_new_tokens < 1:
        raise ValueError("the prompt and max_new_tokens must be non-empty")
    stats = Stats(mode)
    with _intra_op_threads(decode_threads(target, num_threads)):
        if mode != "ar" and draft_len == "auto" and cost_model is None:
            cost_model = measured_cost_model(target, max(drafter.cfg.block_size, tree_budget + 1))
        began = time.perf_counter()
        if mode == "ar":
            out = _decode_ar(target, prompt, max_new_tokens, temperature, seed, stats, tp)
            stats.target_calls += 1  # the prefill's logits give the first token; count it like a step
        else:
            fixed = drafter.cfg.block_size - 1 if draft_len in (None, "auto") else draft_len
            out = _decode_speculative(mode, target, drafter, refiner, prompt, max_new_tokens, iters, temperature,
                                      seed, fixed, stats, tree_budget, tree_topk,
                                      cost_model if draft_len == "auto" else None,
                                      draft_dtype or default_draft_dtype(target), tp)
        if stats._device_passes:
            stats.refine_passes += int(torch.cat(stats._device_passes).sum())
            stats._device_passes.clear()
        stats.seconds = time.perf_counter() - began
    stats.new_tokens = len(out)
    return out, stats
