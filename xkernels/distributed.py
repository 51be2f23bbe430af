"""Vocabulary-parallel (tensor-parallel) verification, refinement and diffusion steps over
torch.distributed.

Each rank of `group` holds one shard of the vocabulary, the global ids
``[vocab_start, vocab_start + V_local)`` (shards may be uneven, even empty), and calls the same
function with its shard of the logits. The package keys its sampling noise by the global id
(Philox words of (sequence, position, id)), so a Gumbel-max over each shard followed by a
maximum over the shards (ties to the lowest id) is exactly the unsharded op's draw, and softmax
statistics combine by log-sum-exp. Each call therefore runs one per-shard pass of the
``shard_row_stats`` op and exchanges only O(rows) numbers per collective (row maxima and sums,
argmaxes, the drafts' logits, the best (score, id) pairs), never logits, in a number of
collectives fixed by the shapes (the two loops that stop early read a flag on the host unless
called with ``capturable=True``):

- ``chain_verify``: 1 all-gather at T = 0, 2 at T > 0. It takes the unsharded op's per-request
  arguments: a temperature per sequence ([N], rows at 0 greedy in the same call), per-request
  streams (seed / offset [N]: row i of request n draws the noise of (seed[n], offset[n] + i), the
  same at any world size and as ``xkernels.chain_verify``), and top_k / top_p / min_p over the
  whole vocabulary: ``filter_cuts`` finds each row's cut from the shards (a radix select over
  all-reduced 256-bucket histograms, ``shard_cut_histogram`` and ``shard_cut_pick``: 8 collectives
  each for top-k and top-p, none for min-p; with ``top_k_bound``, a host bound on every sampled
  request's top_k, or a scalar top_k, 1 all-gather of each shard's lowest keys, from
  ``shard_cut_candidates``, for top-k and top-p within it), then a second ``shard_row_stats`` pass
  with the cut gives the filtered sums (1 all-gather more). Every function with filters takes
  ``top_k_bound``.
  Per-row filter tensors are not value-checked here (that would read them on the host): values
  outside their ranges read as off, as the CUDA kernels read them without ``XKERNELS_CHECK=1``.
  ``method="block"`` (block verification) with draft_probs at T > 0 and K > 1 adds 1 all-reduce
  (the rows' residual masses, from a torch pass over the local rows 1..K-1); ``return_logprobs``
  sends the pick's logit in the draw's all-gather.
- ``refine_step``: an all-reduce of the embedded rows [N, B, r] (a vocabulary-parallel embedding
  lookup) and 1 all-gather; ``jacobi_refine`` / ``sequential_refine`` run passes of it (plus one
  all-gather for the drafter's own sample), as many as the unsharded op runs (``jacobi_refine``
  reads on the host after each pass whether a sequence changed), or with ``capturable=True``
  min(max_iters, D + 1) passes and no host read. They take the per-request arguments too (slot d
  of sequence n at offset[n] + d); with filters a pass adds the cut's collectives and 1 all-gather
  (the pick and the sums within the cut, one more ``shard_row_stats`` pass).
- ``dllm_step``: 1 all-gather; the per-request arguments (position l at slot offset[n] + l), the
  filters ranking the mask token -inf: the cut's collectives and 1 all-gather more (the pick).
- ``tree_verify``: 2 all-gathers (1 at T = 0). It takes the same per-request arguments as
  ``chain_verify`` (node i of sequence n draws slot offset[n] + i of its stream, as in
  ``xkernels.tree_verify``); the filters cut every node row (``filter_cuts``, then 1 all-gather
  more for the filtered sums), and every accept test, residual and draw reads the filtered
  distribution. With draft probabilities at T > 0, at most
  max(M, 2) collectives for trees of M nodes: the all-gather, up to M - 2 all-reduces of N
  float64 sums, the all-gather of the draw. A test after a rejected sibling needs the sum over the
  whole vocabulary of the residual max(e - c q, 0) (xkernels/tree.h's closed form). The walk
  tests at most one child of every sequence a step; a step whose tests need a fresh sum first
  all-reduces the shards' partial sums of every sequence's current residual (a torch pass over the
  local rows [N, V_local]), and the walk stops once no sequence has a child left to test (two
  flags read on the host each step). With ``capturable=True`` it reads nothing on the host: all
  M - 1 steps, each but the first with its all-reduce, needed or not, so the count does not depend
  on the data.

Every rank returns the same tensors, equal to the unsharded op on the gathered logits: the same
tokens at T = 0 and at T > 0 (same seed and offset) and log-probabilities within 1e-5. The global
softmax sum is a sum of the shards' sums, not the unsharded kernel's one pass, so it differs in
the last bits; a draft whose acceptance coin lands within that rounding of p(x) could be decided
differently (about 1e-7 per decision). The residual sums of ``tree_verify`` are taken in float64
(e - c q cancels as the residual shrinks; the kernels keep c in double too) and rounded once to
float32, as the kernels round theirs. Its draw after rejections is shard_row_stats' residual
draw with residual_stats (max, c): c rounded to float32, the weights e / c - q computed in
float32, so a weight errs by about 2^-23 e / c instead of the kernels' 2^-24 of the residual. A
draw after k rejections may then differ with probability about 2^-23 S / R_k (S: the softmax
sum, R_k: the residual's), and the walk gets there with probability R_k / S: about 1e-7 per
rejection depth. Draft ids that lie in no shard are rejected (the unsharded CPU op raises on
them).

``chain_verify``, ``tree_verify``, ``dllm_step`` and the refine functions take ``errors``, the
asynchronous error flag (``xkernels.errors``, as the unsharded ``tree_verify``, ``dllm_step`` and
refine ops take it): an int32 [N] tensor on the logits' device, a word a sequence, into which
each sequence's invalid per-request values (``temperature``, ``top_k``, ``top_p`` and ``min_p`` [N]
tensors) are OR-ed as ``SamplingError`` bits by tensor ops on the device (no host read, so a
captured step flags the values of each replay), instead of raising; they read as off as without it,
so the results are the same. Each ``shard_row_stats`` call gets the buffer too, so that a flagged
temperature does not raise there (it ORs the same bit again: on CUDA one small launch a call).
Scalars still raise, and ``top_k_bound`` still checks each filtered row's ``top_k``.

The refinement functions compute each rank's shard of the refined logits ``s + w_read z`` with
torch (they materialize the local shard's logits, [N, D, V_local] float32), unlike the
unsharded kernels, which never write them. The code uses only tensor ops and collectives, so it
runs on any backend: gloo on CPUs (tested), NCCL on GPUs (not testable here: two ranks cannot
share one GPU). ``seed`` and ``offset`` are ints or 0-dim int64 tensors on the logits'
device (the batch-row form, as for the unsharded ops; a one-element 1-D tensor with N > 1 raises), or
int64 [N] tensors (the per-request streams); a tensor is never read on the host: the kernels read it
on the device and the acceptance coins are computed from it there. The first ``shard_row_stats`` call of
each function checks them (a bad tensor raises naming ``seed`` or ``offset``).
"""

import os
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from . import ops, reference
from .reference.sampling import stream_coins
from .reference.shard_cut import CUT_SHIFTS, cut_keep_all_key, cut_key_cut, cut_rank_keys, cut_weight_values
from .refiner import RefinerWeights, refiner_hidden

_NONE = torch.iinfo(torch.int64).max  # no id: loses every minimum


class Traffic:
    """Bytes this rank contributed to collectives (the local tensors' sizes) and their count; and
    logits_bytes, the local logits the calls read (what gathering them instead would send)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.bytes, self.collectives, self.logits_bytes = 0, 0, 0

    def read(self, logits: torch.Tensor):
        self.logits_bytes += logits.numel() * logits.element_size()


traffic = Traffic()


def _all_gather(fields, group) -> torch.Tensor:
    """All-gathers float32 / int64 tensors of one shape as one float32 buffer (int64 ids travel
    as their int32 bits). Returns [W, F, *shape] float32."""
    packed = torch.stack([f.to(torch.int32).view(torch.float32) if not f.is_floating_point() else f.float()
                          for f in fields])
    world = dist.get_world_size(group)
    out = [torch.empty_like(packed) for _ in range(world)]
    dist.all_gather(out, packed, group=group)
    traffic.bytes += packed.numel() * packed.element_size()
    traffic.collectives += 1
    return torch.stack(out)


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    """Sums x over the ranks, in place (counted in traffic)."""
    dist.all_reduce(x, group=group)
    traffic.bytes += x.numel() * x.element_size()
    traffic.collectives += 1
    return x


def _ids(gathered: torch.Tensor) -> torch.Tensor:
    return gathered.contiguous().view(torch.int32).long()


def merge_stats(row_max: torch.Tensor, row_sum: torch.Tensor, top_id: torch.Tensor):
    """The global (max, sum, top id) of rows from the shards' shard_row_stats [W, ...]: the max
    is NaN if any shard's is (then top is the lowest NaN id), else the largest, its lowest id;
    the sum rescales each shard's by exp(max_shard - max) (0 when max is not finite)."""
    nan = row_max.isnan()
    any_nan = nan.any(0)
    clean = row_max.masked_fill(nan, float("-inf"))
    big_m = clean.amax(0)
    candidate = torch.where(any_nan, nan, clean == big_m) & (top_id >= 0)
    top = torch.where(candidate, top_id, _NONE).amin(0)
    top = torch.where(top == _NONE, 0, top)  # every shard empty
    finite = torch.isfinite(big_m) & ~any_nan
    shift = torch.where(finite, big_m, 0.0)
    terms = torch.where(clean == float("-inf"), 0.0, row_sum * torch.exp(clean - shift))
    total = torch.where(finite, terms.sum(0), 0.0)
    return torch.where(any_nan, float("nan"), big_m), total, top


def merge_picks(pick_score: torch.Tensor, pick_id: torch.Tensor, pick_logit: torch.Tensor):
    """The global Gumbel-max from the shards' picks [W, ...]: the largest score, ties to the
    lowest id. Returns (id, -1 when no shard drew; the owner's pick_logit)."""
    score = pick_score.nan_to_num(nan=float("-inf"), posinf=float("inf"))
    best = score.amax(0)
    candidate = (score == best) & (pick_id >= 0) & (best > float("-inf"))
    idx = torch.where(candidate, pick_id, _NONE).amin(0)
    owner = (candidate & (pick_id == idx)).float().argmax(0, keepdim=True)
    return torch.where(idx == _NONE, -1, idx), pick_logit.gather(0, owner)[0]


def _local_values(x: torch.Tensor, ids: torch.Tensor, vocab_start: int):
    """x[..., id - vocab_start] for the ids of ids [...] that this shard holds (0 elsewhere), and
    whether it holds them. x: [..., V_local] with the leading dimensions of ids."""
    v_local = x.shape[-1]
    local = ids - vocab_start
    own = (local >= 0) & (local < v_local)
    if v_local == 0:
        return torch.zeros(ids.shape, device=x.device), own
    got = x.gather(-1, local.clamp(0, v_local - 1)[..., None])[..., 0].float()
    return torch.where(own, got, 0.0), own


_ID_MAX = 2**31 - 1  # an id past every vocabulary's: a cut at it keeps every tie of its value
# A cut is the key (cut_rank_keys) of the last id it keeps; the stricter of two is the lesser key.
_KEEP_ALL = cut_keep_all_key()  # keeps everything


def _select(logits, scale, vocab_start: int, ignore_id: int, group, goal, row_max=None, keep=(None, None)):
    """The cut at the first id of the whole vocabulary's ranking at which the cumulative weight reaches
    the goal [R]: with row_max, a fraction of the row's total mass (the ids' exp(a - row_max) within
    keep), else a count of ids above -inf. 8 rounds of shard_cut_histogram, its all-reduce (a count's
    without its lo parts, which are 0) and shard_cut_pick: 3 launches a round, no host reads. Returns
    the cuts' keys [R]; rows whose whole weight stays below the goal get the keep-all cut."""
    rows = logits.shape[0]
    dev = logits.device
    parts = 1 if row_max is None else 2
    prefix = torch.zeros(rows, dtype=torch.int64, device=dev)
    before = torch.zeros(rows, 2, dtype=torch.int64, device=dev)  # weight ranked before the prefix's keys
    for shift in CUT_SHIFTS:
        hist = ops.shard_cut_histogram(logits, scale, prefix, shift, vocab_start, ignore_id=ignore_id,
                                       row_max=row_max, keep_value=keep[0], keep_id=keep[1])
        hist = _all_reduce(hist[:, :parts].contiguous(), group)
        if shift == CUT_SHIFTS[0]:  # the first round holds every id: its sum is the total
            total = cut_weight_values(hist.sum(2, keepdim=True))[:, 0]
            target = goal.double() * (2.0**62 if row_max is None else total)
            reached = target <= total
        prefix, before = ops.shard_cut_pick(hist, prefix, before, target)
    return torch.where(reached, prefix, _KEEP_ALL)


def _min_p_key(big_m: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """The key of the least float32 t with t - max >= log(min_p) (the kept ids are a >= t), from
    t0 = max + log(min_p) moved by ulps until the float32 test flips: subtraction rounds
    monotonically, so the test is monotone in t."""
    gap = torch.log(min_p.float())
    t = big_m + gap
    down, up = torch.full((), float("-inf"), device=t.device), torch.full((), float("inf"), device=t.device)
    for _ in range(4):  # t0 is within a few ulps of the flip
        lower = torch.nextafter(t, down)
        t = torch.where(lower - big_m >= gap, lower, t)
        t = torch.where(t - big_m >= gap, t, torch.nextafter(t, up))
    return cut_rank_keys(t, torch.full_like(big_m, _ID_MAX, dtype=torch.int64))


def _all_gather_keys(x: torch.Tensor, group) -> torch.Tensor:
    """All-gathers the int64 tensor x [R, ...] (counted in traffic). Returns [R, W, ...]."""
    world = dist.get_world_size(group)
    out = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(out, x.contiguous(), group=group)
    traffic.bytes += x.numel() * x.element_size()
    traffic.collectives += 1
    return torch.stack(out, 1)


def _bounded_cuts(logits, scale, vocab_start: int, ignore_id: int, group, k, bound: int, big_m, top_p):
    """The top-k cut [R] (k [R] in [1, bound]) and, where top_p [R] is given, top-p's cut within it
    (else None), from one all-gather of every shard's `bound` lowest keys and their masses
    (shard_cut_candidates): they hold the whole row's k lowest. The same cuts as _select's rounds:
    the masses are the same fixed-point numbers, summed and compared alike."""
    rows = logits.shape[0]
    keys, w = ops.shard_cut_candidates(logits, scale, bound, vocab_start, ignore_id=ignore_id,
                                       row_max=None if top_p is None else big_m.float())
    fields = keys[..., None] if top_p is None else torch.cat([keys[..., None], w], -1)  # [R, bound, 1 or 3]
    g = _all_gather_keys(fields, group).reshape(rows, -1, fields.shape[-1])
    g = g.gather(1, g[..., 0].argsort(1)[..., None].expand_as(g))  # the W * bound candidates in ranking order
    key = g[..., 0]
    k_cut = key.gather(1, (k.clamp(1, bound) - 1)[:, None])[:, 0]
    if top_p is None:
        return k_cut, None
    inside = key <= k_cut[:, None]
    cum = cut_weight_values(torch.stack([g[..., 1], g[..., 2]], 1).mul(inside[:, None]).cumsum(2))
    total = cum[:, -1]
    target = top_p.double() * total
    p_cut = key.gather(1, (cum < target[:, None]).sum(1).clamp(max=key.shape[1] - 1)[:, None])[:, 0]
    return k_cut, torch.where(target <= total, p_cut, _KEEP_ALL)


def _value_checks() -> bool:
    """XKERNELS_CHECK=1: check CUDA tensors' values too (a host read), as the kernels do."""
    return os.environ.get("XKERNELS_CHECK", "") not in ("", "0")


def _check_k_bound(k: torch.Tensor, active: torch.Tensor, bound: int):
    """top_k_bound's range, and the active rows' top_k k within it (on the CPU; on CUDA with
    XKERNELS_CHECK=1, a host read)."""
    if not 1 <= bound <= 4096:
        raise ValueError(f"top_k_bound must be in [1, 4096], got {bound}")
    if k.device.type == "cpu" or _value_checks():
        bad = active & ((k < 1) | (k > bound))
        if bool(bad.any()):
            raise ValueError(f"top_k_bound={bound} needs every filtered row's top_k in [1, {bound}], got "
                             f"{int(k[bad][0])}")


def filter_cuts(logits: torch.Tensor, big_m: torch.Tensor, vocab_start: int, group, active: torch.Tensor,
                top_k=None, top_p=None, min_p=None, *, scale: Optional[torch.Tensor] = None, ignore_id: int = -1,
                top_k_bound: Optional[int] = None):
    """The cut of the filtered target distribution (xkernels.reference.sampling.filter_mask: top-k,
    then top-p renormalised over the top-k set, then min-p) of rows of a vocabulary sharded over
    group, without gathering the rows: logits [R, V_local] this shard's (any float dtype), scaled
    by scale [R] (default 1) into a, ignore_id's a at -inf; big_m [R] the global maxima of a,
    active [R] the rows to filter (sampled rows with a softmax), top_k / top_p / min_p [R] tensors
    or None (off). Returns (cut_value float32 [R], cut_id int64 [R]) for shard_row_stats: each row
    keeps the ids ranked at or before its cut (the keep-all cut where inactive). Top-k and top-p
    are each a radix select of 8 shard_cut_histogram rounds, so 8 all-reduces each; min-p needs
    only the max. The masses are summed exactly (62-bit fixed point), so the cut does not depend
    on the number of shards.

    top_k_bound (a host int in [1, 4096]): every active row's top_k is in [1, top_k_bound] (checked
    on the CPU, and on CUDA with XKERNELS_CHECK=1; unchecked, a k outside reads as clamped into
    it). Then top-k, and top-p within it, take no rounds: one shard_cut_candidates pass and 1
    all-gather of top_k_bound keys (and masses, with top_p) a row from each rank; the same cuts."""
    if top_k is not None and top_k_bound is not None:
        _check_k_bound(top_k.long(), active, top_k_bound)
    return _filter_cuts(logits, big_m, vocab_start, group, active, top_k, top_p, min_p, scale, ignore_id, top_k_bound)


def _filter_cuts(logits, big_m, vocab_start: int, group, active, top_k, top_p, min_p, scale, ignore_id: int,
                 top_k_bound: Optional[int]):
    """filter_cuts without top_k_bound's checks."""
    rows = logits.shape[0]
    dev = logits.device
    scale = torch.ones(rows, device=dev) if scale is None else scale.float()
    cut = torch.full((rows,), _KEEP_ALL, dtype=torch.int64, device=dev)
    p_cut = None
    if top_k is not None:
        k = top_k.long()
        on = active & (k > 0)  # a k past the finite ids keeps them all (_select's unreached rows)
        if top_k_bound is not None:
            k_cut, p_cut = _bounded_cuts(logits, scale, vocab_start, ignore_id, group, k, top_k_bound, big_m,
                                         top_p)
        else:
            k_cut = _select(logits, scale, vocab_start, ignore_id, group, k)
        cut = torch.where(on, k_cut, cut)
    if top_p is not None:
        if p_cut is None:
            keep = cut_key_cut(cut)
            p_cut = _select(logits, scale, vocab_start, ignore_id, group, top_p, row_max=big_m.float(), keep=keep)
        cut = torch.minimum(cut, torch.where(active & (top_p < 1), p_cut, _KEEP_ALL))
    if min_p is not None:
        on = active & (min_p > 0)
        cut = torch.minimum(cut, torch.where(on, _min_p_key(big_m, torch.where(on, min_p, 1.0)), _KEEP_ALL))
    return cut_key_cut(cut)


def _kept(a: torch.Tensor, ids: torch.Tensor, cut_value: torch.Tensor, cut_id: torch.Tensor) -> torch.Tensor:
    """Whether the ids with scaled logits a are ranked at or before the cut (sampling_params.h's
    filter_keeps: a higher value first, ties to the lower id)."""
    return (a > cut_value) | ((a == cut_value) & (ids <= cut_id))


def _row_cuts(local_logits, inv_t, big_m, point_mass, vocab_start: int, group, filters, ignore_id: int = -1,
              top_k_bound=(None, False)):
    """Every row's cut over the whole vocabulary (filter_cuts; point-mass rows keep everything) of a
    shard [N, R, V_local], of a = logits * inv_t with ignore_id's logit at -inf; big_m [N, R] the
    global max of a. filters: (top_k, top_p, min_p) [N] or None; top_k_bound: _k_bound's. Returns
    (cut_value, cut_id) [N, R]."""
    n, rows, v_local = local_logits.shape
    expand = lambda t: None if t is None else t[:, None].expand(n, rows).reshape(-1)  # noqa: E731
    bound, checked = top_k_bound
    cuts = filter_cuts if checked else _filter_cuts  # a scalar top_k's own bound holds every row
    cut_value, cut_id = cuts(local_logits.reshape(n * rows, v_local), big_m.reshape(-1), vocab_start, group,
                             ~point_mass.reshape(-1), *(expand(f) for f in filters), scale=expand(inv_t),
                             ignore_id=ignore_id, top_k_bound=bound)
    return cut_value.view(n, rows), cut_id.view(n, rows)


def _filtered_sums(local_logits, vocab_start: int, group, cut, big_s, point_mass, rng):
    """The rows' merged softmax sums within their cuts (a second shard_row_stats pass and 1
    all-gather; the max and top stay), big_s where point_mass. rng: shard_row_stats' temperature,
    seed and offset."""
    kept_max, kept_sum, kept_top, _, _, _ = ops.shard_row_stats(local_logits, vocab_start, cut_value=cut[0],
                                                               cut_id=cut[1], **rng)
    g = _all_gather([kept_max, kept_sum, kept_top], group)
    return torch.where(point_mass, big_s, merge_stats(g[:, 0], g[:, 1], _ids(g[:, 2]))[1])


def _k_bound(top_k, top_k_bound: Optional[int]):
    """filter_cuts' top_k_bound and whether the rows' top_k need its check: the caller's, checked;
    else a scalar top_k's own where in [1, 4096], which every row has."""
    if top_k_bound is not None or top_k is None or isinstance(top_k, torch.Tensor):
        return top_k_bound, True
    return (int(top_k) if 1 <= int(top_k) <= 4096 else None), False


def _row_params(n: int, dev, temperature, top_k, top_p, min_p, errors=None):
    """Each sequence's inv_t [N] float32 (0: greedy) and its filters as [N] tensors (None: off), from
    scalars or [N] tensors, as the unsharded ops read them (values past the ranges read as off).
    errors (int32 [N] on dev): the invalid per-row values' bits OR-ed into it on the device
    (reference.param_errors: tensor ops, no host read)."""
    def column(value, name, dtype, default):
        if value is None:
            return None
        if isinstance(value, torch.Tensor):
            if value.dim() != 1 or value.shape[0] != n:
                raise ValueError(f"{name} must be a scalar or have shape [N] = [{n}], got {list(value.shape)}")
            if value.device != torch.device(dev):
                raise ValueError(f"{name} must be on {dev} like the logits, got {value.device}")
            return value.to(dtype)
        return torch.full((n,), value, dtype=dtype, device=dev)

    if isinstance(temperature, torch.Tensor):
        t = column(temperature, "temperature", torch.float32, 0.0)
        inv = (1.0 / t.double()).float()
        inv_t = torch.where((t > 0) & torch.isfinite(t) & torch.isfinite(inv), inv, 0.0)
    else:
        inv_t = torch.full((n,), reference.inverse_temperature(temperature), device=dev)
    if top_k is not None and not isinstance(top_k, torch.Tensor) and (int(top_k) < 0):
        raise ValueError(f"top_k must be >= 0 (0: off), got {top_k}")
    if top_p is not None and not isinstance(top_p, torch.Tensor) and not 0 < float(top_p) <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1: off), got {top_p}")
    if min_p is not None and not isinstance(min_p, torch.Tensor) and not 0 <= float(min_p) <= 1:
        raise ValueError(f"min_p must be in [0, 1] (0: off), got {min_p}")
    k = column(top_k, "top_k", torch.int64, 0)
    p = column(top_p, "top_p", torch.float32, 1.0)
    m = column(min_p, "min_p", torch.float32, 0.0)
    if errors is not None:
        if (errors.dtype != torch.int32 or errors.shape != (n,) or not errors.is_contiguous()
                or errors.device != torch.device(dev)):
            raise ValueError(f"errors must be a contiguous int32 [N] = [{n}] tensor on {dev}, got {errors.dtype} "
                             f"{list(errors.shape)} on {errors.device}")
        errors |= reference.param_errors(n, temperature, top_k, top_p, min_p)
    k = None if k is None else k.clamp(min=0)
    p = None if p is None else torch.where((p > 0) & (p <= 1), p, 1.0)
    m = None if m is None else torch.where((m >= 0) & (m <= 1), m, 0.0)
    return inv_t, k, p, m


def _block_accept(local_logits, draft_probs, draft_tokens, vocab_start: int, group, inv_t, cut, p_x, q_x, coins,
                  big_m, big_s, top, point_mass):
    """Block verification's accepted length tau [N] and weight w_tau [N] (reference.chain's
    _block_accept; the kernels' block_weight and block_threshold, in float32 as there): w_0 = 1,
    w_i = min(w_{i-1} p'(x_i) / q(x_i), 1); tau the last i with coin i - 1 below h_i = Z_i / (Z_i +
    1 - w_i) (h_K = w_K), Z_i = sum_v max(w_i p'_i(v) - q_i(v), 0). Without draft_probs q =
    one-hot(x) and Z_i = w_i (1 - p'_i(x_i)); with them Z_i of a row with a softmax is
    (w_i / S_i) sum_v max(e_v - (S_i / w_i) q_v, 0) (a torch pass over the local rows 1..K-1 and
    1 all-reduce of their N (K - 1) float64 partial sums, which carries q_i at the argmax for the
    point-mass rows: Z_i = max(w_i - q_i(top), 0)). p_x, q_x [N, K]: p'(x) (1 or 0 at a point mass)
    and q(x) of the drafts (0 for ids no shard holds: their w is 0)."""
    n, k = draft_tokens.shape
    dev = p_x.device
    if k == 0:  # no prefix to judge: the bonus row
        return torch.zeros(n, dtype=torch.int64, device=dev), torch.ones(n, device=dev)
    q_det = torch.ones_like(p_x) if draft_probs is None else q_x
    w = [torch.ones(n, device=dev)]
    for i in range(k):
        ratio = w[i] * p_x[:, i] / q_det[:, i]
        w.append(torch.where(q_det[:, i] > 0, torch.where(ratio < 1, ratio, 1.0), (w[i] * p_x[:, i] > 0).float()))
    w = torch.stack(w, 1)  # [N, K + 1]
    w_mid, s_mid = w[:, 1:k], big_s[:, 1:k]  # rows 1..K-1
    if draft_probs is None or k < 2:  # (no row 1..K-1 at K = 1)
        z = w_mid * (1 - p_x[:, 1:k])
    else:
        pm = point_mass[:, 1:k]
        live = w_mid > 0
        coef = torch.where(live & ~pm, s_mid / w_mid, 1.0).double()  # float32 S / w, as the kernels divide it
        rows = torch.arange(1, k, device=dev).expand(n, k - 1)
        part = _residual_sums(local_logits, draft_probs, rows, coef, big_m[:, 1:k], inv_t,
                              None if cut is None else (cut[0][:, 1:k], cut[1][:, 1:k]), vocab_start)
        q_top = _local_values(draft_probs[:, 1:k], top[:, 1:k], vocab_start)[0].double()
        total = _all_reduce(torch.where(pm, q_top, part), group).float()
        z = torch.where(pm, (w_mid - total).clamp(min=0), total * (w_mid / s_mid))
        z = torch.where(live, z, 0.0)
    denom = z + (1 - w_mid)
    h = torch.cat([torch.where(denom > 0, z / denom, 1.0), w[:, k:]], 1)  # h_1..h_K
    prefix = torch.where(coins < h, torch.arange(1, k + 1, device=dev), 0)
    tau = prefix.amax(1)
    return tau, w.gather(1, tau[:, None])[:, 0]


def chain_verify(draft_tokens: torch.Tensor, local_logits: torch.Tensor, *, vocab_start: int, group=None,
                 draft_probs: Optional[torch.Tensor] = None, temperature=0.0, seed=0, offset=0, top_k=None,
                 top_p=None, min_p=None, top_k_bound: Optional[int] = None, method: str = "token",
                 return_logprobs: bool = False, errors: Optional[torch.Tensor] = None):
    """xkernels.chain_verify over a vocabulary shard: draft_tokens [N, K] global ids,
    local_logits [N, K+1, V_local], draft_probs the local shard [N, K, V_local] of q. temperature,
    top_k, top_p, min_p, seed, offset, method and return_logprobs as for xkernels.chain_verify
    (scalars or [N] tensors; [N] seeds or offsets are the per-request streams), the filters over
    the whole vocabulary (filter_cuts). Returns (accept_len [N], out_tokens [N, K+1]), with
    return_logprobs also logprobs float32 [N, K+1] (log p' of the emitted tokens under their rows'
    filtered distributions, 0 at a point mass, NaN padded), the same on every rank.

    method="block" (block verification, as xkernels.chain_verify_ragged; greedy rows verify
    token-wise, as there) reads the same coins (coin i - 1 for a prefix of i drafts) and adds, with
    draft_probs and K > 1, a torch pass over the local rows 1..K-1 and 1 all-reduce of N (K - 1)
    float64 residual sums; its draw after a rejection at row tau is the residual max(w_tau p' - q,
    0), shard_row_stats' residual_stats (max, S / w_tau). return_logprobs adds the pick's logit to
    the draw's all-gather."""
    block = ops._check_method(method)
    n, k = draft_tokens.shape
    dev = local_logits.device
    bound = _k_bound(top_k, top_k_bound)  # before top_k becomes a tensor
    inv_t, top_k, top_p, min_p = _row_params(n, dev, temperature, top_k, top_p, min_p, errors)
    all_greedy = not isinstance(temperature, torch.Tensor) and reference.inverse_temperature(temperature) == 0
    filtered = not all_greedy and any(x is not None for x in (top_k, top_p, min_p))
    greedy = (inv_t == 0)[:, None]
    traffic.read(local_logits)
    rng = dict(temperature=temperature, seed=seed, offset=offset, errors=errors)
    # seed and offset go in to be checked: this first call would not read them otherwise.
    row_max, row_sum, top, _, _, _ = ops.shard_row_stats(local_logits, vocab_start, **rng)
    a_x, own = _local_values(local_logits[:, :k], draft_tokens, vocab_start)
    a_x = torch.where(greedy, a_x, a_x * inv_t[:, None])
    q_x = _local_values(draft_probs, draft_tokens, vocab_start)[0] if draft_probs is not None else torch.zeros_like(a_x)
    pad = lambda t: torch.cat([t.float(), torch.zeros(n, 1, device=dev)], 1)  # noqa: E731  [N, K] -> [N, K+1]
    g = _all_gather([row_max, row_sum, top, pad(a_x), pad(q_x), pad(own)], group)
    big_m, big_s, top = merge_stats(g[:, 0], g[:, 1], _ids(g[:, 2]))
    held = g[:, 5] > 0
    a_x = torch.where(held, g[:, 3], 0.0).sum(0)[:, :k]  # the owner's value (one shard holds each id)
    q_x = torch.where(held, g[:, 4], 0.0).sum(0)[:, :k]
    valid = held.any(0)[:, :k]
    point_mass = greedy | ~torch.isfinite(big_m)

    cut = None
    if filtered:
        cut = _row_cuts(local_logits, inv_t, big_m, point_mass, vocab_start, group, (top_k, top_p, min_p),
                        top_k_bound=bound)
        big_s = _filtered_sums(local_logits, vocab_start, group, cut, big_s, point_mass, rng)
        a_x = torch.where(_kept(a_x, draft_tokens, cut[0][:, :k], cut[1][:, :k]), a_x, float("-inf"))

    argmax_draft = valid & (draft_tokens == top[:, :k])
    accepted = argmax_draft
    w_stop = torch.ones(n, device=dev)  # the residual's weight where the chain stops (token-wise 1)
    if not all_greedy:
        p_x = torch.exp(a_x - big_m[:, :k]) / big_s[:, :k]
        coins = stream_coins(seed, offset, n, k, dev)
        sampled = coins * q_x < p_x if draft_probs is not None else coins < p_x
        accepted = torch.where(point_mass[:, :k], accepted, valid & sampled)
    accept_len = accepted.long().cumprod(-1).sum(-1)
    if block and not all_greedy:
        p_x = torch.where(point_mass[:, :k], argmax_draft.float(), torch.where(valid, p_x, 0.0))
        tau, w_tau = _block_accept(local_logits, draft_probs, draft_tokens, vocab_start, group, inv_t, cut, p_x, q_x,
                                   coins, big_m, big_s, top, point_mass)
        accept_len = torch.where(greedy[:, 0], accept_len, tau)
        w_stop = torch.where(greedy[:, 0], w_stop, w_tau)
    out = torch.where(torch.arange(k, device=dev) < accept_len[:, None], draft_tokens, -1)
    out = torch.cat([out, torch.full((n, 1), -1, dtype=torch.int64, device=dev)], 1)
    row = accept_len[:, None]
    token, token_a = top.gather(1, row), big_m.gather(1, row)  # the argmax's scaled logit is the max
    if not all_greedy:  # Gumbel-max at the stopping row: the correction (or the bonus at row K)
        stop_draft = torch.cat([draft_tokens, torch.full((n, 1), -1, dtype=torch.int64, device=dev)], 1).gather(1, row)
        stop_valid = torch.cat([valid, torch.zeros(n, 1, dtype=torch.bool, device=dev)], 1).gather(1, row)
        residual = None
        exclude = torch.where(stop_valid, stop_draft, -1)[..., None]
        if draft_probs is not None:  # max(w p' - q, 0) = w max(e / (S / w) - q, 0)
            residual = torch.stack([big_m.gather(1, row), big_s.gather(1, row) / w_stop[:, None]], -1)
            exclude = None
        at_row = {} if cut is None else dict(cut_value=cut[0].gather(1, row), cut_id=cut[1].gather(1, row))
        _, _, _, score, pid, plogit = ops.shard_row_stats(
            local_logits, vocab_start, rows=row, exclude=exclude, draft_probs=draft_probs, residual_stats=residual,
            sample=True, **at_row, **rng)
        g = _all_gather([score, pid] + ([plogit] if return_logprobs else []), group)
        pick, pick_a = merge_picks(g[:, 0], _ids(g[:, 1]), g[:, 2] if return_logprobs else g[:, 0])
        use = ~point_mass.gather(1, row) & (pick >= 0)
        token, token_a = torch.where(use, pick, token), torch.where(use, pick_a, token_a)
    out.scatter_(1, row, token)
    if not return_logprobs:
        return accept_len, out
    # log p' = a - max - log S (the kernels' Row::logprob): the drafts before the stop, then the token.
    a = torch.cat([a_x, torch.zeros(n, 1, device=dev)], 1).scatter(1, row, token_a)
    logprobs = torch.where(point_mass, 0.0, a - big_m - torch.log(big_s))
    logprobs = torch.where(torch.arange(k + 1, device=dev) <= row, logprobs, float("nan"))
    return accept_len, out, logprobs


def _sample_sharded(logits: torch.Tensor, vocab_start: int, group, temperature=0.0, seed=0, offset=0, top_k=None,
                    top_p=None, min_p=None, top_k_bound: Optional[int] = None, errors=None):
    """reference.sample_rows over a shard [N, D, V_local]: tokens = argmax(a' + G) (a = logits / T of
    the sequence's temperature, a' = a within the row's whole-vocabulary cut, G the noise of slot d
    of the sequence's stream), logprobs = log_softmax(a')[tokens]; greedy rows: the argmax and
    log_softmax(logits). One all-gather; with filters the cut's collectives and 1 more (the pick
    and the filtered sums, from one more shard_row_stats pass with the cut)."""
    n = logits.shape[0]
    dev = logits.device
    bound = _k_bound(top_k, top_k_bound)  # before top_k becomes a tensor
    inv_t, top_k, top_p, min_p = _row_params(n, dev, temperature, top_k, top_p, min_p, errors)
    all_greedy = not isinstance(temperature, torch.Tensor) and reference.inverse_temperature(temperature) == 0
    filtered = not all_greedy and any(x is not None for x in (top_k, top_p, min_p))
    rng = dict(temperature=temperature, seed=seed, offset=offset, errors=errors)
    traffic.read(logits)
    stats = ops.shard_row_stats(logits, vocab_start, sample=not (all_greedy or filtered), **rng)
    g = _all_gather(list(stats), group)
    big_m, big_s, top = merge_stats(g[:, 0], g[:, 1], _ids(g[:, 2]))
    point_mass = (inv_t == 0)[:, None] | ~torch.isfinite(big_m)
    if filtered:  # the picks and sums within the cut
        cut = _row_cuts(logits, inv_t, big_m, point_mass, vocab_start, group, (top_k, top_p, min_p),
                        top_k_bound=bound)
        stats = ops.shard_row_stats(logits, vocab_start, sample=True, cut_value=cut[0], cut_id=cut[1], **rng)
        g = _all_gather(list(stats), group)
        big_s = torch.where(point_mass, big_s, merge_stats(g[:, 0], g[:, 1], _ids(g[:, 2]))[1])
    tokens, pick_a = top, big_m
    if not all_greedy:
        pick, pick_logit = merge_picks(g[:, 3], _ids(g[:, 4]), g[:, 5])
        use = ~point_mass & (pick >= 0)
        tokens, pick_a = torch.where(use, pick, top), torch.where(use, pick_logit, big_m)
    logprobs = torch.where(torch.isfinite(big_m), pick_a - big_m - torch.log(big_s), float("nan"))
    return tokens, logprobs


def _embed(tokens: torch.Tensor, local_emb: torch.Tensor, vocab_start: int, group) -> torch.Tensor:
    """emb[tokens] [N, B, r] float32 from a vocabulary-parallel table: the owner's row, summed
    over ranks (exact: the others add zeros)."""
    v_local = local_emb.shape[0]
    local = tokens - vocab_start
    own = (local >= 0) & (local < v_local)
    rows = torch.zeros(*tokens.shape, local_emb.shape[1], device=local_emb.device)
    if v_local:
        rows = torch.where(own[..., None], local_emb.float()[local.clamp(0, v_local - 1)], rows)
    return _all_reduce(rows, group)


def local_refined_logits(ctx, prev_tokens, local_base_logits, local_weights: RefinerWeights, *, vocab_start: int,
                         group=None) -> torch.Tensor:
    """This rank's shard [N, D, V_local] (float32) of the refined logits s + w_read z (one
    all-reduce: the embedding rows of prev_tokens)."""
    n, b, r = ctx.shape
    d = reference._drafted_slots(ctx, local_base_logits)
    rows = _embed(prev_tokens, local_weights.emb, vocab_start, group).reshape(n * b, r)
    index = torch.arange(n * b, device=ctx.device).view(n, b)
    z = refiner_hidden(local_weights._replace(emb=rows), ctx, index)[:, b - d:]
    return local_base_logits.float() + z @ local_weights.w_read.float().T


def refine_step(ctx, prev_tokens, local_base_logits, local_weights: RefinerWeights, *, vocab_start: int, group=None,
                temperature=0.0, seed=0, offset=0, top_k=None, top_p=None, min_p=None,
                top_k_bound: Optional[int] = None, errors: Optional[torch.Tensor] = None):
    """xkernels.refine_step with the base logits' and the refiner's emb / w_read rows sharded by
    vocabulary; temperature, top_k, top_p, min_p, seed and offset as there (scalars or [N]; per
    request: slot d of sequence n at offset[n] + d), the filters over the whole vocabulary.
    Materializes the local shard of the refined logits. Returns (tokens, logprobs)."""
    logits = local_refined_logits(ctx, prev_tokens, local_base_logits, local_weights, vocab_start=vocab_start,
                                  group=group)
    return _sample_sharded(logits, vocab_start, group, temperature, seed, offset, top_k, top_p, min_p, top_k_bound,
                           errors)


def jacobi_refine(ctx, prefix_tokens, local_base_logits, local_weights: RefinerWeights, *, max_iters: int,
                  vocab_start: int, group=None, temperature=0.0, seed=0, offset=0, top_k=None, top_p=None, min_p=None,
                  top_k_bound: Optional[int] = None,
                  capturable: bool = False, errors: Optional[torch.Tensor] = None):
    """xkernels.jacobi_refine over vocabulary shards (the iteration of reference.jacobi_refine,
    each pass a sharded refine_step; the drafter's own sample filtered alike). Returns (tokens,
    logprobs, iters int32).

    By default the loop stops once no sequence changed in a pass, which reads a flag on the host
    after every pass. capturable=True never reads the host (CUDA-graph capturable): it runs
    min(max_iters, D + 1) passes, after which no sequence can still change (pass k fixes slot
    k - 1), with stopped sequences frozen, so the outputs are the same; the cost is the passes
    the early stop would have skipped."""
    if max_iters < 0:
        raise ValueError("max_iters must be >= 0")
    sampling = dict(temperature=temperature, seed=seed, offset=offset, top_k=top_k, top_p=top_p, min_p=min_p,
                    top_k_bound=top_k_bound, errors=errors)
    tokens, logprobs = _sample_sharded(local_base_logits, vocab_start, group, **sampling)
    # The stopping test reads tokens every rank holds alike: every rank runs the same collectives.
    passes = min(max_iters, local_base_logits.shape[1] + 1) if capturable else max_iters
    return reference.jacobi_iterate(
        tokens, logprobs, prefix_tokens, passes,
        lambda prev: refine_step(ctx, prev, local_base_logits, local_weights, vocab_start=vocab_start, group=group,
                                 **sampling), early_exit=not capturable)


def sequential_refine(ctx, prefix_tokens, local_base_logits, local_weights: RefinerWeights, *, vocab_start: int,
                      group=None, temperature=0.0, seed=0, offset=0, top_k=None, top_p=None, min_p=None,
                      top_k_bound: Optional[int] = None, errors: Optional[torch.Tensor] = None):
    """xkernels.sequential_refine over vocabulary shards: D sharded passes, slot d decided by
    pass d. Returns (tokens, logprobs)."""
    n, d = local_base_logits.shape[:2]
    dev = local_base_logits.device
    tokens = torch.zeros(n, d, dtype=torch.int64, device=dev)
    logprobs = torch.zeros(n, d, dtype=torch.float32, device=dev)
    for slot in range(d):
        step_tokens, step_logprobs = refine_step(ctx, reference._prev_tokens(prefix_tokens, tokens), local_base_logits,
                                                 local_weights, vocab_start=vocab_start, group=group,
                                                 temperature=temperature, seed=seed, offset=offset, top_k=top_k,
                                                 top_p=top_p, min_p=min_p, top_k_bound=top_k_bound, errors=errors)
        tokens[:, slot] = step_tokens[:, slot]
        logprobs[:, slot] = step_logprobs[:, slot]
    return tokens, logprobs


def dllm_step(local_logits: torch.Tensor, block_tokens: torch.Tensor, mask_id: int, *, vocab_start: int, group=None,
              num_unmask: int = 1, threshold: Optional[float] = None, temperature=0.0, seed=0, offset=0, top_k=None,
              top_p=None, min_p=None, top_k_bound: Optional[int] = None, errors: Optional[torch.Tensor] = None):
    """xkernels.dllm_step over a vocabulary shard [N, L, V_local] (one all-gather): x0 by the
    merged Gumbel-max, its confidence from the merged untempered statistics, then the unmasking
    rule, computed alike on every rank. temperature, top_k, top_p, min_p, seed and offset as for
    xkernels.dllm_step (scalars or [N]; per request: position l of sequence n at slot offset[n] +
    l); with filters, the cut of every position's row over the whole vocabulary (the mask token
    ranked as -inf; filter_cuts' collectives), then the pick within it (1 all-gather more).
    Returns (new_block, positions, tokens, confidence)."""
    if num_unmask < 1:
        raise ValueError("num_unmask must be >= 1")
    n, length = block_tokens.shape
    dev = local_logits.device
    bound = _k_bound(top_k, top_k_bound)  # before top_k becomes a tensor
    inv_t, top_k, top_p, min_p = _row_params(n, dev, temperature, top_k, top_p, min_p, errors)
    all_greedy = not isinstance(temperature, torch.Tensor) and reference.inverse_temperature(temperature) == 0
    filtered = not all_greedy and any(x is not None for x in (top_k, top_p, min_p))
    rng = dict(ignore_id=mask_id, raw_stats=True, temperature=temperature, seed=seed, offset=offset, errors=errors)
    traffic.read(local_logits)
    stats = ops.shard_row_stats(local_logits, vocab_start, sample=not (all_greedy or filtered), **rng)
    g = _all_gather(list(stats), group)
    big_m, big_s, top = merge_stats(g[:, 0], g[:, 1], _ids(g[:, 2]))
    # The tempered row has no softmax when the raw one has none or its max overflows at 1 / T; its
    # max is the raw max times 1 / T (rounding is monotone).
    tempered_max = big_m * inv_t[:, None]
    sampled = (inv_t > 0)[:, None] & torch.isfinite(tempered_max)
    picks = g[:, 3:]
    if filtered:
        cut = _row_cuts(local_logits, inv_t, tempered_max, ~sampled, vocab_start, group, (top_k, top_p, min_p),
                        ignore_id=mask_id, top_k_bound=bound)
        picks = _all_gather(list(ops.shard_row_stats(local_logits, vocab_start, sample=True, cut_value=cut[0],
                                                     cut_id=cut[1], **rng)[3:]), group)
    x0, raw_pick = top, big_m
    if not all_greedy:
        pick, pick_logit = merge_picks(picks[:, 0], _ids(picks[:, 1]), picks[:, 2])
        use_pick = sampled & (pick >= 0)
        x0, raw_pick = torch.where(use_pick, pick, top), torch.where(use_pick, pick_logit, big_m)
    masked = block_tokens == mask_id
    conf = torch.where(torch.isfinite(big_m), torch.exp(raw_pick - big_m) / big_s, float("nan"))
    conf = torch.where(masked, conf, float("-inf"))
    # Rank: higher confidence first, NaN after every number, unmasked last; ties to the lower
    # position (a stable sort).
    key = torch.where(masked, torch.where(conf.isnan(), -1.0, conf), -2.0)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(length, device=dev).expand(n, length))
    if threshold is None:
        chosen = masked & (rank < num_unmask)
    else:
        chosen = masked & ((conf > threshold) | (rank == 0))
    new_block = torch.where(chosen, x0, block_tokens)
    pos = torch.sort(torch.where(chosen, torch.arange(length, device=dev), length), dim=-1).values
    positions = torch.where(pos < length, pos, -1)
    tokens = torch.where(pos < length, x0.gather(1, pos.clamp(max=max(length - 1, 0))), -1)
    return new_block, positions, tokens, conf


def _siblings(par: torch.Tensor, tok: torch.Tensor, child: torch.Tensor):
    """The children of each node in node order, from par / tok [N, M] (child: the real nodes but
    the root): (first [N, M], each node's first child; next [N, M], each child's next sibling, M
    for none; repeated [N, M], whether an earlier sibling has the child's token)."""
    n, m = par.shape
    ids = torch.arange(m, device=par.device).expand(n, m)
    key = torch.where(child, par, m)  # the parent, the non-children last
    first = torch.full((n, m), m, device=par.device).scatter_reduce(1, par, torch.where(child, ids, m), "amin")
    # Stable sorts: by parent then node order, and by parent, token, node order.
    order = torch.sort(key, dim=1, stable=True).indices
    by_token = torch.sort(tok, dim=1, stable=True).indices
    by_token = by_token.gather(1, torch.sort(key.gather(1, by_token), dim=1, stable=True).indices)

    def after_same(order, *fields):  # entry i of order follows a child with the same fields
        same = key.gather(1, order[:, 1:]) < m
        for f in fields:
            same &= f.gather(1, order[:, 1:]) == f.gather(1, order[:, :-1])
        return same

    nxt = torch.full((n, m), m, device=par.device)
    nxt.scatter_(1, order[:, :-1], torch.where(after_same(order, key), order[:, 1:], m))
    repeated = torch.zeros(n, m, dtype=torch.bool, device=par.device)
    repeated.scatter_(1, by_token[:, 1:], after_same(by_token, key, tok))
    return first, nxt, repeated


def _merged_pick(score: torch.Tensor, pid: torch.Tensor, group) -> torch.Tensor:
    """The global Gumbel-max id (-1: none) from every rank's shard picks (one all-gather)."""
    g = _all_gather([score, pid], group)
    return merge_picks(g[:, 0], _ids(g[:, 1]), g[:, 0])[0]


def _residual_sums(local_logits, draft_probs, node, coef, row_max, inv_t, cut, vocab_start: int) -> torch.Tensor:
    """This shard's part of sum_v max(e_v - coef q_v, 0), e = exp(a - row_max) (0 past the row's cut
    when cut = (cut_value, cut_id) of node's shape is given), of the rows [n, node[n, ...]]: node
    [N] or [N, R], coef, row_max of its shape; returns its shape, float64 (e - coef q in double, as
    the unsharded kernels compute it). inv_t [N]."""
    seq = torch.arange(node.shape[0], device=node.device).view(-1, *[1] * (node.dim() - 1))
    # In place on the gathered copies (a quarter of the time of out-of-place ops on a CPU); a NaN
    # counts 0, as in the kernels.
    a = local_logits[seq, node].float().mul_(inv_t.view(seq.shape)[..., None])
    dropped = None
    if cut is not None:
        ids = torch.arange(vocab_start, vocab_start + a.shape[-1], device=a.device)
        dropped = ~_kept(a, ids, cut[0][..., None], cut[1][..., None])
    e = a.sub_(row_max[..., None]).exp_()
    if dropped is not None:
        e.masked_fill_(dropped, 0.0)
    d = draft_probs[seq, node].double().mul_(-coef[..., None]).add_(e)
    return d.clamp_(min=0).nansum(-1)


def _residual_walk(local_logits, draft_probs, vocab_start, group, without_replacement, inv_t, rng, cut, capturable,
                   tok, par, child, valid, a_c, q_c, zq_row, big_m, big_s, top, point_mass):
    """The walk of tree.h's sampled children (TreeResidual) over a shard: M - 1 steps, each
    testing at most one child of every sequence, each but the first after an all-reduce of the N
    residual sums that the previous step's rejections made stale (capturable=False, reading two
    flags on the host each step: only steps that need one, and the walk ends once no sequence has
    a child left to test); then the draw where the walk stops (one all-gather). Every row is its
    filtered p' (cut: each row's (cut_value, cut_id) [N, M], or None: no filter); point_mass [N, M]
    the rows walked by the argmax. Returns (accept_len, path, out_tokens)."""
    n, m = par.shape
    dev = par.device
    first, next_sibling, repeated = _siblings(par, tok, child)
    coins = stream_coins(rng["seed"], rng["offset"], n, m, dev)
    e_c = torch.exp(a_c - big_m.gather(1, par))  # each child's e under its parent's row
    argmax_child = valid & (tok == top.gather(1, par))  # the rule of a point-mass parent
    at = lambda t, i: t.gather(1, i[:, None])[:, 0]  # noqa: E731  t[n, i[n]]
    cut_at = lambda i: None if cut is None else (at(cut[0], i), at(cut[1], i))  # noqa: E731

    node = torch.zeros(n, dtype=torch.int64, device=dev)
    nxt = first[:, 0]
    coef = torch.zeros(n, dtype=torch.float64, device=dev)  # c, in double as in the kernels
    rsum, zq = big_s[:, 0], zq_row[:, 0]
    flags = lambda: torch.zeros(n, dtype=torch.bool, device=dev)  # noqa: E731
    stale, rejected, empty, done = flags(), flags(), flags(), flags()
    acc = torch.zeros(n, dtype=torch.int64, device=dev)
    path = torch.full((n, m), -1, dtype=torch.int64, device=dev)
    path[:, 0] = 0
    out = torch.full((n, m), -1, dtype=torch.int64, device=dev)
    for step in range(m - 1):
        has = nxt < m
        use = stale & has & ~done  # a fresh sum is needed only to test a next child
        if capturable:  # every step but the first sums, for every sequence: a fixed count
            need_sum = step > 0
        else:  # every rank reads the same flags: it stops, or skips a pass no sequence needs, alike
            finished, need_sum = torch.stack([(done | ~has).all(), use.any()]).tolist()
            if finished:
                break
        if need_sum:
            part = _residual_sums(local_logits, draft_probs, node, coef, at(big_m, node), inv_t, cut_at(node),
                                  vocab_start)
            fresh = _all_reduce(part, group).float()
            rsum = torch.where(use, fresh, rsum)
            empty |= use & ~(fresh > 0)
            stale &= ~use
        done |= ~has | empty
        c = nxt.clamp(max=m - 1)
        q_x = at(q_c, c)
        pm = at(point_mass, node)
        weight = (at(e_c, c).double() - coef * q_x.double()).clamp(min=0).float()
        sampled = at(valid, c) & ~at(repeated, c) & (at(coins, c) * q_x * rsum < weight * zq)
        accept = ~done & torch.where(pm, at(argmax_child, c), sampled)
        reject = ~done & ~accept
        resid = reject & ~pm
        coef = torch.where(resid & (zq > 0), coef + rsum.double() / zq.double(), coef)
        if without_replacement:
            zq = torch.where(resid & ~at(repeated, c), zq - q_x, zq)
        stale |= resid
        rejected |= resid
        nxt = torch.where(reject, at(next_sibling, c), nxt)
        # An acceptance moves to the child, a fresh residual: c = 0, the row's softmax sum.
        out.scatter_(1, acc[:, None], torch.where(accept, at(tok, c), at(out, acc))[:, None])
        acc += accept.long()
        path.scatter_(1, acc[:, None], torch.where(accept, c, at(path, acc))[:, None])
        node = torch.where(accept, c, node)
        nxt = torch.where(accept, at(first, c), nxt)
        coef = torch.where(accept, 0.0, coef)
        rsum, zq = torch.where(accept, at(big_s, c), rsum), torch.where(accept, at(zq_row, c), zq)
        stale &= ~accept
        rejected &= ~accept

    # Where it stops: no rejection -> the tempered (filtered) row's Gumbel-max; rejections -> the
    # residual's, max(e - c q, 0) = c max(e / c - q, 0): residual_stats (max, c) (c = 0 only when q
    # had no mass, where the residual is e itself: then 1); an empty residual or a point mass ->
    # argmax. The kernel's float32 weights cost a little precision (the module's docstring); a
    # torch draw in double would need the Philox noise of every id in torch, several hundred passes.
    rows = node[:, None]
    at_row = {} if cut is None else dict(cut_value=cut[0].gather(1, rows), cut_id=cut[1].gather(1, rows))
    _, _, _, score, pid, _ = ops.shard_row_stats(local_logits, vocab_start, rows=rows, sample=True, **at_row, **rng)
    c32 = torch.where(coef > 0, coef.clamp(max=torch.finfo(torch.float32).max), 1.0).float()
    stats = torch.stack([at(big_m, node), c32], -1)[:, None, :]
    _, _, _, r_score, r_pid, _ = ops.shard_row_stats(local_logits, vocab_start, rows=rows, draft_probs=draft_probs,
                                                     residual_stats=stats, sample=True, **at_row, **rng)
    pick = _merged_pick(torch.where(rejected[:, None], r_score, score), torch.where(rejected[:, None], r_pid, pid),
                        group)[:, 0]
    emit = torch.where(at(point_mass, node) | empty | (pick < 0), at(top, node), pick)
    out.scatter_(1, acc[:, None], emit[:, None])
    return acc, path, out


def tree_verify(tokens: torch.Tensor, parents: torch.Tensor, local_logits: torch.Tensor, *, vocab_start: int,
                group=None, draft_probs: Optional[torch.Tensor] = None, without_replacement: bool = False,
                temperature=0.0, seed=0, offset=0, num_nodes: Optional[torch.Tensor] = None, top_k=None,
                top_p=None, min_p=None, top_k_bound: Optional[int] = None, capturable: bool = False,
                errors: Optional[torch.Tensor] = None):
    """xkernels.tree_verify over a vocabulary shard [N, M, V_local] (draft_probs: the local
    shard [N, M, V_local] of q). temperature, top_k, top_p, min_p, seed and offset as for
    xkernels.tree_verify (scalars or [N] tensors: a temperature per sequence, rows at 0 greedy;
    [N] seeds or offsets are the per-request streams, node i of sequence n at slot offset[n] + i),
    the filters over the whole vocabulary (filter_cuts on every node row, then a second
    shard_row_stats pass for the filtered sums: 1 all-gather more). Returns (accept_len, path,
    out_tokens), the same on every rank.

    The walk needs each node's global statistics and its children's logits (1 all-gather, with
    draft_probs also the children's q values and the local sums of q's rows), then the sample
    where it stops (a second, unless every row is greedy); it runs as M - 1 vectorized steps on
    every rank. With draft_probs at T > 0, a test after a rejection needs the new residual's sum
    over the whole vocabulary: a step that needs one all-reduces the N local partial sums, and the
    walk stops once no sequence has a child left to test (flags read on the host each step);
    capturable=True reads nothing on the host and runs all M - 1 steps (M - 2 all-reduces,
    whatever the data), the same outputs at the cost of the passes the flags skip."""
    if draft_probs is not None and (draft_probs.shape != local_logits.shape or draft_probs.dtype != torch.float32):
        raise ValueError(f"draft_probs must be float32 of local_logits' shape {list(local_logits.shape)}, got "
                         f"{draft_probs.dtype} {list(draft_probs.shape)}")
    n, m = parents.shape
    v_local = local_logits.shape[-1]
    dev = local_logits.device
    bound = _k_bound(top_k, top_k_bound)  # before top_k becomes a tensor
    inv_t, top_k, top_p, min_p = _row_params(n, dev, temperature, top_k, top_p, min_p, errors)
    all_greedy = not isinstance(temperature, torch.Tensor) and reference.inverse_temperature(temperature) == 0
    filtered = not all_greedy and any(x is not None for x in (top_k, top_p, min_p))
    greedy = (inv_t == 0)[:, None]
    residual = draft_probs is not None and not all_greedy  # at T = 0 q plays no part
    node_ids = torch.arange(m, device=dev)
    count = torch.full((n,), m, device=dev) if num_nodes is None else num_nodes.to(dev)
    child = (node_ids >= 1) & (node_ids < count[:, None])  # the real nodes but the root
    par = torch.where(child, parents, 0)
    tok = torch.where(child, tokens, -1)

    # Each child's logit (and q) under its parent's row, from the shard that holds its token.
    local = tok - vocab_start
    own = child & (local >= 0) & (local < v_local)
    seq = torch.arange(n, device=dev)[:, None]

    def at_child(x):  # x[n, par, tok] [N, M] from the owner, 0 elsewhere
        if not v_local:
            return torch.zeros(n, m, device=dev)
        return torch.where(own, x[seq, par, local.clamp(0, v_local - 1)].float(), 0.0)

    a_c = at_child(local_logits)
    a_c = torch.where(greedy, a_c, a_c * inv_t[:, None])
    traffic.read(local_logits)
    rng = dict(temperature=temperature, seed=seed, offset=offset, errors=errors)
    row_max, row_sum, top, _, _, _ = ops.shard_row_stats(local_logits, vocab_start, **rng)  # checks seed, offset
    extra = [at_child(draft_probs), draft_probs.float().sum(-1)] if residual else []
    g = _all_gather([row_max, row_sum, top, a_c, own] + extra, group)
    big_m, big_s, top = merge_stats(g[:, 0], g[:, 1], _ids(g[:, 2]))
    held = g[:, 4] > 0
    a_c = torch.where(held, g[:, 3], 0.0).sum(0)
    valid = held.any(0)
    point_mass = greedy | ~torch.isfinite(big_m)
    cut = None
    if filtered:  # a child outside its parent's cut has p'(x) = 0
        cut = _row_cuts(local_logits, inv_t, big_m, point_mass, vocab_start, group, (top_k, top_p, min_p),
                        top_k_bound=bound)
        big_s = _filtered_sums(local_logits, vocab_start, group, cut, big_s, point_mass, rng)
        a_c = torch.where(_kept(a_c, tok, cut[0].gather(1, par), cut[1].gather(1, par)), a_c, float("-inf"))
    if residual:
        q_c = torch.where(held, g[:, 5], 0.0).sum(0)
        zq_row = g[:, 6].double().sum(0).float()  # q's row sums: the shards' sums, rounded once
        return _residual_walk(local_logits, draft_probs, vocab_start, group, without_replacement, inv_t, rng, cut,
                              capturable, tok, par, child, valid, a_c, q_c, zq_row, big_m, big_s, top, point_mass)

    # Acceptance of every child as if its earlier siblings were rejected (the walk only reads the
    # first accepted child of a node). Point mass: the token is the argmax. Otherwise u * remaining
    # < p'(x), remaining = 1 - the mass of the distinct tokens rejected before, in sibling order.
    accept = valid & (tok == top.gather(1, par))
    if not all_greedy:
        p_c = torch.exp(a_c - big_m.gather(1, par)) / big_s.gather(1, par)
        coins = stream_coins(seed, offset, n, m, dev)
        dup = _siblings(par, tok, child)[2]
        remaining = torch.ones(n, m, device=dev)
        sampled = torch.zeros(n, m, dtype=torch.bool, device=dev)
        for c in range(1, m):  # sibling order is node order: the float32 subtractions in the kernel's order
            p, rem = par[:, c : c + 1], remaining.gather(1, par[:, c : c + 1])
            fresh = child[:, c : c + 1] & ~dup[:, c : c + 1] & valid[:, c : c + 1]
            sampled[:, c : c + 1] = fresh & (coins[:, c : c + 1] * rem < p_c[:, c : c + 1])
            remaining.scatter_(1, p, torch.where(child[:, c : c + 1] & ~dup[:, c : c + 1], rem - p_c[:, c : c + 1],
                                                 rem))
        accept = torch.where(point_mass.gather(1, par), accept, sampled)
    accept &= child
    first = torch.full((n, m), m, device=dev).scatter_reduce(1, par, torch.where(accept, node_ids, m), "amin")

    # The walk: M - 1 steps, every sequence at once.
    node = torch.zeros(n, 1, dtype=torch.int64, device=dev)
    acc = torch.zeros(n, 1, dtype=torch.int64, device=dev)
    done = torch.zeros(n, 1, dtype=torch.bool, device=dev)
    path = torch.full((n, m), -1, dtype=torch.int64, device=dev)
    path[:, 0] = 0
    out = torch.full((n, m), -1, dtype=torch.int64, device=dev)
    for _ in range(m - 1):
        nxt = first.gather(1, node)
        go = ~done & (nxt < m)
        nxt = nxt.clamp(max=m - 1)
        out.scatter_(1, acc, torch.where(go, tok.gather(1, nxt), out.gather(1, acc)))
        acc += go.long()
        path.scatter_(1, acc, torch.where(go, nxt, path.gather(1, acc)))
        node = torch.where(go, nxt, node)
        done |= ~go
    emit = top.gather(1, node)
    if not all_greedy:  # sample at the last node from p' without its (rejected) children's tokens
        exclude = torch.where(child & (par == node), tok, -1)[:, None, :]
        at_row = {} if cut is None else dict(cut_value=cut[0].gather(1, node), cut_id=cut[1].gather(1, node))
        _, _, _, score, pid, _ = ops.shard_row_stats(local_logits, vocab_start, rows=node, exclude=exclude,
                                                     sample=True, **at_row, **rng)
        pick = _merged_pick(score, pid, group)
        emit = torch.where(point_mass.gather(1, node) | (pick < 0), emit, pick)
    out.scatter_(1, acc, emit)
    return acc[:, 0], path, out
