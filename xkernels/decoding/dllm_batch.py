"""Block diffusion decoding of many prompts at once (dllm_generate's loop, batched), with Spiffy.

Every sequence decodes its own block in one forward. Per sequence, after its prefix (a
StaticKVCache with per-sequence lengths) the call lays out first the finished blocks it commits
(none, one or two: their keys and values stay, block-causal among themselves, as in
dllm_generate's forward_copies), then its block and its K draft copies, every copy at the block's
positions after the committed ones, attending to the prefix, the committed blocks and,
bidirectionally, itself; after the drafts, a next block of masks for each complete draft, one
block further on and seeing that draft too. The others' keys are written but never kept.

A sequence takes its step: dllm_step's, or with Spiffy spiffy_accept's walk through the drafts
that spiffy_materialize filled from its last step distribution (none in a block's first call,
as in dllm_generate). A walk that completes the block on a draft with a next block takes that
block's first step from its logits in the same call; the finished block is committed in the next
call. Each prompt is committed alone with its first block's first step (forward_copies, one call
a prompt). Sequences therefore finish blocks at their own steps, and the host reads twice per
call: with Spiffy, before the forward, how many drafts and next blocks to lay out; after it, the
steps taken and the blocks completed.

Each sequence's noise is dllm_generate's: its own seed, and the offset of its block and step within
it (the ops' per-request form), so at any temperature sequence i gets dllm_generate(model,
prompts[i], ..., seed=its seed)'s tokens and calls whatever the rest of the batch holds (up to the
rounding of the batched forward).
"""

import time
from typing import List, Optional, Sequence, Union

import torch

from ..models.block_diffusion import BlockDiffusionLM
from ..models.static_cache import StaticKVCache
from ..ops import dllm_step, spiffy_accept, spiffy_materialize
from ..spiffy import SpiffyConfig
from .dllm import DllmStats, PhaseClock
from .modes import request_seeds


class DllmBatchDecoder:
    def __init__(self, model: BlockDiffusionLM, prompts: List[torch.Tensor], max_new_tokens: List[int],
                 block_size: int, temperature: float, seed: Union[int, Sequence[int]], threshold: Optional[float],
                 spiffy: Optional[SpiffyConfig], clock: PhaseClock):
        device = model.lm_head.weight.device
        self.model, self.block_size, self.spiffy, self.clock = model, block_size, spiffy, clock
        self.temperature, self.threshold = temperature, threshold
        self.seeds = request_seeds(seed, len(prompts), device)
        self.mask_id = model.cfg.mask_id
        n, length = len(prompts), block_size
        blocks = [-(-m // length) for m in max_new_tokens]
        self.blocks_of = torch.tensor(blocks, device=device)  # each sequence's blocks
        # a call lays out at most: two blocks to commit, the block, its drafts, a next block after each
        keep = spiffy.keep if spiffy else 0
        lengths = [p.numel() for p in prompts]
        capacity = max(lengths) + max(blocks) * length + (3 + 2 * keep) * length
        self.cache = StaticKVCache.for_model(model.cfg, n, capacity, model.lm_head.weight.dtype, device)
        self.masks = torch.full((n, length), self.mask_id, dtype=torch.int64, device=device)
        firsts = []
        for i, prompt in enumerate(prompts):  # each prompt's own block-causal layout (its blocks end where it does)
            alone = model.new_cache()
            with clock("model"):
                firsts.append(model.forward_copies(self.masks[:1], alone, commit=prompt.view(1, -1).to(device)))
            self.cache.load(i, alone.k, alone.v)
        self.cache.lengths.copy_(torch.tensor(lengths))
        self.unseen = torch.zeros(n, 2 * length, dtype=torch.int64, device=device)  # finished, not yet committed
        self.pending = torch.zeros(n, dtype=torch.int64, device=device)  # how many blocks of unseen
        # Each sequence's block and step within it: the offset of its noise, as in dllm_generate.
        self.block_index = torch.zeros(n, dtype=torch.int64, device=device)
        self.block_step = torch.zeros(n, dtype=torch.int64, device=device)
        self.block = self.masks.clone()
        logits = torch.cat(firsts)
        with clock("step"):
            stepped, _, _, _ = dllm_step(logits, self.masks, self.mask_id, threshold=threshold,
                                         temperature=temperature, seed=self.seeds, offset=self.block_step)
        # Spiffy: each sequence's last step distribution (that of its block before the last step).
        self.stale = logits
        self.first_rows = self.advance(stepped, torch.ones_like(self.block_step), self.block_step)

    def drafts(self):
        """Each sequence's kept drafts from its last step distribution and the copies the call lays
        out after them: (draft blocks [N, K, L], node ids [N, K], -1 where unused: a block's first
        call, a complete block and a finished sequence have none; follows [N, K + M]: for each of M
        next blocks the draft (1-based copy) it follows, -1 if none), or Nones. K is trimmed to the
        most any sequence uses and M to the most complete drafts (one host read)."""
        if self.block_size == 1:  # a block of one position completes in its first call
            return None, None, None
        with self.clock("draft"):
            drafts, node_ids, _ = spiffy_materialize(self.stale, self.block, self.mask_id, self.spiffy.graph,
                                                     keep=self.spiffy.keep, temperature=self.temperature)
            drafting = (self.block == self.mask_id).any(1) & self.cache.active.bool() & (self.block_step > 0)
            node_ids = torch.where(drafting[:, None], node_ids, -1)
            complete = ((drafts != self.mask_id).all(2) & (node_ids >= 0)
                        & (self.block_index + 1 < self.blocks_of)[:, None])  # with a next block
            used, ahead = torch.stack([(node_ids >= 0).sum(1).max(), complete.sum(1).max()]).tolist()
            if not used:
                return None, None, None
            drafts, node_ids, complete = drafts[:, :used], node_ids[:, :used], complete[:, :used]
            follows = torch.full((len(drafts), 1 + used + ahead), -1, dtype=torch.int64, device=drafts.device)
            if ahead:  # the m-th complete draft's next block is copy 1 + used + m
                slot = torch.where(complete, complete.cumsum(1) + used, 0)  # copy index, or 0 (copy 0 follows none)
                copy = torch.arange(1, used + 1, device=drafts.device).expand_as(slot)
                follows.scatter_(1, slot, torch.where(complete, copy, -1))
        return drafts, node_ids, follows

    def layout(self, commit_blocks: int, copies: int, committing: torch.Tensor, follows: torch.Tensor):
        """Rotary positions [N, (P + C) * L] and the attention mask [N, 1, (P + C) * L, window] of P
        blocks to commit and C copies after each sequence's prefix. Sequence n commits its first
        committing[n] of the P blocks (block-causal; the others are padding that sees itself only);
        copy c sees the prefix, the committed blocks, itself and copy follows[n, c] (>= 0: it is the
        block after that copy, one block further on)."""
        cache, length = self.cache, self.block_size
        device = cache.lengths.device
        p = commit_blocks * length
        q = torch.arange(p + copies * length, device=device)
        q_copy = torch.where(q >= p, (q - p) // length, -1)  # [Q]
        q_commit = torch.where(q < p, q // length, -1)
        parent = torch.where(q_copy >= 0, follows.gather(1, q_copy.clamp(min=0).expand(len(follows), -1)), -1)
        positions = (cache.lengths[:, None] + torch.where(q_copy >= 0, committing[:, None] * length + (q - p) % length
                                                          + length * (parent >= 0), q))
        rel = torch.arange(cache.window, device=device) - cache.lengths[:, None]  # [N, W]: key j is new entry rel
        k_copy = torch.where(rel >= p, (rel - p).div(length, rounding_mode="floor"), -2)[:, None, :]
        k_commit = torch.where((rel >= 0) & (rel < p), rel.div(length, rounding_mode="floor"), -1)
        committed = ((k_commit >= 0) & (k_commit < committing[:, None]))[:, None, :]  # [N, 1, W]
        is_copy = (q_copy >= 0)[None, :, None]
        mask = ((rel < 0)[:, None, :]
                | committed & (is_copy | (k_commit[:, None, :] <= q_commit[None, :, None]))
                | is_copy & ((k_copy == q_copy[None, :, None]) | (k_copy == parent[:, :, None]))
                | ((q_commit[None, :, None] >= committing[:, None, None]) & (rel[:, None, :] == q[None, :, None])))
        return positions, mask[:, None]

    def forward(self, commit_blocks: int, committing: torch.Tensor, copies: torch.Tensor,
                follows: torch.Tensor) -> torch.Tensor:
        """Logits [N, C, L, V] of each sequence's C copies [N, C, L] of its block, after it
        commits its first committing[n] of the unseen blocks (layout's attention); every key is
        written after the prefix."""
        model, cache = self.model, self.cache
        n, c, length = copies.shape
        p = commit_blocks * length
        with self.clock("mask"):
            positions, mask = self.layout(commit_blocks, c, committing, follows)
        with self.clock("model"):
            x = model.embed(torch.cat([self.unseen[:, :p], copies.reshape(n, c * length)], 1))
            for i, block in enumerate(model.blocks):
                x = x + block.attn(block.attn_norm(x), positions, mask=mask, cache=cache, layer=i)
                x = x + block.mlp(block.mlp_norm(x))
            return model.lm_head(model.norm(x[:, p:])).view(n, c, length, -1)

    def push(self, done: torch.Tensor, block: torch.Tensor) -> None:
        """Appends each done sequence's finished block to its unseen blocks."""
        slots = (self.pending[:, None] * self.block_size + torch.arange(self.block_size, device=block.device))
        slots = slots.clamp(max=self.unseen.shape[1] - 1)
        self.unseen.scatter_(1, slots, torch.where(done[:, None], block, self.unseen.gather(1, slots)))
        self.pending += done

    def advance(self, stepped: torch.Tensor, steps: torch.Tensor, offsets_step: torch.Tensor,
                ahead: Optional[torch.Tensor] = None, second: Optional[torch.Tensor] = None,
                second_logits: Optional[torch.Tensor] = None) -> torch.Tensor:
        """After a call: each sequence's block is `stepped` after `steps` steps from block_step
        offsets_step; where ahead, the block completed and the next one took its first step,
        giving `second` from second_logits. Finished blocks join the unseen ones (but a sequence's
        last block, which is never committed). Returns the host's row per sequence: [blocks
        completed (0-2), steps, the first completed block (L), the second (L)]."""
        live = self.cache.active.bool() & (self.block_index + 1 < self.blocks_of)
        done = (stepped != self.mask_id).all(1)
        ahead = torch.zeros_like(done) if ahead is None else ahead & done & live
        second = self.masks if second is None else second
        done2 = ahead & (second != self.mask_id).all(1)
        self.push(done & live, stepped)
        self.push(done2 & (self.block_index + 2 < self.blocks_of), second)
        block = torch.where(done[:, None] & live[:, None], self.masks, stepped)
        block = torch.where((ahead & ~done2)[:, None], second, block)
        self.block_index += (done & live).long() + done2.long()
        self.block_step.copy_(torch.where(done & live, (ahead & ~done2).long(), offsets_step + steps))
        if second_logits is not None:
            self.stale = torch.where(ahead[:, None, None], second_logits, self.stale)
        self.block.copy_(block)
        return torch.cat([(done.long() + done2.long())[:, None], (steps + ahead.long())[:, None], stepped, second], 1)

    def step(self, commit_blocks: int, drafts: Optional[torch.Tensor] = None, node_ids: Optional[torch.Tensor] = None,
             follows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One call for every sequence, with its drafts [N, K, L], their node ids [N, K] and the
        next blocks after complete ones (follows, from drafts()), or none; commit_blocks: the most
        unseen blocks an active sequence commits (the host knows). Returns advance's rows."""
        length, n = self.block_size, self.block.shape[0]
        rows = torch.arange(n, device=self.block.device)
        committing = self.pending * self.cache.active
        offset = (self.block_index * length + self.block_step) * length
        copies = self.block[:, None] if drafts is None else torch.cat([self.block[:, None], drafts], 1)
        if follows is None:
            follows = torch.full((n, 1), -1, dtype=torch.int64, device=self.block.device)
        elif follows.shape[1] > copies.shape[1]:
            copies = torch.cat([copies, self.masks[:, None].expand(-1, follows.shape[1] - copies.shape[1], -1)], 1)
        logits = self.forward(commit_blocks, committing, copies, follows)
        self.cache.lengths += length * committing
        self.pending -= committing
        k = 0 if drafts is None else drafts.shape[1]
        with self.clock("step"):
            if drafts is None:
                stepped, _, _, _ = dllm_step(logits[:, 0], self.block, self.mask_id, threshold=self.threshold,
                                             temperature=self.temperature, seed=self.seeds, offset=offset)
                steps, last = torch.ones_like(offset), torch.full_like(offset, -1)
            else:
                steps, _, _, stepped, last = spiffy_accept(
                    logits[:, 0], logits[:, 1 : 1 + k], drafts, node_ids, self.block, self.mask_id,
                    threshold=self.threshold, temperature=self.temperature, seed=self.seeds, offset=offset)
            if self.spiffy is not None:  # the distribution of each sequence's last step fills its next drafts
                self.stale = logits[rows, last + 1]
            ahead = second = second_logits = None
            if follows.shape[1] > 1 + k:  # the next block after the draft a walk ended on: its first step
                match = (follows == (last + 1)[:, None]) & (last >= 0)[:, None]
                ahead, second_logits = match.any(1), logits[rows, match.long().argmax(1)]
                second, _, _, _ = dllm_step(second_logits, self.masks, self.mask_id, threshold=self.threshold,
                                            temperature=self.temperature, seed=self.seeds,
                                            offset=(self.block_index + 1) * length * length)
        return self.advance(stepped, steps, self.block_step, ahead, second, second_logits)
@torch.inference_mode()
def dllm_generate_batch(model: BlockDiffusionLM, prompts: Sequence, max_new_tokens: Union[int, Sequence[int]], *,
                        block_size: int = 32, temperature: float = 0.0, seed: Union[int, Sequence[int]] = 0,
                        threshold: Optional[float] = None, spiffy: Optional[SpiffyConfig] = None,
                        profile: bool = False):
    """Returns (the new tokens of each prompt, int64 [max_new_tokens], and DllmStats over the batch:
    model_calls counts batched calls after the prompts' own, steps every sequence's unmasking steps,
    drafts every draft verified; `sequences` holds each sequence's stats counted as dllm_generate
    counts its own: model calls, steps, steps per call and drafts equal to that call's).
    prompts: int64 tensors [P] or token lists of any lengths; max_new_tokens an int or one per prompt;
    seed: one per prompt, or an int s giving prompt i request_seeds(s, N)[i] (s for prompt 0);
    profile: time each phase into stats.phase_seconds (PhaseClock)."""
    prompts = [torch.as_tensor(p, dtype=torch.int64).reshape(-1) for p in prompts]
    max_new = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if not prompts or any(p.numel() < 1 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token sequences")
    if len(max_new) != len(prompts) or any(m < 1 for m in max_new):
        raise ValueError("max_new_tokens must be >= 1 (an int, or one per prompt)")
    began = time.perf_counter()
    stats = DllmStats(model_calls=len(prompts), sequences=[DllmStats(model_calls=1) for _ in prompts])
    clock = PhaseClock(stats, profile, model.lm_head.weight.device)
    decoder = DllmBatchDecoder(model, prompts, max_new, block_size, temperature, seed, threshold, spiffy, clock)
    outs: List[List[int]] = [[] for _ in prompts]
    active = [True] * len(prompts)
    written = [p.numel() for p in prompts]  # each sequence's cache entries, as the host knows them
    pending = [0] * len(prompts)  # its completed blocks whose cache entries the next call writes

    def take(rows):
        """Each active sequence's call: [blocks completed, steps, drafts used, block..., block...] a row."""
        finished = False
        for i, row in enumerate(rows):
            if not active[i]:
                continue
            mine = stats.sequences[i]
            mine.steps += row[1]
            mine.steps_per_call.append(row[1])
            mine.drafts += row[2]
            for j in range(row[0]):
                outs[i] += row[3 + j * block_size : 3 + (j + 1) * block_size]
                active[i] = len(outs[i]) < max_new[i]
                pending[i] += active[i]
            finished |= not active[i]
        if finished:
            decoder.cache.active.copy_(torch.tensor(active, dtype=torch.int64))

    def with_used(rows, node_ids):
        used = (node_ids >= 0).sum(1) if node_ids is not None else torch.zeros_like(rows[:, 0])
        return torch.cat([rows[:, :2], used[:, None], rows[:, 2:]], 1).tolist()

    take(with_used(decoder.first_rows, None))
    while any(active):
        drafts, node_ids, follows = decoder.drafts() if spiffy is not None else (None, None, None)
        commit_blocks = max(p for p, a in zip(pending, active) if a)
        copies = 1 if follows is None else follows.shape[1]
        decoder.cache.window = min(decoder.cache.capacity, max(written) + (commit_blocks + copies) * block_size)
        rows = decoder.step(commit_blocks, drafts, node_ids, follows)
        with clock("step"):  # the call's host read
            rows = with_used(rows, node_ids)
        stats.model_calls += 1
        for i in range(len(prompts)):
            if active[i]:
                stats.sequences[i].model_calls += 1
                written[i], pending[i] = written[i] + pending[i] * block_size, 0
        take(rows)
    tokens = [torch.tensor(o[:m], dtype=torch.int64) for o, m in zip(outs, max_new)]
    stats.seconds = time.perf_counter() - began
    for mine, t in zip(stats.sequences, tokens):
        mine.new_tokens = t.numel()
    stats.new_tokens = sum(t.numel() for t in tokens)
    stats.steps = sum(s.steps for s in stats.sequences)
    stats.drafts = sum(s.drafts for s in stats.sequences)
    return tokens, stats
