"""dllm_step, spiffy_materialize and spiffy_accept with per-request sampling parameters (temperature,
top_k, top_p, min_p as scalars or [N] tensors) and per-request streams: the law of the drawn tokens
against the filtered p', the references, batch invariance, Spiffy's losslessness against dllm_step
with the same parameters, the scalar form's stream, bad input."""

import pytest
import torch

import xkernels
from xkernels import reference
from xkernels.reference import rng as ref_rng
from xkernels.reference import sampling as ref_sampling
from tests.test_dllm import MASK, step_case
from tests.test_spiffy import hand_graph
from tests.utils import DEVICES, chi_squared_pvalue


def mixed_params(n, seed, per_request=True):
    """Every parameter kind in one batch: greedy rows, plain sampling, each filter and all three."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.arange(n)
    params = dict(temperature=torch.tensor([0.0, 1.0, 0.8, 1.2, 1.0, 1.5, 0.6, 0.0])[rows % 8],
                  top_k=torch.tensor([0, 0, 3, 0, 0, 5, 2, 4])[rows % 8],
                  top_p=torch.tensor([1.0, 1.0, 1.0, 0.7, 1.0, 0.8, 0.9, 0.5])[rows % 8],
                  min_p=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.2, 0.05, 0.1, 0.3])[rows % 8])
    if per_request:
        params.update(seed=torch.randint(0, 2**40, (n,), generator=g),
                      offset=torch.randint(0, 2**20, (n,), generator=g))
    else:
        params.update(seed=int(torch.randint(0, 2**40, (), generator=g)), offset=7)
    return params


def take(params, rows):
    """The parameters of some rows (a scalar stays as it is)."""
    return {k: v[rows] if isinstance(v, torch.Tensor) and v.dim() == 1 else v for k, v in params.items()}


def on(params, device):
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in params.items()}


def step_distribution(row, params, n):
    """p' of sequence n's parameters over one row of raw logits (the mask token at -inf)."""
    row = row.clone()
    row[MASK] = float("-inf")
    return ref_sampling.filtered_probs(row, float(params["temperature"][n]), int(params["top_k"][n]),
                                       float(params["top_p"][n]), float(params["min_p"][n]))


@pytest.mark.parametrize("variant", ["kernel", "unfiltered target"])
def test_drawn_tokens_follow_the_filtered_distribution(variant):
    """Every parameter kind mixed in one batch, per-request seeds; each sequence's tokens (L
    positions a call, every one unmasked) by chi-squared against its p'. The mask token holds the
    largest logit, so a filter that counted it would keep other ids. The control compares the
    filtered rows with the unfiltered tempered softmax and must fail."""
    n, length, v, calls = 8, 16, 10, 250
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(n, v, generator=g) * 0.8  # every sampled row's p' keeps 2 to 9 ids
    rows[:, MASK] = rows.max() + 2
    params = mixed_params(n, 1)
    logits = rows[:, None].expand(n, length, v).contiguous()
    block = torch.full((n, length), MASK)
    counts = torch.zeros(n, v)
    for c in range(calls):
        seeds = params["seed"] + c * 1000003
        tokens = xkernels.dllm_step(logits, block, MASK, num_unmask=length, **{**params, "seed": seeds})[2]
        counts += torch.nn.functional.one_hot(tokens, v).sum(1)
    for s in range(n):
        want = step_distribution(rows[s], params, s)
        if float(params["temperature"][s]) == 0:
            assert counts[s, want.argmax()] == calls * length
            continue
        if variant == "kernel":
            assert chi_squared_pvalue(counts[s], want) > 1e-4, s
        elif int(params["top_k"][s]) or float(params["top_p"][s]) < 1 or float(params["min_p"][s]) > 0:
            plain = step_distribution(rows[s], {**params, "top_k": torch.zeros(n), "top_p": torch.ones(n),
                                                "min_p": torch.zeros(n)}, s)
            p = chi_squared_pvalue(counts[s], plain) if counts[s][plain == 0].sum() == 0 else 0.0
            assert p < 1e-6, s


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_request", [True, False])
def test_dllm_step_matches_the_reference(device, dtype, per_request):
    logits, block = step_case(8, 12, 41, dtype, seed=2)
    params = mixed_params(8, 4, per_request)
    for num_unmask, threshold in ((2, None), (1, 0.2)):
        got = xkernels.dllm_step(logits.to(device), block.to(device), MASK, num_unmask=num_unmask,
                                 threshold=threshold, **on(params, device))
        want = reference.dllm_step(logits, block, MASK, num_unmask, threshold, **params)
        for a, b in zip(got[:3], want[:3]):
            assert torch.equal(a.cpu(), b)
        torch.testing.assert_close(got[3].cpu(), want[3], atol=1e-5, rtol=1e-4)


def test_scalar_form_keeps_todays_stream():
    """A float temperature and int seed draw x0 = argmax(logits / T + G(seed, offset, sequence,
    position)) as before; a temperature tensor of that value gives the same tokens."""
    logits, block = step_case(4, 10, 30, seed=5)
    block[:] = MASK
    got = xkernels.dllm_step(logits, block, MASK, num_unmask=10, temperature=0.7, seed=9, offset=4)
    inv_t = ref_rng.inverse_temperature(0.7)
    for s in range(4):
        for p in range(10):
            row = logits[s, p].clone()
            row[MASK] = float("-inf")
            want = int((row * inv_t + ref_rng.gumbel_noise(9, 4, s, p, 30)).argmax())
            assert int(got[0][s, p]) == want  # every position is unmasked
    per_row_t = xkernels.dllm_step(logits, block, MASK, num_unmask=10, temperature=torch.full((4,), 0.7), seed=9,
                                   offset=4)
    assert torch.equal(per_row_t[0], got[0])


def _dllm(logits, block, params, **kw):
    return xkernels.dllm_step(logits, block, MASK, **kw, **params)


@pytest.mark.parametrize("device", DEVICES)
def test_dllm_step_is_batch_invariant(device):
    """Per-request streams: a sequence alone gets what it gets in the batch; permuting the batch
    permutes the outputs."""
    n = 8
    logits, block = [t.to(device) for t in step_case(n, 12, 41, seed=6)]
    params = on(mixed_params(n, 5), device)
    full = _dllm(logits, block, params, num_unmask=3)
    for s in range(n):
        alone = _dllm(logits[s:s + 1], block[s:s + 1], take(params, slice(s, s + 1)), num_unmask=3)
        for a, b in zip(alone, full):
            assert torch.equal(a[0], b[s])
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0)).to(device)
    permuted = _dllm(logits[perm], block[perm], take(params, perm), num_unmask=3)
    for a, b in zip(permuted, full):
        assert torch.equal(a, b[perm])


def _accept_inputs(n, seed, device="cpu", params=None):
    """spiffy_accept's inputs on `device`, drafted there by spiffy_materialize with params (on
    `device` too: mixed devices are an error in every op)."""
    logits, block = step_case(n, 8, 20, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    draft_logits = logits[:, None] + 0.3 * torch.randn(n, 3, 8, 20, generator=g)
    logits, draft_logits, block = (t.to(device) for t in (logits, draft_logits, block))
    drafts, node_ids, _ = xkernels.spiffy_materialize(logits, block, MASK, hand_graph(device), keep=3,
                                                      **{k: v for k, v in (params or {}).items()
                                                         if k not in ("seed", "offset")})
    return [logits, draft_logits, drafts, node_ids, block]


def test_accept_inputs_follow_the_device_of_the_parameters():
    """The CPU side of the CUDA tests' inputs: with parameters on another device (meta stands in for
    CUDA: an op refuses it among CPU tensors the same way), _accept_inputs makes and drafts every
    tensor there."""
    params = on(mixed_params(8, 8), "meta")
    assert all(t.device.type == "meta" for t in _accept_inputs(8, 4, "meta", params))


@pytest.mark.parametrize("per_request", [True, False])
def test_spiffy_accept_is_lossless_against_dllm_step(per_request):
    """Each committed step equals the dllm_step call one-step-per-call decoding makes with the
    same parameters, on the logits of the block reached, the offset advanced by 1 a step (scalar
    form) or by L (per request)."""
    n, length = 8, 8
    params = mixed_params(n, 7, per_request)
    root, draft_logits, drafts, node_ids, block = _accept_inputs(n, 3, params=params)
    # Sampled rows rarely land on a draft: make each sequence's drafts the steps it will take.
    state, logits_of = block.clone(), root
    for d in range(3):
        step = dllm_step_at(logits_of, state, params, d, length)
        drafts[:, d] = step[0]
        node_ids[:, d] = d + 1
        state, logits_of = step[0], draft_logits[:, d]
    got = xkernels.spiffy_accept(root, draft_logits, drafts, node_ids, block, MASK, **params)
    want = reference.spiffy_accept(root, draft_logits, drafts, node_ids, block, MASK, **params)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert (got[0] > 1).any()
    steps, state = [], block.clone()  # one-step-per-call decoding of the whole batch
    for d in range(int(got[0].max())):
        state, positions, tokens, _ = dllm_step_at(root if d == 0 else draft_logits[:, d - 1], state, params, d,
                                                   length)
        steps.append((state, positions, tokens))
    for s in range(n):
        taken = int(got[0][s])
        assert torch.equal(steps[taken - 1][0][s], got[3][s])
        committed = [(p, t) for _, positions, tokens in steps[:taken]
                     for p, t in zip(positions[s].tolist(), tokens[s].tolist()) if p >= 0]
        assert sorted(committed) == sorted(zip(got[1][s, :len(committed)].tolist(),
                                               got[2][s, :len(committed)].tolist()))


def dllm_step_at(logits, block, params, step, length):
    """dllm_step at the `step`-th call of a loop that advances the offset as the docstrings say."""
    offset = params["offset"]
    advance = step * length if ref_sampling.is_per_row(offset, len(block)) else step
    return xkernels.dllm_step(logits, block, MASK, **{**params, "offset": offset + advance})


@pytest.mark.parametrize("device", DEVICES)
def test_spiffy_is_batch_invariant(device):
    n = 8
    params = on(mixed_params(n, 8), device)
    root, draft_logits, drafts, node_ids, block = _accept_inputs(n, 4, device, params)
    filt = {k: v for k, v in params.items() if k not in ("seed", "offset")}
    full_m = xkernels.spiffy_materialize(root, block, MASK, hand_graph(device), keep=3, **filt)
    full_a = xkernels.spiffy_accept(root, draft_logits, drafts, node_ids, block, MASK, **params)
    for s in range(n):
        one = slice(s, s + 1)
        alone_m = xkernels.spiffy_materialize(root[one], block[one], MASK, hand_graph(device), keep=3,
                                              **take(filt, one))
        alone_a = xkernels.spiffy_accept(root[one], draft_logits[one], drafts[one], node_ids[one], block[one], MASK,
                                         **take(params, one))
        for a, b in zip(alone_m + alone_a, full_m + full_a):
            assert torch.equal(a[0], b[s])
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1)).to(device)
    permuted = xkernels.spiffy_accept(root[perm], draft_logits[perm], drafts[perm], node_ids[perm], block[perm],
                                      MASK, **take(params, perm))
    for a, b in zip(permuted, full_a):
        assert torch.equal(a, b[perm])


@pytest.mark.parametrize("device", DEVICES)
def test_materialize_scores_under_the_filtered_distribution(device):
    """Scores are p' log probabilities: they match the reference, and a filter that drops a node's
    token makes the node unusable (top_k = 1 leaves only rank-0 nodes)."""
    logits, block = step_case(8, 12, 53, seed=2)
    params = mixed_params(8, 3)
    del params["seed"], params["offset"]
    g = hand_graph(device)
    got = xkernels.spiffy_materialize(logits.to(device), block.to(device), MASK, g, keep=5, **on(params, device))
    want = reference.spiffy_materialize(logits, block, MASK, g.ranks, g.child_ptr, g.children, 5, **params)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    torch.testing.assert_close(got[2].cpu(), want[2], atol=1e-5, rtol=1e-4)
    top1 = xkernels.spiffy_materialize(logits.to(device), block.to(device), MASK, g, keep=8, temperature=1.0,
                                       top_k=1)[1].cpu()
    ranks = g.ranks.cpu()
    for node in top1[top1 >= 0].tolist():
        ops = ranks[node][ranks[node, :, 0] >= 0]
        assert (ops[:, 1] == 0).all()
    assert (top1 >= 0).any()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    logits, draft_logits, drafts, node_ids, block = _accept_inputs(3, 1, device)
    d = lambda t: t.to(device)  # noqa: E731
    t = d(torch.tensor([0.0, 0.7, 1.3]))
    k, p, m = d(torch.tensor([0, 2, 5])), d(torch.tensor([1.0, 0.8, 0.5])), d(torch.tensor([0.0, 0.1, 0.0]))
    seeds, offsets = d(torch.tensor([3, 4, 5])), d(torch.tensor([0, 100, 7]))
    sampling = (1.0, t, 0, k, 1.0, p, 0.0, m, 0, seeds, 0, offsets)
    torch.library.opcheck(torch.ops.xkernels.dllm_step.default, (logits, block, MASK, 2, None, *sampling))
    torch.library.opcheck(torch.ops.xkernels.dllm_step.default,
                          (logits, block, MASK, 1, 0.5, 0.9, None, 3, None, 0.9, None, 0.05, None, 1, None, 2, None))
    g = hand_graph(device)
    torch.library.opcheck(torch.ops.xkernels.spiffy_materialize.default,
                          (logits, block, MASK, g.ranks, g.child_ptr, g.children, 3, *sampling[:8]))
    torch.library.opcheck(torch.ops.xkernels.spiffy_accept.default,
                          (logits, draft_logits, drafts, node_ids, block, MASK, 1, None, *sampling))


def test_bad_sampling_inputs_name_the_argument():
    logits, draft_logits, drafts, node_ids, block = _accept_inputs(2, 1)
    g = hand_graph()
    calls = {
        "dllm_step": lambda **kw: xkernels.dllm_step(logits, block, MASK, **kw),
        "spiffy_accept": lambda **kw: xkernels.spiffy_accept(logits, draft_logits, drafts, node_ids, block, MASK, **kw),
        "spiffy_materialize": lambda **kw: xkernels.spiffy_materialize(logits, block, MASK, g, keep=2, **kw),
    }
    cases = [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=torch.tensor([1.0, -0.5])), "temperature must be finite and >= 0 in every row"),
        (dict(temperature=torch.tensor([1.0, 1.0, 1.0])), r"temperature must have shape \[N\]"),
        (dict(temperature=torch.tensor([1.0, 1.0], dtype=torch.float64)), "temperature must be a Float tensor"),
        (dict(top_k=-1), "top_k must be >= 0"),
        (dict(top_k=torch.tensor([1, -2])), "top_k must be >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=torch.tensor([0.5, 1.5])), r"top_p must be in \(0, 1\]"),
        (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
        (dict(min_p=torch.tensor([0.5])), r"min_p must have shape \[N\]"),
    ]
    streams = [
        (dict(seed=torch.tensor([1, 2, 3])), "seed must be an int, a one-element tensor"),
        (dict(offset=torch.tensor([1.0, 2.0])), "offset must be an int64 tensor"),
    ]
    for name, call in calls.items():
        for kw, message in cases + (streams if name != "spiffy_materialize" else []):
            with pytest.raises(RuntimeError, match=message):
                call(**kw)
