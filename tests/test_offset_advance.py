"""xkernels.offset_advance against the slots the ops read: two calls of a request whose offsets are
advanced by it never share a (seed, offset + slot) pair, and advanced by one less they do (inputs
chosen so that the first call reads its last slot and the second its first). The slots are those the
reference draws (sampling.RowStream), and each case checks that the op returns what the reference
does, so they are the op's."""

import pytest
import torch

import xkernels
from xkernels import reference
from xkernels.reference import chain as ref_chain
from xkernels.reference.sampling import RowStream
from tests.test_refine import make_case

SEEDS = torch.tensor([11, -5])  # two requests
PEAK = 30.0  # a logit far above the rest: the row's sample is that id, whatever the noise


def slots_read(monkeypatch, call):
    """The (seed, absolute slot) pairs the reference reads in call()."""
    seen, at = set(), RowStream._at

    def recording(self, slot):
        key = at(self, slot)
        assert self.per_request
        seen.add(key[:2])
        return key

    with monkeypatch.context() as m:
        m.setattr(RowStream, "_at", recording)
        call()
    return seen


def peaked(shape, ids):
    """Logits [..., V] of zeros with PEAK at ids [...]."""
    logits = torch.zeros(shape)
    logits.scatter_(-1, ids[..., None], PEAK)
    return logits


def chain_case(method, accept_all):
    """N = 2 chains of K = 3 drafts: every draft accepted (the bonus row's slot K is read), or the
    first rejected."""
    drafts = torch.tensor([[4, 9, 2], [7, 7, 1]])
    targets = torch.cat([drafts, torch.tensor([[3], [5]])], 1)
    logits = peaked((2, 4, 12), targets if accept_all else (targets + 1) % 12)
    op = lambda offset: xkernels.chain_verify(drafts, logits, temperature=1.0, seed=SEEDS, offset=offset,  # noqa: E731
                                              method=method)
    ref = lambda offset: reference.chain_verify(drafts, logits, temperature=1.0, seed=SEEDS, offset=offset,  # noqa: E731
                                                method=method)
    return op, ref, ((xkernels.chain_verify, drafts, logits), dict(seed=SEEDS, method=method))


def ragged_case(accept_all):
    """Requests of 3 and 0 drafts, into caller buffers (chain_verify_ragged_)."""
    drafts, cu = torch.tensor([4, 9, 2], dtype=torch.int32), torch.tensor([3, 3])
    targets = torch.tensor([4, 9, 2, 3, 6])
    logits = peaked((5, 12), targets if accept_all else (targets + 1) % 12)
    out, accept_len = torch.empty(2, 4, dtype=torch.int32), torch.empty(2, dtype=torch.int32)

    def op(offset):
        return xkernels.chain_verify_ragged_(drafts, cu, logits, out, accept_len, temperature=1.0, seed=SEEDS,
                                            offset=offset)

    def ref(offset):
        tokens, emitted, _ = ref_chain.chain_verify_ragged(drafts, cu, logits, 3, temperature=1.0, seed=SEEDS,
                                                           offset=offset)
        return emitted - 1, tokens
    return op, ref, ((xkernels.chain_verify_ragged_, drafts, cu, logits, out, accept_len), dict(seed=SEEDS))


def tree_case(accept_all):
    """A chain-shaped tree of M = 4 nodes: every child accepted (slots 1..3: the coins, then the
    bonus at node 3), or the root's child rejected (the sample at the root, slot 0)."""
    tokens = torch.tensor([[-1, 4, 9, 2]] * 2)
    parents = torch.tensor([[-1, 0, 1, 2]] * 2)
    next_ids = torch.tensor([[4, 9, 2, 3]] * 2)
    logits = peaked((2, 4, 12), next_ids if accept_all else (next_ids + 1) % 12)
    op = lambda offset: xkernels.tree_verify(tokens, parents, logits, temperature=1.0, seed=SEEDS,  # noqa: E731
                                             offset=offset)
    ref = lambda offset: reference.tree_verify(tokens, parents, logits, temperature=1.0, seed=SEEDS,  # noqa: E731
                                               offset=offset)
    return op, ref, (("tree_verify", tokens, parents, logits), dict(offset=torch.zeros(2, dtype=torch.int64)))


def refine_case(op_name):
    ctx, prev, base, weights = make_case(2, 5, 4, 40, 8, 16, seed=2)
    prefix = prev[:, :2]
    if op_name == "refine_step":
        op = lambda offset: xkernels.refine_step(ctx, prev, base, weights, temperature=1.0, seed=SEEDS,  # noqa: E731
                                                 offset=offset)
        ref = lambda offset: reference.refine_step(ctx, prev, base, weights, temperature=1.0, seed=SEEDS,  # noqa: E731
                                                   offset=offset)
        return op, ref, ((xkernels.refine_step, ctx, prev, base, weights), dict(seed=SEEDS))
    op = lambda offset: xkernels.sequential_refine(ctx, prefix, base, weights, temperature=1.0,  # noqa: E731
                                                   seed=SEEDS, offset=offset)
    ref = lambda offset: reference.sequential_refine(ctx, prefix, base, weights, temperature=1.0,  # noqa: E731
                                                     seed=SEEDS, offset=offset)
    return op, ref, ((xkernels.sequential_refine, ctx, prefix, base, weights), dict(seed=SEEDS))


def dllm_case():
    """Every position of a block of L = 5 masked: each draws its x0 (slots 0..4)."""
    logits = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(3))
    block = torch.full((2, 5), 12)
    op = lambda offset: xkernels.dllm_step(logits, block, 12, temperature=1.0, seed=SEEDS,  # noqa: E731
                                           offset=offset)
    ref = lambda offset: reference.dllm_step(logits, block, 12, temperature=1.0, seed=SEEDS,  # noqa: E731
                                             offset=offset)
    return op, ref, ((xkernels.dllm_step, logits, block, 12), dict(seed=SEEDS))


def spiffy_case(all_steps):
    """A block of L = 3 masked positions and K = 2 kept drafts that the steps reach one after the
    other: 3 steps, the last reading slot 2 L + 2; or no draft reached (one step)."""
    length, vocab, mask = 3, 8, 7
    ids = torch.tensor([1, 2, 3])
    root = torch.zeros(2, length, vocab)
    root[:, torch.arange(length), ids] = torch.tensor([PEAK, 20.0, 10.0])  # confidence falls with the position
    drafts = torch.tensor([[1, mask, mask], [1, 2, mask]]) if all_steps else torch.tensor([[5, mask, mask]] * 2)
    draft_blocks = drafts.expand(2, 2, length)
    draft_logits = root[:, None].expand(2, 2, length, vocab).contiguous()
    node_ids, block = torch.tensor([[0, 1]] * 2), torch.full((2, length), mask)
    args = (root, draft_logits, draft_blocks, node_ids, block, mask)
    op = lambda offset: xkernels.spiffy_accept(*args, temperature=1.0, seed=SEEDS, offset=offset)  # noqa: E731
    ref = lambda offset: reference.spiffy_accept(*args, temperature=1.0, seed=SEEDS, offset=offset)  # noqa: E731
    return op, ref, ((xkernels.spiffy_accept, *args), dict(seed=SEEDS))


def shard_case():
    logits = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(4))
    kw = dict(sample=True, temperature=1.0, seed=SEEDS)
    op = lambda offset: xkernels.shard_row_stats(logits, 0, offset=offset, **kw)  # noqa: E731
    ref = lambda offset: reference.shard_row_stats(logits, 0, offset=offset, **kw)  # noqa: E731
    return op, ref, ((xkernels.shard_row_stats, logits, 0), kw)


# (name, the call reading its last slot, the call reading its first slot, the advance)
CASES = [
    ("chain token", lambda: chain_case("token", True), lambda: chain_case("token", False), 4),
    ("chain block", lambda: chain_case("block", True), lambda: chain_case("block", False), 4),
    ("chain ragged_", lambda: ragged_case(True), lambda: ragged_case(False), 4),
    ("tree", lambda: tree_case(True), lambda: tree_case(False), 4),
    ("refine_step", lambda: refine_case("refine_step"), lambda: refine_case("refine_step"), 4),
    ("sequential_refine", lambda: refine_case("sequential"), lambda: refine_case("sequential"), 4),
    ("dllm_step", dllm_case, dllm_case, 5),
    ("spiffy_accept", lambda: spiffy_case(True), lambda: spiffy_case(False), 9),
    ("shard_row_stats", shard_case, shard_case, 3),
]


def outputs_equal(got, want):
    return all(torch.equal(g.cpu(), w.cpu().to(g.dtype)) or (g.is_floating_point() and torch.allclose(
        g.cpu(), w.cpu().to(g.dtype), atol=1e-4, equal_nan=True)) for g, w in zip(got, want))


@pytest.mark.parametrize("name,last,first,width", CASES, ids=[c[0] for c in CASES])
def test_the_advance_is_the_range_a_call_reads(monkeypatch, name, last, first, width):
    op_last, ref_last, ((fn, *args), kwargs) = last()
    op_first, ref_first, _ = first()
    advance = xkernels.offset_advance(fn, *args, **kwargs)
    assert advance == width
    base = torch.tensor([100, 7])
    for op, ref, offset in ((op_last, ref_last, base), (op_first, ref_first, base + advance)):
        assert outputs_equal(op(offset), ref(offset)), name  # the reference's slots are the op's
    earlier = slots_read(monkeypatch, lambda: ref_last(base))
    assert {(s, int(o) + width - 1) for s, o in zip(SEEDS.tolist(), base)} & earlier  # a last slot is read
    assert not earlier & slots_read(monkeypatch, lambda: ref_first(base + advance))
    assert earlier & slots_read(monkeypatch, lambda: ref_first(base + advance - 1))


def test_the_batch_row_form_needs_one_offset_a_call():
    drafts, logits = torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 4, 10)
    assert xkernels.offset_advance(xkernels.chain_verify, drafts, logits, seed=7, offset=torch.tensor(3)) == 1
    root = torch.zeros(1, 4, 10)
    assert xkernels.offset_advance("spiffy_accept", root, torch.zeros(1, 2, 4, 10), seed=1) == 3  # a step each
    # N = 1: a one-element tensor is the per-request form
    assert xkernels.offset_advance("chain_verify", drafts[:1], logits[:1], seed=torch.tensor([7])) == 4
    assert xkernels.offset_advance("chain_verify_ragged", drafts.reshape(-1), torch.tensor([3, 6]), logits.reshape(8, 10),
                                   max_spec_len=5, seed=torch.tensor([1, 2])) == 6


def test_bad_calls_name_the_problem():
    with pytest.raises(ValueError, match="build_draft_tree is not a random op"):
        xkernels.offset_advance(xkernels.build_draft_tree)
    with pytest.raises(ValueError, match="give max_spec_len"):
        xkernels.offset_advance("chain_verify_ragged", seed=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="give tokens"):
        xkernels.offset_advance("tree_verify", seed=torch.tensor([1, 2]))
    with pytest.raises(TypeError):
        xkernels.offset_advance("tree_verify", nodes=3)


def test_a_one_element_stream_tensor_with_several_rows_is_refused():
    drafts, logits = torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 4, 10)
    for name in ("seed", "offset"):
        with pytest.raises(ValueError, match=f"{name} is a one-element 1-D tensor but the batch has N = 2"):
            xkernels.chain_verify(drafts, logits, temperature=1.0, **{name: torch.tensor([3])})
        with pytest.raises(ValueError, match=f"{name} is a one-element 1-D tensor"):
            xkernels.dllm_step(logits, torch.zeros(2, 4, dtype=torch.int64), 99, **{name: torch.tensor([3])})
    scalar = xkernels.chain_verify(drafts, logits, temperature=1.0, seed=torch.tensor(3))  # 0-dim: batch-row form
    assert all(torch.equal(a, b) for a, b in zip(scalar, xkernels.chain_verify(drafts, logits, temperature=1.0, seed=3)))
