"""A dFlash-style block drafter: one pass proposes a whole block.

The input is [anchor, MASK x (B-1)] embedded with the target's frozen embedding. The target's
hidden states at a few layers, concatenated and projected (fc, then RMSNorm), become keys and
values injected into every drafter layer; block queries attend to that context and,
bidirectionally, to the whole block. The target's frozen LM head reads the output. The injected
keys and values of committed positions never change, so a decoder computes them once."""

from dataclasses import asdict, dataclass
from typing import List, Optional, Tuple

import torch
from torch import nn

from .target import Attention, Linear, RMSNorm, SwiGLU, TargetConfig


@dataclass
class DrafterConfig:
    dim: int
    mask_token_id: int
    n_layers: int = 1
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_hidden: int = 704
    block_size: int = 16
    target_layers: Tuple[int, ...] = (1, 3)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def attention_config(self) -> TargetConfig:
        return TargetConfig(vocab_size=0, dim=self.dim, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                            rope_theta=self.rope_theta, norm_eps=self.norm_eps)

    def to_dict(self) -> dict:
        return asdict(self)


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg.attention_config())
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.dim, cfg.ffn_hidden)

    def forward(self, x, ctx_kv, block_pos, mask):
        x = x + self.attn(self.attn_norm(x), block_pos, prefix_kv=ctx_kv, mask=mask)
        return x + self.mlp(self.mlp_norm(x))


class BlockDrafter(nn.Module):
    """A dFlash-style block drafter: one pass over [anchor, MASK ...] proposes a block, conditioned
    on the target's hidden states at cfg.target_layers (injected as keys and values, context())."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = Linear(len(cfg.target_layers) * cfg.dim, cfg.dim, bias=False)
        self.ctx_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def context(self, features: torch.Tensor, positions: torch.Tensor) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """The injected keys and values of every layer for target features [N, T, layers*dim] at
        positions [T]. A decoder keeps them and appends those of newly committed positions."""
        ctx = self.ctx_norm(self.fc(features))
        return [layer.attn.keys_values(ctx, positions) for layer in self.layers]

    def forward(self, block_embeds: torch.Tensor, ctx_kv: List[Tuple[torch.Tensor, torch.Tensor]], start: int = 0,
                ctx_len: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Final normed hidden states [N, B, dim] of a block.

        block_embeds [N, B, dim]: the embedded [anchor, MASK ...]; ctx_kv: context(...) of the
        positions before the anchor; start: the anchor's position. For training, ctx_len [N] gives
        each sequence its own anchor position, and it sees only the context positions before it."""
        n, b, _ = block_embeds.shape
        mask = None
        if ctx_len is None:
            block_pos = torch.arange(start, start + b, device=block_embeds.device)
        else:
            t = ctx_kv[0][0].shape[2]
            block_pos = ctx_len[:, None] + torch.arange(b, device=block_embeds.device)  # [N, B]
            visible = torch.cat([torch.arange(t, device=block_embeds.device) < ctx_len[:, None],
                                 torch.ones(n, b, dtype=torch.bool, device=block_embeds.device)], dim=1)
            mask = visible[:, None, None, :]  # [N, 1, 1, T + B]
        x = block_embeds
        for layer, kv in zip(self.layers, ctx_kv):
            x = layer(x, kv, block_pos, mask)
        return self.norm(x)
