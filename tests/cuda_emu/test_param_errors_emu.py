"""param_errors_kernel (the asynchronous error flag of dllm_step, the Spiffy ops and the refine ops),
run by the emulation: its words are the reference's bits OR-ed onto the words held."""
import pytest
import torch

from xkernels.errors import SamplingError
from xkernels.reference import param_errors

NAN, INF = float("nan"), float("inf")


def _rows(n, seed):
    """Per-row values over n rows, about a third of each parameter's invalid (the kinds the bits
    name, NaN among them), the rest valid, top_k partly past int32."""
    g = torch.Generator().manual_seed(seed)
    pick = lambda values: torch.tensor(values)[torch.randint(len(values), (n,), generator=g)]  # noqa: E731
    rows = dict(temperature=pick([0.0, 0.7, 1e-40, 2.0, NAN, INF, -INF, -0.5]),
                top_k=pick([0, 3, 2**40, -1, -2**40]),
                top_p=pick([1.0, 0.5, 1e-7, 0.0, 1.5, -0.2, NAN]),
                min_p=pick([0.0, 1.0, 0.3, -0.1, 1.01, NAN]))
    for name, bad in dict(temperature=NAN, top_k=-1, top_p=0.0, min_p=NAN).items():
        rows[name][0] = bad  # row 0 flags every parameter
    return rows


@pytest.mark.parametrize("n", [1, 7, 256, 257, 600])  # one block, a partial one, several
@pytest.mark.parametrize("given", ["all", "temperature", "top_k", "top_p", "min_p"])
def test_the_bits_are_the_references_on_top_of_the_held_ones(emu, n, given):
    rows = _rows(n, seed=n)
    if given != "all":
        rows = {given: rows[given]}
    g = torch.Generator().manual_seed(n + 1)
    held = torch.randint(0, 64, (n,), generator=g, dtype=torch.int32)  # bits of ours and others (16, 32)
    held[0] = 16
    want = held | param_errors(n, **rows)
    assert torch.equal(emu.param_errors(held.clone(), **rows), want)
    assert want[0] != held[0]


def test_no_per_row_tensor_no_bits(emu):
    held = torch.tensor([0, 5, 16], dtype=torch.int32)
    assert torch.equal(emu.param_errors(held.clone(), temperature=0.7, top_k=3), held)


def test_an_empty_batch(emu):
    rows = {k: v[:0] for k, v in _rows(4, seed=2).items()}
    assert emu.param_errors(torch.zeros(0, dtype=torch.int32), **rows).shape == (0,)


def test_each_bit_alone(emu):
    e = SamplingError
    rows = dict(temperature=torch.tensor([NAN, 1.0, 1.0, 1.0, 1.0]), top_k=torch.tensor([0, -1, 0, 0, 0]),
                top_p=torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0]), min_p=torch.tensor([0.0, 0.0, 0.0, 2.0, 0.0]))
    words = emu.param_errors(torch.zeros(5, dtype=torch.int32), **rows).tolist()
    assert [SamplingError(w) for w in words] == [e.TEMPERATURE, e.TOP_K, e.TOP_P, e.MIN_P, e(0)]
