"""A KV cache of N sequences allocated once: fixed-shape buffers and per-sequence lengths kept
on the device, so a decoding step has the same shapes at every call (a CUDA graph can replay it)
and no step reads a length on the host."""

from typing import List, Optional, Tuple

import torch


class StaticKVCache:
    """Keys and values per layer in buffers [N, kv_heads, capacity, head_dim] that never grow, and
    `lengths` int64 [N] (device): sequence n's valid entries are 0 .. lengths[n] - 1.

    A forward of T tokens writes its entries at lengths[n] + 0 .. T - 1 and reads keys 0 .. window - 1
    under a mask; `commit` then advances each sequence by its own count (ragged acceptance), for
    sequences whose `active` flag is 1. Entries past a length are stale and never visible.
    `window` (host int, default the capacity) bounds the keys a forward reads: a loop that knows
    every length on the host (the CPU loop) narrows it; a captured graph keeps the capacity."""

    def __init__(self, n_layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device):
        shape = (batch, kv_heads, capacity, head_dim)
        self.k: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.lengths = torch.zeros(batch, dtype=torch.int64, device=device)
        self.active = torch.ones(batch, dtype=torch.int64, device=device)
        self.capacity = capacity
        self.window = capacity
        self._rows = torch.arange(batch, device=device)[:, None]

    @classmethod
    def for_model(cls, cfg, batch: int, capacity: int, dtype, device, n_layers: Optional[int] = None):
        """A cache for a model of TargetConfig-like cfg (n_layers, n_kv_heads, head_dim)."""
        return cls(cfg.n_layers if n_layers is None else n_layers, batch, cfg.n_kv_heads, cfg.head_dim, capacity,
                   dtype, device)

    def _slots(self, t: int) -> torch.Tensor:
        """Where the next t entries of each sequence go, [N, t] (clamped: memory-safe on any length)."""
        return (self.lengths[:, None] + torch.arange(t, device=self.lengths.device)).clamp(max=self.capacity - 1)

    def layout(self, t: int, tree_mask: Optional[torch.Tensor] = None,
               tree_depth: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Rotary positions [N, t] and the attention mask [N, 1, t, window] of t new tokens.

        Causal: token i of sequence n sees keys 0 .. lengths[n] + i. A draft tree (tree_mask
        [N, t, t], tree_depth [N, t]): node i sees the prefix and the nodes tree_mask[n, i] allows,
        at position lengths[n] + depth."""
        device = self.lengths.device
        keys = torch.arange(self.window, device=device)
        rel = keys - self.lengths[:, None]  # [N, W]: key j is new entry rel (if 0 <= rel < t)
        if tree_mask is None:
            positions = self.lengths[:, None] + torch.arange(t, device=device)
            mask = rel[:, None, :] <= torch.arange(t, device=device)[None, :, None]
        else:
            positions = self.lengths[:, None] + tree_depth
            in_block = (rel >= 0) & (rel < t)
            rows = tree_mask.gather(2, rel.clamp(0, t - 1)[:, None, :].expand(-1, t, -1))
            mask = (rel < 0)[:, None, :] | (rows & in_block[:, None, :])
        return positions, mask[:, None]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Writes k, v [N, kv_heads, t, hd] after each sequence's entries; returns the buffers'
        first `window` keys and values (the layout's mask says which are visible)."""
        slots = self._slots(k.shape[2])
        self.k[layer][self._rows, :, slots] = k.transpose(1, 2).to(self.k[layer].dtype)
        self.v[layer][self._rows, :, slots] = v.transpose(1, 2).to(self.v[layer].dtype)
        return self.k[layer][:, :, : self.window], self.v[layer][:, :, : self.window]

    def load(self, row: int, k: List[torch.Tensor], v: List[torch.Tensor]) -> None:
        """Copies one sequence's entries (per layer [1, kv_heads, T, hd], e.g. a KVCache's k and v)
        into row `row` from position 0 (a prefill run on its own, without padding)."""
        for buf, src in zip(self.k + self.v, k + v):
            buf[row, :, : src.shape[2]] = src[0]

    def keys_values(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        return [(k[:, :, : self.window], v[:, :, : self.window]) for k, v in zip(self.k, self.v)]

    def commit(self, accept_len: torch.Tensor, written: int, path: Optional[torch.Tensor] = None) -> None:
        """After a forward that wrote `written` entries per sequence: keep the first accept_len + 1
        of them (the anchor and the accepted drafts), or with a tree's path [N, M] the root and
        accepted nodes, moved behind the prefix. Only active sequences advance."""
        if path is not None:
            src = (self.lengths[:, None] + path.clamp(min=0)).clamp(max=self.capacity - 1)
            dst = self._slots(path.shape[1])
            for buf in self.k + self.v:
                buf[self._rows, :, dst] = buf[self._rows, :, src]  # the gather copies before the write
        self.lengths += (accept_len + 1) * self.active
