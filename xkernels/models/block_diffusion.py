"""A block-causal masked diffusion LM (SDAR style): the target's transformer (RMSNorm, RoPE,
QK-norm, SwiGLU) with attention bidirectional inside a block and causal across blocks, so the
keys and values of finished blocks never change and a prefix KV cache is exact.

A decoding call feeds copies of the current block: `forward(blocks [C, L], cache)` gives the
logits of C versions of the block, each at the positions after the cache and attending to the
cache and to itself only; a block's first call also commits the tokens before it
(`commit_then_forward`). Spiffy's draft copies ride in that batch dimension; a flat layout (the
copies one after another in the sequence, under xkernels.spiffy_attention_mask) is supported too.
"""

from dataclasses import dataclass
from typing import Optional

import torch
from .target import KVCache, TargetConfig, Transformer


@dataclass
class BlockDiffusionConfig(TargetConfig):
    block_size: int = 32
    mask_id: int = 1


def block_causal_mask(length: int, block_size: int, device=None) -> torch.Tensor:
    """[T, T] bool: query i sees key j when j's block is not after i's. Blocks end at `length`
    (the first may be partial), so a prompt's last block ends where generation starts."""
    block = (torch.arange(length, device=device) - length) // block_size
    return block[None, :] <= block[:, None]


class BlockDiffusionLM(Transformer):
    """A block-causal masked diffusion LM (SDAR style: bidirectional inside a block, causal across
    blocks, so the prefix KV cache is exact), decoded by xkernels.decoding.dllm_generate."""

    cfg: BlockDiffusionConfig

    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor, mask: Optional[torch.Tensor],
               cache: Optional[KVCache] = None, commit: bool = False, head_from: int = 0) -> torch.Tensor:
        """Logits of tokens [C, T] at positions, attending to the cache (all of it) and to each
        other under mask [T, T] (None: all). commit appends their keys and values to the cache.
        Only the tokens from head_from on get logits ([C, T - head_from, V]): the LM head is a
        quarter of this model's work a token."""
        x = self.embed(tokens)
        c, t = tokens.shape
        start = 0 if cache is None else cache.length
        if mask is not None and start:
            mask = torch.cat([mask.new_ones(t, start), mask], dim=1)
        for i, block in enumerate(self.blocks):
            h = block.attn_norm(x)
            if commit:
                a = block.attn(h, positions, mask=mask, cache=cache, layer=i)
            else:
                prefix = None if not start else (cache.k[i].expand(c, -1, -1, -1), cache.v[i].expand(c, -1, -1, -1))
                a = block.attn(h, positions, prefix_kv=prefix, mask=mask)
            x = x + a
            x = x + block.mlp(block.mlp_norm(x))
        return self.lm_head(self.norm(x[:, head_from:]))

    def forward(self, blocks: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        """Logits [C, L, V] of C versions of the block that follows the cache."""
        start = 0 if cache is None else cache.length
        positions = torch.arange(start, start + blocks.shape[1], device=blocks.device)
        return self.hidden(blocks, positions, None, cache)

    def commit(self, tokens: torch.Tensor, cache: KVCache) -> None:
        """Appends the keys and values of finished tokens [1, T] (a prompt or a decoded block),
        block-causal among themselves, to the cache."""
        start = cache.length
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        self.hidden(tokens, positions, block_causal_mask(tokens.shape[1], self.cfg.block_size, tokens.device),
                    cache, commit=True, head_from=tokens.shape[1])

    def commit_then_forward(self, tokens: torch.Tensor, block: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """commit(tokens [1, T]) and forward(block [1, L]) in one call: the logits [1, L, V] of the
        block that follows the tokens, which join the cache (the block's keys and values do not).
        The same attention as the two calls, so the same values up to rounding; a decoding loop
        takes a block's first step in the call that commits the tokens before it."""
        start, t, length = cache.length, tokens.shape[1], block.shape[1]
        mask = torch.ones(t + length, t + length, dtype=torch.bool, device=tokens.device)
        mask[:t, :t] = block_causal_mask(t, self.cfg.block_size, tokens.device)
        mask[:t, t:] = False  # the committed tokens never see the block
        positions = torch.arange(start, start + t + length, device=tokens.device)
        logits = self.hidden(torch.cat([tokens, block], dim=1), positions, mask, cache, commit=True, head_from=t)
        cache.crop(start + t)
        return logits

    def forward_flat(self, blocks: torch.Tensor, cache: KVCache, mask: torch.Tensor) -> torch.Tensor:
        """forward() with the copies [C, L] laid out one after another in one sequence under mask
        [C * L, C * L] (the part of xkernels.spiffy_attention_mask after the prefix), every copy at
        the block's positions. Equal to forward() up to rounding."""
        c, length = blocks.shape
        positions = torch.arange(cache.length, cache.length + length, device=blocks.device).repeat(c)
        return self.hidden(blocks.reshape(1, -1), positions, mask, cache).view(c, length, -1)
