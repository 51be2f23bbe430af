"""xkernels.compat.flashinfer.chain_speculative_sampling against FlashInfer's documented semantics."""

import pytest
import torch
from scipy import stats

import xkernels
from xkernels.compat import flashinfer
from tests.test_distributed import _unread
from tests.utils import assert_replays_like_eager


def _inputs(b, k, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(b, k + 1, vocab, generator=g), -1)
    draft = torch.softmax(torch.randn(b, k, vocab, generator=g), -1)
    ids = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(b, k).to(torch.int32)
    return draft, ids, target


def test_outputs_and_counters_in_place():
    draft, ids, target = _inputs(64, 4, 30, 0)
    accepted = torch.zeros(64, dtype=torch.int32)
    emitted = torch.zeros(64, dtype=torch.int32)
    out, acc, emi = flashinfer.chain_speculative_sampling(draft, ids, target, accepted, emitted, seed=5, offset=2)
    assert acc is accepted and emi is emitted and out.dtype == torch.int32 and out.shape == (64, 5)
    want_len, want_out = xkernels.chain_verify(ids.long(), torch.log(target), draft_probs=draft, temperature=1.0,
                                               seed=5, offset=2)
    assert torch.equal(out.long(), want_out) and torch.equal(emitted.long(), want_len)
    assert ((out >= 0).sum(1) == emitted + 1).all()  # emitted excludes the bonus token
    assert (accepted >= emitted).all() and (accepted > emitted).any()  # counted past the first rejection
    flashinfer.chain_speculative_sampling(draft, ids, target, accepted, emitted, seed=5, offset=2)
    assert torch.equal(emitted.long(), 2 * want_len)  # added to, as FlashInfer does


def test_first_token_follows_the_target():
    b, vocab = 20000, 6
    draft, _, target = _inputs(1, 1, vocab, 1)
    draft, target = draft.expand(b, -1, -1), target.expand(b, -1, -1)
    ids = torch.multinomial(draft[:, 0], 1, generator=torch.Generator().manual_seed(2)).to(torch.int32)
    out, _, _ = flashinfer.chain_speculative_sampling(draft, ids, target, seed=torch.arange(b),
                                                      offset=torch.zeros(b, dtype=torch.int64))
    counts = torch.bincount(out[:, 0].long(), minlength=vocab).double()
    expected = target[0, 0].double() / target[0, 0].double().sum() * b
    assert stats.chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-4


def _streams(b, device="cpu"):
    """Every seed form FlashInfer takes, with an offset of the same form."""
    return [dict(seed=None, offset=None), dict(seed=5, offset=2),
            dict(seed=torch.tensor(5, device=device), offset=torch.tensor(2, device=device)),
            dict(seed=torch.tensor([5], device=device), offset=torch.tensor([2], device=device)),
            dict(seed=torch.arange(b, device=device), offset=torch.zeros(b, dtype=torch.int64, device=device))]


def test_reads_nothing_on_the_host():
    """No .item() / .tolist() / int() of a tensor and no tensor made from host data, in every seed
    form (seed None included: drawn on the device): on a GPU each would sync the host."""
    draft, ids, target = _inputs(6, 3, 20, 3)
    accepted, emitted = torch.zeros(6, dtype=torch.int32), torch.zeros(6, dtype=torch.int32)
    for rng in _streams(6):
        want = flashinfer.chain_speculative_sampling(draft, ids, target, **rng) if rng["seed"] is not None else None
        with _unread():
            out, acc, emi = flashinfer.chain_speculative_sampling(draft, ids, target, accepted, emitted, **rng)
        assert out.shape == (6, 4) and acc is accepted and emi is emitted
        if want is not None:
            assert torch.equal(out, want[0])


@pytest.mark.needs_cuda
def test_captures_in_a_cuda_graph():
    """Captured once, replayed as the offset tensor advances in place: the eager call's results; and
    with seed None (drawn on the device) the capture succeeds and each replay gives a valid chain."""
    draft, ids, target = (t.cuda() for t in _inputs(6, 3, 20, 3))
    seed, offset = torch.tensor(5, device="cuda"), torch.tensor(2, device="cuda")
    assert_replays_like_eager(lambda: flashinfer.chain_speculative_sampling(draft, ids, target, seed=seed,
                                                                            offset=offset), offset)
    for rng in _streams(6, "cuda")[:1] + _streams(6, "cuda")[3:]:
        step = lambda: flashinfer.chain_speculative_sampling(draft, ids, target, **rng)  # noqa: E731
        step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, _, emitted = step()
        graph.replay()
        assert ((out >= 0).sum(1) == emitted + 1).all()
