"""The decoding loop with a vocabulary-parallel target (generate(..., tp_group=group)).

Each rank of the group holds the rows [start, end) of the target's LM head (and of the refiner's
folded readout w_read and token table emb), so the target's forward returns that rank's shard of
the logits; verification, refinement and the loop's own argmax / softmax run sharded through
xkernels.distributed, exchanging O(rows) numbers per step instead of the logits. The rest of the
model (embedding, blocks, drafter) is replicated: this is the vocabulary-parallel part of tensor
parallelism, the part whose communication is the logits. Every rank emits the same tokens as one
process.

Supported: every mode but "drafter" at T > 0 (its torch.multinomial draw over q needs the whole
distribution); "drafter" at T = 0 drafts the sharded argmax, and the tree modes build their trees
from a sharded top-k (each rank's k best, merged).
"""

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import distributed
from . import candidates
from ..ops import shard_row_stats
from ..models.target import Linear



def check_supported(mode: str, temperature: float, draft_len) -> None:
    """What a vocabulary-parallel decode cannot do, as an error naming the argument."""
    if mode == "drafter" and temperature != 0:
        raise ValueError("tp_group: mode 'drafter' runs only at temperature 0 (its sample reads whole rows)")
    if mode != "ar" and draft_len == "auto":  # its rule reads timings: ranks would verify different drafts
        raise ValueError("tp_group needs a fixed draft_len (an int or None), not 'auto'")


def shard_bounds(vocab_size: int, world: int, rank: int):
    """[start, end) of rank's shard: equal shards, the last one takes the remainder."""
    size = vocab_size // world
    return rank * size, vocab_size if rank == world - 1 else (rank + 1) * size


@dataclass
class VocabShard:
    """This rank's shard of the vocabulary: modes.WholeVocab's calls on shards of the rows."""

    group: object
    start: int
    end: int
    vocab: int  # the whole vocabulary

    def stats(self, local: torch.Tensor, temperature: float = 0.0):
        """Global (max, sum, top id) of the rows of local [N, R, V_local] (logits / T)."""
        distributed.traffic.read(local)
        row_max, row_sum, top, _, _, _ = shard_row_stats(local, self.start, temperature=temperature)
        g = distributed._all_gather([row_max, row_sum, top], self.group)
        return distributed.merge_stats(g[:, 0], g[:, 1], distributed._ids(g[:, 2]))

    def argmax(self, local: torch.Tensor) -> torch.Tensor:
        return self.stats(local)[2]

    def top(self, local: torch.Tensor):
        """(the largest probability of softmax(logits), its global id), per row."""
        _, total, top = self.stats(local)
        return 1 / total, top

    def softmax(self, local: torch.Tensor, temperature: float = 1.0):
        """This shard of softmax(logits / T) [N, R, V_local] (float32), and the distribution's
        largest probability [N, R] (1 / sum)."""
        big_m, big_s, _ = self.stats(local, temperature)
        inv_t = 1.0 / temperature if temperature else 1.0
        return torch.exp(local.float() * inv_t - big_m[..., None]) / big_s[..., None], 1 / big_s

    def topk_logprobs(self, local: torch.Tensor, k: int):
        """(log_softmax(logits) of the k best ids, the ids) [N, R, k] of whole rows from their shards
        [N, R, V_local], equal to WholeVocab's (candidates.py): each rank's k best and its part of
        the log-sum-exp (float64, as two float32 words), in one all-gather, merged alike on every
        rank."""
        k = min(k, self.vocab)
        distributed.traffic.read(local)
        kk = min(k, local.shape[-1])
        values, ids = candidates.topk_lower_id(local, kk)
        row_max, row_sum = candidates.logsumexp_parts(local)
        hi = row_sum.float()
        lo = (row_sum - hi.double()).float()  # hi + lo keeps 48 of the sum's bits
        pad = torch.nn.functional.pad
        floats = torch.cat([pad(values, (0, k - kk), value=float("-inf")), torch.stack([row_max, hi, lo], -1)], -1)
        ids = pad(ids + self.start, (0, k - kk + 3), value=-1)
        g = distributed._all_gather([floats, ids], self.group)  # [W, 2, N, R, k + 3]
        big_m, big_s = candidates.merge_logsumexp(g[:, 0, ..., k], g[:, 0, ..., k + 1].double() +
                                                  g[:, 0, ..., k + 2].double())
        values, ids = candidates.topk_lower_id(torch.cat(list(g[:, 0, ..., :k]), -1), k,
                                               torch.cat(list(distributed._ids(g[:, 1, ..., :k])), -1))
        return candidates.candidate_logprobs(values, big_m, big_s), ids

    def tree_verify(self, tokens, parents, local_logits, **kw):
        return distributed.tree_verify(tokens, parents, local_logits, vocab_start=self.start, group=self.group, **kw)

    def chain_verify(self, drafts, local_logits, *, draft_probs=None, temperature=0.0, seed=0, offset=0):
        return distributed.chain_verify(drafts, local_logits, vocab_start=self.start, group=self.group,
                                        draft_probs=draft_probs, temperature=temperature, seed=seed, offset=offset)

    def refine(self, name: str):
        """distributed.refine_step / jacobi_refine / sequential_refine bound to this shard."""
        fn = getattr(distributed, name)
        return lambda *args, **kw: fn(*args, vocab_start=self.start, group=self.group, **kw)

    def weights(self, weights):
        """The shard's rows of the refiner's folded emb and w_read."""
        return weights._replace(emb=weights.emb[self.start:self.end], w_read=weights.w_read[self.start:self.end])

    def delta(self, refiner, ctx, prev):
        """The refiner's logit bias at this shard's ids. The loop's q at T > 0 reads the unfolded
        refiner (replicated), so this computes its whole readout and keeps the shard: exactly the
        one-process values, at the cost of the full [N, B, V] readout on every rank."""
        return refiner.delta(ctx, prev)[..., self.start:self.end]


def shard_target(target, group):
    """(A view of target whose LM head holds this rank's rows, the VocabShard). The rows are cut
    from the whole head here (the shipped models are small); a deployment would load only its
    rows."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    start, end = shard_bounds(target.lm_head.weight.shape[0], world, rank)
    head = Linear(target.lm_head.weight.shape[1], end - start, bias=False, device=target.lm_head.weight.device,
                  dtype=target.lm_head.weight.dtype)
    with torch.no_grad():
        head.weight.copy_(target.lm_head.weight[start:end])
    view = copy.copy(target)
    view._modules = dict(target._modules)  # the view's own module table: the original keeps its head
    view.lm_head = head
    return view, VocabShard(group, start, end, target.lm_head.weight.shape[0])
