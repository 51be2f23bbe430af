"""dllm_step's CUDA kernels, run by the emulation, against the reference."""
import pytest
import torch

from xkernels import reference
from tests.test_dllm import MASK, near_tie_case, step_case
from tests.test_dllm_sampling import mixed_params, take


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("num_unmask,threshold", [(1, None), (3, None), (40, None), (1, 0.2)])
@pytest.mark.parametrize("v", [301, 1032])  # 1032: rows that take the vector loads
def test_matches_reference(emu, dtype, temperature, num_unmask, threshold, v):
    logits, block = step_case(4, 9, v, dtype, seed=num_unmask)
    block[1] = 2  # nothing masked
    logits[3, 2] = float("nan")
    got = emu.dllm_step(logits, block, MASK, num_unmask, threshold, temperature, 9, 4)
    want = reference.dllm_step(logits, block, MASK, num_unmask, threshold, temperature, 9, 4)
    for a, b in zip(got[:3], want[:3]):
        assert torch.equal(a, b)
    torch.testing.assert_close(got[3], want[3], atol=1e-5, rtol=1e-4, equal_nan=True)


@pytest.mark.parametrize("n,length,v", [(0, 4, 16), (2, 0, 16), (3, 4, 1), (2, 3, 8)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_edge_shapes(emu, n, length, v, temperature):
    logits, block = step_case(n, length, v, torch.bfloat16, seed=2, masked_share=1.0)
    got = emu.dllm_step(logits, block, MASK, 2, None, temperature, 1, 0)
    want = reference.dllm_step(logits, block, MASK, 2, None, temperature, 1, 0)
    for a, b in zip(got[:3], want[:3]):
        assert torch.equal(a, b)
    torch.testing.assert_close(got[3], want[3], atol=1e-5, rtol=1e-4, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("num_sms", [0, 1, 132])
def test_rows_split_over_slices(emu, dtype, temperature, num_sms):
    """Rows long enough for several slices each (masked_row_slices: 64 KB or more a slice, so 3 at
    bfloat16 and 5 at float32), the mask id inside one of them."""
    logits, block = step_case(2, 5, 65544, dtype, seed=3)
    logits[0, :, 3000] = 50.0  # the mask token's logit never counts
    logits[1, 2, [10, 60000]] = 40.0  # a tie across slices
    block[block == MASK] = 3000
    got = emu.dllm_step(logits, block, 3000, 2, None, temperature, 7, 1, num_sms=num_sms)
    want = reference.dllm_step(logits, block, 3000, 2, None, temperature, 7, 1)
    for a, b in zip(got[:3], want[:3]):
        assert torch.equal(a, b)
    torch.testing.assert_close(got[3], want[3], atol=1e-5, rtol=1e-4, equal_nan=True)


@pytest.mark.parametrize("level", [0.0, 2.0**20])
def test_draws_at_near_ties_match_the_reference(emu, level):
    """Rows split over slices whose threads start from the slice's argmax, late in it: ids below it
    that tie or nearly beat it must not be skipped by the sampler's test (sampling.h)."""
    for seed in range(4):
        logits, block = near_tie_case(2, 3, 32776, level, seed)  # 3 slices a row
        got = emu.dllm_step(logits, block, MASK, 3, None, 1.0, seed, 0, num_sms=132)
        want = reference.dllm_step(logits, block, MASK, 3, None, 1.0, seed, 0)
        assert torch.equal(got[2], want[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("v", [301, 65544])  # 65544: rows split over slices
@pytest.mark.parametrize("per_request", [True, False])
def test_per_sequence_parameters_and_streams(emu, dtype, v, per_request):
    """Every parameter kind mixed in one batch (greedy rows, top-k, top-p, min-p; the row cut pass,
    the mask token holding the largest logit so that a cut counting it would differ) against the
    reference; with per-request streams a sequence alone gets what it gets in the batch."""
    n = 8
    logits, block = step_case(n, 6, v, dtype, seed=4)
    logits[:, :, MASK] = 30.0
    params = mixed_params(n, 1, per_request)
    got = emu.dllm_step(logits, block, MASK, 2, None, num_sms=132, **params)
    want = reference.dllm_step(logits, block, MASK, 2, None, **params)
    for a, b in zip(got[:3], want[:3]):
        assert torch.equal(a, b)
    torch.testing.assert_close(got[3], want[3], atol=1e-5, rtol=1e-4, equal_nan=True)
    if per_request:
        for s in (2, 5):
            alone = emu.dllm_step(logits[s:s + 1], block[s:s + 1], MASK, 2, None, num_sms=132,
                                  **take(params, slice(s, s + 1)))
            for a, b in zip(alone, got):
                assert torch.equal(a[0], b[s])
    one_element = emu.dllm_step(logits, block, MASK, 2, None, temperature=0.7, seed=torch.tensor([9]),
                                offset=torch.tensor([4]))
    want = reference.dllm_step(logits, block, MASK, 2, None, 0.7, 9, 4)
    assert torch.equal(one_element[2], want[2])  # one-element tensors: the scalar form, read on the device


@pytest.mark.parametrize("filters,passes", [
    (dict(top_k=50), 2),
    (dict(top_p=0.9), 2),
    (dict(top_k=20, top_p=0.8), 2),
    (dict(top_k=3000, top_p=0.9), 3),  # > 2048 ids at or above top-k's bin: top-p ranks another bin
    (dict(min_p=0.05), 2),  # min-p alone: no gather, the draw's own pass
    (dict(top_k=50, min_p=0.5), 2),  # min-p moves the cut above top-k's bin: the gather draws above its floor
    (dict(top_p=0.9, min_p=0.5), 2),  # and above top-p's guided bin
    (dict(top_k=50, top_p=0.9, min_p=0.5), 2),  # and above the bin top-k's gather ranks for top-p
])
def test_a_filtered_row_is_read_twice(emu, filters, passes):
    """A masked row that samples with a filter is read twice in all (the raw statistics noting
    the cut's top key bits, then the cut's gather, which draws too), where the filters table of
    bench/floors.md says; the slices read the other masked rows (once at T = 0, three times at
    T = 0.7 and twice at T = 1: raw, tempered, draw) and no row that is not masked."""
    n, length, v = 5, 6, 3001
    logits, block = step_case(n, length, v, torch.float32, seed=9)
    logits = logits * 3
    temperature = torch.tensor([1.0, 0.8, 0.0, 0.7, 1.0])
    on = torch.tensor([1, 1, 0, 0, 0], dtype=torch.bool)  # greedy, and unfiltered sampled, rows besides
    params = dict(temperature=temperature, seed=torch.arange(n), offset=torch.zeros(n, dtype=torch.int64),
                  top_k=torch.where(on, filters.get("top_k", 0), 0).int(),
                  top_p=torch.where(on, filters.get("top_p", 1.0), 1.0),
                  min_p=torch.where(on, filters.get("min_p", 0.0), 0.0))
    params["top_k"][2] = 5  # a greedy row's filter does nothing
    emu.take_row_passes()
    got = emu.dllm_step(logits, block, MASK, 2, None, **params)
    counted = emu.take_row_passes()
    want = reference.dllm_step(logits, block, MASK, 2, None, **params)
    for a, b in zip(got[:3], want[:3]):
        assert torch.equal(a, b)
    torch.testing.assert_close(got[3], want[3], atol=1e-5, rtol=1e-4)
    masked = (block == MASK).sum(1)
    assert masked.min() > 0 and masked.sum() < n * length
    assert counted == passes * int(masked[:2].sum()) + int(masked[2]) + 3 * int(masked[3]) + 2 * int(masked[4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["flat", "huge", "ties"])
def test_filtered_picks_where_the_draw_spans_bins(emu, dtype, case):
    """Every masked position committed (num_unmask above L), so each filtered row's pick shows:
    flat rows (top-p's cut far below the top, many bins above it drawn in the gather), values near
    4,100 (top-p's guide underflows: a gather more, the same draw) and rows of few distinct values
    (the cut inside a run of ties, broken to the lower id), for each filter kind in one batch."""
    n, length, v = 6, 4, 5003
    logits, block = step_case(n, length, v, dtype, seed=11)
    if case == "flat":
        logits = logits * 0.3
    elif case == "huge":
        logits = logits + 4100.0
    else:
        logits = torch.round(logits).to(dtype)
    params = dict(temperature=torch.tensor([1.0, 0.6, 1.3, 1.0, 0.9, 1.0]),
                  top_k=torch.tensor([40, 0, 0, 300, 2500, 7], dtype=torch.int32),
                  top_p=torch.tensor([1.0, 0.95, 0.5, 0.9, 0.7, 1.0]),
                  min_p=torch.tensor([0.0, 0.0, 0.02, 0.0, 0.0, 0.3]),
                  seed=torch.arange(n) + 100, offset=torch.arange(n, dtype=torch.int64) * 7)
    for step in range(3):
        params["offset"] = params["offset"] + step
        got = emu.dllm_step(logits, block, MASK, 40, None, **params)
        want = reference.dllm_step(logits, block, MASK, 40, None, **params)
        for a, b in zip(got[:3], want[:3]):
            assert torch.equal(a, b)
        torch.testing.assert_close(got[3], want[3], atol=1e-5, rtol=1e-4)
