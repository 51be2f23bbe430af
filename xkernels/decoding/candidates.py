"""The candidates a draft tree is built over: each slot's k best ids and their log-probabilities,
computed alike from whole logits rows (modes.WholeVocab) and from their vocabulary shards
(tensor_parallel.VocabShard), so both build the same tree from the same logits.

Two things make that hold. The selection has one total order, the larger logit first and ties to
the lower id, on every device and however the rows are cut (torch.topk leaves the order of ties
unspecified, and a bfloat16 drafter's logits tie often). The log-probabilities are one rounding of
logit - max - log(sum), the sum taken in float64 from per-shard parts: the whole row is one part,
so a whole and a sharded sum differ by float64 rounding only, and their float32 log-probabilities
agree unless one lies within about 1e-16 of a rounding boundary (a float32 sum would differ in its
last bits, and so would the trees on a tie between path sums).
"""

import torch

_NAN_KEY = 0x7FFFFFFF  # above every number's key (+inf is 0x7F800000)
_NO_ID = torch.iinfo(torch.int64).max


def _value_keys(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Distinct int64 keys in the order (value, then the lower id): the float's bits made monotone in
    its value (negative floats count down; -0.0 ties 0.0, NaN above every number), the id reversed
    below them. ids in [0, 2**31)."""
    bits = values.view(torch.int32).long()
    key = torch.where(bits >= 0, bits, -(bits & 0x7FFFFFFF)).masked_fill_(values.isnan(), _NAN_KEY)
    return key.mul_(1 << 32).add_((1 << 32) - 1 - ids)


def topk_lower_id(values: torch.Tensor, k: int, ids=None):
    """The k largest of values [..., L] along the last dimension, best first, ties to the lower id:
    (their values as float32, their ids) [..., k]. ids: int64 [..., L] in [0, 2**31), or -1 for
    padding (loses every tie); default each entry's position. NaN ranks above every number, and
    -0.0 ties 0.0. k <= L < 2**31."""
    if ids is not None:  # sorted by id (padding last), the lower id is the lower position
        by_id = torch.sort(torch.where(ids >= 0, ids, _NO_ID), dim=-1, stable=True).indices
        picked_values, picked = topk_lower_id(values.gather(-1, by_id), k)
        return picked_values, ids.gather(-1, by_id).gather(-1, picked)
    v = values.float()
    if k == 0:
        return v[..., :0], torch.zeros(v.shape[:-1] + (0,), dtype=torch.int64, device=v.device)
    # torch.topk's k values are right however it orders ties (NaN ranks first there too), and so is
    # its set of the entries above the k-th value (a prefix of its sorted output). The places of
    # the entries equal to the k-th go to the lowest positions holding it: a second topk over a key
    # that is distinct wherever it is not zero (n - position on them), so it has no tie to order.
    n = v.shape[-1]
    top_values, top = v.topk(k, -1)
    kth = top_values[..., k - 1 :]
    tied = (v == kth) | (v.isnan() & kth.isnan())
    first_tied = torch.where(tied, torch.arange(n, 0, -1, dtype=torch.int32, device=v.device), 0).topk(k, -1).indices
    above = ((top_values > kth) | (top_values.isnan() & ~kth.isnan())).sum(-1, keepdim=True)
    place = torch.arange(k, device=v.device)
    picked = torch.where(place < above, top, first_tied.gather(-1, (place - above).clamp(min=0)))
    picked_values = v.gather(-1, picked)
    best = torch.sort(_value_keys(picked_values, picked), dim=-1, descending=True).indices  # distinct keys
    return picked_values.gather(-1, best), picked.gather(-1, best)


def logsumexp_parts(logits: torch.Tensor):
    """One part of each row's log-sum-exp, from logits [..., L] (a whole row, or a shard of it):
    (its max, float32; the sum of exp(logit - max), float64). merge_logsumexp combines parts."""
    x = logits.float()
    if x.shape[-1] == 0:
        row_max = x.new_full(x.shape[:-1], float("-inf"))
        return row_max, torch.zeros(x.shape[:-1], dtype=torch.float64, device=x.device)
    row_max = x.amax(-1)
    return row_max, x.double().sub_(row_max.double()[..., None]).exp_().sum(-1)


def merge_logsumexp(maxes: torch.Tensor, sums: torch.Tensor):
    """The rows' (max float32, sum of exp(logit - max) float64) from their parts [W, ...] (W = 1: a
    whole row's own part, unchanged). An empty part (max -inf) adds nothing; a NaN max stays."""
    big_m = maxes.amax(0)
    scale = torch.exp(maxes.double() - big_m.double())
    return big_m, torch.where(maxes == float("-inf"), 0.0, sums * scale).sum(0)


def candidate_logprobs(values: torch.Tensor, big_m: torch.Tensor, big_s: torch.Tensor) -> torch.Tensor:
    """log_softmax at logits values [..., k] of rows with statistics (big_m, big_s) [...]: one
    float32 rounding of values - max - log(sum), computed in float64."""
    return (values.double() - big_m.double()[..., None] - torch.log(big_s)[..., None]).float()


def whole_candidates(logits: torch.Tensor, k: int):
    """(log-probs float32, ids int64) [..., k] of each row's k best ids (k <= V) of whole logits
    rows [..., V]: the rule above with the row as its one part (merge_logsumexp would return a
    finite part as it is, and a row without a finite max has NaN log-probs either way)."""
    values, ids = topk_lower_id(logits, k)
    return candidate_logprobs(values, *logsumexp_parts(logits)), ids
