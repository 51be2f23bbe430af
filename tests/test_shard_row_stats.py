"""shard_row_stats, the per-shard pass of vocabulary-parallel sampling: against its reference,
and merged over uneven shards against the unsharded sampling (reference.sample_rows)."""

import math

import pytest
import torch

from xkernels import distributed, ops, reference
from tests.utils import DEVICES, LOGIT_DTYPES


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
    """A 0-dim seed and a one-element offset (int64, high bits set) give the ints' outputs."""
    logits = shard_case(3, 4, 37, seed=6).to(device)
    kw = dict(sample=True, temperature=0.8)
    want = ops.shard_row_stats(logits, 9, seed=2**64 - 3, offset=2**63 + 5, **kw)
    got = ops.shard_row_stats(logits, 9, seed=torch.tensor(-3, device=device),
                              offset=torch.tensor([-(2**63) + 5], device=device), **kw)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    other = ops.shard_row_stats(logits, 9, seed=2**64 - 4, offset=2**63 + 5, **kw)
    assert not torch.equal(other[4], want[4])  # the seed's value is read


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
        (lambda: ops.shard_row_stats(logits, 0, offset=torch.tensor([1, 2])), "offset must hold exactly one element"),
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
