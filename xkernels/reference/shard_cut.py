"""References of shard_cut_histogram and shard_cut_pick, a round of the radix select that finds a
sharded row's whole-vocabulary cut, and of shard_cut_candidates, a shard's lowest keys for a bounded top-k (csrc/include/xkernels/shard_cut.h; xkernels/distributed.py runs
the rounds)."""

import math

import torch

CUT_ID_BITS = 31  # a key is its value's 32 order bits above the global id's 31
CUT_SHIFTS = (56, 48, 40, 32, 24, 16, 8, 0)  # the rounds' digits, from the top of the 63-bit keys
_LOW31 = 2**31 - 1


def cut_rank_keys(a: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The int64 keys of scaled logits a (float32) at global ids (< 2^31), ascending in the ranking:
    a higher value first, ties (-0 and +0 among them) to the lower id."""
    bits = torch.where(a == 0, 0.0, a).contiguous().view(torch.int32).long() & 0xFFFFFFFF
    ascending = torch.where(bits >= 2**31, bits ^ 0xFFFFFFFF, bits | 2**31)
    return ((0xFFFFFFFF - ascending) << CUT_ID_BITS) | ids


def cut_keep_all_key() -> int:
    """The key of (-inf, 2^31 - 1): past every id above -inf; as a cut, it keeps every id."""
    return int(cut_rank_keys(torch.tensor(-math.inf), torch.tensor(_LOW31)))


def cut_key_cut(key: torch.Tensor):
    """The cut (value float32, id int64) that a key stands for: the ids ranked at or before it."""
    ascending = 0xFFFFFFFF - (key >> CUT_ID_BITS)
    bits = torch.where(ascending >= 2**31, ascending & 0x7FFFFFFF, ascending ^ 0xFFFFFFFF)
    value = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)
    return value, key & _LOW31


def cut_weights(a, ids, row_max=None, keep_value=None, keep_id=None):
    """Each id's weight split as (hi, lo) int64, w = (hi 2^31 + lo) / 2^62: 1 for an id above
    -inf (a count), or with row_max its mass exp(a - row_max) clamped to [0, 1]; 0 for the ids
    outside the keep cut (a > keep_value, or equal at an id <= keep_id) and for NaNs."""
    w = (a > -math.inf).float()
    if keep_value is not None:
        kept = (a > keep_value[:, None]) | ((a == keep_value[:, None]) & (ids <= keep_id[:, None].long()))
        w = torch.where(kept, w, 0.0)
    if row_max is not None:
        e = torch.exp(a - row_max[:, None])
        w = torch.where((w > 0) & (e > 0), e.clamp(max=1.0), 0.0)
    fixed = (w.double() * 2.0**62).long()  # exact: a float32 times a power of 2, below 2^63
    return fixed >> 31, fixed & _LOW31


def shard_cut_histogram(logits, scale, prefix, shift, vocab_start, ignore_id=-1, row_max=None, keep_value=None,
                        keep_id=None):
    """See xkernels.ops.shard_cut_histogram: int64 [R, 2, 256], the weights' hi parts then lo parts
    of the candidates (keys whose digits above shift are prefix) by the digit at shift."""
    r, v = logits.shape
    a = logits.detach().cpu().float() * scale.detach().cpu()[:, None]
    ids = torch.arange(vocab_start, vocab_start + v)
    if 0 <= ignore_id - vocab_start < v:
        a[:, ignore_id - vocab_start] = -math.inf
    key = cut_rank_keys(a, ids)
    cpu = lambda t: None if t is None else t.detach().cpu()  # noqa: E731
    hi, lo = cut_weights(a, ids, cpu(row_max), cpu(keep_value), cpu(keep_id))
    if shift + 8 < 64:
        candidate = (key >> (shift + 8)) == prefix.detach().cpu()[:, None]
        hi, lo = torch.where(candidate, hi, 0), torch.where(candidate, lo, 0)
    digit = (key >> shift) & 255
    out = torch.zeros(r, 2, 256, dtype=torch.int64)
    out[:, 0].scatter_add_(1, digit, hi)
    out[:, 1].scatter_add_(1, digit, lo)
    return out.to(logits.device)


def shard_cut_candidates(logits, scale, count, vocab_start, ignore_id=-1, row_max=None):
    """See xkernels.ops.shard_cut_candidates: (keys [R, count], ascending, the keep-all key past the
    row's ids above -inf; weights [R, count, 2], the keys' (hi, lo) masses with row_max, else
    [R, 0, 2])."""
    r, v = logits.shape
    a = logits.detach().cpu().float() * scale.detach().cpu()[:, None]
    if 0 <= ignore_id - vocab_start < v:
        a[:, ignore_id - vocab_start] = -math.inf
    keys = torch.where(a > -math.inf, cut_rank_keys(a, torch.arange(vocab_start, vocab_start + v)), cut_keep_all_key())
    keys = torch.cat([keys.sort(1).values, torch.full((r, count), cut_keep_all_key())], 1)[:, :count]
    weights = torch.zeros(r, 0, 2, dtype=torch.int64)
    if row_max is not None:
        value, ids = cut_key_cut(keys)
        weights = torch.stack(cut_weights(value, ids, row_max.detach().cpu()), -1)
    return keys.to(logits.device), weights.to(logits.device)


def cut_weight_values(hist: torch.Tensor) -> torch.Tensor:
    """The weights (hi, lo) [..., 2 or 1 (hi alone: a count's lo parts are 0), B] as float64 numbers
    in units of 2^-62: hi 2^31 + lo, each part rounded to float64 once."""
    value = hist[..., 0, :].double() * 2.0**31
    return value + hist[..., 1, :].double() if hist.shape[-2] == 2 else value


def shard_cut_pick(hist, prefix, before, target):
    """See xkernels.ops.shard_cut_pick: the bucket of each row's all-reduced histogram hist [R, P, 256]
    (P = 2: hi and lo parts; 1: hi alone) where the cumulative weight, after before [R, 2] (hi, lo),
    first reaches target [R] (float64, units of 2^-62; the last bucket where it never does).
    Returns (prefix * 256 + bucket, before + the weight of the buckets ranked before it)."""
    parts = hist.shape[1]
    cum = before[:, :parts, None] + hist.cumsum(2)
    bucket = (cut_weight_values(cum) < target[:, None]).sum(1).clamp(max=255)
    below = (cum - hist).gather(2, bucket[:, None, None].expand(-1, parts, 1))[..., 0]
    new_before = before.clone()
    new_before[:, :parts] = below
    return prefix * 256 + bucket, new_before
