"""launch_row_cut's kernel, run by the emulation: each row's cut keeps exactly the ids the
reference's filter_mask keeps."""
import math

import pytest
import torch

from xkernels.reference.rng import inverse_temperature
from xkernels.reference.sampling import filter_mask

INT_MAX = 2**31 - 1


def _as_read(t, k, p, m):
    """A row's parameters as SamplingView.row reads them: invalid values are off (greedy for t)."""
    inv = inverse_temperature(t) if math.isfinite(t) and t > 0 else 0.0
    return inv, (k if k > 0 else 0), (p if 0 < p <= 1 else 1.0), (m if 0 <= m <= 1 else 0.0)


def _check(logits, cut_val, cut_idx, params, rows_per_request=1, order="top_k_first"):
    """params: one (temperature, top_k, top_p, min_p) a request."""
    v = logits.shape[1]
    ids = torch.arange(v)
    for r in range(logits.shape[0]):
        inv, k, p, m = _as_read(*params[r // rows_per_request])
        a = logits[r].float() * torch.tensor(inv, dtype=torch.float32)
        if inv == 0 or not torch.isfinite(a.max()) or not (0 < k < v or p < 1 or m > 0):
            assert cut_val[r] == float("-inf") and cut_idx[r] == INT_MAX, f"row {r} keeps every id"
            continue
        finite = a > float("-inf")
        got = (a > cut_val[r]) | ((a == cut_val[r]) & (ids <= cut_idx[r]))
        want = filter_mask(a, k, p, m, order)
        assert torch.equal(got & finite, want & finite), f"row {r}: {(k, p, m)}"


def _run(emu, logits, params, rows_per_request=1, order="top_k_first"):
    t, k, p, m = (torch.tensor(c) for c in zip(*params)) if params else [torch.empty(0)] * 4
    with emu.filter_order(order):
        cut_val, cut_idx = emu.row_cut(logits, temperature=t.float(), top_k=k.to(torch.int32), top_p=p.float(),
                                       min_p=m.float(), rows_per_request=rows_per_request)
    _check(logits, cut_val, cut_idx, params, rows_per_request, order)
    return cut_val, cut_idx


# (temperature, top_k, top_p, min_p): greedy, unfiltered, each filter alone and mixed
PARAMS = [(0.0, 5, 0.5, 0.1), (1.0, 0, 1.0, 0.0), (0.7, 3, 1.0, 0.0), (1.0, 0, 0.8, 0.0), (1.3, 0, 1.0, 0.05),
          (0.9, 7, 0.5, 0.0), (1.0, 20, 0.9, 0.2), (1.1, 1, 0.3, 0.0), (0.5, 0, 0.95, 0.5), (1.0, 4, 1.0, 1.0)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [37, 300, 1, 20011])  # 20011: several rounds of batched loads and a tail
def test_matches_reference(emu, dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(len(PARAMS), vocab, generator=g) * 3).to(dtype)
    _run(emu, logits, PARAMS)


# min-p and top-p both on (where vLLM's order differs), with and without top-k, the floor above and
# below top-k's cut, and each alone (where the orders agree)
ORDER_PARAMS = [(1.0, 0, 0.9, 0.05), (1.0, 0, 0.5, 0.3), (0.7, 10, 0.8, 0.1), (1.3, 40, 0.95, 0.02),
                (1.0, 3, 0.9, 0.5), (1.0, 0, 0.99, 0.001), (1.0, 2000, 0.9, 0.01), (1.0, 5, 1.0, 0.2),
                (1.0, 0, 0.7, 0.0), (2.0, 0, 0.97, 0.2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [37, 300, 20011])
def test_min_p_first_matches_reference(emu, dtype, vocab):
    """vLLM's order (filter_order="min_p_first"): each cut keeps filter_mask's ids in that order,
    on rows where it keeps fewer than the default order (checked: the test can fail)."""
    g = torch.Generator().manual_seed(vocab + 1)
    logits = (torch.randn(len(ORDER_PARAMS), vocab, generator=g) * 2).to(dtype)
    _run(emu, logits, ORDER_PARAMS, order="min_p_first")
    differ = 0
    for r, (t, k, p, m) in enumerate(ORDER_PARAMS):
        a = logits[r].float() * torch.tensor(inverse_temperature(t), dtype=torch.float32)
        differ += not torch.equal(filter_mask(a, k, p, m), filter_mask(a, k, p, m, "min_p_first"))
    assert differ >= 2, differ


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_largest_logits_after_the_last_whole_chunk(emu, dtype):
    """The row's largest logits in its last 3 ids, which follow its last whole 16-byte chunk (they
    are read one by one) in the last round of batched loads: every cut must count them."""
    g = torch.Generator().manual_seed(13)
    logits = torch.randn(len(PARAMS), 20011, generator=g)
    logits[:, -3:] = torch.tensor([6.0, 7.0, 8.0])
    _run(emu, logits.to(dtype), PARAMS)


def test_planted_ties_at_the_cuts(emu):
    """Equal logits at a top-k, a top-p and a min-p cut: the lower ids are kept first."""
    row = torch.tensor([0.0, 2.0, 1.0, 2.0, 2.0, 1.0, 2.0, 1.0, -1.0, 1.0, 0.5, 1.0] * 30)  # V = 360: 120 twos
    params = [(1.0, 3, 1.0, 0.0), (1.0, 130, 1.0, 0.0), (1.0, 0, 0.3, 0.0), (1.0, 200, 0.6, 0.0), (1.0, 0, 1.0, 0.5),
              (1.0, 121, 0.99, 0.3), (1.0, 120, 1.0, 0.0), (1.0, 0, 0.6, 0.4)]
    for dtype in (torch.float32, torch.bfloat16):
        cut_val, cut_idx = _run(emu, row.repeat(len(params), 1).to(dtype), params)
        # top_k = 3 keeps the first three 2.0s (ids 1, 3, 4); top_p = 0.3 cuts inside the 2.0s
        assert (cut_val[0].item(), cut_idx[0].item()) == (2.0, 4)
        assert cut_val[2] == 2.0 and cut_idx[2] < INT_MAX


def test_garbage_per_row_values_read_as_off(emu):
    """Without XKERNELS_CHECK the binding reads no values: the kernel must take any of them."""
    g = torch.Generator().manual_seed(5)
    params = [(float("nan"), 3, 0.5, 0.1), (-1.0, 2, 0.5, 0.0), (float("inf"), 2, 1.0, 0.0), (1e-40, 2, 1.0, 0.0),
              (1.0, -3, 0.0, -1.0), (1.0, INT_MAX, 2.0, 3.0), (1.0, 0, float("nan"), float("nan")),
              (1.0, 5, -0.5, float("inf")), (1.0, -(2**31), float("-inf"), 0.5)]
    _run(emu, torch.randn(len(params), 50, generator=g), params)


def test_rows_without_a_softmax_keep_every_id(emu):
    logits = torch.randn(5, 40)
    logits[0, 7] = float("nan")
    logits[1, 3] = float("inf")
    logits[2] = float("-inf")
    logits[3, 10:] = float("-inf")  # 10 finite ids, top_k 20: fewer than k
    logits[4, ::2] = float("-inf")
    _run(emu, logits, [(1.0, 3, 0.5, 0.1)] * 3 + [(1.0, 20, 1.0, 0.0), (1.0, 5, 0.7, 0.0)])


def test_rows_per_request_and_strided_rows(emu):
    g = torch.Generator().manual_seed(9)
    wide = (torch.randn(12, 300, generator=g) * 2).to(torch.bfloat16)
    params = [(1.0, 10, 0.9, 0.0), (0.0, 3, 1.0, 0.0), (0.8, 0, 0.7, 0.05), (1.2, 50, 1.0, 0.3)]
    _run(emu, wide[:, :257], params, rows_per_request=3)  # rows of 257 ids, 300 apart
    wider = (torch.randn(4, 5003, generator=g) * 2).to(torch.bfloat16)
    _run(emu, wider[:, :5000], params)  # rows 10006 bytes apart: most start unaligned, several rounds


def test_scalar_parameters(emu):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 90, generator=g) * 2
    cut_val, cut_idx = emu.row_cut(logits, temperature=0.9, top_k=12, top_p=0.8, min_p=0.02)
    _check(logits, cut_val, cut_idx, [(0.9, 12, 0.8, 0.02)] * 4)


def test_no_rows(emu):
    cut_val, cut_idx = emu.row_cut(torch.empty(0, 16), temperature=1.0, top_k=3)
    assert cut_val.shape == (0,) and cut_idx.shape == (0,)


def test_bins_over_the_candidate_buffer(emu):
    """More ids in a chosen bin than shared memory ranks (2048): the selection refines on the next
    key bits, and over 2048 ids of one value it takes the ordered pass."""
    g = torch.Generator().manual_seed(11)
    spread = 1.0 + torch.rand(3000, generator=g) * 0.2  # one 11-bit bin: [1, 1.25)
    equal = torch.cat([torch.full((100,), 1.0), torch.zeros(3000)])  # 3000 ids of one value
    params = [(1.0, 1500, 1.0, 0.0), (1.0, 0, 0.5, 0.0), (1.0, 2500, 0.7, 0.0)]
    _run(emu, spread.repeat(len(params), 1), params)
    params = [(1.0, 2000, 1.0, 0.0), (1.0, 0, 0.9, 0.0), (1.0, 3000, 0.95, 0.0), (1.0, 3100, 1.0, 0.0)]
    cut_val, cut_idx = _run(emu, equal.repeat(len(params), 1), params)
    assert (cut_val[0].item(), cut_idx[0].item()) == (0.0, 100 + 1899)


def _passes(emu, logits, params):
    emu.take_row_passes()
    _run(emu, logits, params)
    return emu.take_row_passes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pass_counts(emu, dtype):
    """The passes over a row bench/floors.md states for launch_row_cut: the top's read, which also
    counts top-k's first level or guides top-p's; then one pass that gathers the cut's bin (top-k's
    takes the ids above it too, when they fit, so top-p within top-k needs none); min-p none."""
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(1, 20011, generator=g) * 3).to(dtype)
    cases = [((1.0, 50, 1.0, 0.0), 2), ((1.0, 0, 0.9, 0.0), 2), ((0.5, 0, 0.5, 0.0), 2), ((1.0, 50, 0.9, 0.0), 2),
             ((1.0, 1000, 0.9, 0.0), 2), ((1.0, 0, 1.0, 0.1), 1), ((1.0, 0, 0.9, 0.1), 2), ((1.0, 0, 1.0, 0.0), 0),
             ((0.0, 50, 0.9, 0.0), 0),
             ((1.0, 3000, 0.9, 0.0), 3)]  # the 3,000 ids do not fit the buffer: top-p takes a gather of its own
    for params, want in cases:
        assert _passes(emu, logits, [params]) == want, params


def test_a_wrong_guide_costs_a_pass_not_the_cut(emu):
    """Top-p's guide underflows in a bin 1,024 wide (values near 4,100): the guided pass finds the
    cut outside the bin it gathered, and the cut is still exact, one gather later."""
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 3000, generator=g)
    logits[:, 7], logits[:, 9] = 4100.0, 4099.5
    assert _passes(emu, logits, [(1.0, 0, 0.9, 0.0), (1.0, 0, 0.5, 0.0)]) == 2 * 3
