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


def test_the_cut_pass_reads_only_masked_rows(emu):
    """launch_row_cut before the slices reads a masked, filtered row twice (its top, which counts
    top-k's first level or guides top-p's; then the selection's gather) and the other rows not at
    all (the emulation's count of row passes; the slices kernel's own reads are not counted)."""
    n, length, v = 4, 6, 3001
    logits, block = step_case(n, length, v, torch.float32, seed=9)
    logits = logits * 3
    params = dict(temperature=torch.tensor([1.0, 0.8, 0.0, 1.0]), top_k=torch.tensor([50, 0, 5, 20]),
                  top_p=torch.tensor([1.0, 0.9, 1.0, 0.8]), min_p=torch.zeros(4), seed=torch.arange(4),
                  offset=torch.zeros(4, dtype=torch.int64))
    emu.take_row_passes()
    got = emu.dllm_step(logits, block, MASK, 2, None, **params)
    passes = emu.take_row_passes()
    want = reference.dllm_step(logits, block, MASK, 2, None, **params)
    for a, b in zip(got[:3], want[:3]):
        assert torch.equal(a, b)
    masked = (block == MASK).sum(1)
    assert 0 < masked.sum() < n * length
    assert passes == 2 * int(masked[[0, 1, 3]].sum())  # sequence 2 is greedy: no cut
