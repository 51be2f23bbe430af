"""Block diffusion decoding of many prompts at once (dllm_generate's loop, batched), with Spiffy.

Every sequence decodes its own block in one forward: per sequence, its block and its K draft copies
[N, (1 + K) * L] laid out one after another after the sequence's prefix (a StaticKVCache with
per-sequence lengths), every copy at the block's positions, attending to the prefix and,
bidirectionally, to itself only (xkernels.spiffy_attention_mask's rule, with each sequence's own
prefix length). The forward writes the copies' keys and values after the prefix. A sequence whose
block was complete before the call commits it there, as dllm_generate's next block's first call
does: its copy 0 is the complete block (whose keys and values it keeps: its length advances by L)
and its copy 1 the next block of masks, one block further on and seeing copy 0 too, whose logits
take that block's first step. The others take their step: dllm_step's, or with Spiffy
spiffy_accept's walk through the drafts that spiffy_materialize filled from the sequence's last
step distribution (none in a block's first call, as in dllm_generate). Each prompt is committed
alone with its first block's first step (commit_then_forward, one call a prompt). Sequences
therefore finish blocks at their own steps (with a threshold or Spiffy, ragged), and the host reads
once per call which blocks completed, their tokens and the steps taken (with Spiffy on the CPU
once more: how many drafts to compute).

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
    def __init__(self, model: BlockDiffusionLM, prompts: List[torch.Tensor], max_new_tokens: int, block_size: int,
                 temperature: float, seed: Union[int, Sequence[int]], threshold: Optional[float],
                 spiffy: Optional[SpiffyConfig], clock: PhaseClock):
        device = model.lm_head.weight.device
        self.model, self.block_size, self.spiffy, self.clock = model, block_size, spiffy, clock
        self.temperature, self.threshold = temperature, threshold
        self.seeds = request_seeds(seed, len(prompts), device)
        self.mask_id = model.cfg.mask_id
        self.max_copies = max(2, 1 + (spiffy.keep if spiffy else 0))  # a commit call holds 2
        lengths = [p.numel() for p in prompts]
        capacity = max(lengths) + -(-max_new_tokens // block_size) * block_size + self.max_copies * block_size
        self.cache = StaticKVCache.for_model(model.cfg, len(prompts), capacity, model.lm_head.weight.dtype, device)
        n = len(prompts)
        masks = torch.full((1, block_size), self.mask_id, dtype=torch.int64, device=device)
        firsts = []
        for i, prompt in enumerate(prompts):  # each prompt's own block-causal layout (its blocks end where it does)
            alone = model.new_cache()
            with clock("model"):
                firsts.append(model.commit_then_forward(prompt.view(1, -1).to(device), masks, alone))
            self.cache.load(i, alone.k, alone.v)
        self.cache.lengths.copy_(torch.tensor(lengths))
        # Each sequence's block and step within it: the offset of its noise, as in dllm_generate.
        self.block_index = torch.zeros(n, dtype=torch.int64, device=device)
        self.block_step = torch.zeros(n, dtype=torch.int64, device=device)
        logits = torch.cat(firsts)
        with clock("step"):
            self.block, _, _, _ = dllm_step(logits, masks.repeat(n, 1), self.mask_id, threshold=threshold,
                                            temperature=temperature, seed=self.seeds, offset=self.block_step)
        self.block_step += 1
        # Spiffy: each sequence's last step distribution (that of its block before the last step).
        self.stale = logits if spiffy is not None else None

    def drafts(self):
        """Each sequence's kept drafts from its last step distribution: (draft blocks [N, K, L],
        node ids [N, K], -1 where unused: a block's first call, a complete block and a finished
        sequence have none). On the CPU, where each copy costs a forward, K is trimmed to the most
        any sequence uses (one host read)."""
        if self.block_size == 1:  # a block of one position completes in its first call
            return None, None
        with self.clock("draft"):
            drafts, node_ids, _ = spiffy_materialize(self.stale, self.block, self.mask_id, self.spiffy.graph,
                                                     keep=self.spiffy.keep, temperature=self.temperature)
            drafting = (self.block == self.mask_id).any(1) & self.cache.active.bool()
            node_ids = torch.where(drafting[:, None], node_ids, -1)
            if node_ids.device.type == "cpu":  # kept nodes come first, unused slots last
                used = int((node_ids >= 0).sum(1).max())
                drafts, node_ids = drafts[:, :used], node_ids[:, :used]
        return drafts, node_ids

    def layout(self, copies: int, committing: torch.Tensor):
        """Rotary positions [N, C * L] and the attention mask [N, 1, C * L, window] of C copies of
        each sequence's block after its prefix: a copy sees the prefix and itself; a committing
        sequence's copy 1 (its next block) lies one block further on and sees copy 0 too."""
        cache, length = self.cache, self.block_size
        device = cache.lengths.device
        q = torch.arange(copies * length, device=device)
        next_block = committing[:, None] & (q // length == 1)  # [N, C * L]
        positions = cache.lengths[:, None] + q % length + length * next_block
        rel = torch.arange(cache.window, device=device) - cache.lengths[:, None]  # [N, W]: key j is new entry rel
        key_copy = torch.where(rel >= 0, rel.div(length, rounding_mode="floor"), -1)[:, None, :]
        own = key_copy == (q // length)[:, None]
        committed = next_block[:, :, None] & (key_copy == 0)
        return positions, ((rel < 0)[:, None, :] | own | committed)[:, None]

    def forward(self, copies: torch.Tensor, committing: torch.Tensor) -> torch.Tensor:
        """Logits [N, C, L, V] of each sequence's C copies [N, C, L] of its block (layout's
        attention); the copies' keys and values are written after the prefix."""
        model, cache = self.model, self.cache
        n, c, length = copies.shape
        with self.clock("mask"):
            positions, mask = self.layout(c, committing)
        with self.clock("model"):
            x = model.embed(copies.reshape(n, c * length))
            for i, block in enumerate(model.blocks):
                x = x + block.attn(block.attn_norm(x), positions, mask=mask, cache=cache, layer=i)
                x = x + block.mlp(block.mlp_norm(x))
            return model.lm_head(model.norm(x)).view(n, c, length, -1)

    def step(self, commits: bool, drafts: Optional[torch.Tensor] = None, node_ids: Optional[torch.Tensor] = None):
        """One call for every sequence, with its drafts [N, K, L] and their node ids [N, K] (or
        none); commits: whether some active sequence's block is complete (the host knows). Returns
        (completed [N] bool: the block is complete after the call, block [N, L]: every sequence's
        block after the call, steps [N]: the steps it took)."""
        length, n = self.block_size, self.block.shape[0]
        rows = torch.arange(n, device=self.block.device)
        committing = (self.block != self.mask_id).all(1) & self.cache.active.bool()
        masks = torch.full_like(self.block, self.mask_id)
        block = torch.where(committing[:, None], masks, self.block)  # the block each sequence steps
        index = self.block_index + committing
        step = torch.where(committing, 0, self.block_step)
        offset = (index * length + step) * length
        copies = self.block[:, None] if drafts is None else torch.cat([self.block[:, None], drafts], 1)
        if commits:  # a committing sequence's copy 1 is its next block (it has no drafts)
            if copies.shape[1] == 1:
                copies = torch.cat([copies, masks[:, None]], 1)
            else:
                copies[:, 1] = torch.where(committing[:, None], masks, copies[:, 1])
        logits = self.forward(copies, committing)
        root = logits[rows, committing.long()]
        with self.clock("step"):
            if drafts is None:
                stepped, _, _, _ = dllm_step(root, block, self.mask_id, threshold=self.threshold,
                                             temperature=self.temperature, seed=self.seeds, offset=offset)
                steps, last = torch.ones_like(offset), torch.full_like(offset, -1)
            else:
                steps, _, _, stepped, last = spiffy_accept(
                    root, logits[:, 1:], copies[:, 1:], node_ids, block,
                    self.mask_id, threshold=self.threshold, temperature=self.temperature, seed=self.seeds,
                    offset=offset)
        if self.spiffy is not None:  # the distribution of each sequence's last step fills its next drafts
            self.stale = logits[rows, torch.where(committing, 1, last + 1)]
        cache = self.cache
        cache.lengths += length * committing
        self.block.copy_(stepped)
        self.block_index.copy_(index)
        self.block_step.copy_(step + steps)
        return (stepped != self.mask_id).all(1), stepped, steps


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
    decoder = DllmBatchDecoder(model, prompts, max(max_new), block_size, temperature, seed, threshold, spiffy, clock)
    outs: List[List[int]] = [[] for _ in prompts]
    active = [True] * len(prompts)
    written = [p.numel() for p in prompts]  # each sequence's cache entries, as the host knows them
    pending = [False] * len(prompts)  # a completed block whose cache entries the next call writes

    def take(rows):
        """Each active sequence's call: [completed, steps, drafts used, block...] a row."""
        finished = False
        for i, row in enumerate(rows):
            if not active[i]:
                continue
            mine = stats.sequences[i]
            if pending[i]:  # this call committed the sequence's last block, and stepped the next
                written[i], pending[i] = written[i] + block_size, False
            mine.steps += row[1]
            mine.steps_per_call.append(row[1])
            mine.drafts += row[2]
            if row[0]:
                outs[i] += row[3:]
                pending[i] = True
                active[i] = len(outs[i]) < max_new[i]
                finished |= not active[i]
        if finished:
            decoder.cache.active.copy_(torch.tensor(active, dtype=torch.int64))

    block = decoder.block
    take(torch.cat([(block != decoder.mask_id).all(1, keepdim=True).long(), torch.ones_like(block[:, :1]),
                    torch.zeros_like(block[:, :1]), block], 1).tolist())
    while any(active):
        drafts, node_ids = decoder.drafts() if spiffy is not None else (None, None)
        copies = 1 + (0 if drafts is None else drafts.shape[1])
        if copies == 1:
            drafts = node_ids = None
        commits = any(p and a for p, a in zip(pending, active))
        copies = max(copies, 2 if commits else 1)
        decoder.cache.window = min(decoder.cache.capacity, max(written) + copies * block_size)
        completed, block, steps = decoder.step(commits, drafts, node_ids)
        used = (node_ids >= 0).sum(1) if node_ids is not None else torch.zeros_like(steps)
        with clock("step"):  # the call's one host read
            rows = torch.cat([completed[:, None].long(), steps[:, None], used[:, None], block], 1).tolist()
        stats.model_calls += 1
        for i in range(len(prompts)):
            stats.sequences[i].model_calls += active[i]
        take(rows)
    tokens = [torch.tensor(o[:m], dtype=torch.int64) for o, m in zip(outs, max_new)]
    stats.seconds = time.perf_counter() - began
    for mine, t in zip(stats.sequences, tokens):
        mine.new_tokens = t.numel()
    stats.new_tokens = sum(t.numel() for t in tokens)
    stats.steps = sum(s.steps for s in stats.sequences)
    stats.drafts = sum(s.drafts for s in stats.sequences)
    return tokens, stats
