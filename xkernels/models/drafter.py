"""A dFlash-style block drafter: one pass proposes a whole block.

The input is [anchor, MASK x (B-1)] embedded with the target's frozen embedding. The target's
hidden states at a few layers, concatenated and projected (fc, then RMSNorm), become keys and
values injected into every drafter layer; block queries attend to that context and,
bidirectionally, to the whole block. The target's frozen LM head reads the output."""

from dataclasses import asdict, dataclass
from typing import Optional, Tuple

import torch
from torch import nn

from .target import Attention, RMSNorm, SwiGLU, TargetConfig


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

    def forward(self, x, ctx, block_pos, ctx_pos, mask):
        h = self.attn_norm(x)
        kv = torch.cat([ctx, h], dim=1)
        x = x + self.attn(h, block_pos, kv_source=kv, kv_positions=torch.cat([ctx_pos, block_pos], dim=-1), mask=mask)
        return x + self.mlp(self.mlp_norm(x))


class BlockDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(len(cfg.target_layers) * cfg.dim, cfg.dim, bias=False)
        self.ctx_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, block_embeds: torch.Tensor, features: torch.Tensor, start: int = 0,
                ctx_len: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Final normed hidden states [N, B, dim] of a block.

        block_embeds [N, B, dim]: the embedded [anchor, MASK ...]; features [N, T, layers*dim]: the
        target's hidden states of the context positions 0..T-1; start: the anchor's position (an
        int, for one sequence), or with ctx_len [N] per sequence (training), where sequence n sees
        context positions < ctx_len[n] and its anchor sits at position ctx_len[n]."""
        n, b, _ = block_embeds.shape
        t = features.shape[1]
        ctx = self.ctx_norm(self.fc(features))
        ctx_pos = torch.arange(t, device=features.device)
        mask = None
        if ctx_len is None:
            block_pos = torch.arange(int(start), int(start) + b, device=features.device)
        else:
            block_pos = ctx_len[:, None] + torch.arange(b, device=features.device)  # [N, B]
            ctx_pos = ctx_pos.expand(n, t)
            visible = torch.cat([ctx_pos < ctx_len[:, None],
                                 torch.ones(n, b, dtype=torch.bool, device=features.device)], dim=1)
            mask = visible[:, None, None, :]  # [N, 1, 1, T + B]
        x = block_embeds
        for layer in self.layers:
            x = layer(x, ctx, block_pos, ctx_pos, mask)
        return self.norm(x)
