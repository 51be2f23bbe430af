"""A small decoder-only LM in the Qwen3 style (RMSNorm, RoPE, QK-norm, SwiGLU, grouped-query
attention) with a croppable KV cache, returning logits and the hidden states of chosen layers."""

from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .static_cache import StaticKVCache


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
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


def _rope_angles(positions: torch.Tensor, half: int, theta: float) -> torch.Tensor:
    freqs = theta ** (-torch.arange(half, device=positions.device, dtype=torch.float64) / half)
    return positions.to(torch.float64)[..., None] * freqs


_ROPE_TABLES: Dict[Tuple[int, float, torch.dtype], Tuple[torch.Tensor, torch.Tensor]] = {}


def _rope_cos_sin(positions: torch.Tensor, half: int, theta: float, dtype: torch.dtype):
    """cos and sin of the angles at positions, [..., half]. On the CPU they come from a table
    (computing them costs more than the rest of a one-token attention); the table's values are
    the ones computed directly. Elsewhere reading positions.max() would sync the host."""
    if positions.device.type != "cpu":
        angles = _rope_angles(positions, half, theta)
        return angles.cos().to(dtype), angles.sin().to(dtype)
    key = (half, theta, dtype)
    table = _ROPE_TABLES.get(key)
    need = int(positions.max()) + 1 if positions.numel() else 0
    if table is None or table[0].shape[0] < need:
        with torch.inference_mode(False):  # a table made in inference mode could not enter autograd later
            angles = _rope_angles(torch.arange(max(2 * need, 4096)), half, theta)
            table = _ROPE_TABLES[key] = (angles.cos().to(dtype), angles.sin().to(dtype))
    return table[0][positions], table[1][positions]


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [B, H, T, hd] at integer positions [T] or [B, T] (rotate-half)."""
    half = x.shape[-1] // 2
    cos, sin = _rope_cos_sin(positions, half, theta, x.dtype)
    if cos.dim() == 3:  # per-sequence positions: broadcast over heads
        cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def stacked_weight_t(owner: nn.Module, name: str, dtype: torch.dtype, *linears: nn.Linear) -> torch.Tensor:
    """The linears' weights stacked by rows and transposed, [in, sum of outs], contiguous, in dtype:
    one x @ w computes every linear, and MKL's small-batch product reads this layout faster than
    nn.Linear's (1.2-1.5x at one token). Kept on owner per dtype while no weight changes (an
    optimizer step or a load bumps _version, .to() moves the data); with autograd on it is
    rebuilt every call."""
    weights = [lin.weight for lin in linears]
    if torch.is_grad_enabled() and any(w.requires_grad for w in weights):
        return (weights[0] if len(weights) == 1 else torch.cat(weights)).t().to(dtype)
    # Weights made under inference_mode keep no version counter (and cannot be trained).
    key = tuple((w.data_ptr(), -1 if w.is_inference() else w._version, w.dtype) for w in weights)
    cache = owner.__dict__.setdefault(name, {})
    if cache.get(dtype, (None,))[0] != key:
        with torch.inference_mode(False):  # usable by autograd later (a frozen layer in training)
            cache[dtype] = (key, torch.cat([w.detach() for w in weights]).t().to(dtype).contiguous())
    return cache[dtype][1]


class Linear(nn.Linear):
    """nn.Linear (no bias) computed as x @ weight.t() from the contiguous transpose, in x's dtype
    (a module can run in a lower precision than its weights are kept in)."""

    def forward(self, x):
        return x @ stacked_weight_t(self, "_weight_t", x.dtype, self)


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

    def commit(self, accept_len: torch.Tensor, written: int, path: Optional[torch.Tensor] = None) -> None:
        """After a forward that appended `written` entries: keep the first accept_len + 1 (one
        sequence: a host read), or with a tree's path the root and accepted nodes (keep_path).
        StaticKVCache.commit is the same for N sequences on the device."""
        kept = int(accept_len.max()) + 1
        if path is None:
            self.crop(self.length - written + kept)
        else:
            self.keep_path(self.length - written, path, accept_len, kept)


class Attention(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.wq = Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wv = Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wo = Linear(cfg.n_heads * hd, cfg.dim, bias=False)
        self.q_norm = RMSNorm(hd, cfg.norm_eps)
        self.k_norm = RMSNorm(hd, cfg.norm_eps)

    def _project(self, x, heads, name, *linears):
        """x [B, T, dim] through the linears in one product, split into [B, T, heads, hd] each."""
        b, t, _ = x.shape
        out = x @ stacked_weight_t(self, name, x.dtype, *linears)
        return out.view(b, t, sum(heads), self.cfg.head_dim).split(heads, dim=2)

    def _rotate(self, x, norm, positions):
        return apply_rope(norm(x).transpose(1, 2), positions, self.cfg.rope_theta)

    def keys_values(self, src: torch.Tensor, positions: torch.Tensor):
        """Keys (normed, rotated) and values of src [B, T, dim] at positions, [B, kv_heads, T, hd]."""
        n = self.cfg.n_kv_heads
        k, v = self._project(src, (n, n), "_kv", self.wk, self.wv)
        return self._rotate(k, self.k_norm, positions), v.transpose(1, 2)

    def forward(self, x, positions, prefix_kv=None, mask=None, cache=None, layer=0):
        """Attention of x [B, T, dim] over its own keys and values, placed after prefix_kv (keys and
        values given, e.g. an injected context) or after the cache's (and appended to it)."""
        cfg = self.cfg
        q, k, v = self._project(x, (cfg.n_heads, cfg.n_kv_heads, cfg.n_kv_heads), "_qkv", self.wq, self.wk,
                                self.wv)
        q, k, v = self._rotate(q, self.q_norm, positions), self._rotate(k, self.k_norm, positions), v.transpose(1, 2)
        if prefix_kv is not None:
            k, v = torch.cat([prefix_kv[0], k], dim=2), torch.cat([prefix_kv[1], v], dim=2)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=cfg.n_heads != cfg.n_kv_heads)
        return self.wo(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = Linear(dim, hidden, bias=False)
        self.up = Linear(dim, hidden, bias=False)
        self.down = Linear(hidden, dim, bias=False)

    def forward(self, x):
        gate, up = (x @ stacked_weight_t(self, "_gate_up", x.dtype, self.gate, self.up)).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


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
        self.lm_head = Linear(cfg.dim, cfg.vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layers)


class TargetLM(Transformer):
    """The shipped target's architecture: a small Qwen3-style decoder LM with a croppable KV cache
    and tree attention (forward's tree_mask and tree_depth)."""

    def forward(self, tokens: torch.Tensor, cache: Optional[KVCache] = None, hidden_layers: Sequence[int] = (),
                tree_mask: Optional[torch.Tensor] = None,
                tree_depth: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """Logits [B, T, V] of tokens [B, T] that follow the cache's positions, and the outputs of
        the blocks listed in hidden_layers (each [B, T, dim]).

        With tree_mask [T, T] or [B, T, T] (xkernels.tree_attention_mask) and tree_depth [T] or
        [B, T] the tokens are a draft tree: each attends to the cache and to its ancestors, at
        position start + depth. A StaticKVCache gives each sequence its own start (its length)."""
        t = tokens.shape[1]
        if isinstance(cache, StaticKVCache):
            positions, mask = cache.layout(t, tree_mask, tree_depth)
            return self._run(tokens, positions, mask, cache, hidden_layers)
        start = 0 if cache is None else cache.length
        if tree_mask is None:
            positions = torch.arange(start, start + t, device=tokens.device)
            # Query i (at position start + i) sees keys 0 .. start + i; one query sees them all.
            mask = None if t == 1 else torch.ones(t, start + t, dtype=torch.bool, device=tokens.device).tril(start)
        else:
            positions = start + tree_depth
            prefix = torch.ones(*tree_mask.shape[:-1], start, dtype=torch.bool, device=tokens.device)
            mask = torch.cat([prefix, tree_mask], dim=-1)
            mask = mask[:, None] if mask.dim() == 3 else mask
        return self._run(tokens, positions, mask, cache, hidden_layers)

    def _run(self, tokens, positions, mask, cache, hidden_layers):
        x = self.embed(tokens)
        hidden = []
        for i, block in enumerate(self.blocks):
            x = block(x, positions, mask, cache, i)
            if i in hidden_layers:
                hidden.append(x)
        return self.lm_head(self.norm(x)), hidden
