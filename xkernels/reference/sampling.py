"""Per-request sampling parameters: the filtered target distribution and the per-request streams.

Every verification op that takes per-row `temperature`, `top_k`, `top_p` and `min_p` follows the
distribution `filtered_probs` states, and draws its noise from `RowStream`.
"""

from dataclasses import dataclass
from typing import Sequence

import torch

from .rng import (_MASK32, COIN_DRAW, gumbel_noise, int64_on, inverse_temperature, philox4x32_10, philox_draw,
                  uniform_open)


FILTER_ORDERS = ("top_k_first", "min_p_first")


def check_filter_order(filter_order: str) -> bool:
    """Whether `filter_order` is vLLM's ("min_p_first"); a ValueError naming it unless it is one of
    FILTER_ORDERS."""
    if filter_order not in FILTER_ORDERS:
        raise ValueError(f"filter_order must be one of {FILTER_ORDERS}, got {filter_order!r}")
    return filter_order == "min_p_first"


def filter_mask(a: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                filter_order: str = "top_k_first") -> torch.Tensor:
    """Which ids of one row of scaled logits `a` ([V], float32, finite max) the filters keep.

    Ids are ranked by `a` (a higher logit first, ties to the lower id). With p = softmax(a), in
    the order "top_k_first": keep the `top_k` first ids (0: all); then the smallest prefix of
    those whose mass, renormalised over them, reaches `top_p`; then drop ids with p < `min_p` *
    max(p). In vLLM's order, "min_p_first": drop ids with p < `min_p` * max(p); then keep the
    `top_k` first of the rest; then the smallest prefix of those whose mass, renormalised over
    them, reaches `top_p`. Every filter keeps a prefix of the ranking, so the result is one
    prefix and always holds the argmax; the orders differ only where min-p and top-p are both on.
    Masses are float32 exp(a - max), summed in float64 in ranking order; a kernel that sums in
    another order may put an id whose cumulative mass lies within that rounding of `top_p` on the
    other side of the cut.
    """
    vocab = a.shape[0]
    # A stable sort of -a ranks ties by the lower id; -(-inf) sorts last, as p = 0 should.
    order = torch.sort(-a, stable=True).indices
    e = torch.exp(a - a.max())  # p times its sum; e = 1 at the argmax

    def min_p_count(kept):  # of the first `kept` ids, those with p >= min_p max(p), as a - max >= log(min_p) in float32
        gap = a[order[:kept]] - a.max()
        return min(kept, int((gap >= torch.log(torch.tensor(min_p, dtype=torch.float32))).sum()))

    kept = vocab if top_k <= 0 else min(top_k, vocab)
    if min_p > 0.0 and check_filter_order(filter_order):
        kept = min_p_count(kept)
    if top_p < 1.0:
        mass = e[order[:kept]].double().cumsum(0)
        kept = min(int((mass < top_p * mass[-1]).sum()) + 1, kept)  # the first prefix reaching top_p
    if min_p > 0.0:
        kept = min_p_count(kept)
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[order[:kept]] = True
    return mask


def filtered_logits(a: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                    filter_order: str = "top_k_first") -> torch.Tensor:
    """`a` with the ids the filters drop set to -inf: softmax of it is the filtered distribution
    p'. A row without a softmax (a NaN, a +inf, or all -inf) is returned as it is."""
    check_filter_order(filter_order)
    if not torch.isfinite(a.max()) or (top_k <= 0 and top_p >= 1.0 and min_p <= 0.0):
        return a
    return torch.where(filter_mask(a, top_k, top_p, min_p, filter_order), a, float("-inf"))


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                   min_p: float = 0.0, filter_order: str = "top_k_first") -> torch.Tensor:
    """The distribution p' a request with these parameters samples from: softmax(logits / T),
    filtered as `filter_mask` says and renormalised; a point mass at the argmax at T = 0."""
    check_filter_order(filter_order)
    inv_t = inverse_temperature(temperature)
    logits = logits.float()
    if inv_t == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    rows = logits.reshape(-1, logits.shape[-1]) * inv_t
    out = torch.stack([torch.softmax(filtered_logits(r, top_k, top_p, min_p, filter_order), -1) for r in rows])
    return out.reshape(logits.shape)


@dataclass(frozen=True)
class RowParams:
    """One request's sampling parameters, as the ops read them."""

    inv_t: float  # the float32 reciprocal of the temperature; 0: greedy
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    filter_order: str = "top_k_first"


@dataclass(frozen=True)
class RowStream:
    """The Philox stream of one request.

    The scalar form (per_request False) keys slot i of batch row `sequence` by (seed, offset,
    sequence, i): today's stream, which depends on the row. The per-request form keys it by
    (seed, offset + i) alone (sequence and position 0), `offset` being (token-wise) the absolute position of
    the request's first slot, so a request draws the same noise at any row of any batch."""

    seed: int
    offset: int
    sequence: int
    per_request: bool

    def _at(self, slot: int):
        if self.per_request:
            return self.seed, self.offset + slot, 0, 0
        return self.seed, self.offset, self.sequence, slot

    def gumbel(self, slot: int, vocab: int) -> torch.Tensor:
        return gumbel_noise(*self._at(slot), vocab)

    def coin(self, slot: int) -> float:
        seed, offset, sequence, position = self._at(slot)
        return float(uniform_open(philox_draw(seed, offset, sequence, position, COIN_DRAW)[..., 0]))


def is_per_row(value, n: int) -> bool:
    """Whether a seed, offset or parameter is one value a row: a 1-D tensor of n elements (a
    one-element 1-D tensor with n > 1 is the scalar form, as before per-row values existed)."""
    return isinstance(value, torch.Tensor) and value.dim() == 1 and (value.numel() != 1 or n == 1)


def _per_row(value, n: int, cast) -> list:
    if is_per_row(value, n):
        return [cast(x) for x in value.tolist()]
    return [cast(value.item() if isinstance(value, torch.Tensor) else value)] * n


def row_params(n: int, temperature=0.0, top_k=None, top_p=None, min_p=None,
               filter_order: str = "top_k_first") -> Sequence[RowParams]:
    """The RowParams of n rows from scalars or [n] tensors (None: the filter is off)."""
    check_filter_order(filter_order)
    temps = _per_row(temperature, n, float)
    ks = _per_row(0 if top_k is None else top_k, n, int)
    ps = _per_row(1.0 if top_p is None else top_p, n, float)
    mins = _per_row(0.0 if min_p is None else min_p, n, float)
    return [RowParams(inverse_temperature(t), k, p, m, filter_order) for t, k, p, m in zip(temps, ks, ps, mins)]


def row_streams(n: int, seed=0, offset=0) -> Sequence[RowStream]:
    """The streams of n rows: the per-request form when seed or offset is a 1-D [n] tensor."""
    per_request = is_per_row(seed, n) or is_per_row(offset, n)
    seeds, offsets = _per_row(seed, n, int), _per_row(offset, n, int)
    return [RowStream(s, o, i, per_request) for i, (s, o) in enumerate(zip(seeds, offsets))]


def stream_coins(seed, offset, n: int, k: int, device=None) -> torch.Tensor:
    """The acceptance coins of slots 0..k-1 of n rows, [n, k] float32, in either form, computed
    with tensor ops on `device` (no host read of seed or offset tensors)."""
    slots = torch.arange(k, device=device)[None, :]
    if not (is_per_row(seed, n) or is_per_row(offset, n)):
        rows = torch.arange(n, device=device)[:, None]
        return uniform_open(philox_draw(seed, offset, rows, slots, COIN_DRAW)[..., 0])

    def column(x):
        x = int64_on(x, device)
        return x.reshape(-1, 1) if x.dim() == 1 and x.numel() == n else x.reshape(())

    seeds, offsets = column(seed), column(offset) + slots
    counter = (torch.full_like(offsets, COIN_DRAW), torch.zeros_like(offsets), torch.zeros_like(offsets),
               offsets & _MASK32)
    key = (seeds & _MASK32, ((seeds >> 32) ^ (offsets >> 32)) & _MASK32)
    return uniform_open(philox4x32_10(counter, key)[0])


def gumbel_argmax(log_w: torch.Tensor, noise: torch.Tensor, fallback: int) -> int:
    """argmax(log_w + noise) over the ids with log_w > -inf, or `fallback` when there is none."""
    if torch.isneginf(log_w).all():
        return fallback
    return int(torch.where(torch.isneginf(log_w), float("-inf"), log_w + noise).argmax())


def log_weights_of_linear(w: torch.Tensor) -> torch.Tensor:
    """log w where w > 0, -inf elsewhere: Gumbel-max over it draws from normalize(max(w, 0))."""
    return torch.where(w > 0, torch.log(w), float("-inf"))
