"""A block-causal masked diffusion LM (SDAR style): the target's transformer (RMSNorm, RoPE,
QK-norm, SwiGLU) with attention bidirectional inside a block and causal across blocks, so the
keys and values of finished blocks never change and a prefix KV cache is exact.

A decoding call feeds copies of the current block: `forward(blocks [C, L], cache)` gives the
logits of C versions of the block, each at the positions after the cache and attending to the
cache and to itself only; a block's first call also commits the tokens before it, and a copy
may be the block after a complete draft (`forward_copies`). Spiffy's draft copies ride in that batch dimension; a flat layout (the
copies one after another in the sequence, under xkernels.spiffy_attention_mask) is supported too.
"""

from dataclasses import dataclass
from typing import Optional, Sequence

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

    def forward_copies(self, blocks: torch.Tensor, cache: KVCache, commit: Optional[torch.Tensor] = None,
                       follows: Optional[Sequence[int]] = None, commit_block_size: Optional[int] = None) -> torch.Tensor:
        """Logits [C, L, V] of C copies [C, L] of the block after the cache, in one call, each
        seeing the cache and itself. commit: tokens [1, T] (a prompt, or finished blocks) that
        join the cache in this call, block-causal in blocks of commit_block_size (default the
        model's; a decoding loop's own for its blocks) ending at T; every copy sees them (the
        copies' own keys never join).
        follows (host ints, one a copy): where follows[c] = k >= 0, copy c is the block after copy
        k, a complete block: one block further on, it sees copy k too (a block's first step taken
        in the call that verifies the draft completing the block before it). The same attention
        as commit() and forward() called apart, so the same values up to rounding."""
        c, length = blocks.shape
        t = 0 if commit is None else commit.shape[1]
        after = torch.full((c,), -1, dtype=torch.int64) if follows is None else torch.as_tensor(follows)
        if after.shape != (c,) or bool(((after >= c) | (after >= 0) & (after[after.clamp(0, c - 1)] >= 0)).any()):
            raise ValueError(f"forward_copies: follows must name, for each of the {c} copies, -1 or a copy "
                             f"that follows none; got {after.tolist()}")
        if not t and bool((after < 0).all()):
            return self.forward(blocks, cache)
        start, device = cache.length, blocks.device
        copy = torch.arange(c * length, device=device) // length
        parent = after.to(device)[copy]
        n = t + c * length
        mask = torch.ones(n, n, dtype=torch.bool, device=device)
        mask[:t, :t] = block_causal_mask(t, commit_block_size or self.cfg.block_size, device)
        mask[:t, t:] = False  # the committed tokens never see the copies
        mask[t:, t:] = (copy[None, :] == copy[:, None]) | (copy[None, :] == parent[:, None])
        positions = torch.cat([torch.arange(start, start + t, device=device),
                               start + t + torch.arange(c * length, device=device) % length + length * (parent >= 0)])
        tokens = blocks.reshape(1, -1) if commit is None else torch.cat([commit, blocks.reshape(1, -1)], dim=1)
        logits = self.hidden(tokens, positions, mask, cache, commit=bool(t), head_from=t)
        if t:
            cache.crop(start + t)
        return logits.view(c, length, -1)

    def forward_flat(self, blocks: torch.Tensor, cache: KVCache, mask: torch.Tensor) -> torch.Tensor:
        """forward() with the copies [C, L] laid out one after another in one sequence under mask
        [C * L, C * L] (the part of xkernels.spiffy_attention_mask after the prefix), every copy at
        the block's positions. Equal to forward() up to rounding."""
        c, length = blocks.shape
        positions = torch.arange(cache.length, cache.length + length, device=blocks.device).repeat(c)
        return self.hidden(blocks.reshape(1, -1), positions, mask, cache).view(c, length, -1)
