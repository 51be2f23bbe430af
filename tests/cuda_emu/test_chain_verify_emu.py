"""chain_verify's CUDA kernels, run by the emulation, against the reference."""
import pytest
import torch

from xkernels import reference
from tests.test_chain_verify import make_case
from tests.test_verify_contract import peaked_q_case

# (N, K, V): tails of the 16-byte chunks, one id, rows longer than 32 (two warp rounds of the walk),
# many slices per row (num_sms), a batch over several warps of chain_walk, and vocabularies whose
# rows take the 16-byte vector loads (V a multiple of 8).
# The last one takes several vector-loaded slices a row (row_slice_count: V / 1024 of them at most).
SHAPES = [(3, 5, 37), (2, 1, 1), (1, 40, 19), (9, 4, 1030), (33, 2, 65), (3, 2, 1024), (2, 3, 72), (2, 2, 4104)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature,with_q", [(0.0, False), (1.0, False), (1.0, True), (0.6, True)])
@pytest.mark.parametrize("num_sms", [1, 64])
def test_matches_reference(emu, shape, dtype, temperature, with_q, num_sms):
    drafts, logits, q = make_case(*shape, dtype, with_q, seed=sum(shape))
    for seed, offset in [(3, 1), (2**63 + 5, 2**40 + 1)]:
        got = emu.chain_verify(drafts, logits, q, temperature, seed, offset, num_sms=num_sms)
        want = reference.chain_verify(drafts, logits, q, temperature, seed, offset)
        assert torch.equal(got[0], want[0])
        assert torch.equal(got[1], want[1])


# 32 rows on one SM make one slice a row (row_slice_count), so a thread of row_stats reads floor or
# ceil(chunks / 256) chunks of 8 ids: 1-2, 4-5 (one round of the pipelined read, and one more),
# 8-9, and an unaligned row read id by id.
@pytest.mark.parametrize("v", [2048 + 24, 4 * 2048 + 800, 8 * 2048 + 56, 4 * 2048 + 801])
@pytest.mark.parametrize("temperature,with_q", [(0.0, False), (0.7, True)])
def test_reads_across_round_boundaries(emu, v, temperature, with_q):
    drafts, logits, q = make_case(8, 3, v, torch.bfloat16, with_q, seed=v)
    got = emu.chain_verify(drafts, logits, q, temperature, 3, 1, num_sms=1)
    want = reference.chain_verify(drafts, logits, q, temperature, 3, 1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_seed_and_offset_tensors(emu):
    drafts, logits, q = make_case(4, 3, 50, torch.float32, True, seed=2)
    got = emu.chain_verify(drafts, logits, q, 1.0, 0, 0, seed_tensor=torch.tensor([11]),
                           offset_tensor=torch.tensor([4]))
    want = reference.chain_verify(drafts, logits, q, 1.0, 11, 4)
    assert torch.equal(got[1], want[1])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_out_of_range_drafts_are_rejected_unread(emu, temperature):
    drafts, logits, q = make_case(4, 3, 20, torch.float32, True, seed=3)
    drafts[0, 0], drafts[1, 1], drafts[2, 2] = -1, 20, 2**40
    accept_len, out = emu.chain_verify(drafts, logits, q, temperature)
    assert accept_len[0] == 0 and accept_len[1] <= 1 and accept_len[2] <= 2
    assert ((out >= -1) & (out < 20)).all()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_degenerate_rows(emu, temperature):
    logits = torch.randn(3, 3, 9)
    logits[0, 0] = float("-inf")
    logits[1, 1, 4] = float("nan")
    logits[2, 0, 2] = float("inf")
    drafts = torch.tensor([[0, 1], [2, 4], [2, 3]])
    got = emu.chain_verify(drafts, logits, None, temperature, 5, 1)
    want = reference.chain_verify(drafts, logits, None, temperature, 5, 1)
    assert torch.equal(got[1], want[1])


# Empty batches, no drafts, one-id vocabularies, and SM counts from none to absurd: the launcher's
# planning (row_slice_count, the workspace layout) is the one the CUDA binding runs.
@pytest.mark.parametrize("shape", [(0, 3, 50), (2, 0, 50), (0, 0, 1), (3, 2, 1), (1, 1, 8)])
@pytest.mark.parametrize("num_sms", [0, 1, 132, 1 << 20])
@pytest.mark.parametrize("temperature,with_q", [(0.0, False), (1.0, True)])
def test_edge_shapes(emu, shape, num_sms, temperature, with_q):
    drafts, logits, q = make_case(*shape, torch.bfloat16, with_q, seed=1)
    got = emu.chain_verify(drafts, logits, q, temperature, 3, 1, num_sms=num_sms)
    want = reference.chain_verify(drafts, logits, q, temperature, 3, 1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_ties_and_nan_inside_vector_chunks(emu):
    """The chunked argmax (a chunk's max first, its index only when it wins) keeps torch.argmax's
    rules: the lowest index among equal maxima, across chunks and slices, and the first NaN."""
    logits = torch.zeros(3, 2, 2048)
    logits[0, 0, [5, 13, 1500]] = 2.0  # a tie inside one chunk, another chunk, another slice
    logits[1, 0, [9, 700]] = float("nan")
    logits[1, 0, 3] = 5.0
    logits[2, 0] = float("-inf")
    logits[2, 1, 1024:] = float("-inf")
    drafts = torch.tensor([[5], [9], [0]])
    for temperature in (0.0, 1.0):
        got = emu.chain_verify(drafts, logits.bfloat16(), None, temperature, 4, 2, num_sms=64)
        want = reference.chain_verify(drafts, logits.bfloat16(), None, temperature, 4, 2)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# Draft probabilities in bfloat16 / float16, read in their dtype: sample_slices' loads of 4 ids of q
# at once (V a multiple of 4 with aligned rows) and id by id (the rest), chain_walk's q(x). The
# tokens are those of the same values in float32 (the conversion is exact), and the reference's.
@pytest.mark.parametrize("shape", [(3, 5, 37), (2, 3, 72), (2, 2, 4104), (1, 1, 1), (0, 2, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
def test_16_bit_draft_probs(emu, shape, dtype, q_dtype):
    drafts, logits, q = peaked_q_case(*shape, seed=sum(shape), dtype=dtype)
    q16 = q.to(q_dtype)
    for temperature, num_sms in [(1.0, 64), (0.6, 1)]:
        got = emu.chain_verify(drafts, logits, q16, temperature, 3, 1, num_sms=num_sms)
        want = emu.chain_verify(drafts, logits, q16.float(), temperature, 3, 1, num_sms=num_sms)
        ref = reference.chain_verify(drafts, logits, q16, temperature, 3, 1)
        for g, w, r in zip(got, want, ref):
            assert torch.equal(g, w) and torch.equal(g, r)
