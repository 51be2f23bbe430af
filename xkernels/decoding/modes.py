"""A speculative decoding mode is a proposer (where a block's drafts come from) and a verifier (how
one target call checks them and what the caches keep). Both work on N sequences at once and read
nothing on the host, so the one-sequence loop (generate) and the batched one (generate_batch, whose
blocks a CUDA graph can capture) run the same code.

Proposers: "drafter" (the drafter's own drafts), "sequential" and "jacobi" (xPress refinement),
"tree" and "tree-jacobi" (the per-slot marginals a draft tree is built over). Verifiers: a chain
(chain_verify) or a tree (build_draft_tree, a tree-masked forward, tree_verify).

Both sample through a vocabulary: WholeVocab (the ops on whole logits rows, one process) or
tensor_parallel.VocabShard (the same calls on this rank's shard of every row, exchanging a few
numbers per row with the other ranks), so the modes are written once for both.
"""

import numbers
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from .. import ops
from ..models.target import Linear
from ..ops import build_draft_tree
from ..streams import offset_advance
from .candidates import whole_candidates

Step = Union[int, torch.Tensor]


class WholeVocab:
    """The loop's sampling calls on whole logits rows [..., V]: the xkernels ops as they are."""

    chain_verify = staticmethod(ops.chain_verify)
    tree_verify = staticmethod(ops.tree_verify)

    @staticmethod
    def refine(name: str):
        """The refinement op `name` (refine_step, jacobi_refine or sequential_refine)."""
        return getattr(ops, name)

    @staticmethod
    def weights(weights):
        return weights

    @staticmethod
    def delta(refiner, ctx, prev):
        return refiner.delta(ctx, prev)

    @staticmethod
    def argmax(logits):
        return logits.argmax(-1)

    @staticmethod
    def top(logits):
        """(the largest probability of softmax(logits), its id), per row: the id is the logits'
        argmax, the lowest on a tie (softmax could round distinct logits to one probability)."""
        return torch.softmax(logits, -1).amax(-1), logits.argmax(-1)

    @staticmethod
    def softmax(logits, temperature):
        """(softmax(logits / T) float32, its largest probability per row); T a float, or [N] for
        logits [N, ...] (each sequence's)."""
        if isinstance(temperature, torch.Tensor):
            temperature = temperature.view(-1, *[1] * (logits.dim() - 1))
        q = torch.softmax(logits / temperature, -1)
        return q, q.amax(-1)

    @staticmethod
    def topk_logprobs(logits, k: int):
        """(log_softmax(logits) of each row's k best ids, the ids), ties to the lower id
        (candidates.py: the same as VocabShard's from shards of the rows)."""
        return whole_candidates(logits, min(k, logits.shape[-1]))


@dataclass
class Streams:
    """The Philox streams of block `step` of N sequences, in the ops' per-request form: sequence n's
    noise is keyed by (seed[n], offset + slot) only, so its tokens are the same alone or at any row
    of any batch. seed: int64 [N] (request_seeds); step: an int, a 0-dim int64 tensor (a CUDA graph
    advances it in place) or [N] (each sequence's own block). The drafts, the verification and a
    truncated chain's bonus token key disjoint ranges of offsets, so the residual sample at row d
    never reuses the noise that chose draft d, and block verification's coins of unverified slots
    are never read again by a later block. temperature: a float (0: greedy), or each sequence's
    float32 [N], all above 0 (the refined proposers take it: vLLM's proposer drafts its sampled
    requests in one call)."""

    temperature: Union[float, torch.Tensor]
    seed: torch.Tensor
    step: Step

    SLOTS = 1 << 16  # offsets one draw kind may use in a block: more than any block's slots or tree's nodes

    @property
    def greedy(self) -> bool:
        return not isinstance(self.temperature, torch.Tensor) and self.temperature == 0

    def _offset(self, kind: int) -> Step:
        return (3 * self.step + kind) * self.SLOTS

    def room(self, op: str, *args, **kwargs) -> None:
        """Raises where a call of op reads more slots (xkernels.offset_advance) than a draw kind's
        range of SLOTS holds: its noise would then overlap the next kind's, silently."""
        width = offset_advance(op, *args, seed=self.seed, **kwargs)
        if width > self.SLOTS:
            raise ValueError(f"{op} reads {width} stream slots a call, more than the {self.SLOTS} of a block's range")

    @property
    def verify(self) -> Step:
        return self._offset(0)

    @property
    def draft(self) -> Step:
        return self._offset(1)

    @property
    def bonus(self) -> Step:
        return self._offset(2)


# Odd, so seed + i * _SEED_STRIDE (mod 2**64) differs for every i < 2**64; its size keeps the seeds
# of small nearby integer seeds apart.
_SEED_STRIDE = 0x9E3779B97F4A7C15


def request_seeds(seed: Union[int, Sequence[int]], n: int, device=None) -> torch.Tensor:
    """The seeds of n sequences, int64 [n]: a list gives each its own; an int s gives sequence i the
    seed s + i * 0x9E3779B97F4A7C15 (mod 2**64), so sequence 0 has s (generate's seed) and rows of
    one prompt are independent samples."""
    if isinstance(seed, numbers.Integral):  # an int or a NumPy integer
        seeds = [(int(seed) + i * _SEED_STRIDE) % (1 << 64) for i in range(n)]
    else:
        seeds = [int(s) % (1 << 64) for s in seed]
        if len(seeds) != n:
            raise ValueError(f"seed must be an int or one per sequence ({n}), got {len(seeds)}")
    return torch.tensor([s - (1 << 64) if s >= 1 << 63 else s for s in seeds], dtype=torch.int64, device=device)


@dataclass
class Proposal:
    drafts: torch.Tensor  # int64 [N, D]
    q: Optional[torch.Tensor]  # float32 [N, D, V], the distributions the drafts were drawn from (T > 0)
    confidence: Optional[torch.Tensor]  # [N, D], each slot's largest draft probability (the draft length rule)
    limit: Optional[torch.Tensor] = None  # int64 [N]: only the first limit[n] drafts are proper samples of q


def draft_block(drafter, target, anchor: torch.Tensor, ctx_kv, dtype: torch.dtype, start: int = 0,
                ctx_len: Optional[torch.Tensor] = None):
    """The drafter's pass over [anchor, MASK ...] for anchors [N]: (base logits float32 [N, B-1, V]
    from the target's head, the drafter's states [N, B, dim])."""
    masks = torch.full((anchor.shape[0], drafter.cfg.block_size - 1), drafter.cfg.mask_token_id,
                       device=anchor.device)
    h = drafter(target.embed(torch.cat([anchor[:, None], masks], 1)).to(dtype), ctx_kv, start=start,
                ctx_len=ctx_len)
    head = target.lm_head
    return head(h[:, 1:] if isinstance(head, Linear) else h[:, 1:].to(head.weight.dtype)).float(), h


class Proposer:
    """Drafts of a block from base_logits [N, D, V] and the drafter's states h [N, D+1, dim], after
    prefix [N, 2] (the token before the anchor, the anchor). At T > 0 a draft's confidence is a
    function of its distribution, never of the token drawn from it (a choice that read the drawn
    token would bias which drafts get verified)."""

    tree = False

    def __init__(self, refiner=None, iters: int = 4, vocab=WholeVocab, slots: Optional[int] = None):
        """slots: refine only the first `slots` drafted slots of a block (their drafts are those of
        the whole block: the refiner is causal), for callers that verify no more; None: every slot."""
        self.refiner, self.iters, self.vocab, self.slots = refiner, iters, vocab, slots
        folded = refiner.fold().to(torch.float32) if refiner is not None else None
        if folded is not None and slots is not None:
            folded = folded.first_slots(slots + 1)  # the anchor's slot and the drafted ones
        self.weights = vocab.weights(folded) if folded is not None else None
        self._passes: Optional[torch.Tensor] = None  # refinement passes, on the device (a graph replay adds too)

    def _count(self, passes, device) -> None:
        if self._passes is None:
            self._passes = torch.zeros((), dtype=torch.int64, device=device)
        self._passes += passes

    def refine_passes(self) -> int:
        """The refinement passes run so far (one host read)."""
        return 0 if self._passes is None else int(self._passes)

    def _ctx(self, h: torch.Tensor) -> torch.Tensor:
        return self.refiner.prepare(h.to(self.refiner.w2.weight.dtype)).float()


class DrafterProposer(Proposer):
    def propose(self, base_logits, h, prefix, rng: Streams, with_confidence=False) -> Proposal:
        if rng.temperature == 0:
            if not with_confidence:
                return Proposal(self.vocab.argmax(base_logits), None, None)
            confidence, drafts = self.vocab.top(base_logits)
            return Proposal(drafts, None, confidence)
        # Whole rows: one process only (tensor_parallel refuses this mode at T > 0).
        q = torch.softmax(base_logits / rng.temperature, -1)
        return Proposal(sample_slots(base_logits, rng, self.vocab), q, q.amax(-1) if with_confidence else None)


def sample_slots(logits: torch.Tensor, rng: Streams, vocab=WholeVocab) -> torch.Tensor:
    """A sample of softmax(logits / T) at every slot of logits [N, D, V], int64 [N, D], from each
    sequence's draft stream (slot d at offset rng.draft + d): chain_verify without drafts samples
    each slot row's bonus token."""
    n, d, v = logits.shape
    slots = torch.arange(d, device=logits.device)
    # An int or 0-dim draft offset is added as a scalar: no copy of host data (capturable).
    draft = rng.draft[:, None] if isinstance(rng.draft, torch.Tensor) and rng.draft.dim() == 1 else rng.draft
    offset = (slots + draft).expand(n, d).reshape(-1)
    seed = rng.seed[:, None].expand(n, d).reshape(-1)
    no_drafts = torch.empty(n * d, 0, dtype=torch.int64, device=logits.device)
    _, out = vocab.chain_verify(no_drafts, logits.reshape(n * d, 1, v), temperature=rng.temperature, seed=seed,
                                offset=offset)
    return out.view(n, d)


class RefinedProposer(Proposer):
    """xPress: the drafter's logits plus the refiner's correction given the drafts before each slot."""

    settles = True  # the refinement ends on drafts that are samples of the q it reports

    def _refine(self, ctx, prefix, base_logits, rng):
        raise NotImplementedError

    def propose(self, base_logits, h, prefix, rng: Streams, with_confidence=False) -> Proposal:
        ctx = self._ctx(h)  # of the whole block: prepare's context reads the mean of every slot's h
        if self.slots is not None:
            ctx, base_logits = ctx[:, : self.slots + 1], base_logits[:, : self.slots]
        drafts, logprobs = self._refine(ctx, prefix, base_logits, rng)
        if rng.greedy:
            return Proposal(drafts, None, logprobs.exp() if with_confidence else None)  # the argmax's probability
        prev = torch.cat([prefix, drafts[:, :-1]], dim=1)
        limit = None
        if not self.settles:
            # A slot's draft follows q(. | the drafts before it) only where Jacobi has settled: a check
            # pass from the final drafts (same noise) agrees up to the first unsettled slot, whose
            # check sample is itself a proper draft; verify up to there. prev is right for those
            # slots: it differs from the check only later.
            check, _ = self.vocab.refine("refine_step")(ctx, prev, base_logits, self.weights,
                                                        temperature=rng.temperature, seed=rng.seed, offset=rng.draft)
            self._count(drafts.shape[0], drafts.device)
            differ = check != drafts
            limit = torch.where(differ.any(1), differ.int().argmax(1) + 1, drafts.shape[1])
            drafts = check
        refined = base_logits.float() + self.vocab.delta(self.refiner, ctx, prev)[:, 1:].float()
        q, top = self.vocab.softmax(refined, rng.temperature)
        return Proposal(drafts, q, top if with_confidence else None, limit)


class SequentialProposer(RefinedProposer):
    def _refine(self, ctx, prefix, base_logits, rng):
        drafts, logprobs = self.vocab.refine("sequential_refine")(ctx, prefix, base_logits, self.weights,
                                                                  temperature=rng.temperature, seed=rng.seed,
                                                                  offset=rng.draft)
        self._count(drafts.numel(), drafts.device)
        return drafts, logprobs


class JacobiProposer(RefinedProposer):
    settles = False  # it may stop after `iters` passes on an iterate that would still change

    def _refine(self, ctx, prefix, base_logits, rng):
        drafts, logprobs, passes = self.vocab.refine("jacobi_refine")(
            ctx, prefix, base_logits, self.weights, max_iters=self.iters, temperature=rng.temperature, seed=rng.seed,
            offset=rng.draft)
        self._count(passes.sum(), passes.device)
        return drafts, logprobs


class TreeProposer(Proposer):
    """The per-slot logits [N, D, V] a draft tree is built over: the drafter's own."""

    tree = True

    def marginals(self, base_logits, h, prefix, rng: Streams) -> torch.Tensor:
        return base_logits


class TreeJacobiProposer(JacobiProposer):
    """The refiner's logits at the final Jacobi iterate (each slot conditioned on the iterate's
    tokens before it)."""

    tree = True

    def marginals(self, base_logits, h, prefix, rng: Streams) -> torch.Tensor:
        ctx = self._ctx(h)
        drafts, _ = self._refine(ctx, prefix, base_logits, rng)
        prev = torch.cat([prefix, drafts[:, :-1]], dim=1)
        return base_logits.float() + self.vocab.delta(self.refiner, ctx, prev)[:, 1:].float()


def truncate_chain(accept_len, out, logits, limit, rng: Streams, vocab=WholeVocab):
    """Sequence n's chain as if only its first limit[n] drafts had been verified: where the walk got
    that far, the token at row limit[n] is a fresh sample of the target's row (its own noise: the
    choice of limit reads only the drafts, so the row is still the target's distribution there)."""
    n, k1, v = logits.shape
    limit = limit.clamp(max=k1 - 1)
    row = logits.gather(1, limit[:, None, None].expand(n, 1, v))
    _, bonus = vocab.chain_verify(torch.empty(n, 0, dtype=torch.int64, device=logits.device), row,
                                  temperature=rng.temperature, seed=rng.seed, offset=rng.bonus)
    cols = torch.arange(k1, device=logits.device)[None]
    reached = (accept_len >= limit)[:, None] & (cols == limit[:, None])
    accept_len = torch.minimum(accept_len, limit)
    out = torch.where(reached, bonus, out)
    return accept_len, torch.where(cols > accept_len[:, None], -1, out)


class ChainVerifier:
    """method: "token" (token-wise) or "block" (block verification, whole vocabulary only)."""

    def __init__(self, vocab=WholeVocab, method: str = "token"):
        self.vocab, self.method = vocab, method

    def verify(self, target, anchor, proposal: Proposal, cache, layers, rng: Streams):
        """One target call over [anchor, drafts] (anchor [N]), chain_verify, and the cache keeps the
        anchor and the accepted drafts. Returns (accept_len [N], out_tokens [N, K+1], the target's
        features [N, K+1, F] of the forward's tokens, valid through accept_len)."""
        drafts = proposal.drafts
        tokens = torch.cat([anchor[:, None], drafts], 1)
        logits, hidden = target(tokens, cache, hidden_layers=layers)
        logits = logits.float()
        block = {"method": "block"} if self.method == "block" else {}
        if block and proposal.limit is not None:  # block acceptance reads every row: no cutting afterwards
            raise ValueError("block verification needs every verified draft proper (no per-sequence limit)")
        rng.room("chain_verify", drafts)
        accept_len, out = self.vocab.chain_verify(drafts, logits, draft_probs=proposal.q, temperature=rng.temperature,
                                                  seed=rng.seed, offset=rng.verify, **block)
        if proposal.limit is not None:
            accept_len, out = truncate_chain(accept_len, out, logits, proposal.limit, rng, self.vocab)
        cache.commit(accept_len, tokens.shape[1])
        return accept_len, out, torch.cat(hidden, dim=-1)


@dataclass
class DraftTree:
    tokens: torch.Tensor  # int64 [N, M], the root -1
    parents: torch.Tensor  # int64 [N, M]
    num_nodes: torch.Tensor  # int64 [N]
    depth: torch.Tensor  # int64 [N, M]
    mask: torch.Tensor  # bool [N, M, M]: the tree's attention mask, written by the build's launch
    candidates: tuple  # (log-probs, ids) [N, D, k] of each slot's candidates the tree was built from

    def prefix(self, m: int) -> "DraftTree":
        """The first m nodes (a prefix of a best-first tree is a tree; its mask is the first m rows and
        columns, as a node's ancestors come before it and a padding node sees itself only)."""
        return DraftTree(self.tokens[:, :m], self.parents[:, :m], self.num_nodes.clamp(max=m), self.depth[:, :m],
                         self.mask[:, :m, :m], self.candidates)

    def node_probs(self, n: int, m: int) -> torch.Tensor:
        """The marginal probability of nodes 1..m-1 of sequence n (for the draft length rule)."""
        lp, ids = self.candidates
        slot = (self.depth[n, 1:m] - 1).clamp(min=0)
        mine = ids[n, slot] == self.tokens[n, 1:m, None]
        return lp[n, slot].masked_fill(~mine, float("-inf")).amax(-1).exp()


class TreeVerifier:
    def __init__(self, budget: int, topk: int, vocab=WholeVocab):
        self.budget, self.topk, self.vocab = budget, topk, vocab

    def build(self, marginals: torch.Tensor) -> DraftTree:
        """DDTree's best-first tree of `budget` draft nodes over each slot's `topk` candidates."""
        lp, tok = self.vocab.topk_logprobs(marginals, self.topk)
        lp, tok = lp.contiguous(), tok.contiguous()
        return DraftTree(*build_draft_tree(lp, tok, self.budget, mask="bool"), (lp, tok))

    def verify(self, target, anchor, tree: DraftTree, cache, layers, rng: Streams):
        """One target call over the tree under its attention mask (padding nodes see themselves
        only), tree_verify, and the cache keeps the root and the accepted path. Returns (accept_len
        [N], out_tokens [N, M], the target's features [N, M, F] of the kept nodes first, path [N, M])."""
        m = tree.tokens.shape[1]
        root = torch.arange(m, device=anchor.device)[None] == 0
        tokens = torch.where(root, anchor[:, None], tree.tokens.clamp(min=0))
        logits, hidden = target(tokens, cache, hidden_layers=layers, tree_mask=tree.mask, tree_depth=tree.depth)
        rng.room("tree_verify", tokens)
        accept_len, path, out = self.vocab.tree_verify(tokens, tree.parents, logits.float(),
                                                       temperature=rng.temperature, seed=rng.seed, offset=rng.verify,
                                                       num_nodes=tree.num_nodes)
        cache.commit(accept_len, m, path)
        rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
        return accept_len, out, torch.cat(hidden, dim=-1)[rows, path.clamp(min=0)], path


PROPOSERS = {"drafter": DrafterProposer, "sequential": SequentialProposer, "jacobi": JacobiProposer,
             "tree": TreeProposer, "tree-jacobi": TreeJacobiProposer}


@dataclass
class Mode:
    """A speculative mode: its proposer, its verifier, and the drafts a chain verifies per block."""

    name: str
    proposer: Proposer
    verifier: Union[ChainVerifier, TreeVerifier]
    draft_len: int


def make_mode(name: str, refiner, iters: int, draft_len: int, tree_budget: int, tree_topk: int,
              vocab=WholeVocab, verify_method: str = "token") -> Mode:
    """vocab: WholeVocab, or the VocabShard of a vocabulary-parallel target; verify_method: a chain's
    "token" or "block" verification."""
    if max(draft_len, tree_budget) >= Streams.SLOTS:  # a block's slots must stay inside its draw kind's range
        raise ValueError(f"draft_len and tree_budget must be below {Streams.SLOTS}, got {draft_len} and {tree_budget}")
    proposer = PROPOSERS[name](refiner, iters, vocab)
    verifier = TreeVerifier(tree_budget, tree_topk, vocab) if proposer.tree else ChainVerifier(vocab, verify_method)
    return Mode(name, proposer, verifier, draft_len)
