"""candidates.cuh's scan_slice at the edges of its rounds of loads (kScanDepth = 4 chunks of 16 bytes a
thread, 256 threads: 4096 ids a round in float32, 8192 in 16-bit types), where each slot's load of the
next round is issued as the slot is consumed: rows that end exactly at a round, a chunk past or short of
one, in a partial chunk, or start unaligned, and the row's top tied across a round's edge."""
import pytest
import torch

from tests.test_dllm import MASK
from xkernels import reference
from xkernels.reference import chain as ref_chain

ROUND_IDS = {torch.float32: 4096, torch.bfloat16: 8192, torch.float16: 8192}

# dllm_step scans a whole row as one slice, so a row of V ids takes V / ROUND_IDS rounds.
DLLM_SHAPES = [
    (torch.float32, 4096),  # one round exactly
    (torch.float32, 8192),  # two rounds exactly: no load past the second
    (torch.float32, 8196),  # one chunk into a third round
    (torch.float32, 12284),  # a chunk short of three rounds
    (torch.float32, 8190),  # not a multiple of 4: rows start unaligned (scalar loop) or take the radix path
    (torch.bfloat16, 16384),
    (torch.bfloat16, 16392),
    (torch.bfloat16, 16376),
    (torch.float16, 24576),
]


@pytest.mark.parametrize("dtype,v", DLLM_SHAPES)
def test_dllm_rounds_match_the_radix_path(emu, dtype, v):
    """dllm_step's candidate pipeline against dllm_filtered_kernel alone (radix_only), bitwise: tokens
    and confidences (scan_slice's on_read hook sums the raw statistics the confidence takes, in the
    order of each thread's chunks); every row the scan can read in order is settled by it, and is
    read once. Per sequence: top-k with top-p, top-p alone (the kWithTotal scan), min-p alone; the
    mask token, inside the second round where there is one, holds the largest logit."""
    g = torch.Generator().manual_seed(v)
    n, length = 3, 2
    logits = torch.randn(n, length, v, generator=g) * torch.tensor([3.0, 9.0, 3.0])[:, None, None]
    edge = ROUND_IDS[dtype]
    mask = edge + 5 if v > edge + 5 else MASK
    logits[:, :, mask] = 60.0
    if v > edge:
        logits[:, 0, [edge - 1, edge]] = 40.0  # the top tied across the first round's edge: the lower id
    logits = logits.to(dtype).contiguous()
    block = torch.full((n, length), mask)
    params = dict(temperature=torch.tensor([1.0, 0.7, 1.0]), top_k=torch.tensor([50, 0, 0], dtype=torch.int32),
                  top_p=torch.tensor([0.9, 0.95, 1.0]), min_p=torch.tensor([0.0, 0.0, 0.2]),
                  seed=torch.arange(n) + 11, offset=torch.arange(n, dtype=torch.int64) * 3)
    emu.take_row_passes()
    new = emu.dllm_step(logits, block, mask, 40, None, **params)
    new_passes = emu.take_row_passes()
    old = emu.dllm_step(logits, block, mask, 40, None, radix_only=True, **params)
    old_passes = emu.take_row_passes()
    for a, b in zip(new[:3], old[:3]):
        assert torch.equal(a, b)
    assert torch.equal(new[3].view(torch.int32), old[3].view(torch.int32))
    assert torch.equal(new[2], reference.dllm_step(logits, block, mask, 40, None, **params)[2])
    rows = n * length
    if v % (16 // logits.element_size()) == 0:  # every row aligned: all settled by the scan
        assert new_passes == rows
    else:  # the aligned rows (read by chunks, unlike the radix path's loads then) fall back
        assert rows < new_passes < rows + old_passes


# chain_verify_ragged_ splits a row over up to 32 slices of at least a round each: past 32 rounds'
# worth of chunks, a slice takes ceil(chunks / 32) of them, more than one round.
RAGGED_SHAPES = [
    (torch.float32, 131200),  # 32 slices of 1025 chunks: a second round of one chunk (thread 0's)
    (torch.float32, 131202),  # the same and a partial last chunk; every other row starts unaligned
    (torch.bfloat16, 262400),  # 1025 chunks a slice
    (torch.float32, 4096 * 32 * 2),  # 32 slices of exactly two rounds
]


@pytest.mark.parametrize("dtype,v", RAGGED_SHAPES)
def test_ragged_slices_of_several_rounds(emu, dtype, v):
    """Requests of no drafts, a row each (top-k with top-p, top-p alone, all filters): the reference's
    tokens and log-probabilities, each row settled by its slices and read once."""
    g = torch.Generator().manual_seed(v)
    rows = 3
    logits = torch.randn(rows, v, generator=g) * 3
    edge = ROUND_IDS[dtype]
    logits[0, [edge - 1, edge]] = 30.0  # the top tied across the first slice's rounds
    logits = logits.to(dtype)
    none = torch.empty(0, dtype=torch.int64)
    cu = torch.zeros(rows, dtype=torch.int64)
    params = dict(temperature=torch.tensor([1.0, 0.2, 1.0]), top_k=torch.tensor([50, 0, 40]),
                  top_p=torch.tensor([0.9, 0.9, 0.8]), min_p=torch.tensor([0.0, 0.0, 0.1]),
                  seed=torch.arange(rows) + 5, offset=torch.zeros(rows, dtype=torch.int64))
    emu.take_row_passes()
    got = emu.chain_verify_ragged(none, cu, logits, 0, **params)
    assert emu.take_row_passes() == rows
    want = ref_chain.chain_verify_ragged(none, cu, logits, 0, **params)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], atol=2e-5, rtol=1e-5, equal_nan=True)
