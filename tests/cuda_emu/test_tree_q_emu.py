"""tree_verify's CUDA kernels reading bfloat16 / float16 draft probabilities in their dtype (the
walk's q stage and scalar reads, the residual passes, the stop draw), run by the emulation: bit for
bit the results of the same values given as float32 (the binding's former copy) and the
reference's."""
import pytest
import torch

from xkernels import reference
from tests.cuda_emu import fuzz_emu
from tests.cuda_emu.emu import LaunchError
from tests.cuda_emu.test_tree_emu import _mixed_params, draft_mass_case
from tests.fuzz import harness
from tests.test_tree import verify_case

Q_DTYPES = [torch.bfloat16, torch.float16]


def _check(emu, tokens, parents, logits, q, *args, max_smem=227 * 1024, **kw):
    """The op on q (16-bit), on q widened to float32, and the reference on q: all alike."""
    got = emu.tree_verify(tokens, parents, logits, q, *args, max_smem=max_smem, **kw)
    wide = emu.tree_verify(tokens, parents, logits, q.float(), *args, max_smem=max_smem, **kw)
    want = reference.tree_verify(tokens, parents, logits, q, *args, **kw)
    for a, b, c in zip(got, wide, want):
        assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("qdtype", Q_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("v", [300, 304])  # 300: id by id; 304: every dtype's rows take the vector loads
@pytest.mark.parametrize("temperature,without_replacement", [(0.0, False), (1.0, False), (0.7, True)])
def test_tree_verify_with_16_bit_draft_probs(emu, qdtype, dtype, v, temperature, without_replacement):
    """Chains, stars and bushy trees; q far from p (so most children are rejected: residual passes
    and residual draws at the stop rows); a greedy walk reads no q."""
    for kind in ("chain", "bushy"):
        tokens, parents, logits, _ = verify_case(5, 13, v, kind, dtype, seed=len(kind))
        g = torch.Generator().manual_seed(v)
        q = torch.softmax(torch.randn(5, 13, v, generator=g) * 3, -1).to(qdtype)
        num_nodes = torch.tensor([13, 5, 1, 9, 13])
        _check(emu, tokens, parents, logits, q, without_replacement, temperature, 11, 2, num_nodes)


@pytest.mark.parametrize("qdtype", Q_DTYPES)
@pytest.mark.parametrize("dtype,v", [(torch.bfloat16, 4104), (torch.float32, 4000), (torch.float16, 4103)])
def test_tree_verify_residual_draws_from_16_bit_draft_probs(emu, qdtype, dtype, v):
    """Stars whose children are drawn from a q far from p (most rejected, often all of them): the
    residual passes and the stop draw from max(p - c q, 0), which every id's q shapes."""
    tokens, parents, logits, _ = verify_case(4, 9, v, "star", dtype, seed=v % 7)
    g = torch.Generator().manual_seed(v)
    q = torch.softmax(torch.randn(4, 9, v, generator=g) * 3, -1)
    tokens[:, 1:] = torch.multinomial(q[:, 0], 8, replacement=True, generator=g)
    for seed in range(6):
        _check(emu, tokens, parents, logits, q.to(qdtype), seed % 2 == 1, 1.0, seed, 3)


# The rounds of the q stage (q_stage_depth, at half the bytes a chunk of float32 q's): 8 chunks a
# thread a round with 227 KB (20,000 float32 ids: 2 rounds of 8-byte copies; 70,008 bf16 ids 3 of
# 16-byte ones), 16-bit logits at 99 KB, 48 KB (0) and 20,000 bytes (1 chunk at 16-bit logits).
@pytest.mark.parametrize("dtype,v,max_smem", [(torch.float32, 20000, 227 * 1024), (torch.bfloat16, 70008, 227 * 1024),
                                              (torch.float16, 20000, 99 * 1024), (torch.bfloat16, 4104, 0),
                                              (torch.float32, 4104, 20000), (torch.float16, 4104, 20000)])
@pytest.mark.parametrize("where", ["first", "last"])
def test_tree_verify_16_bit_draft_mass_in_one_chunk(emu, dtype, v, max_smem, where):
    """test_tree_emu's draft mass in one chunk with 16-bit q: a chunk whose q the copies miss or
    misplace changes q's sum or the residuals, and the walks with them."""
    tokens, parents, logits, q = draft_mass_case(v, where)
    logits = logits.to(dtype)
    qdtype = Q_DTYPES[v % 2]
    for seed in range(2):
        _check(emu, tokens, parents, logits, q.to(qdtype), seed % 2 == 1, 1.0, seed, 1, max_smem=max_smem)


@pytest.mark.parametrize("qdtype", Q_DTYPES)
@pytest.mark.parametrize("dtype,v", [(torch.float32, 304), (torch.bfloat16, 4104), (torch.float16, 4103)])
def test_tree_verify_filtered_with_16_bit_draft_probs(emu, qdtype, dtype, v):
    """test_tree_emu's mixed filters (every kind, per-request streams) with 16-bit q: the filtered
    walk's residual passes and draws read it through the cuts."""
    n = 12
    tokens, parents, logits, q = verify_case(n, 7, v, "bushy", torch.float32, seed=v + 3)
    logits = (logits * 2).to(dtype)
    params = _mixed_params(n, v)
    for without_replacement in (False, True):
        _check(emu, tokens, parents, logits, q.to(qdtype), without_replacement, **params)


def test_tree_verify_filtered_16_bit_draft_probs_need_half_the_stage(emu):
    """With 48 KB of shared memory the filtered walk's cut state leaves no room for a chunk of
    float32 q at 16-bit logits (test_tree_emu), but room for one of 16-bit q (half the bytes)."""
    tokens, parents, logits, q = verify_case(2, 5, 64, "bushy", torch.bfloat16, seed=2)
    with pytest.raises(LaunchError, match="cudaError 9"):
        emu.tree_verify(tokens, parents, logits, q, False, 1.0, 3, 1, max_smem=48 * 1024, top_k=5)
    q16 = q.to(torch.bfloat16)
    got = emu.tree_verify(tokens, parents, logits, q16, False, 1.0, 3, 1, max_smem=48 * 1024, top_k=5)
    wide = emu.tree_verify(tokens, parents, logits, q16.float(), False, 1.0, 3, 1, max_smem=99 * 1024, top_k=5)
    want = reference.tree_verify(tokens, parents, logits, q16, False, 1.0, 3, 1, top_k=5)
    for a, b, c in zip(got, wide, want):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_fuzz_cases_with_16_bit_draft_probs(emu):
    """The fuzz campaign's tree_verify cases that launch (tests/cuda_emu/fuzz_emu.py) with their q
    in 16 bits: the float32 copy's results, bit for bit, whatever q holds (negative, NaN, zero rows,
    odd shapes, unchecked values); ASan checks the reads."""
    launch = fuzz_emu.LAUNCHES["tree_verify"][0]
    tried = 0
    for index in range(150):
        spec, args, _, _, _, _ = harness.make_case("tree_verify", 3, index)
        args = fuzz_emu._launchable(spec, args)
        q = None if args is None else args.get("draft_probs")
        if not isinstance(q, torch.Tensor) or q.dtype != torch.float32:
            continue
        kind, cpu = harness._call(spec, args)
        if kind == "raised" and not fuzz_emu.VALUE_CHECKS.search(str(cpu)):
            continue  # the binding refuses it: no launch
        for qdtype in Q_DTYPES:
            q16 = q.to(qdtype)
            got = launch(emu, {**harness._clone(args), "draft_probs": q16})
            wide = launch(emu, {**harness._clone(args), "draft_probs": q16.float()})
            for a, b in zip(got, wide):
                assert torch.equal(a, b), f"case {index}"
        tried += 1
    assert tried >= 20, f"only {tried} cases launched"


def _settled_star_case(n, m, v, dtype, seed):
    """Stars whose children are drawn from a q far from p (most rejected, often all: residual sums
    after each rejection and residual draws at the stop rows), with top-k cuts the candidates settle
    (alone, with top-p, with min-p, top-k 1) and per-request streams."""
    tokens, parents, logits, _ = verify_case(n, m, v, "star", dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 1000)  # not verify_case's stream: q apart from p
    q = torch.softmax(torch.randn(n, m, v, generator=g) * 3, -1)
    tokens[:, 1:] = torch.multinomial(q[:, 0], m - 1, replacement=True, generator=g)
    params = dict(temperature=torch.tensor([1.0, 0.8, 1.1, 1.0]), top_k=torch.tensor([10, 64, 30, 1]),
                  top_p=torch.tensor([1.0, 0.9, 0.8, 1.0]), min_p=torch.tensor([0.0, 0.0, 0.05, 0.0]),
                  seed=torch.arange(n) + seed, offset=torch.arange(n) * 3)
    return tokens, parents, logits, q, params


@pytest.mark.parametrize("qdtype", [torch.float32] + Q_DTYPES)
@pytest.mark.parametrize("dtype,v", [(torch.bfloat16, 8200), (torch.float32, 3001), (torch.float16, 4103)])
def test_tree_verify_settled_rows_with_draft_probs_take_no_pass(emu, qdtype, dtype, v):
    """Top-k cuts the candidates settle, with draft_probs: the residual sums after rejections are taken
    over the kept ids (q gathered there), the stop draws (from p' or from the residual) in the walk,
    so no row pass is counted beyond the walk's statistics pass (and its read of q's sum), at M = 1
    too; rows read as vectors (V = 8200) and id by id (3001, 4103). With one q below 0 in each row
    (an id the cut drops then adds to the residual) the same walks stream the row and q for their
    residual sums and draws as before. Both bitwise as the reference."""
    n = 4
    tokens, parents, logits, q, params = _settled_star_case(n, 9, v, dtype, seed=v % 11)
    q = q.to(qdtype)
    for without_replacement in (False, True):
        for m in (9, 1):
            args = (tokens[:, :m], parents[:, :m], logits[:, :m], q[:, :m], without_replacement)
            emu.take_row_passes()
            got = emu.tree_verify(*args, **params)
            assert emu.take_row_passes() == 0
            want = reference.tree_verify(*args, **params)
            for a, b in zip(got, want):
                assert torch.equal(a, b)
        negative = q.clone()
        negative[:, :, v // 2] = -1e-4
        args = (tokens, parents, logits, negative, without_replacement)
        emu.take_row_passes()
        got = emu.tree_verify(*args, **params)
        passes = emu.take_row_passes()
        want = reference.tree_verify(*args, **params)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        rejected = int((got[0] == 0).sum())  # every child of the root rejected: residual sums, a residual draw
        assert rejected > 0 and passes >= rejected
