"""filter_order, the order of the filters (reference.sampling.filter_mask): "top_k_first", the
default, or vLLM's "min_p_first", through every sampling op on the CPU. Where min-p and top-p are
both on the two orders keep different ids; each op then equals its reference in the order asked,
its default call is the "top_k_first" one, a bad value raises naming the argument, and opcheck
passes with "min_p_first"."""
import pytest
import torch

import xkernels
from xkernels.reference import chain as ref_chain
from xkernels.reference import sampling
from tests.test_error_flags import N, SCHEMA_OPS, SEQUENCE_OPS, _sequence_case, _sequence_op_args
from tests.test_verify_contract import _ragged_case, _same

# Flat rows (high temperatures) with min-p and top-p on in every sequence and a top-k in one: the
# orders keep different ids in many of the rows each op reads.
PARAMS = dict(temperature=torch.tensor([3.0, 2.0, 3.0, 2.0]), top_k=torch.tensor([0, 0, 0, 12]),
              top_p=torch.tensor([0.5, 0.5, 0.5, 0.5]), min_p=torch.tensor([0.3, 0.3, 0.3, 0.3]))
MIN_P_FIRST = {**PARAMS, "filter_order": "min_p_first"}


def _assert_close(got, want):
    """Token ids equal; log-probabilities, confidences and scores within float32 rounding."""
    for a, b in zip(got, want, strict=True):
        if a.is_floating_point():
            torch.testing.assert_close(a.cpu(), b.cpu(), atol=1e-4, rtol=1e-4, equal_nan=True)
        else:
            assert torch.equal(a.cpu(), b.cpu())


def _differ(got, want) -> bool:
    return any(not torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) for a, b in zip(got, want, strict=True))


def _reference_and_rows(reference_call, params, monkeypatch):
    """reference_call(params)'s outputs and the rows it filtered, each as filter_mask's (a, top_k,
    top_p, min_p)."""
    rows, mask = [], sampling.filter_mask

    def record(a, top_k=0, top_p=1.0, min_p=0.0, filter_order="top_k_first"):
        rows.append((a.clone(), top_k, top_p, min_p))
        return mask(a, top_k, top_p, min_p, filter_order)

    with monkeypatch.context() as m:
        m.setattr(sampling, "filter_mask", record)
        return reference_call(params, None), rows


@pytest.mark.parametrize("op", SEQUENCE_OPS)
def test_min_p_first_matches_the_reference(op, monkeypatch):
    call, reference_call = _sequence_case(op, "cpu")
    want, rows = _reference_and_rows(reference_call, MIN_P_FIRST, monkeypatch)
    # The case can tell the orders apart: they keep different ids in a row the op reads, and the
    # reference's results differ.
    mask = sampling.filter_mask
    assert any(not torch.equal(mask(*row, "top_k_first"), mask(*row, "min_p_first")) for row in rows)
    assert _differ(want, reference_call(PARAMS, None))
    _assert_close(call(MIN_P_FIRST, None), want)


@pytest.mark.parametrize("op", SEQUENCE_OPS)
def test_the_default_is_top_k_first(op):
    call, reference_call = _sequence_case(op, "cpu")
    got = call(PARAMS, None)
    _same(got, call({**PARAMS, "filter_order": "top_k_first"}, None))
    _assert_close(got, reference_call(PARAMS, None))


@pytest.mark.parametrize("inplace", [False, True])
def test_the_ragged_forms_pass_it(inplace):
    drafts, cu, logits, q = _ragged_case("cpu", seed=5)
    stream = dict(seed=torch.tensor([11, 12, 13, 14]), offset=torch.arange(4) * 5)

    def call(**params):
        if inplace:
            out, accept = torch.empty(N, 5, dtype=torch.int32), torch.empty(N, dtype=torch.int32)
            accept, out, logprobs = xkernels.chain_verify_ragged_(drafts, cu, logits, out, accept,
                                                                  logprobs=torch.empty(N, 5), draft_probs=q,
                                                                  **stream, **params)
            return out, accept + 1, logprobs  # as chain_verify_ragged counts them
        return xkernels.chain_verify_ragged(drafts, cu, logits, max_spec_len=4, draft_probs=q, **stream, **params)

    want = ref_chain.chain_verify_ragged(drafts, cu, logits, 4, q, **stream, **MIN_P_FIRST)
    assert _differ(want, ref_chain.chain_verify_ragged(drafts, cu, logits, 4, q, **stream, **PARAMS))
    _assert_close(call(**MIN_P_FIRST), want)
    _same(call(**PARAMS), call(**PARAMS, filter_order="top_k_first"))


@pytest.mark.parametrize("op", SEQUENCE_OPS)
@pytest.mark.parametrize("bad", ["vllm", "TOP_K_FIRST", "", None])
def test_a_bad_filter_order_raises_naming_it(op, bad):
    call, reference_call = _sequence_case(op, "cpu")
    for fn in (call, reference_call):
        with pytest.raises(ValueError, match="filter_order"):
            fn({**PARAMS, "filter_order": bad}, None)
    if isinstance(bad, str):  # the op itself, below the wrapper's check
        schema_op = getattr(torch.ops.xkernels, SCHEMA_OPS.get(op, op)).default
        with pytest.raises(RuntimeError, match='filter_order must be "top_k_first" or "min_p_first"'):
            schema_op(*_sequence_op_args(op, torch.zeros(N, dtype=torch.int32)), bad)


def test_a_bad_filter_order_raises_in_the_unfiltered_and_ragged_forms():
    drafts, cu, logits, q = _ragged_case("cpu")
    with pytest.raises(ValueError, match="filter_order"):  # the plain form: no filters, still checked
        xkernels.chain_verify(drafts[:4].reshape(2, 2), logits[:6].reshape(2, 3, -1), filter_order="vllm")
    with pytest.raises(ValueError, match="filter_order"):
        xkernels.chain_verify_ragged(drafts, cu, logits, max_spec_len=4, filter_order="vllm")
    with pytest.raises(ValueError, match="filter_order"):
        xkernels.chain_verify_ragged_(drafts, cu, logits, torch.empty(N, 5, dtype=torch.int32),
                                      torch.empty(N, dtype=torch.int32), filter_order="vllm")


@pytest.mark.parametrize("op", SEQUENCE_OPS)
def test_opcheck_and_fake(op):
    from torch._subclasses.fake_tensor import FakeTensorMode
    schema_op = getattr(torch.ops.xkernels, SCHEMA_OPS.get(op, op)).default
    args = _sequence_op_args(op, torch.zeros(N, dtype=torch.int32))
    torch.library.opcheck(schema_op, args + ("min_p_first",))
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        schema_op(*fake, "min_p_first")
        with pytest.raises(ValueError, match="filter_order"):
            schema_op(*fake, "vllm")


# p of six ids, ranked 1, 3, 5, 0, 4, 2: min_p 0.2 drops p < 0.08 (ids 4 and 2), top_p 0.7.
HAND_PROBS = torch.tensor([0.10, 0.40, 0.04, 0.25, 0.06, 0.15])


@pytest.mark.parametrize("top_p,min_p,top_k_first,min_p_first", [
    # top-p over every id: 0.40, 0.65, 0.80 reaches 0.7 at id 5; then min-p keeps all three. vLLM's:
    # min-p keeps 1, 3, 5, 0 (mass 0.90), then top-p over them: 0.40 / 0.9, 0.65 / 0.9 = 0.72 >= 0.7.
    (0.7, 0.2, [1, 3, 5], [1, 3]),
    (1.0, 0.2, [1, 3, 5, 0], [1, 3, 5, 0]),  # one filter alone: the same in both orders
    (0.7, 0.0, [1, 3, 5], [1, 3, 5]),
])
def test_filter_mask_by_hand(top_p, min_p, top_k_first, min_p_first):
    a = HAND_PROBS.log()
    for order, kept in (("top_k_first", top_k_first), ("min_p_first", min_p_first)):
        assert sampling.filter_mask(a, 0, top_p, min_p, order).nonzero().flatten().tolist() == sorted(kept), order
