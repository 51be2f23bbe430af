"""Per-sequence sampling of the refine ops: temperature, top_k, top_p and min_p as scalars or [N]
tensors, greedy rows beside sampled ones, and the per-request stream (seed, offset int64 [N]):
sequence n's slot d draws the noise of (seed[n], offset[n] + d) alone."""
import pytest
import torch

import xkernels
from xkernels import reference
from xkernels.reference.sampling import filtered_probs
from tests.test_refine import make_case, to
from tests.utils import DEVICES, chi_squared_pvalue

OPS = ["refine_step", "jacobi_refine", "sequential_refine"]


def call(op, ctx, prev, base, weights, **kw):
    """The op on its natural token argument; jacobi_refine runs to convergence (D passes)."""
    b, d = ctx.shape[1], base.shape[1]
    if op == "refine_step":
        return xkernels.refine_step(ctx, prev, base, weights, **kw)
    prefix = prev[:, : b - d + 1].contiguous()
    if op == "jacobi_refine":
        return xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=d + 1, **kw)[:2]
    return xkernels.sequential_refine(ctx, prefix, base, weights, **kw)


def reference_call(op, ctx, prev, base, weights, **kw):
    b, d = ctx.shape[1], base.shape[1]
    if op == "refine_step":
        return reference.refine_step(ctx, prev, base, weights, **kw)
    prefix = prev[:, : b - d + 1]
    if op == "jacobi_refine":
        return reference.jacobi_refine(ctx, prefix, base, weights, d + 1, **kw)[:2]
    return reference.sequential_refine(ctx, prefix, base, weights, **kw)


def mixed_params(n, seed):
    """Every parameter kind in one batch: greedy rows, plain sampling, top_k, top_p, min_p and all three."""
    g = torch.Generator().manual_seed(seed)
    kind = torch.arange(n) % 6
    temperature = torch.where(kind == 0, 0.0, 0.6 + torch.rand(n, generator=g)).float()
    top_k = torch.where((kind == 2) | (kind == 5), 3, 0).int()
    top_p = torch.where((kind == 3) | (kind == 5), 0.7, 1.0).float()
    min_p = torch.where((kind == 4) | (kind == 5), 0.1, 0.0).float()
    seeds = torch.randint(0, 2**62, (n,), generator=g)
    offsets = torch.randint(0, 1000, (n,), generator=g)
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seeds, offset=offsets)


def on(device, params):
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in params.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_mixed_parameters_match_the_reference(device, op):
    ctx, prev, base, weights = make_case(12, 5, 4, 300, 16, 32, seed=3)
    params = mixed_params(12, 1)
    tokens, logprobs = call(op, *to(device, ctx, prev, base), weights.to(device), **on(device, params))
    want_tokens, want_logprobs = reference_call(op, ctx, prev, base, weights, **params)
    assert torch.equal(tokens.cpu(), want_tokens)
    torch.testing.assert_close(logprobs.cpu(), want_logprobs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_per_row_temperature_and_streams_without_filters_match_the_reference(device):
    ctx, prev, base, weights = make_case(6, 5, 4, 300, 16, 32, seed=4)
    params = mixed_params(6, 2)
    params = dict(temperature=params["temperature"], seed=params["seed"], offset=params["offset"])
    tokens, logprobs = xkernels.refine_step(*to(device, ctx, prev, base), weights.to(device), **on(device, params))
    want_tokens, want_logprobs = reference.refine_step(ctx, prev, base, weights, **params)
    assert torch.equal(tokens.cpu(), want_tokens)
    torch.testing.assert_close(logprobs.cpu(), want_logprobs, atol=1e-4, rtol=1e-4)


# Parameters of the law test's kinds: (temperature, top_k, top_p, min_p).
KINDS = [(0.8, 0, 1.0, 0.0), (1.0, 3, 1.0, 0.0), (1.3, 0, 0.6, 0.0), (1.0, 0, 1.0, 0.25), (0.9, 4, 0.8, 0.1)]


def assert_follows(counts, probs, what):
    """counts ~ probs (chi-squared); where probs is a point mass, every count at its id."""
    if int((probs > 0).sum()) == 1:
        assert counts[probs == 0].sum() == 0, what
    else:
        assert chi_squared_pvalue(counts, probs) > 1e-3, what


@pytest.mark.parametrize("op", ["refine_step", "sequential_refine"])
def test_sampled_tokens_follow_the_filtered_distribution(op):
    """Every kind mixed in one batch, greedy rows among them: the drafted block of each kind
    follows p' (per slot for refine_step; jointly, p'(x1) p'(x2 | x1), for sequential_refine),
    chi-squared, and the log-probs are log p' of the tokens."""
    rows, b, d, v, r, h = 3000, 3, 2, 6, 8, 16
    ctx, prev, base, weights = make_case(1, b, d, v, r, h, seed=12)
    base = base * 0.4  # flatter rows: most kinds keep several ids
    weights = weights._replace(w_read=weights.w_read * 2)  # a token-dependent refinement
    kinds = KINDS + [(0.0, 2, 0.5, 0.3)]  # greedy: the filters do not apply
    n = rows * len(kinds)
    kind = torch.arange(n) % len(kinds)
    column = lambda i, dtype: torch.tensor([kinds[k][i] for k in kind.tolist()], dtype=dtype)  # noqa: E731
    params = dict(temperature=column(0, torch.float32), top_k=column(1, torch.int64), top_p=column(2, torch.float32),
                  min_p=column(3, torch.float32), seed=torch.arange(n) * 7919 + 3, offset=torch.full((n,), 40))
    batch = [ctx.expand(n, -1, -1).contiguous(), prev.expand(n, -1).contiguous(), base.expand(n, -1, -1).contiguous()]
    tokens, logprobs = call(op, *batch, weights, **params)
    prefix = prev[:, : b - d + 1]

    def logits_after(x1):  # the refined logits of both slots, slot 0 reading x1's predecessor only
        return reference.refine_logits(ctx, torch.cat([prefix, torch.tensor([[x1]])], 1), base, weights)[0]

    for k, (t, top_k, top_p, min_p) in enumerate(kinds):
        sel = kind == k
        got, lp = tokens[sel], logprobs[sel]
        if op == "refine_step":
            logits = reference.refine_logits(ctx, prev, base, weights)[0]
            probs = [filtered_probs(logits[j], t, top_k, top_p, min_p) for j in range(d)]
            for j in range(d):
                if t == 0:
                    assert (got[:, j] == logits[j].argmax()).all()
                    continue
                assert_follows(torch.bincount(got[:, j], minlength=v), probs[j], (k, j))
                torch.testing.assert_close(lp[:, j], probs[j].log()[got[:, j]], atol=1e-4, rtol=1e-4)
        else:
            p1 = filtered_probs(logits_after(0)[0], t, top_k, top_p, min_p)
            p2 = torch.stack([filtered_probs(logits_after(x)[1], t, top_k, top_p, min_p) for x in range(v)])
            if t == 0:
                assert (got[:, 0] == p1.argmax()).all() and (got[:, 1] == p2[got[:, 0]].argmax(-1)).all()
                continue
            counts = torch.bincount(got[:, 0] * v + got[:, 1], minlength=v * v)
            assert_follows(counts, p1[:, None] * p2, k)
            torch.testing.assert_close(lp[:, 0], p1.log()[got[:, 0]], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(lp[:, 1], p2.log()[got[:, 0], got[:, 1]], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("op", OPS)
def test_a_sequence_alone_equals_it_in_a_batch_and_permutes_with_it(op):
    """Per-request streams: each sequence's tokens do not depend on its row or the other rows."""
    n = 12
    ctx, prev, base, weights = make_case(n, 5, 4, 300, 16, 32, seed=5)
    params = mixed_params(n, 3)
    tokens, logprobs = call(op, ctx, prev, base, weights, **params)
    for i in range(n):
        alone = call(op, ctx[i:i + 1], prev[i:i + 1], base[i:i + 1], weights,
                     **{k: v[i:i + 1] for k, v in params.items()})
        assert torch.equal(alone[0][0], tokens[i]), i
        torch.testing.assert_close(alone[1][0], logprobs[i], atol=1e-5, rtol=1e-5)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    permuted = call(op, ctx[perm], prev[perm], base[perm], weights, **{k: v[perm] for k, v in params.items()})
    assert torch.equal(permuted[0], tokens[perm])
    torch.testing.assert_close(permuted[1], logprobs[perm], atol=1e-5, rtol=1e-5)


def test_the_per_request_stream_is_keyed_by_offset_plus_slot():
    """Slot d at offset o draws what slot d - 1 draws at offset o + 1: the same row of base logits
    sampled at slot 1 with offset 5 and at slot 0 with offset 6 gives the same token (no read:
    jacobi_refine at max_iters = 0 returns the drafter's own sample)."""
    ctx, prev, base, weights = make_case(4, 3, 2, 300, 8, 16, seed=6)
    base = base[:, :1].expand(-1, 2, -1).contiguous()  # both slots: the same logits
    prefix = prev[:, :2]
    seeds = torch.tensor([11, 12, 13, 14])
    at5, _, _ = xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=0, temperature=1.0, seed=seeds,
                                       offset=torch.full((4,), 5))
    at6, _, _ = xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=0, temperature=1.0, seed=seeds,
                                       offset=torch.full((4,), 6))
    assert torch.equal(at5[:, 1], at6[:, 0])
    assert not torch.equal(at5[:, 0], at5[:, 1])  # the slots draw different noise (4 sequences, V = 300)


@pytest.mark.parametrize("op", OPS)
def test_the_scalar_form_is_unchanged(op):
    """A uniform [N] temperature, filters that are off (None, 0, 1, 0 or such tensors), and a
    0-dim seed tensor give today's scalar-form result bitwise."""
    n = 5
    ctx, prev, base, weights = make_case(n, 5, 4, 300, 16, 32, seed=7)
    want = call(op, ctx, prev, base, weights, temperature=0.8, seed=9, offset=2)
    want_ref = reference_call(op, ctx, prev, base, weights, temperature=0.8, seed=9, offset=2)
    assert torch.equal(want[0], want_ref[0])
    forms = [dict(temperature=torch.full((n,), 0.8)), dict(top_k=0, top_p=1.0, min_p=0.0),
             dict(top_k=torch.zeros(n, dtype=torch.int32), top_p=torch.ones(n), min_p=torch.zeros(n)),
             dict(seed=torch.tensor(9), offset=torch.tensor(2))]
    for form in forms:
        kw = dict(temperature=0.8, seed=9, offset=2) | form
        got = call(op, ctx, prev, base, weights, **kw)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), form


def test_a_filter_that_keeps_everything_changes_nothing():
    """A min_p of 1e-30 keeps every id (a - top >= -69) but takes the filtered path: its tokens
    equal the fused read's (the same logits and noise), its log-probs to the sum's rounding."""
    ctx, prev, base, weights = make_case(4, 5, 4, 300, 16, 32, seed=8)
    params = dict(temperature=1.0, seed=torch.arange(4), offset=torch.zeros(4, dtype=torch.int64))
    want = xkernels.refine_step(ctx, prev, base, weights, **params)
    got = xkernels.refine_step(ctx, prev, base, weights, min_p=torch.full((4,), 1e-30), **params)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    ctx, prev, base, weights = make_case(6, 5, 4, 70, 8, 16)
    ctx, prev, base = to(device, ctx, prev, base)
    w = tuple(weights.to(device))
    p = on(device, mixed_params(6, 4))
    kw = dict(temperature=0.0, temperature_tensor=p["temperature"], top_k_tensor=p["top_k"], top_p_tensor=p["top_p"],
              min_p_tensor=p["min_p"], seed_tensor=p["seed"], offset_tensor=p["offset"])
    torch.library.opcheck(torch.ops.xkernels.refine_step.default, (ctx, prev, base, *w), kw)
    prefix = prev[:, :2].contiguous()
    torch.library.opcheck(torch.ops.xkernels.jacobi_refine.default, (ctx, prefix, base, *w, 3), kw)
    torch.library.opcheck(torch.ops.xkernels.sequential_refine.default, (ctx, prefix, base, *w), kw)


@pytest.mark.parametrize("change, name", [
    (dict(temperature=torch.tensor([1.0, -1.0])), "temperature"),
    (dict(temperature=torch.tensor([1.0, float("nan")])), "temperature"),
    (dict(temperature=torch.ones(3)), "temperature"),
    (dict(temperature=torch.ones(2, dtype=torch.float64)), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=torch.tensor([3, -2])), "top_k"),
    (dict(top_k=torch.ones(2)), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=torch.tensor([0.5, 1.5])), "top_p"),
    (dict(min_p=1.5), "min_p"),
    (dict(min_p=torch.tensor([0.5, -0.1])), "min_p"),
    (dict(seed=torch.tensor([1, 2, 3])), "seed"),
    (dict(offset=torch.tensor([1.0, 2.0])), "offset"),
])
@pytest.mark.parametrize("op", OPS)
def test_bad_sampling_input_names_the_argument(op, change, name):
    ctx, prev, base, weights = make_case(2, 5, 4, 70, 8, 16)
    with pytest.raises(RuntimeError, match=name):
        call(op, ctx, prev, base, weights, **(dict(temperature=1.0) | change))


@pytest.mark.needs_cuda
@pytest.mark.parametrize("op", OPS)
def test_cuda_equals_the_cpu_with_every_parameter_kind(op):
    n = 12
    ctx, prev, base, weights = make_case(n, 5, 4, 300, 16, 32, seed=9)
    params = mixed_params(n, 5)
    want = call(op, ctx, prev, base, weights, **params)
    got = call(op, *to("cuda", ctx, prev, base), weights.to("cuda"), **on("cuda", params))
    assert torch.equal(got[0].cpu(), want[0])
    torch.testing.assert_close(got[1].cpu(), want[1], atol=1e-4, rtol=1e-4)
