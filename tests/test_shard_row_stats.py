"""shard_row_stats, the per-shard pass of vocabulary-parallel sampling: against its reference,
and merged over uneven shards against the unsharded sampling (reference.sample_rows)."""

import math

import pytest
import torch

from xkernels import distributed, ops, reference
from tests.utils import DEVICES, LOGIT_DTYPES, chi_squared_pvalue


def shard_case(n, r, v, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, r, v, generator=g) * 2).to(dtype)


def assert_outputs_match(got, want, sample):
    row_max, row_sum, top, score, pid, plogit = got
    torch.testing.assert_close(row_max.cpu(), want[0], equal_nan=True)
    torch.testing.assert_close(row_sum.cpu(), want[1], rtol=1e-5, atol=1e-6)
    assert torch.equal(top.cpu(), want[2])
    if sample:
        finite = torch.isfinite(want[0])  # a row without a softmax has no meaningful pick
        assert torch.equal(pid.cpu()[finite], want[4][finite])
        torch.testing.assert_close(score.cpu()[finite], want[3][finite], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(plogit.cpu()[finite], want[5][finite], equal_nan=True)
    else:
        assert (pid == -1).all() and torch.isneginf(score).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("vocab_start", [0, 5, 7, 40])
@pytest.mark.parametrize("temperature,sample,raw_stats", [(0.0, False, False), (1.0, False, False),
                                                          (0.7, True, False), (0.7, True, True)])
def test_matches_reference(device, dtype, vocab_start, temperature, sample, raw_stats):
    logits = shard_case(3, 4, 37, dtype, seed=vocab_start)
    logits[1, 2, 3] = float("nan")
    logits[2, 1] = float("-inf")
    rows = torch.tensor([[0, 3], [2, 2], [1, 0]])
    exclude = torch.tensor([[[vocab_start + 4, -1]], [[-1, -1]], [[vocab_start, vocab_start + 36]]]).expand(3, 2, 2)
    kw = dict(temperature=temperature, sample=sample, raw_stats=raw_stats, seed=11, offset=3,
              ignore_id=vocab_start + 9)
    for r, e in [(None, None), (rows, exclude.contiguous() if sample else None)]:
        got = ops.shard_row_stats(logits.to(device), vocab_start, rows=None if r is None else r.to(device),
                                  exclude=None if e is None else e.to(device), **kw)
        assert_outputs_match(got, reference.shard_row_stats(logits, vocab_start, rows=r, exclude=e, **kw), sample)


@pytest.mark.parametrize("device", DEVICES)
def test_residual_matches_reference(device):
    logits = shard_case(2, 3, 29, seed=4)
    q = torch.softmax(shard_case(2, 2, 29, seed=5), -1)
    rows = torch.tensor([[0, 1, 2], [1, 2, 0]])
    stats = torch.stack([logits.amax(-1) + 0.5, torch.full((2, 3), 40.0)], -1).gather(
        1, rows[..., None].expand(2, 3, 2))  # any global statistics that leave a residual
    kw = dict(rows=rows, draft_probs=q, residual_stats=stats.contiguous(), sample=True, temperature=0.9, seed=2,
              offset=7)
    got = ops.shard_row_stats(logits.to(device), 6, **{k: x.to(device) if torch.is_tensor(x) else x
                                                      for k, x in kw.items()})
    want = reference.shard_row_stats(logits, 6, **kw)
    assert_outputs_match(got, want, True)
    assert (want[4] >= 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_seeds_draw_like_int_seeds(device):
    """A 0-dim seed and offset (int64, high bits set) give the ints' outputs."""
    logits = shard_case(3, 4, 37, seed=6).to(device)
    kw = dict(sample=True, temperature=0.8)
    want = ops.shard_row_stats(logits, 9, seed=2**64 - 3, offset=2**63 + 5, **kw)
    got = ops.shard_row_stats(logits, 9, seed=torch.tensor(-3, device=device),
                              offset=torch.tensor(-(2**63) + 5, device=device), **kw)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    other = ops.shard_row_stats(logits, 9, seed=2**64 - 4, offset=2**63 + 5, **kw)
    assert not torch.equal(other[4], want[4])  # the seed's value is read


def inverse_temperatures(temps):
    return torch.tensor([reference.inverse_temperature(float(t)) for t in temps])


def per_row_case(n=4, r=3, v=41, dtype=torch.float32, seed=0):
    """Logits with per-sequence temperatures (one greedy), per-request seeds and offsets (one with
    the high bits set) and, for each row, a cut at a random id of its scaled ranking."""
    logits = shard_case(n, r, v, dtype, seed)
    temps = torch.tensor([0.7, 0.0, 1.3, 1.0][:n])
    g = torch.Generator().manual_seed(seed + 1)
    a = logits.float() * inverse_temperatures(temps)[:, None, None]
    order = torch.sort(-a, dim=-1, stable=True).indices
    at = order.gather(-1, torch.randint(0, v, (n, r, 1), generator=g))[..., 0]
    cut_value, cut_id = a.gather(-1, at[..., None])[..., 0], at
    seeds, offsets = torch.tensor([3, -1, 7, 2**40][:n]), torch.tensor([0, 9, 2**62, 5][:n])
    return logits, temps, seeds, offsets, cut_value, cut_id


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("vocab_start", [0, 6])
@pytest.mark.parametrize("raw_stats", [False, True])
def test_per_row_sampling_matches_reference(device, dtype, vocab_start, raw_stats):
    """Per-sequence temperatures (a greedy row among them), per-request streams and per-row cuts,
    global ids from vocab_start, selected rows with exclusions, against the reference."""
    logits, temps, seeds, offsets, cut_value, cut_id = per_row_case(dtype=dtype, seed=vocab_start)
    cut_id = cut_id + vocab_start
    rows = torch.tensor([[2, 0], [1, 1], [0, 2], [2, 1]])
    exclude = cut_id.gather(1, rows)[..., None]  # the cut's own id: the pick must skip it
    kw = dict(temperature=temps, seed=seeds, offset=offsets, sample=True, raw_stats=raw_stats, ignore_id=vocab_start + 5)
    for r, e in [(None, None), (rows, exclude)]:
        cv, ci = (cut_value, cut_id) if r is None else (cut_value.gather(1, r), cut_id.gather(1, r))
        want = reference.shard_row_stats(logits, vocab_start, rows=r, exclude=e, cut_value=cv, cut_id=ci, **kw)
        on = lambda t: None if t is None else t.to(device)  # noqa: E731
        got = ops.shard_row_stats(logits.to(device), vocab_start, rows=on(r), exclude=on(e), cut_value=on(cv),
                                  cut_id=on(ci), **{k: on(x) if torch.is_tensor(x) else x for k, x in kw.items()})
        assert_outputs_match(got, want, True)
        assert (got[4][1].cpu() == -1).all()  # the greedy sequence draws nothing


@pytest.mark.parametrize("device", DEVICES)
def test_per_row_residual_matches_reference(device):
    logits, temps, seeds, offsets, cut_value, cut_id = per_row_case(seed=3)
    q = torch.softmax(shard_case(4, 2, 41, seed=5), -1)
    stats = torch.stack([logits.amax(-1) + 0.5, torch.full((4, 3), 40.0)], -1)
    kw = dict(draft_probs=q, residual_stats=stats, sample=True, temperature=temps, seed=seeds, offset=offsets,
              cut_value=cut_value, cut_id=cut_id)
    want = reference.shard_row_stats(logits, 0, **kw)
    assert_outputs_match(ops.shard_row_stats(logits.to(device), 0, **{k: x.to(device) if torch.is_tensor(x) else x
                                                                     for k, x in kw.items()}), want, True)


def test_per_request_stream_does_not_depend_on_the_batch():
    """A sequence alone (its seed and offset as one-element [1] tensors) gets the outputs it gets at
    any row of the batch, and permuting the batch permutes them."""
    logits, temps, seeds, offsets, cut_value, cut_id = per_row_case(seed=4)
    kw = lambda idx: dict(temperature=temps[idx], seed=seeds[idx], offset=offsets[idx], sample=True,  # noqa: E731
                          cut_value=cut_value[idx], cut_id=cut_id[idx])
    batch = ops.shard_row_stats(logits, 3, **kw(slice(None)))
    for i in range(4):
        alone = ops.shard_row_stats(logits[i:i + 1], 3, **kw(slice(i, i + 1)))
        assert all(torch.equal(a, b[i:i + 1]) for a, b in zip(alone, batch))
    perm = torch.tensor([2, 0, 3, 1])
    permuted = ops.shard_row_stats(logits[perm], 3, **kw(perm))
    assert all(torch.equal(a, b[perm]) for a, b in zip(permuted, batch))


def _filter_cut(a, top_k, top_p, min_p):
    """The cut of reference.sampling.filter_mask's kept prefix of one row: its last id."""
    from xkernels.reference.sampling import filter_mask

    kept = filter_mask(a, top_k, top_p, min_p)
    value = a[kept].min()
    return value, int(torch.nonzero(kept & (a == value)).max())


@pytest.mark.parametrize("world", [2, 3])
def test_merged_cut_shards_draw_the_unsharded_per_request_token(world):
    """Over uneven shards with each row's whole-vocabulary cut, the merged pick of row 0 is the token
    chain_verify_ragged emits for a request with no drafts, with the same per-request seed and offset,
    per-request temperatures (one greedy) and filters."""
    n, v = 4, 61
    logits = shard_case(n, 1, v, seed=world)[:, 0]
    temps = torch.tensor([0.8, 0.0, 1.5, 1.0])
    top_k, top_p, min_p = torch.tensor([5, 0, 0, 12]), torch.tensor([1.0, 0.9, 0.7, 0.8]), torch.tensor(
        [0.0, 0.0, 0.05, 0.01])
    seeds, offsets = torch.tensor([5, 5, -3, 11]), torch.tensor([0, 17, 3, 2**50])
    inv = inverse_temperatures(temps)
    cuts = [_filter_cut(logits[i] * inv[i], int(top_k[i]), float(top_p[i]), float(min_p[i])) if inv[i] else (0.0, 0)
            for i in range(n)]
    cut_value = torch.tensor([[float(c[0])] for c in cuts])
    cut_id = torch.tensor([[c[1]] for c in cuts])
    shards = [ops.shard_row_stats(logits[:, None, a:b].contiguous(), a, sample=True, temperature=temps, seed=seeds,
                                  offset=offsets, cut_value=cut_value, cut_id=cut_id) for a, b in split(v, world)]
    stacked = [torch.stack([s[i] for s in shards]) for i in range(6)]
    _, big_s, top = distributed.merge_stats(*stacked[:3])
    from xkernels.reference.sampling import filtered_logits

    for i in range(n):  # the merged sums are the filtered distribution's
        if inv[i]:
            a = filtered_logits(logits[i] * inv[i], int(top_k[i]), float(top_p[i]), float(min_p[i]))
            torch.testing.assert_close(big_s[i, 0], torch.exp(a - a.max()).sum(), rtol=1e-5, atol=0)
    pick, _ = distributed.merge_picks(*stacked[3:])
    tokens = torch.where(inv[:, None] == 0, top, pick)[:, 0]
    out, emitted, _ = ops.chain_verify_ragged(
        torch.zeros(0, dtype=torch.int64), torch.zeros(n, dtype=torch.int64), logits, max_spec_len=0,
        temperature=temps, top_k=top_k, top_p=top_p, min_p=min_p, seed=seeds, offset=offsets)
    assert (emitted == 1).all()
    assert torch.equal(tokens, out[:, 0].long())


def test_merged_cut_picks_follow_the_filtered_distribution():
    """Chi-squared: 6000 requests of one row (per-request offsets 0, 1, ...), cut by top-k and top-p
    over the whole vocabulary, drawn over 2 uneven shards with the cut's ties at the boundary: the
    merged picks follow reference.filtered_probs (p-value > 1e-3), and no dropped id is drawn."""
    from xkernels.reference.sampling import filtered_probs

    m, v = 6000, 13
    row = torch.tensor([2.0, 1.0, 1.5, 1.5, 0.2, 1.0, -1.0, 0.7, 1.5, 0.0, 0.3, 1.2, -0.5])
    want = filtered_probs(row, 0.9, top_k=6, top_p=0.85)
    value, last = _filter_cut(row / 0.9, 6, 0.85, 0.0)
    logits = row.expand(m, 1, v).contiguous()
    kw = dict(sample=True, temperature=torch.full((m,), 0.9), seed=torch.full((m,), 7), offset=torch.arange(m),
              cut_value=torch.full((m, 1), float(value)), cut_id=torch.full((m, 1), last))
    shards = [ops.shard_row_stats(logits[..., a:b].contiguous(), a, **kw) for a, b in [(0, 3), (3, v)]]
    pick, _ = distributed.merge_picks(*[torch.stack([s[i] for s in shards]) for i in (3, 4, 5)])
    counts = torch.bincount(pick[:, 0], minlength=v).double()
    assert counts[want == 0].sum() == 0
    assert chi_squared_pvalue(counts, want) > 1e-3


def split(v, world):
    """Uneven shard boundaries of [0, v): the first shard short and not a multiple of 4."""
    cuts = [0] + [min(v, 4 * i * v // (4 * world) + (3 if i == 1 else 1)) for i in range(1, world)] + [v]
    return list(zip(cuts[:-1], cuts[1:]))


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_merged_shards_sample_like_the_unsharded_rows(world, temperature):
    logits = shard_case(4, 3, 61, seed=world)
    logits[0, 0, 17] = float("nan")
    logits[1, 1] = float("-inf")
    logits[2, 2, :] = 1.5  # every id ties: the lowest id wins at T = 0
    bounds = split(61, world)
    assert len(bounds) == world and all(b > a for a, b in bounds)
    shards = [ops.shard_row_stats(logits[..., a:b].contiguous(), a, sample=temperature > 0, temperature=temperature,
                                  seed=5, offset=2) for a, b in bounds]
    stacked = [torch.stack([s[i] for s in shards]) for i in range(6)]
    big_m, big_s, top = distributed.merge_stats(*stacked[:3])
    want_tokens, want_logprobs = reference.sample_rows(logits, temperature, 5, 2)
    degenerate = ~torch.isfinite(big_m)
    if temperature:
        pick, pick_a = distributed.merge_picks(*stacked[3:])
        tokens = torch.where(degenerate, top, pick)
    else:
        tokens, pick_a = top, big_m
    logprobs = torch.where(degenerate, math.nan, pick_a - big_m - torch.log(big_s))
    assert torch.equal(tokens[~degenerate], want_tokens[~degenerate])
    assert torch.equal(top, (logits * (1 / temperature if temperature else 1)).argmax(-1))
    torch.testing.assert_close(logprobs[~degenerate], want_logprobs[~degenerate], atol=1e-5, rtol=1e-5)
    assert degenerate[0, 0] and degenerate[1, 1] and top[0, 0] == 17 and top[1, 1] == 0 and top[2, 2] == 0


def test_empty_inputs():
    for shape in [(0, 3, 8), (2, 0, 8), (2, 3, 0)]:
        out = ops.shard_row_stats(torch.zeros(shape), 4, sample=True, temperature=1.0)
        assert all(t.shape == shape[:2] for t in out)
    out = ops.shard_row_stats(torch.zeros(2, 3, 0), 4)
    assert (out[2] == -1).all() and torch.isneginf(out[0]).all() and (out[1] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    logits = shard_case(2, 3, 10).to(device)
    rows = torch.tensor([[2], [0]], device=device)
    q = torch.softmax(shard_case(2, 2, 10, seed=1), -1).to(device)
    stats = torch.tensor([[[3.0, 20.0]], [[3.0, 20.0]]], device=device)
    op = torch.ops.xkernels.shard_row_stats.default
    torch.library.opcheck(op, (logits, 5, None, None, None, None, -1, False, False, 0.0, 0, 0, None, None))
    torch.library.opcheck(op, (logits, 5, rows, rows[..., None], q, stats, 7, True, True, 0.5, 3, 1, None, None))
    seed, offset = torch.tensor(3, device=device), torch.tensor([1], device=device)
    torch.library.opcheck(op, (logits, 5, None, None, None, None, -1, True, False, 0.5, 0, 0, seed, offset))
    temps, seeds = torch.tensor([0.5, 0.0], device=device), torch.tensor([3, 4], device=device)
    cut_value, cut_id = torch.zeros(2, 1, device=device), torch.tensor([[7], [9]], device=device)
    torch.library.opcheck(op, (logits, 5, rows, None, None, None, -1, True, False, 0.0, 0, 0, seeds, seeds, temps,
                               cut_value, cut_id))


def test_bad_inputs_name_the_argument():
    logits = shard_case(2, 3, 10)
    rows = torch.tensor([[0], [1]])
    q = torch.zeros(2, 3, 10)
    stats = torch.zeros(2, 1, 2)
    cases = [
        (lambda: ops.shard_row_stats(logits[0], 0), "logits must have shape"),
        (lambda: ops.shard_row_stats(logits.double(), 0), "logits must be"),
        (lambda: ops.shard_row_stats(logits, -1), "vocab_start must be >= 0"),
        (lambda: ops.shard_row_stats(logits, 2**31 - 5), "vocab_start \\+ V_local"),
        (lambda: ops.shard_row_stats(logits, 0, sample=True), "needs temperature > 0"),
        (lambda: ops.shard_row_stats(logits, 0, rows=rows.int()), "rows must be int64"),
        (lambda: ops.shard_row_stats(logits, 0, rows=rows[0]), "rows must have shape"),
        (lambda: ops.shard_row_stats(logits, 0, rows=rows + 2), "rows holds row indices outside"),
        (lambda: ops.shard_row_stats(logits, 0, rows=rows, exclude=rows), "exclude must have shape"),
        (lambda: ops.shard_row_stats(logits, 0, rows=rows, draft_probs=q, sample=True, temperature=1.0),
         "draft_probs and residual_stats go together"),
        (lambda: ops.shard_row_stats(logits, 0, rows=rows, draft_probs=q[..., :4], residual_stats=stats, sample=True,
                                     temperature=1.0), "draft_probs must have shape"),
        (lambda: ops.shard_row_stats(logits, 0, rows=rows, draft_probs=q, residual_stats=stats[:, :, :1], sample=True,
                                     temperature=1.0), "residual_stats must have shape"),
        (lambda: ops.shard_row_stats(logits, 0, seed=torch.tensor(1, dtype=torch.int32)),
         "seed must be an int64 tensor"),
        (lambda: ops.shard_row_stats(logits, 0, offset=torch.tensor([1, 2, 3])), "offset must be an int, a one-element"),
        (lambda: ops.shard_row_stats(logits, 0, temperature=torch.ones(3)), "temperature must have shape \\[N\\]"),
        (lambda: ops.shard_row_stats(logits, 0, temperature=torch.ones(2).double()), "temperature must be a Float"),
        (lambda: ops.shard_row_stats(logits, 0, temperature=torch.tensor([1.0, -1.0])), "temperature must be finite"),
        (lambda: ops.shard_row_stats(logits, 0, cut_value=torch.zeros(2, 3)), "cut_value and cut_id go together"),
        (lambda: ops.shard_row_stats(logits, 0, cut_value=torch.zeros(2, 2), cut_id=torch.zeros(2, 3).long()),
         "cut_value must have shape"),
        (lambda: ops.shard_row_stats(logits, 0, cut_value=torch.zeros(2, 3), cut_id=torch.zeros(2, 3)),
         "cut_id must be int64 or int32"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()


@pytest.mark.needs_cuda
def test_seed_on_another_device_is_rejected():
    with pytest.raises(RuntimeError, match="seed must be on"):
        ops.shard_row_stats(shard_case(2, 3, 10).cuda(), 0, sample=True, temperature=1.0, seed=torch.tensor(1))


@pytest.mark.needs_cuda
@pytest.mark.parametrize("sample", [False, True])
def test_cpu_and_cuda_agree(sample):
    logits = shard_case(3, 5, 1001, torch.bfloat16, seed=9)
    kw = dict(sample=sample, temperature=0.6 if sample else 0.0, seed=4, offset=8, ignore_id=1500)
    cpu = ops.shard_row_stats(logits, 1203, **kw)
    cuda = ops.shard_row_stats(logits.cuda(), 1203, **kw)
    assert_outputs_match(cuda, cpu, sample)
