"""The decoding loop of one sequence, composed from the xkernels ops (generate_batch, in batch.py,
decodes many with static caches and fixed-shape steps; both run the modes of modes.py).

Modes:
    "ar"          plain autoregressive decoding with the KV cache (the baseline)
    "drafter"     dFlash: the drafter proposes a block, chain_verify checks it in one target call
    "sequential"  the drafter plus sequential_refine (xPress refinement decoded slot by slot)
    "jacobi"      the drafter plus jacobi_refine with `iters` passes (xPress)
    "tree"        DDTree: a best-first draft tree over the drafter's per-slot top-k marginals
                  (build_draft_tree, which writes the tree's attention mask in the same launch),
                  verified in one target call under that mask (tree_verify); the KV cache keeps the
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
from ..models.target import KVCache, TargetLM
from . import tensor_parallel
from .modes import Mode, Proposal, Streams, WholeVocab, draft_block, make_mode, request_seeds

MODES = ("ar", "drafter", "sequential", "jacobi", "tree", "tree-jacobi")
TREE_MODES = ("tree", "tree-jacobi")


@dataclass
class Stats:
    mode: str
    new_tokens: int = 0
    target_calls: int = 0  # forwards after the prefill
    draft_calls: int = 0  # blocks that ran the drafter (the others were plain ar steps: draft_len="auto")
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


def _next_token(logits_row: torch.Tensor, rng: Streams, vocab=WholeVocab) -> int:
    """The argmax, or a sample of softmax(l / T): chain_verify with no drafts emits just the bonus."""
    no_drafts = torch.empty(1, 0, dtype=torch.int64, device=logits_row.device)
    _, out = vocab.chain_verify(no_drafts, logits_row.float().view(1, 1, -1), temperature=rng.temperature,
                                seed=rng.seed, offset=rng.verify)
    return int(out[0, 0])


def _decode_ar(target, prompt, max_new_tokens, temperature, seed, stats, vocab=WholeVocab):
    cache = target.new_cache()
    logits, _ = target(prompt, cache)
    seeds = request_seeds(seed, 1, prompt.device)
    out = []
    while True:  # step i is block i of one token (generate_batch's ar steps)
        out.append(_next_token(logits[0, -1], Streams(temperature, seeds, len(out)), vocab))
        if len(out) == max_new_tokens:
            return out
        logits, _ = target(torch.tensor([[out[-1]]], device=prompt.device), cache)
        stats.target_calls += 1


def _chain_block(mode, target, anchor, base_logits, h, prefix, cache, layers, rng, rule, spent, clock):
    """Propose, choose how many drafts to verify (the rule, or mode.draft_len), verify. Returns
    (emitted tokens, accepted count, the target's features of the committed positions)."""
    p = mode.proposer.propose(base_logits, h, prefix, rng, with_confidence=rule is not None)
    k = min(mode.draft_len, p.drafts.shape[1])
    if p.limit is not None:  # unsettled Jacobi slots at T > 0: verify only the proper drafts
        k = min(k, int(p.limit[0]))
    if rule is not None:
        confidence = p.confidence[0, :k].tolist()
        k = rule.choose(confidence, spent + clock.lap("refinement"))
    clock.lap("refinement")
    chosen = Proposal(p.drafts[:, :k], None if p.q is None else p.q[:, :k], None)
    accept_len, out, hidden = mode.verifier.verify(target, anchor, chosen, cache, layers, rng)
    # The one host read of the block: the accepted length and the emitted tokens together.
    row = torch.cat([accept_len, out[0]]).tolist()
    accepted = row[0]
    if rule is not None:
        for i in range(min(accepted + 1, k)):
            rule.observe(confidence[i], i < accepted)
    return row[1 : accepted + 2], accepted, hidden[:, : accepted + 1]


def _tree_block(mode, target, anchor, base_logits, h, prefix, cache, layers, rng, rule, spent, clock):
    """Build the tree, cut it with the rule (each node counting its path's probability under the
    marginals as expected tokens), verify. Returns what _chain_block does."""
    marginals = mode.proposer.marginals(base_logits, h, prefix, rng)
    spent += clock.lap("refinement")
    tree = mode.verifier.build(marginals)
    m = int(tree.num_nodes[0])  # the one host sync of the build: how many nodes the forward takes
    if rule is not None:  # the tree is a function of the marginals, so its nodes' probabilities may be read
        node_p = tree.node_probs(0, m).tolist()
        node_parents = tree.parents[0, 1:m].tolist()
        m = rule.choose_nodes(node_p, node_parents, spent) + 1
    accept_len, out, hidden, path = mode.verifier.verify(target, anchor, tree.prefix(m), cache, layers, rng)
    # The block's second host read: the accepted length, the emitted tokens and the path together.
    row = torch.cat([accept_len, out[0], path[0]]).tolist()
    accepted = row[0]
    if rule is not None:  # a node was tried if its parent was accepted
        kept = set(row[m + 1 :][: accepted + 1])
        for node in range(1, m):
            if node_parents[node - 1] in kept:
                rule.observe(node_p[node - 1], node in kept)
    return row[1 : accepted + 2], accepted, hidden[:, : accepted + 1]


def _decode_speculative(mode: Mode, target, drafter, prompt, max_new_tokens, temperature, seed, stats, rule=None,
                        draft_dtype=torch.float32):
    layers = drafter.cfg.target_layers
    cache = target.new_cache()
    context = KVCache(len(drafter.layers))  # the drafter's injected keys and values, grown in place
    device = prompt.device
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
    seeds = request_seeds(seed, 1, device)
    step = 0
    clock = _PartClock(stats)
    block = _tree_block if mode.proposer.tree else _chain_block
    while len(tokens) - start < max_new_tokens:
        anchor = torch.tensor([tokens[-1]], device=device)
        rng = Streams(temperature, seeds, step)
        if rule is not None and not rule.draft_now():
            # A plain ar step (the rule found drafting not worth its cost here): no drafter call.
            logits, hidden = target(anchor[:, None], cache, hidden_layers=layers)
            emitted, accepted = [_next_token(logits[0, -1], rng, mode.verifier.vocab)], 0
            pending.append(torch.cat(hidden, dim=-1))
            clock.lap("verification")
        else:
            if pending:
                commit_context()
                clock.lap("bookkeeping")
            stats.draft_calls += 1
            base_logits, h = draft_block(drafter, target, anchor, list(zip(context.k, context.v)), draft_dtype,
                                         start=len(tokens) - 1)
            spent = clock.lap("drafter")
            prefix = torch.tensor([tokens[-2:] if len(tokens) > 1 else tokens[-1:] * 2], device=device)
            emitted, accepted, kept_hidden = block(mode, target, anchor, base_logits, h, prefix, cache, layers, rng,
                                                   rule, spent, clock)
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
             draft_dtype: Optional[torch.dtype] = None, tp_group=None, verify_method: str = "token"):
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
    is sharded by vocabulary rows (xkernels.decoding.tensor_parallel): every rank of the group calls
    generate with the same arguments and gets the same tokens as one process. Every mode, "drafter"
    at T = 0 only; draft_len must be fixed.
    seed: the request's seed: its noise is keyed by (seed, block, slot) only (the ops' per-request
    form, xkernels.decoding.modes.Streams), so generate_batch gives a sequence of this seed the same
    tokens in any batch (with a fixed draft_len).
    verify_method: the chain modes' verification, "token" (token-wise) or "block" (block
    verification, Sun et al.: the same output distribution, at least as many accepted drafts in
    expectation; identical at T = 0); not with tp_group."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "ar" and drafter is None:
        raise ValueError(f"mode {mode!r} needs a drafter")
    if mode in ("sequential", "jacobi", "tree-jacobi") and refiner is None:
        raise ValueError(f"mode {mode!r} needs a refiner")
    if mode in TREE_MODES and tree_budget < 1:
        raise ValueError(f"tree_budget must be >= 1, got {tree_budget}")
    if verify_method not in ("token", "block"):
        raise ValueError(f"verify_method must be 'token' or 'block', got {verify_method!r}")
    if verify_method == "block" and tp_group is not None:
        raise ValueError("verify_method='block' is not sharded: leave tp_group None")
    if not (draft_len is None or draft_len == "auto" or (isinstance(draft_len, int) and draft_len >= 0)):
        raise ValueError(f"draft_len must be 'auto', None or an int >= 0, got {draft_len!r}")
    target = as_target(target, drafter if mode != "ar" else None)
    vocab = WholeVocab
    if tp_group is not None:
        tensor_parallel.check_supported(mode, temperature, draft_len)
        target, vocab = tensor_parallel.shard_target(target, tp_group)
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
            out = _decode_ar(target, prompt, max_new_tokens, temperature, seed, stats, vocab)
            stats.target_calls += 1  # the prefill's logits give the first token; count it like a step
        else:
            fixed = drafter.cfg.block_size - 1 if draft_len in (None, "auto") else draft_len
            spec = make_mode(mode, refiner, iters, fixed, tree_budget, tree_topk, vocab, verify_method)
            rule = DraftLengthRule(cost_model) if draft_len == "auto" else None
            out = _decode_speculative(spec, target, drafter, prompt, max_new_tokens, temperature, seed, stats, rule,
                                      draft_dtype or default_draft_dtype(target))
            stats.refine_passes = spec.proposer.refine_passes()
        stats.seconds = time.perf_counter() - began
    stats.new_tokens = len(out)
    return out, stats
