"""xkernels.compat.flashinfer.chain_speculative_sampling against FlashInfer's documented semantics."""

import torch
from scipy import stats

import xkernels
from xkernels.compat import flashinfer


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
