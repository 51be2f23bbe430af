"""The Spiffy CUDA kernels, run by the emulation, against the references."""
import pytest
import torch

from xkernels import reference
from xkernels.spiffy import DraftGraph
from tests.test_dllm import MASK, step_case
from tests.test_spiffy import accept_case, hand_graph


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("keep", [0, 3, 8])
def test_materialize_matches_reference(emu, dtype, temperature, keep):
    logits, block = step_case(5, 12, 301, dtype, seed=keep)
    block[1] = 3  # nothing masked
    block[2, 2:] = 3  # two masked positions
    logits[3, 4] = float("nan")
    graph = hand_graph()
    got = emu.spiffy_materialize(logits, block, MASK, graph, keep, temperature)
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children, keep,
                                        temperature)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("num_sms", [0, 1, 132])
def test_materialize_splits_rows_over_slices(emu, dtype, temperature, num_sms):
    """Rows long enough for several vector-loaded slices each (row_slice_count), merged by pass 2."""
    logits, block = step_case(2, 6, 3080, dtype, seed=5)
    logits[0, 1, [100, 2900]] = 9.0  # a tie across slices
    graph = hand_graph()
    got = emu.spiffy_materialize(logits, block, MASK, graph, 4, temperature, num_sms=num_sms)
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children, 4,
                                        temperature)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("n,length,v", [(0, 4, 16), (2, 0, 16), (2, 4, 1)])
def test_materialize_edge_shapes(emu, n, length, v):
    logits, block = step_case(n, length, v, seed=1, masked_share=1.0)
    graph = hand_graph()
    got = emu.spiffy_materialize(logits, block, MASK, graph, 2)
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children, 2)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_materialize_with_many_warps_of_rows_and_a_small_vocabulary(emu):
    """More masked rows than warps, V below kSpiffyMaxRank (ranks past V cannot be filled)."""
    logits, block = step_case(2, 40, 5, seed=1)
    graph = DraftGraph([[], [(0, 0)], [(0, 4)], [(0, 0), (30, 1)]], [(0, 1), (0, 2), (1, 3)])
    got = emu.spiffy_materialize(logits, block, MASK, graph, 3)
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children, 3)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_materialize_stays_in_bounds_on_a_bad_graph(emu):
    """Values the CUDA op does not check (a host read): edges out of range, a child before its
    parent, ranks beyond the block. The kernel skips them; ASan would report a stray access."""
    logits, block = step_case(2, 6, 30, seed=2)
    graph = hand_graph()
    graph.child_ptr = torch.tensor([0, 2, 99, -5, 4, 4, 4, 4, 4, 4], dtype=torch.int32)
    graph.children = torch.tensor([1, 0, 12, 3], dtype=torch.int32)
    graph.ranks = graph.ranks.clone()
    graph.ranks[3, 0] = torch.tensor([40, 100], dtype=torch.int32)
    drafts, node_ids, _ = emu.spiffy_materialize(logits, block, MASK, graph, 4)
    assert ((node_ids >= -1) & (node_ids < len(graph))).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("threshold", [None, 0.2])
@pytest.mark.parametrize("v", [301, 304])  # 304: rows that take the vector loads
def test_accept_matches_reference(emu, dtype, temperature, threshold, v):
    args = accept_case(4, 6, 10, v, dtype, seed=2)
    args[-1][3] = 3  # nothing masked
    got = emu.spiffy_accept(*args, MASK, 1, threshold, temperature, 5, 11)
    want = reference.spiffy_accept(*args, MASK, threshold=threshold, temperature=temperature, seed=5, offset=11)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_accept_follows_a_chain_of_drafts(emu):
    logits, block = step_case(1, 10, 40, seed=4)
    chain = DraftGraph([[]] + [[(i, 0) for i in range(d)] for d in range(1, 5)], [(d, d + 1) for d in range(4)])
    drafts, node_ids, _ = reference.spiffy_materialize(logits, block, MASK, chain.ranks, chain.child_ptr,
                                                       chain.children, 4)
    draft_logits = logits[:, None].expand(1, 4, 10, 40).contiguous()
    got = emu.spiffy_accept(logits, draft_logits, drafts, node_ids, block, MASK, 2, None, 0.0, 1, 3)
    want = reference.spiffy_accept(logits, draft_logits, drafts, node_ids, block, MASK, 2, None, 0.0, 1, 3)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert int(got[0][0]) == 3 and int(got[4][0]) == 3  # steps of two tokens: the drafts of 2 and 4 tokens match


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("n,num_drafts,block_size,max_prefix", [(4, 3, 4, 13), (0, 3, 4, 13), (3, 0, 1, 0),
                                                                  (2, 2, 5, 70), (4100, 1, 4, 3)])
def test_attention_mask_matches_reference(emu, packed, n, num_drafts, block_size, max_prefix):
    """Rows longer than a warp, a grid that strides (32,800 rows over 4096 blocks of 8), empty cases."""
    lens = torch.arange(n) % (max_prefix + 1)
    got = emu.spiffy_attention_mask(lens, num_drafts, block_size, max_prefix, packed)
    if n == 0:  # the reference's packed view cannot infer a size of an empty batch
        assert got.numel() == 0
        return
    assert torch.equal(got, reference.spiffy_attention_mask(lens, num_drafts, block_size, max_prefix, packed))
