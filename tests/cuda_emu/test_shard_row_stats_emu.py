"""shard_row_stats's CUDA kernel, run by the emulation, against the reference: unaligned shard
starts, shards narrower than a Philox group and wider than a block, selected and out-of-range rows,
exclusions, the ignored id, residual rows, degenerate rows, an empty shard."""
import pytest
import torch

from xkernels import reference
from tests.test_shard_row_stats import assert_outputs_match, per_row_case, shard_case


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab_start,v", [(0, 1), (6, 3), (13, 300), (1024, 1031), (8, 1032)])  # 1032: 16-byte loads
@pytest.mark.parametrize("temperature,sample,raw_stats", [(0.0, False, False), (0.8, True, False),
                                                          (0.8, True, True)])
def test_matches_reference(emu, dtype, vocab_start, v, temperature, sample, raw_stats):
    logits = shard_case(3, 4, v, dtype, seed=v)
    logits[1, 2, v // 2] = float("nan")
    logits[2, 1] = float("-inf")
    rows = torch.tensor([[0, 3], [2, 1], [1, 0]])
    exclude = torch.tensor([[[vocab_start, -1]], [[-1, -1]], [[vocab_start + v - 1, vocab_start + 1]]]).expand(3, 2, 2)
    kw = dict(temperature=temperature, sample=sample, raw_stats=raw_stats, seed=11, offset=3,
              ignore_id=vocab_start + v // 3)
    for r, e in [(None, None), (rows, exclude.contiguous() if sample else None)]:
        got = emu.shard_row_stats(logits, vocab_start, rows=r, exclude=e, **kw)
        assert_outputs_match(got, reference.shard_row_stats(logits, vocab_start, rows=r, exclude=e, **kw), sample)


def test_residual_rows(emu):
    logits = shard_case(2, 3, 301, seed=4)
    q = torch.softmax(shard_case(2, 2, 301, seed=5), -1)
    rows = torch.tensor([[0, 1, 2], [1, 2, 0]])
    stats = torch.stack([logits.amax(-1) + 0.5, torch.full((2, 3), 400.0)], -1).gather(
        1, rows[..., None].expand(2, 3, 2)).contiguous()
    kw = dict(rows=rows, draft_probs=q, residual_stats=stats, sample=True, temperature=0.9, seed=2, offset=7)
    assert_outputs_match(emu.shard_row_stats(logits, 6, **kw), reference.shard_row_stats(logits, 6, **kw), True)


def test_bad_rows_and_empty_shards_write_empty_results(emu):
    logits = shard_case(2, 3, 20)
    out = emu.shard_row_stats(logits, 4, rows=torch.tensor([[-1, 3], [2, 99]]), sample=True, temperature=1.0)
    assert torch.equal(out[2], torch.tensor([[-1, -1], [out[2][1, 0].item(), -1]])) and out[2][1, 0] >= 4
    out = emu.shard_row_stats(torch.zeros(2, 3, 0), 8, sample=True, temperature=1.0)
    assert (out[2] == -1).all() and (out[4] == -1).all() and torch.isneginf(out[0]).all()


def test_seed_and_offset_read_from_device_memory(emu):
    """The binding hands seed tensors to the kernel as pointers (no host read): the same picks as the
    integers, including a seed with the high bit set (int64 -1 is the uint64 2**64 - 1)."""
    logits = shard_case(2, 3, 301, seed=8)
    kw = dict(sample=True, temperature=0.7)
    for seed, offset in [(5, 9), (-1, 2**40 + 3)]:
        want = reference.shard_row_stats(logits, 12, seed=seed % 2**64, offset=offset, **kw)
        got = emu.shard_row_stats(logits, 12, seed=0, offset=0, seed_tensor=torch.tensor(seed),
                                  offset_tensor=torch.tensor(offset), **kw)
        assert_outputs_match(got, want, True)
    other = emu.shard_row_stats(logits, 12, seed_tensor=torch.tensor(6), offset_tensor=torch.tensor(9), **kw)
    assert not torch.equal(other[4], emu.shard_row_stats(logits, 12, seed=5, offset=9, **kw)[4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab_start,v", [(0, 41), (6, 41), (8, 1032)])  # 1032: 16-byte loads on both passes
@pytest.mark.parametrize("raw_stats", [False, True])
def test_per_row_sampling_matches_reference(emu, dtype, vocab_start, v, raw_stats):
    """Per-sequence temperatures (one greedy), per-request streams read from device memory, per-row
    cuts, selected rows with exclusions and residual rows: the kernel's SamplingView and cut."""
    logits, temps, seeds, offsets, cut_value, cut_id = per_row_case(v=v, dtype=dtype, seed=vocab_start)
    cut_id = cut_id + vocab_start
    rows = torch.tensor([[2, 0], [1, 1], [0, 2], [2, 1]])
    q = torch.softmax(shard_case(4, 1, v, seed=5), -1)
    stats = torch.stack([logits.float().amax(-1) + 0.5, torch.full((4, 3), 40.0)], -1).gather(
        1, rows[..., None].expand(4, 2, 2)).contiguous()
    kw = dict(temperature=temps, seed=seeds, offset=offsets, sample=True, raw_stats=raw_stats,
              ignore_id=vocab_start + 5)
    for r, e, dq in [(None, None, None), (rows, cut_id.gather(1, rows)[..., None], None), (rows, None, q)]:
        cv, ci = (cut_value, cut_id) if r is None else (cut_value.gather(1, r), cut_id.gather(1, r))
        extra = {} if dq is None else dict(draft_probs=dq, residual_stats=stats)
        want = reference.shard_row_stats(logits, vocab_start, rows=r, exclude=e, cut_value=cv, cut_id=ci, **kw,
                                         **extra)
        got = emu.shard_row_stats(logits, vocab_start, rows=r, exclude=e, draft_probs=extra.get("draft_probs"),
                                  residual_stats=extra.get("residual_stats"), ignore_id=kw["ignore_id"], sample=True,
                                  raw_stats=raw_stats, temperature_tensor=temps, seed_tensor=seeds,
                                  offset_tensor=offsets, cut_value=cv, cut_id=ci)
        assert_outputs_match(got, want, True)
        assert (got[4][1] == -1).all()  # the greedy sequence draws nothing
