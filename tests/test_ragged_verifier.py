"""xkernels.integrations.ragged_verifier (no vLLM needed): the layout's rows built on the device, a
step equal to chain_verify_ragged_ with the streams it documents, seeds kept per request id, no host
read in a steady step, and (on CUDA) a step captured in a graph."""

import pytest
import torch

import xkernels
from tests.integrations.vllm.host_reads import count_host_reads
from tests.utils import mixed_sampling_params
from xkernels.integrations.ragged_verifier import RaggedVerifier, request_rows, row_requests

V = 40
DRAFTS = [[3, 1, 4], [], [5, 9], [], [2]]  # vLLM's example layout: bonus rows 3, 4, 7, 8, 10


def step_case(drafts, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor([len(d) for d in drafts])
    flat = torch.tensor([t for d in drafts for t in d], dtype=torch.int32)
    logits = torch.randn(int(counts.sum()) + len(drafts), V, generator=g)
    return flat.to(device), counts.cumsum(0).to(torch.int32).to(device), logits.to(device)


def test_rows_of_the_layout():
    _, cu, logits = step_case(DRAFTS)
    first, bonus = request_rows(cu)
    assert first.tolist() == [0, 4, 5, 8, 9] and bonus.tolist() == [3, 4, 7, 8, 10]
    assert row_requests(bonus, logits.shape[0]).tolist() == [0, 0, 0, 0, 1, 2, 2, 2, 3, 4, 4]
    empty = torch.zeros(0, dtype=torch.int32)
    assert [t.numel() for t in request_rows(empty)] == [0, 0] and row_requests(request_rows(empty)[1], 0).numel() == 0


def test_a_step_is_the_op_with_its_documented_streams():
    flat, cu, logits = step_case(DRAFTS, seed=1)
    params = mixed_sampling_params(len(DRAFTS), 3)
    params.pop("seed", None), params.pop("offset", None)
    verifier = RaggedVerifier(8, 6, "cpu")
    assert verifier.width == 7  # offset_advance of chain_verify_ragged at max_spec_len = 6
    verifier.set_requests(list("abcde"), lambda row: 1000 + row if row % 2 else None)
    positions = torch.tensor([5, 9, 2, 40, 7])
    verifier.set_positions(positions)
    accept_len, out = verifier.verify(flat, cu, logits, 3, **params)
    seeds = verifier.seed[:5].clone()
    assert seeds[1] == 1001 and seeds[3] == 1003
    want_out, emitted, _ = xkernels.chain_verify_ragged(flat, cu, logits, max_spec_len=3, seed=seeds,
                                                        offset=positions * 7, **params)
    assert torch.equal(out, want_out) and torch.equal(accept_len, emitted - 1)
    # the same requests in another order keep their seeds
    verifier.set_requests(list("edcba"))
    assert torch.equal(verifier.seed[:5], seeds.flip(0))


def test_a_request_gets_the_same_tokens_alone_and_in_a_batch():
    x_flat, x_cu, x_logits = step_case([[7, 7]], seed=4)
    verifier = RaggedVerifier(4, 4, "cpu")
    verifier.set_requests(["x"], lambda row: 77)
    verifier.set_positions(torch.tensor([12]))
    alone = verifier.verify(x_flat, x_cu, x_logits, 2, temperature=1.0)[1].clone()
    flat, cu, logits = step_case([[1], [7, 7], []], seed=5)
    logits[2:5] = x_logits
    verifier.set_requests(["u", "x", "w"], lambda row: 77 if row == 1 else None)
    verifier.set_positions(torch.tensor([3, 12, 30]))
    assert torch.equal(verifier.verify(flat, cu, logits, 2, temperature=1.0)[1][1], alone[0])


def test_limits_name_the_problem():
    verifier = RaggedVerifier(2, 3, "cpu")
    with pytest.raises(ValueError, match="more than max_requests = 2"):
        verifier.set_requests(list("abc"))
    flat, cu, logits = step_case([[1, 2, 3, 4]])
    with pytest.raises(ValueError, match="max_spec_len 4 is above the verifier's 3"):
        verifier.verify(flat, cu, logits, 4)
    verifier.set_requests(["a"])
    grown = verifier.resized(4)
    grown.set_requests(list("bcda"))
    assert grown.max_requests == 4 and grown.seed[3] == verifier.seed[0]  # a keeps its seed


def steady_step(device):
    """A verifier fed once, and a step of the same requests: positions in, tokens out."""
    flat, cu, logits = step_case(DRAFTS, seed=6, device=device)
    params = {k: v.to(device) for k, v in mixed_sampling_params(len(DRAFTS), 7).items() if k not in ("seed", "offset")}
    positions = torch.arange(logits.shape[0], device=device) + 20
    verifier = RaggedVerifier(8, 3, device)
    ids = list("abcde")

    def step():
        verifier.set_requests(ids)
        first, bonus = request_rows(cu)
        verifier.set_positions(positions[first])
        return verifier.verify(flat, cu, logits, 3, **params)

    step()
    return step, positions


def test_a_steady_step_makes_no_host_read():
    step, _ = steady_step("cpu")
    with count_host_reads() as seen:
        step()
    assert seen == []
    with count_host_reads() as seen:  # the counter sees what it is there to see
        torch.tensor([1, 2]).nonzero()
        torch.tensor(3).item()
    assert seen == ["nonzero", ".item()", "_local_scalar_dense"]


@pytest.mark.needs_cuda
def test_a_step_is_cuda_graph_capturable():
    from tests.utils import assert_replays_like_eager

    step, positions = steady_step("cuda")
    with count_host_reads() as seen:
        step()
    assert seen == []
    assert_replays_like_eager(step, positions)
