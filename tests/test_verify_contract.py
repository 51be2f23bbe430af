"""The verify ops' input and output contract (issue 44, section 1): draft probabilities in float32,
bfloat16 or float16, read in their dtype (the same results as the same values in float32), and
chain_verify_ragged_'s log-probabilities only when a buffer is given."""
import pytest
import torch

import xkernels
from xkernels import reference
from xkernels.reference import chain as ref_chain
from tests.test_chain_verify import make_case
from tests.test_tree import verify_case
from tests.utils import DEVICES

Q_DTYPES = [torch.bfloat16, torch.float16]


def _q16(q, dtype):
    """q in dtype, and the same values in float32 (every 16-bit value is one float32)."""
    q16 = q.to(dtype)
    return q16, q16.float()


def peaked_q_case(n, k, v, seed, dtype=torch.float32):
    """Drafts drawn from a peaked q that the target does not share: rejections and residual draws
    are common, so q decides the tokens."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k + 1, v, generator=g).to(dtype)
    q = torch.softmax(torch.randn(n, k, v, generator=g) * 3, -1)
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(n, k) if n * k else torch.zeros(
        n, k, dtype=torch.int64)
    return drafts, logits, q


def _ragged_case(device, seed=0):
    """A flat batch with requests of 3, 0, 2 and 4 drafts; q rows of the drafts."""
    drafts, logits, q = peaked_q_case(4, 4, 57, seed)
    counts = torch.tensor([3, 0, 2, 4])
    keep = torch.arange(4)[None, :] < counts[:, None]
    rows = torch.cat([logits[i, :c + 1] for i, c in enumerate(counts.tolist())])
    cu = counts.cumsum(0)
    return [t.to(device) for t in (drafts[keep], cu, rows, q[keep])]


def _same(got, want):
    """Equal outputs, bit for bit (NaN padding equal to NaN padding)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g.nan_to_num(7.0), w.nan_to_num(7.0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("q_dtype", Q_DTYPES)
@pytest.mark.parametrize("kw", [dict(temperature=1.0, seed=3, offset=1), dict(temperature=0.6, seed=9),
                                dict(temperature=0.8, seed=torch.tensor([5, 6, 7, 8]), offset=torch.arange(4),
                                     top_k=12, top_p=0.9, method="block", return_logprobs=True),
                                dict(temperature=1.0, min_p=0.05, return_logprobs=True)])
def test_chain_verify_reads_16_bit_draft_probs(device, q_dtype, kw):
    drafts, logits, q = peaked_q_case(4, 5, 300, 11, torch.bfloat16)
    q16, q32 = _q16(q, q_dtype)
    kw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    drafts, logits = drafts.to(device), logits.to(device)
    got = xkernels.chain_verify(drafts, logits, draft_probs=q16.to(device), **kw)
    want = xkernels.chain_verify(drafts, logits, draft_probs=q32.to(device), **kw)
    _same(got, want)
    # the reference takes the 16-bit q too, as its float32 values
    ref_kw = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    ref = reference.chain_verify(drafts.cpu(), logits.cpu(), q16, **ref_kw)
    assert torch.equal(got[1].cpu(), ref[1]) and torch.equal(got[0].cpu(), ref[0])


def test_a_case_where_q_decides():
    """The 16-bit cases above would pass with q ignored if q never decided: here it does (the
    tokens differ from those of another q), so they compare what q makes."""
    drafts, logits, q = peaked_q_case(4, 5, 300, 11, torch.bfloat16)
    other = torch.softmax(torch.randn(q.shape, generator=torch.Generator().manual_seed(1)), -1)
    a = xkernels.chain_verify(drafts, logits, draft_probs=q.bfloat16(), temperature=1.0, seed=3, offset=1)
    b = xkernels.chain_verify(drafts, logits, draft_probs=other.bfloat16(), temperature=1.0, seed=3, offset=1)
    assert not torch.equal(a[1], b[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("q_dtype", Q_DTYPES)
@pytest.mark.parametrize("method", ["token", "block"])
def test_chain_verify_ragged_reads_16_bit_draft_probs(device, q_dtype, method):
    drafts, cu, logits, q = _ragged_case(device, seed=4)
    q16, q32 = _q16(q, q_dtype)
    n = cu.shape[0]
    kw = dict(temperature=torch.tensor([1.0, 0.7, 0.0, 1.2], device=device), top_k=torch.tensor([0, 5, 0, 30],
              device=device), seed=torch.arange(n, device=device) + 17, offset=torch.full((n,), 3, device=device),
              method=method)
    got = xkernels.chain_verify_ragged(drafts, cu, logits, max_spec_len=4, draft_probs=q16, **kw)
    want = xkernels.chain_verify_ragged(drafts, cu, logits, max_spec_len=4, draft_probs=q32, **kw)
    _same(got, want)
    ref = ref_chain.chain_verify_ragged(*[t.cpu() for t in (drafts, cu, logits)], 4, q16.cpu(),
                                        **{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
    assert torch.equal(got[0].cpu(), ref[0]) and torch.equal(got[1].cpu(), ref[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("q_dtype", Q_DTYPES)
@pytest.mark.parametrize("without_replacement", [False, True])
def test_tree_verify_reads_16_bit_draft_probs(device, q_dtype, without_replacement):
    tokens, parents, logits, q = [t.to(device) for t in verify_case(3, 9, 40, "bushy", seed=2)]
    q16, q32 = _q16(q, q_dtype)
    kw = dict(without_replacement=without_replacement, temperature=0.9, seed=torch.tensor([1, 2, 3], device=device),
              offset=torch.tensor([0, 9, 18], device=device))
    got = xkernels.tree_verify(tokens, parents, logits, draft_probs=q16, **kw)
    want = xkernels.tree_verify(tokens, parents, logits, draft_probs=q32, **kw)
    _same(got, want)


def _verify_with_q(op, cast):
    """One call of op with draft probabilities cast(q) (q float32 of the op's shape)."""
    if op == "tree_verify":
        tokens, parents, logits, q = verify_case(2, 4, 10, "chain")
        return xkernels.tree_verify(tokens, parents, logits, draft_probs=cast(q), temperature=1.0)
    drafts, logits, q = make_case(2, 3, 10, torch.float32, True)
    if op == "chain_verify":
        return xkernels.chain_verify(drafts, logits, draft_probs=cast(q), temperature=1.0)
    return xkernels.chain_verify_ragged_(drafts.reshape(-1), torch.tensor([3, 6]), logits.reshape(8, 10),
                                         torch.empty(2, 4, dtype=torch.int32), torch.empty(2, dtype=torch.int32),
                                         draft_probs=cast(q.reshape(6, 10)), temperature=1.0)


@pytest.mark.parametrize("op", ["chain_verify", "chain_verify_ragged_", "tree_verify"])
def test_other_draft_prob_dtypes_name_the_argument(op):
    for cast in (torch.Tensor.double, lambda q: (q * 100).to(torch.uint8)):
        with pytest.raises(RuntimeError, match="draft_probs must be float32, bfloat16 or float16"):
            _verify_with_q(op, cast)
    _verify_with_q(op, torch.Tensor.half)  # the three dtypes pass


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["token", "block"])
def test_ragged_log_probabilities_only_when_asked(device, method):
    """Without a logprobs buffer the tokens and counts are those with one; the fake and the
    reference say the same (None)."""
    drafts, cu, logits, q = _ragged_case(device, seed=6)
    n = cu.shape[0]
    kw = dict(draft_probs=q, temperature=0.9, top_p=0.95, seed=torch.arange(n, device=device),
              offset=torch.zeros(n, dtype=torch.int64, device=device), method=method)
    buffers = lambda: (torch.full((n, 5), 99, dtype=torch.int32, device=device),  # noqa: E731
                       torch.full((n,), 99, dtype=torch.int32, device=device))
    lp = torch.full((n, 5), 3.0, device=device)
    with_lp = xkernels.chain_verify_ragged_(drafts, cu, logits, *buffers(), logprobs=lp, **kw)
    without = xkernels.chain_verify_ragged_(drafts, cu, logits, *buffers(), **kw)
    assert len(with_lp) == 3 and len(without) == 2
    _same(without, with_lp[:2])
    ref = ref_chain.chain_verify_ragged(*[t.cpu() for t in (drafts, cu, logits)], 4, q.cpu(),
                                        **{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kw.items()
                                           if k != "draft_probs"}, return_logprobs=False)
    assert ref[2] is None and torch.equal(ref[0], without[1].cpu()) and torch.equal(ref[1] - 1, without[0].cpu())
    # chain_verify's engine form passes no buffer unless return_logprobs
    d, t, qq = make_case(3, 4, 50, torch.float32, True, seed=1)
    a = xkernels.chain_verify(d, t, draft_probs=qq, temperature=1.0, top_k=5, method=method)
    b = xkernels.chain_verify(d, t, draft_probs=qq, temperature=1.0, top_k=5, method=method, return_logprobs=True)
    assert len(a) == 2 and len(b) == 3
    _same(a, b[:2])


def _ragged_op_args(q, logprobs):
    n, vocab, width = 2, 10, 3
    return (torch.tensor([1, 2, 3]), torch.tensor([2, 3]), torch.randn(5, vocab), 2, q, 1.0, torch.tensor([0.5, 0.0]),
            0, torch.tensor([3, 0]), 0.9, None, 0.0, None, 3, torch.tensor([1, 2]), 0, torch.tensor([5, 6]), True,
            torch.empty(n, width, dtype=torch.int32), torch.empty(n, dtype=torch.int32),
            torch.empty(n, width) if logprobs else None)


@pytest.mark.parametrize("q_dtype", [torch.float32] + Q_DTYPES)
def test_opcheck(q_dtype):
    drafts, logits, q = make_case(4, 3, 33, torch.float32, True)
    torch.library.opcheck(torch.ops.xkernels.chain_verify.default,
                          (drafts, logits, q.to(q_dtype), 1.0, 1, 2, None, None))
    for logprobs in (True, False):
        args = _ragged_op_args(torch.softmax(torch.randn(3, 10), -1).to(q_dtype), logprobs)
        torch.library.opcheck(torch.ops.xkernels.chain_verify_ragged_.default, args)
    tokens, parents, t_logits, tq = verify_case(3, 9, 20, "bushy")
    torch.library.opcheck(torch.ops.xkernels.tree_verify.default,
                          (tokens, parents, t_logits, tq.to(q_dtype), True, None, 1.0, None, 0, None, 1.0, None, 0.0,
                           None, 1, None, 2, None))
