"""vLLM's filter order (filter_order="min_p_first": min-p, then top-k, then top-p within what both
keep) in the CUDA kernels, run by the emulation, against the references called with it: the
candidates' cut (select_cut: chain_verify_ragged, tree_verify, dllm_step, the refine ops), the
gathered prefix's (prefix_cut: the refine ops' filtered_pick, alone with pick_only) and the radix
passes with their draw hooks (the rows the candidates do not settle, and dllm's radix-only path).
test_row_cut_emu checks the radix cut alone."""
import pytest
import torch

from xkernels import reference
from xkernels.reference import chain as ref_chain
from xkernels.reference.rng import inverse_temperature
from xkernels.reference.sampling import filter_mask
from tests.test_dllm import MASK, step_case
from tests.test_refine import make_case
from tests.test_tree import verify_case

ORDER = "min_p_first"


def _params(n, seed):
    """Per request: min-p with top-p and no top-k (the floor above the candidates' least, and far
    below it: 0.001), with top-k (the floor above and below top-k's cut), each alone, greedy."""
    g = torch.Generator().manual_seed(seed)
    i = torch.arange(n) % 7
    return dict(temperature=torch.tensor([1.0, 0.8, 1.2, 1.0, 0.9, 1.0, 0.0])[i],
                top_k=torch.tensor([0, 20, 5, 0, 0, 50, 3])[i],
                top_p=torch.tensor([0.9, 0.8, 0.95, 0.7, 1.0, 0.99, 0.5])[i],
                min_p=torch.tensor([0.1, 0.05, 0.3, 0.001, 0.2, 0.02, 0.5])[i],
                seed=torch.randint(0, 2**40, (n,), generator=g), offset=torch.randint(0, 1000, (n,), generator=g))


def _orders_differ(rows, params, request_of_row):
    """How many rows (scaled by their request's temperature) the two orders filter differently."""
    differ = 0
    for r, row in enumerate(rows.float()):
        n = int(request_of_row[r])
        inv = inverse_temperature(float(params["temperature"][n]))
        if inv == 0:
            continue
        a = row * torch.tensor(inv, dtype=torch.float32)
        f = [int(params["top_k"][n]), float(params["top_p"][n]), float(params["min_p"][n])]
        differ += not torch.equal(filter_mask(a, *f), filter_mask(a, *f, ORDER))
    return differ


@pytest.mark.parametrize("vocab,scale", [(300, 2.0), (9001, 3.0), (9001, 0.7)])
@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("with_q", [False, True])
def test_chain_verify_ragged(emu, vocab, scale, method, with_q):
    counts = [2, 0, 3, 1, 2, 1, 2]
    g = torch.Generator().manual_seed(vocab + int(scale * 10))
    cu = torch.tensor(counts).cumsum(0)
    t, n = int(cu[-1]), len(counts)
    logits = torch.randn(t + n, vocab, generator=g) * scale
    drafts = torch.randint(0, vocab, (t,), generator=g)
    q = torch.softmax(torch.randn(t, vocab, generator=g), -1) if with_q else None
    params = _params(n, vocab)
    with emu.filter_order(ORDER):
        got = emu.chain_verify_ragged(drafts, cu, logits, 3, q, method=method, **params)
    want = ref_chain.chain_verify_ragged(drafts, cu, logits, 3, q, method=method, filter_order=ORDER, **params)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], atol=2e-5, rtol=1e-5, equal_nan=True)
    request_of_row = torch.repeat_interleave(torch.arange(n), torch.tensor(counts) + 1)
    assert _orders_differ(logits, params, request_of_row) >= 2  # the test can fail


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_q", [False, True])
def test_tree_verify(emu, dtype, with_q):
    tokens, parents, logits, q = verify_case(7, 9, 304, "bushy", dtype, seed=5)
    logits = logits * 3
    params = _params(7, 3)
    qq = q if with_q else None
    with emu.filter_order(ORDER):
        got = emu.tree_verify(tokens, parents, logits, qq, False, **params)
    want = reference.tree_verify(tokens, parents, logits, qq, False, filter_order=ORDER, **params)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert _orders_differ(logits.reshape(-1, logits.shape[-1]), params, torch.arange(7).repeat_interleave(9)) >= 2


@pytest.mark.parametrize("radix_only", [False, True])
@pytest.mark.parametrize("scale", [3.0, 0.7])
def test_dllm_step(emu, radix_only, scale):
    n, length, v = 7, 6, 3008
    logits, block = step_case(n, length, v, torch.float32, seed=9)
    logits = logits * scale
    params = _params(n, 11)
    with emu.filter_order(ORDER):
        got = emu.dllm_step(logits, block, MASK, 2, None, radix_only=radix_only, **params)
    want = reference.dllm_step(logits, block, MASK, 2, None, filter_order=ORDER, **params)
    for a, b in zip(got[:3], want[:3]):
        assert torch.equal(a, b)
    torch.testing.assert_close(got[3], want[3], atol=1e-5, rtol=1e-4)
    masked = logits.clone()
    masked[..., MASK] = float("-inf")
    assert _orders_differ(masked.reshape(-1, v), params, torch.arange(n).repeat_interleave(length)) >= 2


@pytest.mark.parametrize("base_scale", [2.0, 0.2])
@pytest.mark.parametrize("num_sms", [8, 132])
@pytest.mark.parametrize("pick_only", [False, True])  # the candidates' cut, or the gathered prefix's alone
def test_refine_step(emu, base_scale, num_sms, pick_only):
    n = 7
    ctx, prev, base, weights = make_case(n, 4, 3, 3001, 16, 8, seed=21)
    base = base * base_scale
    params = _params(n, 13)
    params["top_k"] = params["top_k"].int()
    with emu.filter_order(ORDER):
        tokens, logprobs, _ = emu.refine("refine_step", ctx, prev, base, weights, **params, num_sms=num_sms,
                                         pick_only=pick_only)
    want_tokens, want_logprobs = reference.refine_step(ctx, prev, base, weights, filter_order=ORDER, **params)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logprobs, want_logprobs, atol=1e-4, rtol=1e-4)
    rows = reference.refine_logits(ctx, prev, base, weights)
    assert _orders_differ(rows.reshape(-1, rows.shape[-1]), params, torch.arange(n).repeat_interleave(3)) >= 2


# (params, passes over the row): where min-p's floor lies within the candidates' head, the head
# settles top-p over the ids it keeps (one pass, as the default order's); where every head id is
# above it (0.001, ~7 nats below the top), the radix path (4).
PASS_CASES = [(dict(top_p=0.9, min_p=0.1), 1), (dict(top_k=50, top_p=0.9, min_p=0.1), 1),
              (dict(top_k=10, top_p=0.5, min_p=0.3), 1), (dict(top_p=0.9, min_p=0.001), 4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_candidates_settle_min_p_first(emu, dtype):
    logits = (torch.randn(1, 20011, generator=torch.Generator().manual_seed(8)) * 3).to(dtype)
    none = torch.empty(0, dtype=torch.int64)
    differ = 0
    for params, want in PASS_CASES:
        kw = dict(temperature=1.0, seed=3, **params)
        emu.take_row_passes()
        with emu.filter_order(ORDER):
            got = emu.chain_verify_ragged(none, torch.tensor([0]), logits, 0, **kw)
        assert emu.take_row_passes() == want, params
        ref = ref_chain.chain_verify_ragged(none, torch.tensor([0]), logits, 0, filter_order=ORDER, **kw)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
        torch.testing.assert_close(got[2], ref[2], atol=2e-5, rtol=1e-5)
        full = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0}
        full.update(params)
        differ += _orders_differ(logits, {k: torch.tensor([v]) for k, v in full.items()}, torch.zeros(1, dtype=torch.int64))
    assert differ >= 2, differ
