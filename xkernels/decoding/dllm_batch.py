"""Block diffusion decoding of many prompts at once (dllm_generate's vanilla loop, batched).

Every sequence decodes its own block in the rows of one forward: the blocks [N, L] at positions
after each sequence's prefix (a StaticKVCache with per-sequence lengths), each attending to its
prefix and, bidirectionally, to itself. The same forward writes the blocks' keys and values after
the prefixes; a sequence whose block was complete before the step keeps them (its length advances
by L: the commit call of dllm_generate, in a row of a shared call) and starts a new block of masks,
while the others take their dllm_step. Sequences therefore finish blocks at their own steps (with
a threshold, ragged), and the host reads once per step which blocks completed and their tokens.

Each sequence's noise is dllm_generate's: its own seed, and the offset of its block and step within
it (the ops' per-request form), so at any temperature sequence i gets dllm_generate(model,
prompts[i], ..., seed=its seed)'s tokens whatever the rest of the batch holds (up to the rounding of
the batched forward).
"""

import time
from typing import List, Optional, Sequence, Union

import torch

from ..models.block_diffusion import BlockDiffusionLM
from ..models.static_cache import StaticKVCache
from ..ops import dllm_step
from .dllm import DllmStats
from .modes import request_seeds


class DllmBatchDecoder:
    def __init__(self, model: BlockDiffusionLM, prompts: List[torch.Tensor], max_new_tokens: int, block_size: int,
                 temperature: float, seed: Union[int, Sequence[int]], threshold: Optional[float]):
        device = model.lm_head.weight.device
        self.model, self.block_size = model, block_size
        self.temperature, self.threshold = temperature, threshold
        self.seeds = request_seeds(seed, len(prompts), device)
        self.mask_id = model.cfg.mask_id
        lengths = [p.numel() for p in prompts]
        capacity = max(lengths) + -(-max_new_tokens // block_size) * block_size + block_size
        self.cache = StaticKVCache.for_model(model.cfg, len(prompts), capacity, model.lm_head.weight.dtype, device)
        for i, prompt in enumerate(prompts):  # each prompt's own block-causal layout (its blocks end where it does)
            alone = model.new_cache()
            model.commit(prompt.view(1, -1).to(device), alone)
            self.cache.load(i, alone.k, alone.v)
        self.cache.lengths.copy_(torch.tensor(lengths))
        self.block = torch.full((len(prompts), block_size), self.mask_id, dtype=torch.int64, device=device)
        # Each sequence's block and step within it: the offset of its noise, as in dllm_generate.
        self.block_index = torch.zeros(len(prompts), dtype=torch.int64, device=device)
        self.block_step = torch.zeros(len(prompts), dtype=torch.int64, device=device)

    def step(self):
        """One call for every sequence: (completed [N] bool: the block this step completed,
        block [N, L]: every sequence's block after the step)."""
        model, cache, length = self.model, self.cache, self.block_size
        positions = cache.lengths[:, None] + torch.arange(length, device=self.block.device)
        keys = torch.arange(cache.window, device=self.block.device)
        mask = (keys < cache.lengths[:, None] + length)[:, None, None, :]  # the prefix and the whole block
        x = model.embed(self.block)
        for i, block in enumerate(model.blocks):
            x = x + block.attn(block.attn_norm(x), positions, mask=mask, cache=cache, layer=i)
            x = x + block.mlp(block.mlp_norm(x))
        logits = model.lm_head(model.norm(x))
        committing = (self.block != self.mask_id).all(1)  # complete before this call: it wrote their cache entries
        offset = (self.block_index * length + self.block_step) * length
        stepped, _, _, _ = dllm_step(logits, self.block, self.mask_id, threshold=self.threshold,
                                     temperature=self.temperature, seed=self.seeds, offset=offset)
        completed = (stepped != self.mask_id).all(1) & ~committing
        cache.lengths += length * (committing & cache.active.bool())
        self.block.copy_(torch.where(committing[:, None], self.mask_id, stepped))
        self.block_index += committing  # a commit's step is dropped: the next block starts at step 0
        self.block_step.copy_(torch.where(committing, 0, self.block_step + 1))
        return completed, stepped


@torch.inference_mode()
def dllm_generate_batch(model: BlockDiffusionLM, prompts: Sequence, max_new_tokens: Union[int, Sequence[int]], *,
                        block_size: int = 32, temperature: float = 0.0, seed: Union[int, Sequence[int]] = 0,
                        threshold: Optional[float] = None):
    """Returns (the new tokens of each prompt, int64 [max_new_tokens], and DllmStats over the batch:
    model_calls counts batched calls after the prompts' own, steps every sequence's unmasking steps).
    prompts: int64 tensors [P] or token lists of any lengths; max_new_tokens an int or one per prompt;
    seed: one per prompt, or an int s giving prompt i request_seeds(s, N)[i] (s for prompt 0)."""
    prompts = [torch.as_tensor(p, dtype=torch.int64).reshape(-1) for p in prompts]
    max_new = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if not prompts or any(p.numel() < 1 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token sequences")
    if len(max_new) != len(prompts) or any(m < 1 for m in max_new):
        raise ValueError("max_new_tokens must be >= 1 (an int, or one per prompt)")
    began = time.perf_counter()
    decoder = DllmBatchDecoder(model, prompts, max(max_new), block_size, temperature, seed, threshold)
    stats = DllmStats(model_calls=len(prompts))
    outs: List[List[int]] = [[] for _ in prompts]
    active = [True] * len(prompts)
    written = [p.numel() for p in prompts]  # each sequence's cache entries, as the host knows them
    pending = [False] * len(prompts)  # a completed block whose cache entries the next call writes
    while any(active):
        decoder.cache.window = min(decoder.cache.capacity, max(written) + block_size)
        completed, block = decoder.step()
        rows = torch.cat([completed[:, None].long(), block], 1).tolist()  # the step's one host read
        stats.model_calls += 1
        finished = False
        for i, row in enumerate(rows):
            if not active[i]:
                continue
            if pending[i]:  # this call was the sequence's commit of its last block
                written[i], pending[i] = written[i] + block_size, False
                continue
            stats.steps += 1
            if row[0]:
                outs[i] += row[1:]
                pending[i] = True
                active[i] = len(outs[i]) < max_new[i]
                finished |= not active[i]
        if finished:
            decoder.cache.active.copy_(torch.tensor(active, dtype=torch.int64))
    tokens = [torch.tensor(o[:m], dtype=torch.int64) for o, m in zip(outs, max_new)]
    stats.new_tokens = sum(t.numel() for t in tokens)
    stats.seconds = time.perf_counter() - began
    return tokens, stats
