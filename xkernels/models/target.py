"""A small decoder-only LM in the Qwen3 style (RMSNorm, RoPE, QK-norm, SwiGLU, grouped-query
attention) with a croppable KV cache, returning logits and the hidden states of chosen layers."""

from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class TargetConfig:
    vocab_size: int
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_hidden: int = 704
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [B, H, T, hd] at integer positions [T] or [B, T] (rotate-half)."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, device=x.device, dtype=torch.float64) / half)
    angles = positions.to(torch.float64)[..., None] * freqs
    if angles.dim() == 3:  # per-sequence positions: broadcast over heads
        angles = angles[:, None]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class KVCache:
    """Keys and values per layer in preallocated buffers [B, kv_heads, capacity, head_dim], written
    in place: append() writes after the valid positions (the capacity doubles when a step needs
    more), crop() only lowers the length, and k / v are views of the valid positions."""

    def __init__(self, n_layers: int, capacity: int = 512):
        self._k: List[Optional[torch.Tensor]] = [None] * n_layers
        self._v: List[Optional[torch.Tensor]] = [None] * n_layers
        self._len = [0] * n_layers
        self.capacity = capacity

    @property
    def length(self) -> int:
        return self._len[0]

    @property
    def k(self) -> List[Optional[torch.Tensor]]:
        return [None if b is None else b[:, :, :n] for b, n in zip(self._k, self._len)]

    @property
    def v(self) -> List[Optional[torch.Tensor]]:
        return [None if b is None else b[:, :, :n] for b, n in zip(self._v, self._len)]

    def _reserve(self, layer: int, like: torch.Tensor, need: int) -> None:
        buf = self._k[layer]
        if buf is not None and buf.shape[2] >= need:
            return
        size = max(self.capacity, need, 0 if buf is None else 2 * buf.shape[2])
        shape = (like.shape[0], like.shape[1], size, like.shape[3])
        k, v = like.new_empty(shape), like.new_empty(shape)
        if buf is not None:
            n = self._len[layer]
            k[:, :, :n], v[:, :, :n] = buf[:, :, :n], self._v[layer][:, :, :n]
        self._k[layer], self._v[layer] = k, v

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        n, t = self._len[layer], k.shape[2]
        self._reserve(layer, k, n + t)
        self._k[layer][:, :, n : n + t] = k
        self._v[layer][:, :, n : n + t] = v
        self._len[layer] = n + t
        return self._k[layer][:, :, : n + t], self._v[layer][:, :, : n + t]

    def crop(self, length: int) -> None:
        self._len = [min(n, length) for n in self._len]

    def keep_path(self, prefix_len: int, path: torch.Tensor, accept_len: torch.Tensor,
                  kept: Optional[int] = None) -> None:
        """After a tree forward: keep the entries of the root and accepted nodes (path [B, M],
        accept_len [B]), moved behind the prefix in place (xkernels.compact_kv_), then crop to
        prefix_len + kept (default: read max(accept_len) + 1 from the tensor)."""
        from ..ops import compact_kv_

        for t in self._k + self._v:
            if t is not None:
                compact_kv_(t, path, accept_len, prefix_len)
        self.crop(prefix_len + (int(accept_len.max()) + 1 if kept is None else kept))


class Attention(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)
        self.q_norm = RMSNorm(hd, cfg.norm_eps)
        self.k_norm = RMSNorm(hd, cfg.norm_eps)

    def heads(self, x, proj, n):
        b, t, _ = x.shape
        return proj(x).view(b, t, n, self.cfg.head_dim).transpose(1, 2)

    def keys_values(self, src: torch.Tensor, positions: torch.Tensor):
        """Keys (normed, rotated) and values of src [B, T, dim] at positions, [B, kv_heads, T, hd]."""
        cfg = self.cfg
        k = apply_rope(self.k_norm(self.heads(src, self.wk, cfg.n_kv_heads)), positions, cfg.rope_theta)
        return k, self.heads(src, self.wv, cfg.n_kv_heads)

    def forward(self, x, positions, prefix_kv=None, mask=None, cache=None, layer=0):
        """Attention of x [B, T, dim] over its own keys and values, placed after prefix_kv (keys and
        values given, e.g. an injected context) or after the cache's (and appended to it)."""
        cfg = self.cfg
        q = apply_rope(self.q_norm(self.heads(x, self.wq, cfg.n_heads)), positions, cfg.rope_theta)
        k, v = self.keys_values(x, positions)
        if prefix_kv is not None:
            k, v = torch.cat([prefix_kv[0], k], dim=2), torch.cat([prefix_kv[1], v], dim=2)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        rep = cfg.n_heads // cfg.n_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.dim, cfg.ffn_hidden)

    def forward(self, x, positions, mask, cache=None, layer=0):
        x = x + self.attn(self.attn_norm(x), positions, mask=mask, cache=cache, layer=layer)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Embedding, blocks, final norm and LM head: the parameters the target and the block
    diffusion LM share (the latter starts from the former's weights)."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layers)


class TargetLM(Transformer):

    def forward(self, tokens: torch.Tensor, cache: Optional[KVCache] = None, hidden_layers: Sequence[int] = (),
                tree_mask: Optional[torch.Tensor] = None,
                tree_depth: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """Logits [B, T, V] of tokens [B, T] that follow the cache's positions, and the outputs of
        the blocks listed in hidden_layers (each [B, T, dim]).

        With tree_mask [T, T] (xkernels.tree_attention_mask) and tree_depth [T] the tokens are a
        draft tree: each attends to the cache and to its ancestors, at position start + depth."""
        start = 0 if cache is None else cache.length
        t = tokens.shape[1]
        if tree_mask is None:
            positions = torch.arange(start, start + t, device=tokens.device)
            # Query i (at position start + i) sees keys 0 .. start + i.
            mask = torch.ones(t, start + t, dtype=torch.bool, device=tokens.device).tril(start)
        else:
            positions = start + tree_depth
            mask = torch.cat([torch.ones(t, start, dtype=torch.bool, device=tokens.device), tree_mask], dim=1)
        x = self.embed(tokens)
        hidden = []
        for i, block in enumerate(self.blocks):
            x = block(x, positions, mask, cache, i)
            if i in hidden_layers:
                hidden.append(x)
        return self.lm_head(self.norm(x)), hidden
