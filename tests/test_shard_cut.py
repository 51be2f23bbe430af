"""shard_cut_histogram and shard_cut_pick, a round of the radix select behind xkernels.distributed's
filters: against their references, round after round along a real key; exact sums (a bucket is the
sum of the next round's histogram within it, and a row's histogram is the sum of its shards'); the
picks at and around the targets; bad inputs. shard_cut_candidates, a shard's lowest keys for a
bounded top-k: against its reference, its weights bitwise the histogram's, the shards' candidates
holding the row's, bad inputs."""

import pytest
import torch

from xkernels import ops, reference
from xkernels.reference.shard_cut import CUT_SHIFTS, cut_keep_all_key, cut_rank_keys, cut_weight_values
from tests.utils import DEVICES, LOGIT_DTYPES


def cut_case(r, v, dtype=torch.float32, seed=0):
    """Rows with ties (rounded values), -inf and NaN ids, +-0, and a flat row."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(r, v, generator=g) * 3).round(decimals=1)
    if v > 5:
        logits[0, 1:5] = float("-inf")
        logits[min(1, r - 1), 2] = float("nan")
        logits[-1, :3] = torch.tensor([0.0, -0.0, 0.0])
    if r > 3:
        logits[3] = 0.5
    return logits.to(dtype)


def scaled(logits, scale, vocab_start, ignore_id):
    a = logits.float() * scale[:, None]
    if 0 <= ignore_id - vocab_start < a.shape[1]:
        a[:, ignore_id - vocab_start] = float("-inf")
    return a


def weight_values(hist):
    """Each bucket's weight, in units of 2^-62, as float64."""
    return hist[:, 0].double() * 2.0**31 + hist[:, 1].double()


def assert_histograms_match(got, want, mass):
    got = got.cpu()
    if not mass:  # counts are exact on every device
        assert torch.equal(got, want)
        return
    # the kernels' exp and torch's may differ by an ulp at an id
    torch.testing.assert_close(weight_values(got), weight_values(want), rtol=1e-6, atol=2.0**40)


def modes(a):
    rows = a.shape[0]
    return {"count": {}, "mass": dict(row_max=a.amax(-1).nan_to_num(nan=0.0)),
            "mass within a cut": dict(row_max=a.amax(-1).nan_to_num(nan=0.0), keep_value=torch.full((rows,), 0.3),
                                      keep_id=torch.arange(rows) * 7 + 20)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("vocab_start,v", [(0, 1), (5, 37), (40, 300), (1000, 1031)])
@pytest.mark.parametrize("mode", ["count", "mass", "mass within a cut"])
def test_matches_reference_round_after_round(device, dtype, vocab_start, v, mode):
    """Every round along the key of each row's 7th-ranked id (a real path: the candidates are never
    empty), a per-row scale and an ignored id."""
    logits = cut_case(5, v, dtype, seed=v)
    scale = torch.tensor([1.0, 0.5, 2.0, 1.3, 0.7])
    ignore = vocab_start + v // 2 if v > 1 else -1
    a = scaled(logits, scale, vocab_start, ignore)
    kw = modes(a)[mode]
    keys = cut_rank_keys(a, torch.arange(vocab_start, vocab_start + v)).sort(1).values
    path = keys[:, min(6, v - 1)]
    dev = lambda t: t.to(device)  # noqa: E731
    for shift in CUT_SHIFTS:
        prefix = path >> (shift + 8) if shift < 56 else torch.zeros_like(path)
        want = reference.shard_cut_histogram(logits, scale, prefix, shift, vocab_start, ignore_id=ignore, **kw)
        got = ops.shard_cut_histogram(dev(logits), dev(scale), dev(prefix), shift, vocab_start, ignore_id=ignore,
                                      **{k: dev(t) for k, t in kw.items()})
        assert_histograms_match(got, want, mode != "count")
        assert want[:, 0].sum() > 0 or mode == "mass within a cut"


@pytest.mark.parametrize("device", DEVICES)
def test_a_bucket_is_the_sum_of_the_next_round_within_it(device):
    """The sums are exact integers: the bucket a round picks holds exactly what the next round
    splits, in both parts, for masses too, so a select never loses its target between rounds."""
    logits = cut_case(4, 2000, torch.bfloat16, seed=3).to(device)
    scale = torch.tensor([1.0, 0.8, 1.7, 1.0], device=device)
    row_max = (logits.float() * scale[:, None]).amax(-1).nan_to_num(nan=0.0)
    prefix = torch.zeros(4, dtype=torch.int64, device=device)
    hist = ops.shard_cut_histogram(logits, scale, prefix, 56, 11, row_max=row_max)
    for shift in CUT_SHIFTS[1:]:
        bucket = (weight_values(hist) > 0).double().argmax(1)  # the first bucket with weight
        prefix = prefix * 256 + bucket
        nxt = ops.shard_cut_histogram(logits, scale, prefix, shift, 11, row_max=row_max)
        assert torch.equal(nxt.sum(2), hist.gather(2, bucket[:, None, None].expand(4, 2, 1))[..., 0]), shift
        hist = nxt


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["count", "mass", "mass within a cut"])
def test_shards_add_up_to_the_whole_row(device, mode):
    """Split anywhere (an empty shard, odd sizes), the shards' histograms sum exactly to the row's:
    the all-reduce of xkernels.distributed gives the same cut at any world size."""
    logits = cut_case(4, 1203, torch.bfloat16, seed=5).to(device)
    scale = torch.tensor([1.0, 0.6, 1.2, 2.0], device=device)
    a = scaled(logits, scale, 0, -1)
    kw = {k: t.to(device) for k, t in modes(a)[mode].items()}
    key = cut_rank_keys(a.cpu(), torch.arange(1203)).sort(1).values[:, 40].to(device)
    for shift in (56, 48, 16, 0):
        prefix = key >> (shift + 8) if shift < 56 else torch.zeros_like(key)
        whole = ops.shard_cut_histogram(logits, scale, prefix, shift, 0, **kw)
        for bounds in ([0, 600, 1203], [0, 0, 17, 1203], [0, 1, 2, 999, 1203]):
            parts = [ops.shard_cut_histogram(logits[:, lo:hi], scale, prefix, shift, lo, **kw)
                     for lo, hi in zip(bounds, bounds[1:])]
            assert torch.equal(sum(parts), whole), (shift, bounds)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device):
    for r, v in [(0, 8), (3, 0)]:
        z = torch.zeros(r, device=device)
        out = ops.shard_cut_histogram(torch.zeros(r, v, device=device), z, z.long(), 56, 4, row_max=z)
        assert out.shape == (r, 2, 256) and not out.any()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    logits = cut_case(3, 50).to(device)
    scale, prefix = torch.ones(3, device=device), torch.zeros(3, dtype=torch.int64, device=device)
    op = torch.ops.xkernels.shard_cut_histogram.default
    torch.library.opcheck(op, (logits, scale, prefix, 56, 5))
    torch.library.opcheck(op, (logits.bfloat16(), scale, prefix + 1, 48, 5, 7, torch.zeros(3, device=device),
                               torch.zeros(3, device=device), torch.tensor([9, 10, 11], device=device).int()))


def test_bad_inputs_name_the_argument():
    logits, scale, prefix = torch.zeros(2, 10), torch.ones(2), torch.zeros(2, dtype=torch.int64)
    call = ops.shard_cut_histogram
    cases = [
        (lambda: call(logits[0], scale, prefix, 56, 0), "logits must have shape"),
        (lambda: call(logits.double(), scale, prefix, 56, 0), "logits must be"),
        (lambda: call(logits, scale, prefix, 57, 0), "shift must be one of"),
        (lambda: call(logits, scale, prefix, 64, 0), "shift must be one of"),
        (lambda: call(logits, scale, prefix, 56, -1), "vocab_start must be >= 0"),
        (lambda: call(logits, scale, prefix, 56, 2**31 - 5), "vocab_start \\+ V_local"),
        (lambda: call(logits, scale[:1], prefix, 56, 0), "scale must have shape \\[R\\]"),
        (lambda: call(logits, scale.double(), prefix, 56, 0), "scale must be float32"),
        (lambda: call(logits, scale, prefix.int(), 56, 0), "prefix must be int64"),
        (lambda: call(logits, scale, prefix[:1], 56, 0), "prefix must have shape"),
        (lambda: call(logits, scale, prefix, 56, 0, row_max=torch.zeros(3)), "row_max must have shape"),
        (lambda: call(logits, scale, prefix, 56, 0, keep_value=scale), "keep_value and keep_id go together"),
        (lambda: call(logits, scale, prefix, 56, 0, keep_value=scale, keep_id=scale), "keep_id must be int64 or int32"),
        (lambda: call(logits, scale, prefix.to("meta"), 56, 0), "prefix must be on"),
    ]
    for fn, message in cases:
        with pytest.raises(RuntimeError, match=message):
            fn()


@pytest.mark.needs_cuda
@pytest.mark.parametrize("mode", ["count", "mass", "mass within a cut"])
def test_cpu_and_cuda_agree(mode):
    logits = cut_case(6, 20011, torch.bfloat16, seed=9)
    scale = torch.linspace(0.5, 1.5, 6)
    a = scaled(logits, scale, 1203, 1500)
    kw = modes(a)[mode]
    key = cut_rank_keys(a, torch.arange(1203, 1203 + 20011)).sort(1).values[:, 100]
    for shift in CUT_SHIFTS:
        prefix = key >> (shift + 8) if shift < 56 else torch.zeros_like(key)
        cpu = ops.shard_cut_histogram(logits, scale, prefix, shift, 1203, ignore_id=1500, **kw)
        cuda = ops.shard_cut_histogram(logits.cuda(), scale.cuda(), prefix.cuda(), shift, 1203, ignore_id=1500,
                                       **{k: t.cuda() for k, t in kw.items()})
        assert_histograms_match(cuda, cpu, mode != "count")


def pick_case(r, parts, seed=0):
    """Histograms of weights below 2^31 an id (counts, or masses in two parts), some buckets empty,
    weight before the prefix, and targets: 0, within, at a bucket's cumulative weight exactly, past
    the total."""
    g = torch.Generator().manual_seed(seed)
    if parts == 1:  # counts: hi parts of 2^31 an id
        hist = torch.randint(0, 50, (r, 1, 256), generator=g) * 2**31
    else:
        hist = torch.randint(0, 2**31, (r, 2, 256), generator=g) * torch.randint(0, 3, (r, 2, 256), generator=g)
    hist[:, :, 100:140] = 0
    before = torch.randint(0, 2**40, (r, 2), generator=g)
    cum = cut_weight_values(before[:, :parts, None] + hist.cumsum(2))
    target = cum[torch.arange(r), torch.randint(0, 256, (r,), generator=g)]  # exactly a cumulative weight
    target[0] = 0.0
    if r > 1:
        target[1] = cum[1, -1] * 2  # past the total: the last bucket
    if r > 2:
        target[2] = target[2] + 1.0  # just past one
    return hist, torch.randint(0, 2**40, (r,), generator=g), before, target


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("parts", [1, 2])
def test_pick_matches_reference(device, parts):
    hist, prefix, before, target = pick_case(40, parts, seed=parts)
    want = reference.shard_cut_pick(hist, prefix, before, target)
    got = ops.shard_cut_pick(hist.to(device), prefix.to(device), before.to(device), target.to(device))
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    bucket = want[0] - prefix * 256
    assert bucket[0] == 0 and bucket[1] == 255 and bool(((bucket >= 0) & (bucket < 256)).all())
    # The bucket reaches the target and the one before does not.
    cum = cut_weight_values(before[:, :parts, None] + hist.cumsum(2))
    at = cum.gather(1, bucket[:, None])[:, 0]
    assert bool(((at >= target) | (bucket == 255)).all())
    assert bool(((bucket == 0) | (cum.gather(1, (bucket - 1).clamp(min=0)[:, None])[:, 0] < target)).all())


def test_pick_of_any_values_wraps_as_torch_does():
    """Negative and huge weights (no select makes them; a caller may): the sums wrap like torch's
    int64 sums, the same bucket as the reference, nothing undefined."""
    g = torch.Generator().manual_seed(4)
    hist = torch.randint(-(2**62), 2**62, (8, 2, 256), generator=g)
    prefix = torch.randint(-(2**62), 2**62, (8,), generator=g)
    before = torch.randint(-(2**62), 2**62, (8, 2), generator=g)
    target = torch.tensor([0.0, -1e30, 1e30, float("nan"), float("inf"), float("-inf"), 5.0, 2.0**62],
                          dtype=torch.float64)
    want = reference.shard_cut_pick(hist, prefix, before, target)
    got = ops.shard_cut_pick(hist, prefix, before, target)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("device", DEVICES)
def test_pick_opcheck_and_empty(device):
    hist, prefix, before, target = (t.to(device) for t in pick_case(3, 2))
    op = torch.ops.xkernels.shard_cut_pick.default
    torch.library.opcheck(op, (hist, prefix, before, target))
    torch.library.opcheck(op, (hist[:, :1].contiguous(), prefix, before, target))
    out = ops.shard_cut_pick(hist[:0], prefix[:0], before[:0], target[:0])
    assert out[0].shape == (0,) and out[1].shape == (0, 2)


def test_pick_bad_inputs_name_the_argument():
    hist, prefix, before, target = pick_case(2, 2)
    call = ops.shard_cut_pick
    cases = [
        (lambda: call(hist.int(), prefix, before, target), "hist must be int64"),
        (lambda: call(hist[:, :, :255], prefix, before, target), "hist must have shape"),
        (lambda: call(torch.zeros(2, 3, 256, dtype=torch.long), prefix, before, target), "hist must have shape"),
        (lambda: call(hist, prefix[:1], before, target), "prefix must have shape"),
        (lambda: call(hist, prefix.float(), before, target), "prefix must be int64"),
        (lambda: call(hist, prefix, before[:, :1], target), "before must have shape"),
        (lambda: call(hist, prefix, before, target.float()), "target must be float64"),
        (lambda: call(hist, prefix, before, target[:1]), "target must have shape"),
        (lambda: call(hist, prefix, before.to("meta"), target), "before must be on"),
    ]
    for fn, message in cases:
        with pytest.raises(RuntimeError, match=message):
            fn()



def candidate_weights_match_the_histograms(logits, scale, vocab_start, ignore_id, keys, weights, row_max):
    """Each candidate's weight is bitwise the weight shard_cut_histogram gives its id on the same
    device (the last round isolates one key), so both paths of filter_cuts weigh an id alike."""
    for j in range(keys.shape[1]):
        key = keys[:, j]
        hist = ops.shard_cut_histogram(logits, scale, key >> 8, 0, vocab_start, ignore_id=ignore_id, row_max=row_max)
        at = hist.gather(2, (key & 255)[:, None, None].expand(-1, 2, 1))[..., 0]
        assert torch.equal(at, weights[:, j]), j


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("vocab_start,v,count", [(0, 1, 1), (5, 37, 0), (5, 37, 40), (40, 300, 7), (1000, 1031, 512),
                                                 (0, 5000, 50)])
def test_candidates_match_reference(device, dtype, vocab_start, v, count):
    """Ties (rounded values), -inf and NaN ids, +-0, a flat row, an ignored id; counts of 0, past
    the row, and within it."""
    logits = cut_case(5, v, dtype, seed=v + count)
    scale = torch.tensor([1.0, 0.5, 2.0, 1.3, 0.7])
    ignore = vocab_start + v // 3 if v > 1 else -1
    a = scaled(logits, scale, vocab_start, ignore)
    row_max = a.amax(-1).nan_to_num(nan=0.0)
    dev = lambda t: t.to(device)  # noqa: E731
    keys, weights = ops.shard_cut_candidates(dev(logits), dev(scale), count, vocab_start, ignore_id=ignore)
    want_keys, _ = reference.shard_cut_candidates(logits, scale, count, vocab_start, ignore_id=ignore)
    assert torch.equal(keys.cpu(), want_keys) and weights.shape == (5, 0, 2)
    keys, weights = ops.shard_cut_candidates(dev(logits), dev(scale), count, vocab_start, ignore_id=ignore,
                                             row_max=dev(row_max))
    want_keys, want_weights = reference.shard_cut_candidates(logits, scale, count, vocab_start, ignore_id=ignore,
                                                             row_max=row_max)
    assert torch.equal(keys.cpu(), want_keys)
    # the kernels' exp and torch's may differ by an ulp at an id
    torch.testing.assert_close(weight_values(weights.cpu().transpose(1, 2)),
                               weight_values(want_weights.transpose(1, 2)), rtol=1e-6, atol=2.0**40)
    finite = (a > float("-inf")).sum(1)
    assert torch.equal((keys.cpu() != cut_keep_all_key()).sum(1), finite.clamp(max=count))
    candidate_weights_match_the_histograms(dev(logits), dev(scale), vocab_start, ignore, keys[:, :9], weights[:, :9],
                                           dev(row_max))


@pytest.mark.parametrize("device", DEVICES)
def test_the_shards_candidates_hold_the_rows(device):
    """Split anywhere (an empty shard, odd sizes), the lowest count keys of the shards' candidates
    are the whole row's: a bounded top-k needs no rounds."""
    logits = cut_case(4, 1203, torch.bfloat16, seed=8).to(device)
    scale = torch.tensor([1.0, 0.6, 1.2, 2.0], device=device)
    for count in (1, 30, 700):
        whole = ops.shard_cut_candidates(logits, scale, count, 0)[0]
        for bounds in ([0, 600, 1203], [0, 0, 17, 1203], [0, 1, 2, 999, 1203]):
            parts = [ops.shard_cut_candidates(logits[:, lo:hi], scale, count, lo)[0] for lo, hi in zip(bounds, bounds[1:])]
            assert torch.equal(torch.cat(parts, 1).sort(1).values[:, :count], whole), (count, bounds)


@pytest.mark.parametrize("device", DEVICES)
def test_candidates_opcheck_and_empty(device):
    logits = cut_case(3, 50).to(device)
    scale = torch.ones(3, device=device)
    op = torch.ops.xkernels.shard_cut_candidates.default
    torch.library.opcheck(op, (logits, scale, 8, 5))
    torch.library.opcheck(op, (logits.bfloat16(), scale, 60, 5, 7, torch.zeros(3, device=device)))
    for r, v, count in [(0, 8, 4), (3, 0, 4), (3, 8, 0)]:
        z = torch.zeros(r, device=device)
        keys, weights = ops.shard_cut_candidates(torch.zeros(r, v, device=device), z, count, 4, row_max=z)
        assert keys.shape == (r, count) and weights.shape == (r, count, 2) and not weights.any()
        assert bool((keys == cut_keep_all_key()).all())


def test_candidates_bad_inputs_name_the_argument():
    logits, scale = torch.zeros(2, 10), torch.ones(2)
    call = ops.shard_cut_candidates
    cases = [
        (lambda: call(logits[0], scale, 4, 0), "logits must have shape"),
        (lambda: call(logits.double(), scale, 4, 0), "logits must be"),
        (lambda: call(logits, scale, -1, 0), "count must be in \\[0, 4096\\]"),
        (lambda: call(logits, scale, 4097, 0), "count must be in \\[0, 4096\\]"),
        (lambda: call(logits, scale, 4, -1), "vocab_start must be >= 0"),
        (lambda: call(logits, scale, 4, 2**31 - 5), "vocab_start \\+ V_local"),
        (lambda: call(logits, scale[:1], 4, 0), "scale must have shape \\[R\\]"),
        (lambda: call(logits, scale.double(), 4, 0), "scale must be float32"),
        (lambda: call(logits, scale, 4, 0, row_max=torch.zeros(3)), "row_max must have shape"),
        (lambda: call(logits, scale, 4, 0, row_max=scale.to("meta")), "row_max must be on"),
    ]
    for fn, message in cases:
        with pytest.raises(RuntimeError, match=message):
            fn()


@pytest.mark.needs_cuda
def test_candidates_cpu_and_cuda_agree():
    logits = cut_case(6, 20011, torch.bfloat16, seed=9)
    scale = torch.linspace(0.5, 1.5, 6)
    row_max = scaled(logits, scale, 1203, 1500).amax(-1).nan_to_num(nan=0.0)
    for count in (1, 50, 4096):
        cpu = ops.shard_cut_candidates(logits, scale, count, 1203, ignore_id=1500, row_max=row_max)
        cuda = ops.shard_cut_candidates(logits.cuda(), scale.cuda(), count, 1203, ignore_id=1500, row_max=row_max.cuda())
        assert torch.equal(cuda[0].cpu(), cpu[0])
        torch.testing.assert_close(weight_values(cuda[1].cpu().transpose(1, 2)), weight_values(cpu[1].transpose(1, 2)),
                                   rtol=1e-6, atol=2.0**40)
