"""Batched decoding: N prompts of different lengths decoded together, every mode of generate.

The state of a decode lives on the device: static KV caches (StaticKVCache: buffers allocated once,
per-sequence lengths), each sequence's last two tokens and the block counter. One step function of
fixed shapes advances every sequence by one block: the ar step (one token each), or the speculative
block (drafter, refinement, one verification call, commit) whose ragged acceptance (each sequence
keeps its own accepted count) is applied on the device. The host reads each block's accepted
lengths and tokens once, appends them, and marks sequences that reached their max_new_tokens
inactive (they still run, in fixed shapes, but commit nothing). On CUDA the step is captured once
as a CUDA graph and replayed; on the CPU the same step runs eagerly.

At T = 0 sequence i's tokens are generate(target, prompts[i], ...)'s (ar's); at T > 0 each follows
the target's distribution, its noise keyed by its own seed and block (the ops' per-request form), so
with a fixed draft_len it gets generate(target, prompts[i], ..., seed=seed of sequence i)'s tokens
whatever the rest of the batch holds (up to the rounding of the batched forward).
"""

import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

import torch

from ..models.static_cache import StaticKVCache
from ..models.target import TargetLM
from . import tensor_parallel
from .draft_length import CostModel, DraftLengthRule, MeasuredChoice, measured_cost_model
from .generate import MODES, _intra_op_threads, decode_threads, default_draft_dtype
from .modes import Proposal, Streams, WholeVocab, draft_block, make_mode, request_seeds


CHAIN_MODES = ("drafter", "sequential", "jacobi")


@dataclass
class BatchStats:
    mode: str
    target_calls: int = 0  # batched forwards after the prefill: one per step, every sequence in it
    draft_calls: int = 0  # steps that ran the drafter (the others were ar steps: draft_len="auto")
    new_tokens: int = 0  # over all sequences
    seconds: float = 0.0
    accept_lens: List[List[int]] = field(default_factory=list)  # per sequence, per step it was active in
    refine_passes: int = 0

    @property
    def tau(self) -> List[float]:
        """Tokens committed per step for each sequence, over the steps it took part in (the bonus
        token included)."""
        return [(sum(a) + len(a)) / max(len(a), 1) for a in self.accept_lens]

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / max(self.seconds, 1e-9)


class BatchDecoder:
    """The device state of one batched decode and its fixed-shape step.

    The target's cache holds every committed token but each sequence's newest (its anchor), whose
    features are unknown until the next step feeds it; the drafter's context holds the same
    positions' injected keys and values. Every step writes `width` entries per sequence after
    its length; commit keeps the accepted ones."""

    def __init__(self, target: TargetLM, prompts: List[List[int]], max_new_tokens: int, mode: str, drafter=None,
                 refiner=None, iters: int = 4, temperature: float = 0.0, seed: Union[int, Sequence[int]] = 0,
                 draft_len: Optional[int] = None, tree_budget: int = 15, tree_topk: int = 8,
                 draft_dtype: Optional[torch.dtype] = None, vocab=WholeVocab):
        device = target.lm_head.weight.device
        n = len(prompts)
        self.target, self.drafter, self.temperature, self.vocab = target, drafter, temperature, vocab
        self.seeds = request_seeds(seed, n, device)
        self.spec = None if mode == "ar" else make_mode(mode, refiner, iters, drafter.cfg.block_size - 1
                                                          if draft_len is None else draft_len, tree_budget, tree_topk,
                                                          vocab)
        if self.spec is None:
            self.width = 1
        elif self.spec.proposer.tree:
            self.width = tree_budget + 1
        else:
            self.width = min(self.spec.draft_len, drafter.cfg.block_size - 1) + 1
        lengths = torch.tensor([len(p) - 1 for p in prompts], device=device)
        capacity = int(lengths.max()) + max_new_tokens + self.width + 1
        self.cache = StaticKVCache.for_model(target.cfg, n, capacity, target.lm_head.weight.dtype, device)
        self.layers = () if self.spec is None else drafter.cfg.target_layers
        self.draft_dtype = draft_dtype or default_draft_dtype(target)
        if self.spec is not None:
            self.context = StaticKVCache.for_model(drafter.cfg.attention_config(), n, capacity, self.draft_dtype,
                                                   device, n_layers=len(drafter.layers))
            self.context.active = self.cache.active  # one flag per sequence for both caches
        self._prefill(prompts)
        self.cache.lengths.copy_(lengths)
        if self.spec is not None:
            self.context.lengths.copy_(lengths)
        self.anchor = torch.tensor([p[-1] for p in prompts], device=device)
        self.before = torch.tensor([p[-2] if len(p) > 1 else p[-1] for p in prompts], device=device)
        self.step_index = torch.zeros((), dtype=torch.int64, device=device)  # the block counter

    def caches(self) -> List[StaticKVCache]:
        return [self.cache] if self.spec is None else [self.cache, self.context]

    def _prefill(self, prompts) -> None:
        """Every prompt but its last token, each in a forward of its own (no padding: as long as
        generate's prefill), copied into its rows of the static caches."""
        device = self.cache.lengths.device
        for i, p in enumerate(prompts):
            if len(p) < 2:
                continue
            alone = self.target.new_cache()
            _, hidden = self.target(torch.tensor([p[:-1]], device=device), alone, hidden_layers=self.layers)
            self.cache.load(i, alone.k, alone.v)
            if self.spec is not None:
                features = torch.cat(hidden, dim=-1).to(self.draft_dtype)
                context = self.drafter.context(features, torch.arange(len(p) - 1, device=device))
                self.context.load(i, [k for k, _ in context], [v for _, v in context])

    def _extend_context(self, features: torch.Tensor) -> None:
        """The drafter's injected keys and values of features [N, T, F], written after each context."""
        positions = self.context.lengths[:, None] + torch.arange(features.shape[1], device=features.device)
        for i, (k, v) in enumerate(self.drafter.context(features.to(self.draft_dtype), positions)):
            self.context.append(i, k, v)

    def _ar(self, rng: Streams):
        """Every sequence's next token from its anchor alone (in a speculative decode the anchor's
        features also join the drafter's context)."""
        logits, hidden = self.target(self.anchor[:, None], self.cache, hidden_layers=self.layers)
        no_drafts = torch.empty(self.anchor.shape[0], 0, dtype=torch.int64, device=logits.device)
        accept_len, out = self.vocab.chain_verify(no_drafts, logits.float(), temperature=rng.temperature,
                                                  seed=rng.seed, offset=rng.verify)
        self.cache.commit(accept_len, 1)
        if self.spec is not None:
            self._extend_context(torch.cat(hidden, dim=-1))
            self.context.commit(accept_len, 1)
        return accept_len, out

    def _draft(self, rng: Streams, with_confidence: bool = False):
        """The drafter's pass and the mode's proposal: a Proposal, or a DraftTree."""
        spec = self.spec
        base_logits, h = draft_block(self.drafter, self.target, self.anchor, self.context.keys_values(),
                                     self.draft_dtype, ctx_len=self.context.lengths)
        prefix = torch.stack([self.before, self.anchor], 1)
        if spec.proposer.tree:
            return spec.verifier.build(spec.proposer.marginals(base_logits, h, prefix, rng))
        return spec.proposer.propose(base_logits, h, prefix, rng, with_confidence)

    def _verify(self, drafted, rng: Streams, k: Optional[int] = None, limit: Optional[torch.Tensor] = None):
        """One target call over every sequence's first k drafts (default: the step's width) or its
        tree; sequence n keeps at most limit[n] drafts. The drafter's context gets every written
        position's keys and values; commit makes the accepted ones visible."""
        spec = self.spec
        if spec.proposer.tree:
            accept_len, out, features, _ = spec.verifier.verify(self.target, self.anchor, drafted, self.cache,
                                                                self.layers, rng)
        else:
            k = self.width - 1 if k is None else k
            if drafted.limit is not None:
                limit = drafted.limit if limit is None else torch.minimum(limit, drafted.limit)
            chosen = Proposal(drafted.drafts[:, :k], None if drafted.q is None else drafted.q[:, :k], None, limit)
            accept_len, out, features = spec.verifier.verify(self.target, self.anchor, chosen, self.cache,
                                                             self.layers, rng)
        self._extend_context(features)
        self.context.commit(accept_len, features.shape[1])
        return accept_len, out

    def _streams(self) -> Streams:
        return Streams(self.temperature, self.seeds, self.step_index)

    def step(self, draft: bool = True):
        """One block for every sequence, in fixed shapes: (accept_len [N], out_tokens [N, width]);
        draft=False (or mode "ar"): an ar step, out_tokens [N, 1]."""
        rng = self._streams()
        accept_len, out = self._verify(self._draft(rng), rng) if draft and self.spec else self._ar(rng)
        self._advance(accept_len, out)
        return accept_len, out

    def ruled_step(self, rule, active: List[bool]):
        """A chain block whose verified width the draft length rule chooses for the batch (a host
        read of the confidences; shapes vary: the eager CPU path), or an ar step while the rule
        finds drafting not worth its cost. Returns (accept_len, out_tokens, each sequence's
        confidences of the verified drafts, or None for an ar step)."""
        rng = self._streams()
        if not rule.draft_now():
            accept_len, out = self._ar(rng)
            confidences = None
        else:
            began = time.perf_counter()
            drafted = self._draft(rng, with_confidence=True)
            confidences = drafted.confidence[:, : self.width - 1].tolist()
            if drafted.limit is not None:  # unsettled Jacobi slots at T > 0 are never verified
                confidences = [c[:n] for c, n in zip(confidences, drafted.limit.tolist())]
            confidences = [c if a else [] for c, a in zip(confidences, active)]
            k = rule.choose_batch(confidences, time.perf_counter() - began)
            confidences = [c[:k] for c in confidences]
            accept_len, out = self._verify(drafted, rng, k=k)
        self._advance(accept_len, out)
        return accept_len, out, confidences

    def _advance(self, accept_len: torch.Tensor, out: torch.Tensor) -> None:
        """Each active sequence's new anchor (its last emitted token) and the token before it."""
        idx = accept_len[:, None]
        anchor = out.gather(1, idx)[:, 0]
        before = torch.where(accept_len > 0, out.gather(1, (idx - 1).clamp(min=0))[:, 0], self.anchor)
        active = self.cache.active.bool()
        self.before.copy_(torch.where(active, before, self.before))
        self.anchor.copy_(torch.where(active, anchor, self.anchor))
        self.step_index += 1


class CapturedStep:
    """step() run eagerly once (a real step, and the warm-up lazy initialisation needs), then captured
    once as a CUDA graph and replayed: every later call is one replay, its outputs the captured ones."""

    def __init__(self, step):
        self.step = step
        self.graph, self.outputs, self.calls = None, None, 0

    def __call__(self):
        self.calls += 1
        if self.calls == 1:
            return self.step()
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.outputs = self.step()
        self.graph.replay()
        return self.outputs


def _check(target, prompts, max_new, mode, drafter, refiner, draft_len, tree_budget):
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(target, TargetLM):
        raise ValueError(f"generate_batch needs xkernels' TargetLM (its static cache), got {type(target).__name__}")
    if mode != "ar" and drafter is None:
        raise ValueError(f"mode {mode!r} needs a drafter")
    if mode in ("sequential", "jacobi", "tree-jacobi") and refiner is None:
        raise ValueError(f"mode {mode!r} needs a refiner")
    if mode in ("tree", "tree-jacobi") and tree_budget < 1:
        raise ValueError(f"tree_budget must be >= 1, got {tree_budget}")
    if not (draft_len is None or draft_len == "auto" or (isinstance(draft_len, int) and draft_len >= 1)):
        raise ValueError(f"draft_len must be 'auto', None or an int >= 1, got {draft_len!r}")
    if not prompts or any(len(p) < 1 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token lists")
    if len(max_new) != len(prompts) or any(m < 1 for m in max_new):
        raise ValueError("max_new_tokens must be >= 1 (an int, or one per prompt)")


@torch.inference_mode()
def generate_batch(target, prompts: Sequence[Sequence[int]], max_new_tokens: Union[int, Sequence[int]], *,
                   mode: str = "ar", drafter=None, refiner=None, iters: int = 4, temperature: float = 0.0,
                   seed: Union[int, Sequence[int]] = 0, draft_len: Union[int, str, None] = "auto",
                   tree_budget: int = 15, tree_topk: int = 8, num_threads: Optional[int] = None,
                   draft_dtype: Optional[torch.dtype] = None, cost_model: Optional[CostModel] = None,
                   cuda_graph: Optional[bool] = None, tp_group=None):
    """Continue every prompt (token lists of any lengths) by its max_new_tokens (an int, or one per
    prompt). Returns (a list of token lists, BatchStats).

    Modes and their arguments as in generate. seed: one per prompt, or an int s that gives prompt i
    the seed request_seeds(s, N)[i] (s itself for prompt 0; xkernels.decoding.modes.request_seeds).
    Each sequence's noise is keyed by its seed and its own block counter only, so with a fixed
    draft_len (an int or None) sequence i gets generate(target, prompts[i], ..., seed=its seed)'s
    tokens in any batch, on CPU and CUDA; "auto" chooses draft lengths for the whole batch (and by
    timing), which changes the tokens a seed gives at T > 0.
    draft_len: an int verifies the first draft_len drafts of every block, None all B-1, in one
    fixed shape. "auto" (the default): in the chain modes without a CUDA graph, the draft length rule (xkernels.decoding.draft_length, with cost_model or
    one measured for this batch size) chooses per block how many drafts every sequence verifies,
    for the batch's throughput, and runs ar steps while drafting does not pay; with a graph and in
    the tree modes, each step is a block of all B-1 drafts (or the whole tree) or an ar step, the
    one with more tokens per second as measured on the steps themselves (MeasuredChoice).
    cuda_graph: capture the step as a CUDA graph (default: on a CUDA target without tp_group).
    tp_group: a vocabulary-parallel target, as in generate (every rank calls with the same arguments;
    eager steps: the sharded ops take the step's offset as a device tensor and read nothing on the
    host, but the loop's sharded Jacobi stops early on a host read and no capture under NCCL has
    been run)."""
    prompts = [[int(t) for t in p] for p in prompts]
    max_new = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    _check(target, prompts, max_new, mode, drafter, refiner, draft_len, tree_budget)
    seed = request_seeds(seed, len(prompts)).tolist()  # checked before any work
    vocab = WholeVocab
    if tp_group is not None:
        if cuda_graph:
            raise ValueError("cuda_graph=True cannot be combined with tp_group (the loop's sharded Jacobi stops on "
                             "a host read, and capture under NCCL has not been run)")
        tensor_parallel.check_supported(mode, temperature, draft_len)
        target, vocab = tensor_parallel.shard_target(target, tp_group)
    device = target.lm_head.weight.device
    # Tensor parallel runs eagerly: the sharded ops take the offset on the device and read nothing
    # on the host, but the loop's Jacobi stops early on a host read, and no capture under NCCL has
    # been run.
    graphed = device.type == "cuda" and tp_group is None if cuda_graph is None else cuda_graph
    if graphed and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs a target on a CUDA device, not {device.type}")
    stats = BatchStats(mode, accept_lens=[[] for _ in prompts])
    outs: List[List[int]] = [[] for _ in prompts]
    with _intra_op_threads(decode_threads(target, num_threads)):
        rule = choice = None
        if draft_len == "auto" and mode in CHAIN_MODES and not graphed:  # measured before the clock starts
            rule = DraftLengthRule(cost_model or measured_cost_model(target, drafter.cfg.block_size,
                                                                     batch=len(prompts)), weigh_probes=True)
        elif draft_len == "auto" and mode != "ar":
            choice = MeasuredChoice()
        began = time.perf_counter()
        decoder = BatchDecoder(target, prompts, max(max_new), mode, drafter, refiner, iters, temperature, seed,
                               None if draft_len == "auto" else draft_len, tree_budget, tree_topk, draft_dtype, vocab)
        steps = {kind: (lambda kind=kind: decoder.step(kind)) for kind in (True, False)}
        if graphed:
            steps = {kind: CapturedStep(step) for kind, step in steps.items()}
        lengths = [len(p) - 1 for p in prompts]  # each cache's entries, as the host knows them
        active = [True] * len(prompts)
        while any(active):
            if not graphed:  # the eager step reads only the keys in use
                for cache in decoder.caches():
                    cache.window = min(cache.capacity, max(lengths) + decoder.width)
            drafting, step_began = decoder.spec is not None and (choice is None or choice.draft_now()), time.perf_counter()
            if rule is None:
                (accept_len, out), verified = steps[drafting](), None
            else:
                accept_len, out, verified = decoder.ruled_step(rule, active)
                drafting = verified is not None
            stats.draft_calls += drafting
            rows = torch.cat([accept_len[:, None], out], 1).tolist()  # the step's one host read
            if choice is not None:
                choice.observe(drafting, sum(r[0] + 1 for r, a in zip(rows, active) if a),
                               time.perf_counter() - step_began)
            stats.target_calls += 1
            finished = False
            for i, row in enumerate(rows):
                if active[i]:
                    outs[i] += row[1 : row[0] + 2]
                    lengths[i] += row[0] + 1
                    stats.accept_lens[i].append(row[0])
                    active[i] = len(outs[i]) < max_new[i]
                    finished |= not active[i]
                    if verified is not None:
                        for j, c in enumerate(verified[i][: row[0] + 1]):
                            rule.observe(c, j < row[0])
            if finished:
                decoder.cache.active.copy_(torch.tensor(active, dtype=torch.int64))
        if decoder.spec is not None:
            stats.refine_passes = decoder.spec.proposer.refine_passes()
        stats.seconds = time.perf_counter() - began
    outs = [o[:m] for o, m in zip(outs, max_new)]
    stats.new_tokens = sum(len(o) for o in outs)
    return outs, stats
