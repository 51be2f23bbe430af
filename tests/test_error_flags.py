"""The asynchronous error flag (issue 44, section 2) of chain_verify_ragged_ (its kernels set it; also
through chain_verify) and of tree_verify, dllm_step, the Spiffy ops, the refine ops and shard_row_stats (param_errors_kernel, a
launch of its own): each invalid per-row value ORs its bit into its request's word (SamplingError), on every
device, instead of raising; valid values set none; the results are those of the values read as off,
as without the flag."""
import pytest
import torch

import xkernels
from xkernels import reference
from xkernels.errors import SamplingError
from xkernels.reference import chain as ref_chain
from xkernels.reference import param_errors
from tests.test_verify_contract import _ragged_case, _same
from tests.utils import DEVICES

NAN, INF = float("nan"), float("inf")
N = 4  # _ragged_case's requests

# (parameter, an invalid value, its bit); the other requests hold valid values
INVALID = [("temperature", NAN, SamplingError.TEMPERATURE), ("temperature", INF, SamplingError.TEMPERATURE),
           ("temperature", -INF, SamplingError.TEMPERATURE), ("temperature", -0.5, SamplingError.TEMPERATURE),
           ("top_k", -1, SamplingError.TOP_K), ("top_k", -2**40, SamplingError.TOP_K),
           ("top_p", 0.0, SamplingError.TOP_P), ("top_p", 1.5, SamplingError.TOP_P),
           ("top_p", -0.2, SamplingError.TOP_P), ("top_p", NAN, SamplingError.TOP_P),
           ("min_p", -0.1, SamplingError.MIN_P), ("min_p", 1.01, SamplingError.MIN_P),
           ("min_p", NAN, SamplingError.MIN_P)]
VALID = dict(temperature=[0.7, 0.0, 1.3, 0.9], top_k=[5, 0, 40, 3], top_p=[0.9, 1.0, 0.5, 1.0],
             min_p=[0.0, 0.1, 1.0, 0.05])
DTYPES = dict(temperature=torch.float32, top_k=torch.int32, top_p=torch.float32, min_p=torch.float32)


def _params(device, **rows):
    """The per-request tensors, VALID's values where `rows` gives none (rows: name -> list)."""
    out = {}
    for name, values in {**VALID, **rows}.items():
        dtype = torch.int64 if name == "top_k" and not -2**31 <= min(values) <= max(values) < 2**31 else DTYPES[name]
        out[name] = torch.tensor(values, dtype=dtype, device=device)
    return out


def _call(device, params, method, errors=None, inplace=False):
    drafts, cu, logits, q = _ragged_case(device, seed=5)
    seed, offset = torch.tensor([11, 12, 13, 14], device=device), torch.arange(4, device=device) * 5
    if inplace:
        out, accept = (torch.empty(N, 5, dtype=torch.int32, device=device),
                       torch.empty(N, dtype=torch.int32, device=device))
        lp = torch.empty(N, 5, device=device)
        return xkernels.chain_verify_ragged_(drafts, cu, logits, out, accept, logprobs=lp, draft_probs=q, seed=seed,
                                             offset=offset, method=method, errors=errors, **params)
    return xkernels.chain_verify_ragged(drafts, cu, logits, max_spec_len=4, draft_probs=q, seed=seed, offset=offset,
                                        method=method, errors=errors, **params)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("name,value,bit", INVALID)
def test_each_invalid_value_sets_its_bit(device, method, name, value, bit):
    values = list(VALID[name])
    values[1] = value  # request 1 only
    params = _params(device, **{name: values})
    errors = torch.tensor([0, 16, 0, 0], dtype=torch.int32, device=device)  # 16: no bit of ours, kept (OR)
    got = _call(device, params, method, errors)
    assert errors.cpu().tolist() == [0, 16 | int(bit), 0, 0]
    # the results of the value read as off, as without the flag
    off_value = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)[name]
    off = _params(device, **{name: [off_value if i == 1 else v for i, v in enumerate(values)]})
    _same(got, _call(device, off, method))
    # the reference: the same bits and results
    ref_errors = torch.zeros(N, dtype=torch.int32)
    drafts, cu, logits, q = _ragged_case("cpu", seed=5)
    want = ref_chain.chain_verify_ragged(drafts, cu, logits, 4, q, seed=torch.tensor([11, 12, 13, 14]),
                                         offset=torch.arange(4) * 5, method=method, errors=ref_errors,
                                         **{k: v.cpu() for k, v in params.items()})
    assert ref_errors.tolist() == [0, int(bit), 0, 0]
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    torch.testing.assert_close(got[2].cpu(), want[2], atol=2e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inplace", [False, True])
def test_valid_values_set_no_bit(device, inplace):
    tiny = dict(temperature=[1e-40, 0.0, -0.0, 2.0])  # a temperature whose inverse overflows is greedy, not invalid
    for rows in ({}, tiny, dict(top_k=[2**40, 0, 1, 57])):
        params = _params(device, **rows)
        errors = torch.zeros(N, dtype=torch.int32, device=device)
        got = _call(device, params, "token", errors, inplace)
        assert errors.cpu().tolist() == [0] * N
        _same(got, _call(device, params, "token", None, inplace))


@pytest.mark.parametrize("device", DEVICES)
def test_several_bits_and_scalars(device):
    params = _params(device, temperature=[0.5, NAN, 1.0, -1.0], top_k=[-3, -1, 0, 4], top_p=[2.0, 0.5, 1.0, 1.0],
                     min_p=[0.0, 3.0, 0.0, 0.0])
    errors = torch.zeros(N, dtype=torch.int32, device=device)
    _call(device, params, "token", errors, inplace=True)
    e = SamplingError
    assert [SamplingError(x) for x in errors.cpu().tolist()] == [e.TOP_K | e.TOP_P, e.TEMPERATURE | e.TOP_K | e.MIN_P,
                                                                 e(0), e.TEMPERATURE]
    assert param_errors(N, **{k: v.cpu() for k, v in params.items()}).tolist() == errors.cpu().tolist()
    # scalars are checked on the host (no sync needed): still raised, with or without the flag
    with pytest.raises(RuntimeError, match="top_p"):
        _call(device, dict(temperature=1.0, top_p=1.5), "token", torch.zeros(N, dtype=torch.int32, device=device))


def test_without_errors_the_cpu_raises():
    with pytest.raises(RuntimeError, match="temperature"):
        _call("cpu", _params("cpu", temperature=[1.0, NAN, 1.0, 1.0]), "token")


@pytest.mark.parametrize("bad", [torch.zeros(N, dtype=torch.int64), torch.zeros(N + 1, dtype=torch.int32),
                                 torch.zeros(N, 2, dtype=torch.int32)[:, 0]])
def test_bad_errors_buffer_raises_naming_it(bad):
    with pytest.raises(RuntimeError, match="errors"):
        _call("cpu", _params("cpu"), "token", bad)


def test_opcheck_and_fake():
    from tests.test_verify_contract import _ragged_op_args
    for errors in (torch.zeros(2, dtype=torch.int32), torch.tensor([4, 0], dtype=torch.int32)):
        args = _ragged_op_args(None, True)
        temperature = torch.tensor([NAN, 0.0])  # request 0 flagged
        args = args[:6] + (temperature,) + args[7:] + (errors,)
        torch.library.opcheck(torch.ops.xkernels.chain_verify_ragged_.default, args)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        torch.ops.xkernels.chain_verify_ragged_.default(*fake)
        with pytest.raises(RuntimeError, match="errors"):
            wrong = mode.from_tensor(torch.zeros(3, dtype=torch.int32))
            torch.ops.xkernels.chain_verify_ragged_.default(*fake[:-1], wrong)


@pytest.mark.parametrize("device", DEVICES)
def test_ragged_verifier_holds_each_steps_words(device):
    from tests.test_ragged_verifier import DRAFTS, step_case
    from xkernels.integrations.ragged_verifier import RaggedVerifier
    flat, cu, logits = step_case(DRAFTS, seed=2, device=device)
    verifier = RaggedVerifier(8, 3, device)
    verifier.set_requests(list("abcde"))
    verifier.set_positions(torch.arange(5, device=device))
    bad = torch.tensor([1.0, NAN, 0.5, 1.0, 1.0], device=device)
    verifier.verify(flat, cu, logits, 3, temperature=bad, top_p=torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0], device=device))
    assert verifier.errors[:5].cpu().tolist() == [0, int(SamplingError.TEMPERATURE), 0, int(SamplingError.TOP_P), 0]
    verifier.verify(flat, cu, logits, 3, temperature=torch.ones(5, device=device))  # the next step's words only
    assert verifier.errors.cpu().tolist() == [0] * 8


@pytest.mark.needs_cuda
def test_the_flag_is_captured_and_follows_the_replayed_values():
    """A captured step reads the parameters' current values at each replay and flags them."""
    params = _params("cuda")
    drafts, cu, logits, q = _ragged_case("cuda", seed=5)
    seed, offset = torch.tensor([11, 12, 13, 14], device="cuda"), torch.arange(4, device="cuda") * 5
    out, accept = torch.empty(N, 5, dtype=torch.int32, device="cuda"), torch.empty(N, dtype=torch.int32, device="cuda")
    errors = torch.zeros(N, dtype=torch.int32, device="cuda")

    def step():  # every tensor made beforehand: a capture copies nothing from the host
        errors.zero_()
        xkernels.chain_verify_ragged_(drafts, cu, logits, out, accept, draft_probs=q, seed=seed, offset=offset,
                                      errors=errors, **params)

    _replays_flag_temperature(step, params, errors)


# ---- the ops whose bindings flag the rows (param_errors_kernel on CUDA): a word a sequence

SEQUENCE_OPS = ["chain_verify", "tree_verify", "dllm_step", "spiffy_materialize", "spiffy_accept", "refine_step", "jacobi_refine",
                "sequential_refine"]
STREAMS = dict(seed=[11, 12, 13, 14], offset=[0, 40, 80, 120])


def _sequence_case(op, device):
    """op's call and its reference's on a small case of N sequences, the inputs on `device` made
    once (a captured call copies nothing): each takes the per-sequence parameters (tensors moved to
    `device` for the op, none where there already) and errors, and returns its outputs."""
    from tests.test_chain_sampling import _random_batch
    from tests.test_dllm import MASK, step_case
    from tests.test_dllm_sampling import _accept_inputs
    from tests.test_refine import make_case
    from tests.test_refine_sampling import call, reference_call
    from tests.test_spiffy import hand_graph
    from tests.test_tree import verify_case

    stream = {} if op == "spiffy_materialize" else {k: torch.tensor(v) for k, v in STREAMS.items()}
    on_device = {k: v.to(device) for k, v in stream.items()}

    def dev(params):
        return {**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in params.items()}, **on_device}

    def cpu(params):
        return {**{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in params.items()}, **stream}

    if op == "chain_verify":
        logits, drafts, q = _random_batch(N, 3, 20, seed=6)
        d_case = [t.to(device) for t in (drafts, logits, q)]
        return (lambda p, e: xkernels.chain_verify(*d_case[:2], draft_probs=d_case[2], return_logprobs=True, errors=e,
                                                   **dev(p)),
                lambda p, e: reference.chain_verify(drafts, logits, q, return_logprobs=True, errors=e, **cpu(p)))
    if op == "tree_verify":
        case = verify_case(N, 9, 20, "bushy", seed=3)  # tokens, parents, logits, q: children drawn from q
        d_case = [t.to(device) for t in case]
        return (lambda p, e: xkernels.tree_verify(*d_case[:3], draft_probs=d_case[3], errors=e, **dev(p)),
                lambda p, e: reference.tree_verify(*case, errors=e, **cpu(p)))
    if op == "dllm_step":
        logits, block = step_case(N, 8, 20, seed=1)
        d_logits, d_block = logits.to(device), block.to(device)
        return (lambda p, e: xkernels.dllm_step(d_logits, d_block, MASK, num_unmask=2, errors=e, **dev(p)),
                lambda p, e: reference.dllm_step(logits, block, MASK, 2, errors=e, **cpu(p)))
    if op == "spiffy_materialize":
        logits, block = step_case(N, 8, 20, seed=2)
        g, d_graph, d_logits, d_block = hand_graph(), hand_graph(device), logits.to(device), block.to(device)
        return (lambda p, e: xkernels.spiffy_materialize(d_logits, d_block, MASK, d_graph, keep=3, errors=e, **dev(p)),
                lambda p, e: reference.spiffy_materialize(logits, block, MASK, g.ranks, g.child_ptr, g.children, 3,
                                                          errors=e, **cpu(p)))
    if op == "spiffy_accept":
        inputs = _accept_inputs(N, 3)
        d_inputs = [t.to(device) for t in inputs]
        return (lambda p, e: xkernels.spiffy_accept(*d_inputs, MASK, errors=e, **dev(p)),
                lambda p, e: reference.spiffy_accept(*inputs, MASK, errors=e, **cpu(p)))
    ctx, prev, base, weights = make_case(N, 5, 4, 70, 8, 16, seed=4)
    d_case = [ctx.to(device), prev.to(device), base.to(device), weights.to(device)]
    return (lambda p, e: call(op, *d_case, errors=e, **dev(p)),
            lambda p, e: reference_call(op, ctx, prev, base, weights, errors=e, **cpu(p)))


def _assert_same(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", SEQUENCE_OPS)
@pytest.mark.parametrize("name,value,bit", INVALID)
def test_each_invalid_value_sets_its_bit_per_sequence(device, op, name, value, bit):
    """Sequence 2 (a sampled one) holds the value; the bit lands in its word on top of the held bits,
    the reference's words agree, and the results are those of the value read as off."""
    call, reference_call = _sequence_case(op, device)
    values = list(VALID[name])
    values[2] = value
    params = _params("cpu", **{name: values})
    errors = torch.tensor([0, 16, 0, 1], dtype=torch.int32, device=device)  # 16: no bit of ours, kept (OR)
    got = call(params, errors)
    assert errors.cpu().tolist() == [0, 16, int(bit), 1]
    off_value = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)[name]
    _assert_same(got, call(_params("cpu", **{name: [off_value if i == 2 else v for i, v in enumerate(values)]}), None))
    ref_errors = torch.zeros(N, dtype=torch.int32)
    reference_call(params, ref_errors)
    assert ref_errors.tolist() == [0, 0, int(bit), 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", SEQUENCE_OPS)
def test_valid_values_set_no_bit_and_change_nothing_per_sequence(device, op):
    call, _ = _sequence_case(op, device)
    for rows in ({}, dict(temperature=[1e-40, 0.0, -0.0, 2.0]), dict(top_k=[2**40, 0, 1, 57])):
        params = _params("cpu", **rows)
        errors = torch.zeros(N, dtype=torch.int32, device=device)
        got = call(params, errors)
        assert errors.cpu().tolist() == [0] * N
        _assert_same(got, call(params, None))


@pytest.mark.parametrize("op", SEQUENCE_OPS)
def test_several_bits_the_reference_reads_them_as_off_and_the_cpu_raises_without(op):
    call, reference_call = _sequence_case(op, "cpu")
    bad = dict(temperature=[0.5, NAN, 1.0, -1.0], top_k=[-3, -1, 0, 4], top_p=[2.0, 0.5, 1.0, 1.0],
               min_p=[0.0, 3.0, 0.0, 0.0])
    off = dict(temperature=[0.5, 0.0, 1.0, 0.0], top_k=[0, 0, 0, 4], top_p=[1.0, 0.5, 1.0, 1.0],
               min_p=[0.0, 0.0, 0.0, 0.0])
    e = SamplingError
    words = [e.TOP_K | e.TOP_P, e.TEMPERATURE | e.TOP_K | e.MIN_P, e(0), e.TEMPERATURE]
    errors, ref_errors = torch.zeros(N, dtype=torch.int32), torch.zeros(N, dtype=torch.int32)
    got = call(_params("cpu", **bad), errors)
    assert [SamplingError(x) for x in errors.tolist()] == words
    _assert_same(got, call(_params("cpu", **off), None))
    _assert_same(reference_call(_params("cpu", **bad), ref_errors), reference_call(_params("cpu", **off), None))
    assert ref_errors.tolist() == errors.tolist()
    with pytest.raises(RuntimeError, match="temperature"):
        call(_params("cpu", **bad), None)
    # scalars are checked on the host: still raised with the flag
    with pytest.raises(RuntimeError, match="top_p"):
        call(dict(temperature=torch.ones(N), top_p=1.5), torch.zeros(N, dtype=torch.int32))


@pytest.mark.parametrize("op", SEQUENCE_OPS)
@pytest.mark.parametrize("bad", [torch.zeros(N, dtype=torch.int64), torch.zeros(N + 1, dtype=torch.int32),
                                 torch.zeros(N, 2, dtype=torch.int32)[:, 0], torch.zeros(N, dtype=torch.int32,
                                                                                         device="meta")])
def test_bad_errors_buffer_raises_naming_it_per_sequence(op, bad):
    call, _ = _sequence_case(op, "cpu")
    with pytest.raises(RuntimeError, match="errors"):
        call(_params("cpu"), bad)


# the op each function runs with errors, where it is not the function's own
SCHEMA_OPS = dict(chain_verify="chain_verify_ragged_")


def _sequence_op_args(op, errors):
    """The arguments of op's schema op (SCHEMA_OPS) on the CPU, a flagged NaN temperature in
    sequence 0, then errors."""
    from tests.test_chain_sampling import _random_batch
    from tests.test_dllm import MASK, step_case
    from tests.test_dllm_sampling import _accept_inputs
    from tests.test_refine import make_case
    from tests.test_spiffy import hand_graph
    from tests.test_tree import verify_case
    t = torch.tensor([NAN, 0.7, 1.3, 0.0])
    k, p, m = torch.tensor([0, 2, 5, 0]), torch.tensor([1.0, 0.8, 0.5, 1.0]), torch.tensor([0.0, 0.1, 0.0, 0.0])
    sampling = (1.0, t, 0, k, 1.0, p, 0.0, m, 0, torch.tensor([3, 4, 5, 6]), 0, torch.tensor([0, 100, 7, 9]))
    if op in ("refine_step", "jacobi_refine", "sequential_refine"):
        ctx, prev, base, weights = make_case(N, 5, 4, 70, 8, 16)
        tokens = prev if op == "refine_step" else prev[:, :2].contiguous()
        return (ctx, tokens, base, *weights, *((3,) if op == "jacobi_refine" else ()), *sampling, errors)
    if op == "spiffy_accept":
        return (*_accept_inputs(N, 1), MASK, 1, None, *sampling, errors)
    if op == "chain_verify":  # chain_verify_ragged_ over the dense layout, as chain_verify calls it
        logits, drafts, q = _random_batch(N, 3, 20, seed=6)
        return (drafts.reshape(-1), torch.arange(1, N + 1) * 3, logits.reshape(N * 4, 20), 3, q.reshape(N * 3, 20),
                *sampling, False, torch.empty(N, 4, dtype=torch.int32), torch.empty(N, dtype=torch.int32),
                torch.empty(N, 4), errors)
    if op == "tree_verify":
        return (*verify_case(N, 9, 20, "bushy", seed=3), False, torch.tensor([9, 4, 1, 6]), *sampling, errors)
    logits, block = step_case(N, 8, 20, seed=1)
    if op == "dllm_step":
        return (logits, block, MASK, 2, None, *sampling, errors)
    g = hand_graph()
    return (logits, block, MASK, g.ranks, g.child_ptr, g.children, 3, *sampling[:8], errors)


@pytest.mark.parametrize("op", SEQUENCE_OPS)
def test_opcheck_and_fake_per_sequence(op):
    from torch._subclasses.fake_tensor import FakeTensorMode
    schema_op = getattr(torch.ops.xkernels, SCHEMA_OPS.get(op, op)).default
    for errors in (torch.zeros(N, dtype=torch.int32), torch.tensor([0, 4, 0, 0], dtype=torch.int32)):
        torch.library.opcheck(schema_op, _sequence_op_args(op, errors))
    args = _sequence_op_args(op, torch.zeros(N, dtype=torch.int32))
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        schema_op(*fake)
        with pytest.raises(RuntimeError, match="errors"):
            schema_op(*fake[:-1], mode.from_tensor(torch.zeros(N + 1, dtype=torch.int32)))


@pytest.mark.parametrize("device", DEVICES)
def test_chain_verify_takes_errors_with_scalar_parameters(device):
    """Scalars alone (the plain form's call) with errors: the buffer is still checked, nothing is
    flagged, the tokens are the plain form's."""
    from tests.test_chain_sampling import _random_batch
    logits, drafts, q = (t.to(device) for t in _random_batch(N, 3, 20, seed=6))
    errors = torch.tensor([0, 16, 0, 0], dtype=torch.int32, device=device)
    got = xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=0.8, seed=5, offset=9, errors=errors)
    assert errors.cpu().tolist() == [0, 16, 0, 0]
    _assert_same(got, xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=0.8, seed=5, offset=9))
    with pytest.raises(RuntimeError, match="errors"):
        xkernels.chain_verify(drafts, logits, errors=torch.zeros(N + 1, dtype=torch.int32, device=device))


@pytest.mark.needs_cuda
@pytest.mark.parametrize("op", SEQUENCE_OPS)
def test_the_flag_of_each_op_is_captured_and_follows_the_replayed_values(op):
    """A captured call reads the per-sequence values at each replay and flags them (the flag's
    launch is in the graph)."""
    call, _ = _sequence_case(op, "cuda")
    params = {k: v.cuda() for k, v in _params("cpu").items()}
    errors = torch.zeros(N, dtype=torch.int32, device="cuda")

    def step():
        errors.zero_()
        call(params, errors)

    _replays_flag_temperature(step, params, errors)


def _replays_flag_temperature(step, params, errors):
    """Captures step (which zeroes errors, then calls the op) and replays it with row 2's temperature
    NaN, valid, then negative: its word must follow each replay's value."""
    step()  # warm-up: lazy initialisation must not be captured
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for bad, want in ((NAN, int(SamplingError.TEMPERATURE)), (0.8, 0), (-1.0, int(SamplingError.TEMPERATURE))):
        params["temperature"][2] = bad
        graph.replay()
        torch.cuda.synchronize()
        assert errors.cpu().tolist() == [0, 0, want, 0]


# ---- shard_row_stats: a word a sequence; temperature is its only per-sequence parameter

def _shard_call(device):
    """shard_row_stats (sampling, with a cut) and its reference on a 4-sequence case, inputs on
    `device` made once; each takes the temperature [N] and errors and returns the six outputs."""
    from tests.test_shard_row_stats import per_row_case
    logits, _, seeds, offsets, cut_value, cut_id = per_row_case()
    case = dict(sample=True, seed=seeds, offset=offsets, cut_value=cut_value, cut_id=cut_id)
    d_logits, d_case = logits.to(device), {k: v.to(device) if isinstance(v, torch.Tensor) else v
                                           for k, v in case.items()}
    return (lambda t, e: xkernels.shard_row_stats(d_logits, 5, temperature=t.to(device), errors=e, **d_case),
            lambda t, e: reference.shard_row_stats(logits, 5, temperature=t.cpu(), errors=e, **case))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", [v for name, v, _ in INVALID if name == "temperature"])
def test_shard_row_stats_flags_each_invalid_temperature(device, value):
    call, reference_call = _shard_call(device)
    errors = torch.tensor([0, 16, 0, 1], dtype=torch.int32, device=device)  # 16: no bit of ours, kept (OR)
    got = call(torch.tensor([0.7, 0.0, value, 1.0]), errors)
    assert errors.cpu().tolist() == [0, 16, int(SamplingError.TEMPERATURE), 1]
    _assert_same(got, call(torch.tensor([0.7, 0.0, 0.0, 1.0]), None))  # read as greedy
    ref_errors = torch.zeros(N, dtype=torch.int32)
    reference_call(torch.tensor([0.7, 0.0, value, 1.0]), ref_errors)
    assert ref_errors.tolist() == [0, 0, int(SamplingError.TEMPERATURE), 0]


@pytest.mark.parametrize("device", DEVICES)
def test_shard_row_stats_valid_temperatures_set_no_bit(device):
    call, _ = _shard_call(device)
    for t in ([0.7, 0.0, 1.3, 1.0], [1e-40, 0.0, -0.0, 2.0]):
        errors = torch.zeros(N, dtype=torch.int32, device=device)
        got = call(torch.tensor(t), errors)
        assert errors.cpu().tolist() == [0] * N
        _assert_same(got, call(torch.tensor(t), None))


@pytest.mark.parametrize("bad", [torch.zeros(N, dtype=torch.int64), torch.zeros(N + 1, dtype=torch.int32),
                                 torch.zeros(N, 2, dtype=torch.int32)[:, 0],
                                 torch.zeros(N, dtype=torch.int32, device="meta")])
def test_shard_row_stats_bad_errors_buffer_raises_naming_it(bad):
    call, _ = _shard_call("cpu")
    with pytest.raises(RuntimeError, match="errors"):
        call(torch.ones(N), bad)


def test_shard_row_stats_raises_without_errors_and_for_scalars():
    call, _ = _shard_call("cpu")
    with pytest.raises(RuntimeError, match="temperature"):
        call(torch.tensor([1.0, NAN, 1.0, 1.0]), None)
    with pytest.raises(RuntimeError, match="temperature"):  # a scalar is checked on the host
        xkernels.shard_row_stats(torch.zeros(N, 3, 8), 0, temperature=-1.0, errors=torch.zeros(N, dtype=torch.int32))


def test_shard_row_stats_opcheck_and_fake():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from tests.test_shard_row_stats import per_row_case
    logits, _, seeds, offsets, cut_value, cut_id = per_row_case()
    op = torch.ops.xkernels.shard_row_stats.default

    def args(errors):  # temperature_tensor: sequence 0 flagged
        return (logits, 5, None, None, None, None, -1, True, False, 0.0, 0, 0, seeds, offsets,
                torch.tensor([NAN, 0.0, 1.3, 1.0]), cut_value, cut_id, errors)

    for errors in (torch.zeros(N, dtype=torch.int32), torch.tensor([0, 4, 0, 0], dtype=torch.int32)):
        torch.library.opcheck(op, args(errors))
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                for a in args(torch.zeros(N, dtype=torch.int32))]
        op(*fake)
        with pytest.raises(RuntimeError, match="errors"):
            op(*fake[:-1], mode.from_tensor(torch.zeros(N + 1, dtype=torch.int32)))


@pytest.mark.needs_cuda
def test_the_flag_of_shard_row_stats_is_captured_and_follows_the_replayed_values():
    call, _ = _shard_call("cuda")
    params = dict(temperature=torch.tensor([0.7, 0.0, 1.3, 1.0], device="cuda"))
    errors = torch.zeros(N, dtype=torch.int32, device="cuda")

    def step():
        errors.zero_()
        call(params["temperature"], errors)

    _replays_flag_temperature(step, params, errors)


# ---- xkernels.distributed: the sharded functions flag as the ops do (gloo, 2 ranks, uneven shards)

def _check_sharded_flags(rank, world, port):
    import os
    import torch.distributed as dist
    from tests.test_distributed import BOUNDS, V, _case_logits, _refiner_case, _shard, _unread
    from xkernels import distributed
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        bounds = BOUNDS[world]
        g = torch.Generator().manual_seed(21)
        logits = _case_logits(N, 8, 9, bounds)
        local, start = _shard(logits, bounds, rank)
        chain_local = _shard(logits[:, :4], bounds, rank)[0]
        drafts = torch.randint(0, V, (N, 3), generator=g)
        parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3, 3]]).repeat(N, 1)
        tokens = torch.randint(0, V, (N, 8), generator=g)
        tokens[:, 0] = -1
        local_q = _shard(torch.softmax(torch.randn(N, 8, V, generator=g), -1), bounds, rank)[0]
        mask = bounds[1][0]
        block = torch.randint(0, V, (N, 8), generator=g)
        block[:, ::2] = mask
        ctx, prev, prefix, base, weights = _refiner_case(bounds, n=N)
        local_base = _shard(base, bounds, rank)[0]
        a, b = bounds[rank]
        local_w = weights._replace(emb=weights.emb[a:b].contiguous(), w_read=weights.w_read[a:b].contiguous())
        refine = dict(vocab_start=start, seed=torch.tensor(STREAMS["seed"]), offset=torch.tensor(STREAMS["offset"]))
        calls = {
            "chain_verify": lambda e, **p: distributed.chain_verify(drafts, chain_local, errors=e, **refine, **p),
            "tree_verify": lambda e, **p: distributed.tree_verify(tokens, parents, local, draft_probs=local_q,
                                                                  capturable=True, errors=e, **refine, **p),
            "dllm_step": lambda e, **p: distributed.dllm_step(local, block, mask, num_unmask=2, errors=e, **refine,
                                                              **p),
            "refine_step": lambda e, **p: distributed.refine_step(ctx, prev, local_base, local_w, errors=e, **refine,
                                                                  **p),
            "jacobi_refine": lambda e, **p: distributed.jacobi_refine(ctx, prefix, local_base, local_w, max_iters=3,
                                                                      capturable=True, errors=e, **refine, **p),
            "sequential_refine": lambda e, **p: distributed.sequential_refine(ctx, prefix, local_base, local_w,
                                                                              errors=e, **refine, **p),
        }
        bad = dict(temperature=[0.5, NAN, 1.0, -1.0], top_k=[-3, -1, 0, 4], top_p=[2.0, 0.5, 1.0, 1.0],
                   min_p=[0.0, 3.0, 0.0, 0.0])
        off = dict(temperature=[0.5, 0.0, 1.0, 0.0], top_k=[0, 0, 0, 4], top_p=[1.0, 0.5, 1.0, 1.0],
                   min_p=[0.0, 0.0, 0.0, 0.0])
        e = SamplingError
        words = [16 | e.TOP_K | e.TOP_P, e.TEMPERATURE | e.TOP_K | e.MIN_P, 0, e.TEMPERATURE]
        for name, call in calls.items():
            errors, params = torch.tensor([16, 0, 0, 0], dtype=torch.int32), _params("cpu", **bad)  # 16: kept (OR)
            with _unread():  # no host read, no tensor from host data: capturable on a GPU
                got = call(errors, **params)
            assert errors.tolist() == [int(w) for w in words], (name, errors.tolist())
            _assert_same(got, call(None, **_params("cpu", **off)))
            for wrong in (torch.zeros(N, dtype=torch.int64), torch.zeros(N + 1, dtype=torch.int32)):
                with pytest.raises(ValueError, match="errors"):
                    call(wrong, **_params("cpu"))
        with pytest.raises(RuntimeError, match="temperature"):  # without errors the CPU still raises
            calls["chain_verify"](None, **_params("cpu", **bad))
    finally:
        dist.destroy_process_group()


def test_sharded_functions_flag_the_per_request_values():
    import torch.multiprocessing as mp
    from tests.test_distributed import _free_port
    mp.spawn(_check_sharded_flags, args=(2, _free_port()), nprocs=2, join=True)
