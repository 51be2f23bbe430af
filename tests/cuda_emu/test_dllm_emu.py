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


# Passes over a filtered row: by dllm_filtered_kernel alone (radix_only) and through the candidate
# pipeline (1 where its 64 candidates settle the cut; else its scan, then the radix path's).
@pytest.mark.parametrize("filters,radix,pipeline", [
    (dict(top_k=50), 2, 1),
    (dict(top_p=0.9), 2, 1),  # these peaked rows' nucleus lies within the candidates
    (dict(top_k=20, top_p=0.8), 2, 1),
    (dict(top_k=3000, top_p=0.9), 3, 4),  # > 2048 ids at or above top-k's bin: top-p ranks another bin
    (dict(min_p=0.05), 2, 1),  # min-p alone: no gather, the draw's own pass; its floor above the candidates' least
    (dict(top_k=50, min_p=0.5), 2, 1),  # min-p moves the cut above top-k's bin: the gather draws above its floor
    (dict(top_p=0.9, min_p=0.5), 2, 1),  # and above top-p's guided bin
    (dict(top_k=50, top_p=0.9, min_p=0.5), 2, 1),  # and above the bin top-k's gather ranks for top-p
])
def test_a_filtered_row_is_read_once_or_twice(emu, filters, radix, pipeline):
    """A masked row that samples with a filter is read once where the candidates settle its cut,
    else scanned and then read by dllm_filtered_kernel, twice in all there (the raw statistics
    noting the cut's top key bits, then the cut's gather, which draws too) where the filters table
    of bench/floors.md says; the slices read the other masked rows (once at T = 0, three times at
    T = 0.7 and twice at T = 1: raw, tempered, draw) and no row that is not masked."""
    n, length, v = 5, 6, 3008
    logits, block = step_case(n, length, v, torch.float32, seed=9)
    logits = logits * 3
    temperature = torch.tensor([1.0, 0.8, 0.0, 0.7, 1.0])
    on = torch.tensor([1, 1, 0, 0, 0], dtype=torch.bool)  # greedy, and unfiltered sampled, rows besides
    params = dict(temperature=temperature, seed=torch.arange(n), offset=torch.zeros(n, dtype=torch.int64),
                  top_k=torch.where(on, filters.get("top_k", 0), 0).int(),
                  top_p=torch.where(on, filters.get("top_p", 1.0), 1.0),
                  min_p=torch.where(on, filters.get("min_p", 0.0), 0.0))
    params["top_k"][2] = 5  # a greedy row's filter does nothing
    want = reference.dllm_step(logits, block, MASK, 2, None, **params)
    masked = (block == MASK).sum(1)
    assert masked.min() > 0 and masked.sum() < n * length
    others = int(masked[2]) + 3 * int(masked[3]) + 2 * int(masked[4])
    for radix_only, passes in ((True, radix), (False, pipeline)):
        emu.take_row_passes()
        got = emu.dllm_step(logits, block, MASK, 2, None, radix_only=radix_only, **params)
        counted = emu.take_row_passes()
        for a, b in zip(got[:3], want[:3]):
            assert torch.equal(a, b)
        torch.testing.assert_close(got[3], want[3], atol=1e-5, rtol=1e-4)
        assert counted == passes * int(masked[:2].sum()) + others, radix_only


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


def _bits(confidence):
    return confidence.view(torch.int32)


def _both_paths(emu, logits, block, params):
    """dllm_step through the candidate pipeline and through dllm_filtered_kernel alone (radix_only):
    both results, and the passes over rows each made."""
    emu.take_row_passes()
    new = emu.dllm_step(logits, block, MASK, 40, None, **params)
    new_passes = emu.take_row_passes()
    old = emu.dllm_step(logits, block, MASK, 40, None, radix_only=True, **params)
    return new, old, new_passes, emu.take_row_passes()


# Filtered rows (every position masked, T > 0, mask token 7) the candidates settle ("settle": a
# pass a row, the scan), cannot settle ("fall back": the scan, then the radix path's passes as
# before) or both. n sequences of 2 positions.
def _randn(scale, v, n=3):
    return lambda g: torch.randn(n, 2, v, generator=g) * scale


PIPELINE_CASES = [
    ("top-k", _randn(3, 2048), dict(top_k=50), "settle"),
    ("top-k and top-p", _randn(3, 2048), dict(top_k=50, top_p=0.9), "settle"),
    ("all filters", _randn(3, 2048), dict(top_k=40, top_p=0.8, min_p=0.1), "settle"),
    ("top-p alone, peaked", _randn(9, 2048), dict(top_p=0.95), "settle"),
    ("top-p alone, flat", _randn(1, 2048), dict(top_p=0.9), "fall back"),
    ("min-p alone", _randn(3, 2048), dict(min_p=0.2), "settle"),  # the floor above every dropped key
    ("min-p alone, low", _randn(3, 2048), dict(min_p=0.001), "fall back"),  # below the 64th id
    ("top-k beyond the candidates", _randn(3, 2048), dict(top_k=300), "fall back"),
    ("huge top-k", _randn(3, 2048), dict(top_k=2047, top_p=0.99), "fall back"),
    ("flat", lambda g: torch.zeros(3, 2, 2048), dict(top_k=10), "fall back"),
    ("flat top-p", lambda g: torch.zeros(3, 2, 2048), dict(top_p=0.5), "fall back"),
    ("ties at the cut", lambda g: torch.randint(0, 3, (3, 2, 2048), generator=g).float(), dict(top_k=100), "fall back"),
    ("V = 8", _randn(3, 8), dict(top_k=3), "settle"),
    ("V not a multiple of 8", _randn(3, 1001), dict(top_k=20), "both"),  # aligned rows fall back
    ("NaN and inf rows", lambda g: torch.tensor([[0.0, float("nan"), 1.0] * 683, [float("inf"), 0.0, 1.0] * 683,
                                                 [float("-inf")] * 2049])[:, :2048].reshape(3, 1, 2048).expand(3, 2, 2048),
     dict(top_k=5, top_p=0.9), "settle"),
    ("-inf ids", lambda g: torch.where(torch.arange(2048) % 3 == 0, torch.randn(3, 2, 2048, generator=g),
                                       torch.tensor(float("-inf"))), dict(top_k=30), "settle"),
]


@pytest.mark.parametrize("name,make,filters,path", PIPELINE_CASES, ids=[c[0] for c in PIPELINE_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_candidates_match_the_radix_path(emu, name, make, filters, path, dtype):
    """The candidate pipeline picks the tokens and confidences (bitwise) dllm_filtered_kernel picks,
    the mask token holding the largest logit; a row it settles is read once, one it does not is
    scanned and then takes the radix path."""
    g = torch.Generator().manual_seed(12)
    logits = make(g).to(dtype).contiguous()
    n, length, v = logits.shape
    if v > MASK:
        logits[:, :, MASK] = 30.0
    block = torch.full((n, length), MASK)
    params = dict(temperature=torch.tensor([1.0, 0.7, 1.3])[:n], seed=torch.arange(n) + 3,
                  offset=torch.arange(n, dtype=torch.int64) * 5, **filters)
    new, old, new_passes, old_passes = _both_paths(emu, logits, block, params)
    for a, b in zip(new[:3], old[:3]):
        assert torch.equal(a, b)
    assert torch.equal(_bits(new[3]), _bits(old[3]))
    want = reference.dllm_step(logits, block, MASK, 40, None, **params)
    assert torch.equal(new[2], want[2])
    rows = n * length
    if path == "settle":
        assert new_passes == rows
    elif path == "fall back":
        assert new_passes == rows + old_passes
    else:
        assert rows < new_passes < rows + old_passes


def test_candidates_in_mixed_batches(emu):
    """Greedy, unfiltered and filtered sequences in one batch (every filter kind, unmasked
    positions, the mask token's logit the largest), and an empty batch: both paths agree bitwise."""
    for dtype, v in ((torch.float32, 3000), (torch.bfloat16, 2048), (torch.float16, 1000)):
        logits, block = step_case(16, 5, v, dtype, seed=v)
        logits = logits * 2
        logits[:, :, MASK] = 30.0
        params = mixed_params(16, 2)
        new, old, _, _ = _both_paths(emu, logits, block, params)
        for a, b in zip(new[:3], old[:3]):
            assert torch.equal(a, b)
        assert torch.equal(_bits(new[3]), _bits(old[3]))
    logits, block = step_case(0, 5, 64, torch.bfloat16)
    new, old, _, _ = _both_paths(emu, logits, block, dict(temperature=1.0, top_k=3))
    assert all(t.numel() == 0 for t in new + old)
