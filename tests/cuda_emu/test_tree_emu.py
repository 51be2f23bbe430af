"""The draft-tree CUDA kernels, run by the emulation, against the references."""
import pytest
import torch

import xkernels
from xkernels import reference
from tests.cuda_emu.emu import LaunchError
from tests.test_tree import far_below_case, random_tree, sampled_edge_case, topk_case, verify_case


# (2, 4, 16, 2100): the search state (4,201 candidates) does not fit in 48 KB of shared memory,
# global scratch, planned by the binding's tree_build_workspace_bytes (the shim calls it; ASan
# checks the accesses). Budgets of 0 and 1, k = 1, D = 1, budgets past D * k (the frontier runs dry), N = 0.
@pytest.mark.parametrize("n,d,k,budget,ties", [(4, 5, 3, 12, False), (3, 3, 2, 63, True), (2, 4, 4, 0, False),
                                               (3, 4, 4, 1, False), (3, 6, 1, 9, False), (3, 1, 5, 9, True),
                                               (130, 2, 2, 5, False), (2, 4, 16, 2100, False), (0, 3, 2, 5, False),
                                               (64, 15, 8, 63, False), (5, 4, 40, 63, True)])
def test_build_draft_tree(emu, n, d, k, budget, ties):
    lp, tok = topk_case(n, d, k, seed=d + k, ties=ties)
    if n:
        lp[0, 0, -1] = float("nan")
    for a, b in zip(emu.build_draft_tree(lp, tok, budget), reference.build_draft_tree(lp, tok, budget)):
        assert torch.equal(a, b)


# The mask the build's launch writes: the CPU op's, bitwise (the CPU's own is the two calls'). N = 0,
# budget 0, fewer prefixes than the budget (padding rows), M = 8, 64 and not a multiple of 8, more
# sequences than a round of anything, and the global-scratch search (2100: rows of 2101 bits).
@pytest.mark.parametrize("n,d,k,budget,layout", [(4, 5, 3, 12, "bool"), (4, 5, 3, 12, "packed"),
                                                 (3, 6, 1, 9, "bool"), (3, 1, 5, 9, "packed"),
                                                 (2, 4, 4, 0, "bool"), (2, 4, 4, 0, "packed"),
                                                 (0, 3, 2, 5, "packed"), (3, 3, 2, 7, "bool"),
                                                 (130, 2, 2, 5, "packed"), (64, 15, 8, 63, "bool"),
                                                 (5, 4, 40, 63, "packed"), (2, 4, 16, 2100, "packed")])
def test_build_draft_tree_with_mask(emu, n, d, k, budget, layout):
    lp, tok = topk_case(n, d, k, seed=d + k, ties=True)
    if n:
        lp[0, 0, -1] = float("nan")
    got = emu.build_draft_tree(lp, tok, budget, mask=layout)
    want = xkernels.build_draft_tree(lp, tok, budget, mask=layout)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(got[4], emu.tree_mask(got[1], got[2], packed=layout == "packed"))


def test_build_draft_tree_infinite_and_equal_scores(emu):
    """-inf and NaN log-probs, +inf ones whose sums with -inf are NaN (counted as -inf), -0.0 beside
    0.0, and rows of equal log-probs: the pops follow score, then push order, exactly."""
    lp = torch.zeros(4, 4, 5)
    lp[0] = float("-inf")
    lp[1, :, 2:] = float("nan")
    lp[2, 0, 0], lp[2, 1, 1:], lp[2, 2] = float("inf"), float("-inf"), -0.0
    lp[3] = torch.tensor([0.0, -0.0, -1.0, -1.0, float("-inf")])
    tok = torch.arange(4 * 4 * 5).view(4, 4, 5)
    for budget in (1, 7, 30):
        for a, b in zip(emu.build_draft_tree(lp, tok, budget), reference.build_draft_tree(lp, tok, budget)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["chain", "star", "bushy"])
@pytest.mark.parametrize("m", [1, 9, 300])
def test_masks_and_positions(emu, kind, m):
    parents = random_tree(3, m, kind, seed=m)
    num_nodes = torch.tensor([m, max(1, m // 2), 1])
    for nn in (None, num_nodes):
        assert torch.equal(emu.tree_mask(parents, nn), reference.tree_attention_mask(parents, nn))
        assert torch.equal(emu.tree_mask(parents, nn, packed=True), reference.tree_attention_mask(parents, nn, True))
        assert torch.equal(emu.tree_mask(parents, nn, positions=True), reference.tree_positions(parents, nn))


def test_positions_of_a_tree_too_big_to_stage(emu):
    """12,300 parents do not fit in 48 KB of shared memory as int32: the walks read them from global."""
    parents = random_tree(2, 12300, "star")
    num_nodes = torch.tensor([12300, 50])
    assert torch.equal(emu.tree_mask(parents, num_nodes, positions=True), reference.tree_positions(parents, num_nodes))


def test_invalid_parents_stay_memory_safe(emu):
    parents = random_tree(2, 9, "bushy")
    parents[0, 4] = 7  # a parent after its child
    parents[1, 3] = -9
    parents[1, 5] = 2**40
    parents[1, 6] = 2**32 + 2  # narrowed to int32 unchecked, the staged parent would be node 2
    assert emu.tree_mask(parents, positions=True)[1, 6] == 0  # the walk ends at once
    assert emu.tree_mask(parents)[1, 6].nonzero().flatten().tolist() == [6]
    emu.tree_mask(parents, torch.tensor([9, 20]))  # num_nodes past M is clamped
    emu.tree_mask(parents, packed=True, positions=True)
    tokens, _, logits, q = verify_case(2, 9, 20, "bushy")
    tokens[0, 2], tokens[1, 1] = -3, 99
    for temperature, qq in [(0.0, None), (1.0, None), (1.0, q)]:
        accept_len, path, out = emu.tree_verify(tokens, parents, logits, qq, True, temperature,
                                                num_nodes=torch.tensor([0, 50]))
        assert ((out >= -1) & (out < 20)).all() and ((path >= -1) & (path < 9)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["chain", "star", "bushy"])
@pytest.mark.parametrize("temperature,with_q,without_replacement",
                         [(0.0, False, False), (1.0, False, False), (1.0, True, False), (0.7, True, True)])
@pytest.mark.parametrize("v", [300, 304])  # 304: every dtype's rows take the vector loads
def test_tree_verify(emu, dtype, kind, temperature, with_q, without_replacement, v):
    tokens, parents, logits, q = verify_case(5, 13, v, kind, dtype, seed=len(kind))
    num_nodes = torch.tensor([13, 5, 1, 9, 13])
    for nn in (None, num_nodes):
        got = emu.tree_verify(tokens, parents, logits, q if with_q else None, without_replacement, temperature, 11,
                              2, nn)
        want = reference.tree_verify(tokens, parents, logits, q if with_q else None, without_replacement,
                                     temperature, 11, 2, nn)
        for a, b in zip(got, want):
            assert torch.equal(a, b)


@pytest.mark.parametrize("temperature,with_q,without_replacement",
                         [(0.0, False, False), (1.0, False, False), (1.0, True, False), (1.0, True, True)])
def test_tree_verify_many_children(emu, temperature, with_q, without_replacement):
    """Roots of 79 children (warp 0 tests them 32 a round), tokens out of 20 (repeats within and
    across rounds, which a rejection rules out); children rejected for three rounds. The first two
    roots' children hold tokens 1..9 only: q keeps the mass of 10..19, so the draft residual keeps
    ~1e-3 of the row's mass after the ~70 rejections. (Removing every token but the target's from q
    takes it to ~1e-22, a path of that probability when children are drawn from q, where the closed
    form of xkernels/tree.h, good to ~2^-48 of the row's mass, no longer follows the reference.)"""
    tokens, parents, logits, q = verify_case(4, 80, 20, "star", seed=8)
    tokens[:, 1:] = torch.randint(0, 20, (4, 79), generator=torch.Generator().manual_seed(1))
    tokens[3, 1:] = logits[3, 0].argmax()  # every child the argmax: the first is taken
    logits[2, 0] = 0.0  # a flat row
    logits[:2, 0, 0] = 30.0  # token 0 all but certain: the others are rejected, round after round
    tokens[:2, 1:] = tokens[:2, 1:] % 9 + 1
    tokens[1, 70] = 0  # the third round's child 70 is taken
    got = emu.tree_verify(tokens, parents, logits, q if with_q else None, without_replacement, temperature, 3, 4)
    want = reference.tree_verify(tokens, parents, logits, q if with_q else None, without_replacement, temperature,
                                 3, 4)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("temperature,with_q", [(0.0, False), (1.0, False), (1.0, True)])
def test_tree_verify_long_rows(emu, temperature, with_q):
    """Rows of 150,008 bf16 ids, 18,751 chunks of 16 bytes: more than one round of the vector loads
    of a cluster's two blocks (without draft_probs: 2 x 512 threads x 16 in flight), and of a block's
    (with them)."""
    tokens, parents, logits, q = verify_case(2, 4, 150008, "chain", torch.bfloat16, seed=5)
    got = emu.tree_verify(tokens, parents, logits, q if with_q else None, False, temperature, 7, 1)
    want = reference.tree_verify(tokens, parents, logits, q if with_q else None, False, temperature, 7, 1)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype,v", [(torch.bfloat16, 8200), (torch.float32, 3001), (torch.float16, 37),
                                     (torch.bfloat16, 1)])
@pytest.mark.parametrize("temperature,with_q,without_replacement",
                         [(0.0, False, False), (1.0, False, False), (1.0, True, False), (0.7, True, True)])
def test_tree_verify_walks_a_cluster_a_sequence(emu, dtype, v, temperature, with_q, without_replacement):
    """Where the device runs clusters, the walk that does not filter runs a cluster of two blocks a
    sequence (one cluster launch), each block a share of every pass over a visited row (the
    statistics with q's sum, the residual sums), merged in rank order: the same lengths, paths and
    tokens as a block a sequence and as the reference (chains and bushy trees, num_nodes; rows the
    second block has no share of: V = 37 and 1; unaligned rows: 3001 and 37; q in bfloat16 at V =
    8200). Walks that filter: test_tree_verify_filtered_walks_a_cluster_a_sequence."""
    n, m = 5, 9
    num_nodes = torch.tensor([9, 1, 5, 9, 3])
    for kind in ("chain", "bushy"):
        tokens, parents, logits, q = verify_case(n, m, v, kind, dtype, seed=v + len(kind))
        if v == 8200:
            q = q.bfloat16()
        args = (tokens, parents, logits, q if with_q else None, without_replacement, temperature, 3, 1, num_nodes)
        want = reference.tree_verify(*args)
        emu.take_cluster_launches()
        team = emu.tree_verify(*args)
        assert emu.take_cluster_launches() == 1
        alone = emu.tree_verify(*args, clusters=False)
        assert emu.take_cluster_launches() == 0
        for a, b, c in zip(team, alone, want):
            assert torch.equal(a, c) and torch.equal(b, c)


def split_mass_logits(n, m, second):
    """Rows of 8200 bf16 ids (chunks of 8 dealt to a cluster's threads in turn) with half their mass
    at id 10, in the first block's share, and half at `second`, in the second block's: 5000 for the
    walk that does not filter (2 x 512 threads: chunks 512-1023 of every 1,024 are the second's),
    2400 for the filtered one (2 x 256: chunks 256-511 of every 512)."""
    logits = torch.full((n, m, 8200), -30.0)
    logits[:, :, 10] = 0.0
    logits[:, :, second] = 0.0
    return logits.bfloat16()


def team_verify(emu, *args, **params):
    """emu.tree_verify in one cluster launch, bitwise the reference's."""
    emu.take_cluster_launches()
    got = emu.tree_verify(*args, **params)
    assert emu.take_cluster_launches() == 1
    want = reference.tree_verify(*args, **params)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    return got


def test_tree_verify_cluster_merges_both_blocks_mass(emu):
    """Half of each root row's mass in each cluster block's share (split_mass_logits): the draft
    token 10 has probability 1/2 only with both blocks' sums (1 with the first's alone), so about
    half of 32 sequences accept it, as the reference does, per-sequence streams."""
    n = 32
    parents = torch.tensor([[-1, 0]] * n)
    tokens = torch.tensor([[-1, 10]] * n)
    params = dict(temperature=1.0, seed=torch.arange(n) + 1, offset=torch.zeros(n, dtype=torch.int64))
    got = team_verify(emu, tokens, parents, split_mass_logits(n, 2, 5000), **params)
    assert 0 < int(got[0].sum()) < n


@pytest.mark.parametrize("dtype,v", [(torch.bfloat16, 4104), (torch.float32, 3001), (torch.float16, 37),
                                     (torch.bfloat16, 8200)])
@pytest.mark.parametrize("with_q,without_replacement", [(False, False), (True, False), (True, True)])
def test_tree_verify_filtered_walks_a_cluster_a_sequence(emu, dtype, v, with_q, without_replacement):
    """Where the device runs clusters, the walk that filters runs a cluster of two blocks a sequence
    too: each block keeps the candidates of its share of the row, the blocks hand them over, and each
    selects over both blocks' lists (or finds the cut alone on the radix path): every filter kind
    (_mixed_params) on rows the candidates settle and rows they do not (flat, ties, a top-k beyond
    them), the same lengths, paths and tokens as a block a sequence and as the reference, bitwise."""
    n = 12
    tokens, parents, logits, q = verify_case(n, 7, v, "bushy", torch.float32, seed=v + 5)
    logits = logits * 2
    logits[1] = logits[1].round()  # ties at every cut
    logits[5, :3] = 0.0  # flat rows
    logits = logits.to(dtype)
    if v == 8200:
        q = q.bfloat16()
    args = (tokens, parents, logits, q if with_q else None, without_replacement)
    params = _mixed_params(n, v + 1)
    want = reference.tree_verify(*args, **params)
    emu.take_cluster_launches()
    team = emu.tree_verify(*args, **params)
    assert emu.take_cluster_launches() == 1
    alone = emu.tree_verify(*args, clusters=False, **params)
    assert emu.take_cluster_launches() == 0
    for a, b, c in zip(team, alone, want):
        assert torch.equal(a, c) and torch.equal(b, c)


@pytest.mark.parametrize("filters", [dict(top_k=2), dict(top_p=0.6), dict(min_p=0.5), dict(top_k=2, top_p=0.6)],
                         ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
@pytest.mark.parametrize("with_q", [False, True])
def test_tree_verify_cluster_merges_both_blocks_candidates(emu, filters, with_q):
    """A filtered row's cut takes both blocks' candidates: half of each root row's mass in each
    block's share (split_mass_logits), every filter keeping both ids, so that the draft token 10 has
    probability 1/2 only over both blocks' lists (1 over the first's alone); about half of 32
    sequences accept it, as the reference does, per-sequence streams; with draft_probs (q 1 at id
    10) the residual over the kept ids too. Every cut settles from the lists, so no row pass follows
    the statistics pass (without the second block's lists the selection could not settle them: the
    radix path, as exact but with passes)."""
    n = 32
    parents = torch.tensor([[-1, 0]] * n)
    tokens = torch.tensor([[-1, 10]] * n)
    q = torch.zeros(n, 2, 8200)
    q[:, :, 10] = 1.0
    params = dict(temperature=1.0, seed=torch.arange(n) + 1, offset=torch.zeros(n, dtype=torch.int64), **filters)
    emu.take_row_passes()
    got = team_verify(emu, tokens, parents, split_mass_logits(n, 2, 2400), q if with_q else None, False, **params)
    assert emu.take_row_passes() == 0
    assert 0 < int(got[0].sum()) < n


@pytest.mark.parametrize("second,filters", [(5000, {}), (2400, dict(top_k=2))])
def test_tree_verify_cluster_merges_both_blocks_residual(emu, second, filters):
    """The residual sums of a clustered walk with draft_probs are the team's: a root whose p holds
    half its mass in each block's share (split_mass_logits), q 0.9 at id 20 and 0.1 at 10, children
    20 then 10 drawn without replacement: 20 is rejected (p(20) ~ 0), and 10 is accepted with
    probability r(10) = 0.4 / 0.9 only with both blocks' residual sums (1 with the first's alone):
    about half of 32 sequences, as the reference, per-sequence streams. With top-k 2 (the filtered
    walk) the sums run over the kept ids, each block adding both blocks' shares in rank order."""
    n = 32
    parents = torch.tensor([[-1, 0, 0]] * n)
    tokens = torch.tensor([[-1, 20, 10]] * n)
    q = torch.zeros(n, 3, 8200)
    q[:, :, 20] = 0.9
    q[:, :, 10] = 0.1
    params = dict(temperature=1.0, seed=torch.arange(n) + 1, offset=torch.zeros(n, dtype=torch.int64), **filters)
    got = team_verify(emu, tokens, parents, split_mass_logits(n, 3, second), q, True, **params)
    assert 0 < int(got[0].sum()) < n


def test_greedy_ties_and_nan_rows(emu):
    parents = torch.tensor([[-1, 0, 0, 1]])
    logits = torch.zeros(1, 4, 6)
    logits[0, 0, [2, 4]] = 1.0
    logits[0, 2, 5] = float("nan")
    tokens = torch.tensor([[-1, 4, 2, 5]])
    for temperature in (0.0, 1.0):
        got = emu.tree_verify(tokens, parents, logits, temperature=temperature)
        want = reference.tree_verify(tokens, parents, logits, temperature=temperature)
        for a, b in zip(got, want):
            assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.uint8])
def test_compact_kv(emu, dtype):
    tokens, parents, logits, _ = verify_case(4, 9, 20, "chain", seed=4)
    accept_len, path, _ = reference.tree_verify(tokens, parents, logits)
    cache = (torch.randn(4, 3, 16, 8) * 50).to(dtype)
    assert torch.equal(emu.compact_kv(cache, path, accept_len, 5), reference.compact_kv(cache, path, accept_len, 5))
    bad = path.clone()
    bad[:, 1] = 40  # past the cache: the moves stop
    emu.compact_kv(cache, bad, accept_len, 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_q,without_replacement", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("num_sms", [0, 132])
def test_tree_verify_draws_over_several_slices(emu, dtype, with_q, without_replacement, num_sms):
    """Stop rows long enough for several sampling slices (row_slice_count: up to V / 1024)."""
    tokens, parents, logits, q = verify_case(3, 7, 4104, "bushy", dtype, seed=6)
    got = emu.tree_verify(tokens, parents, logits, q if with_q else None, without_replacement, 1.0, 2, 9,
                          num_sms=num_sms)
    want = reference.tree_verify(tokens, parents, logits, q if with_q else None, without_replacement, 1.0, 2, 9)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("n,m,v", [(0, 4, 16), (2, 1, 16), (3, 4, 1), (2, 5, 8)])
@pytest.mark.parametrize("temperature,with_q", [(0.0, False), (1.0, False), (1.0, True)])
def test_tree_verify_edge_shapes(emu, n, m, v, temperature, with_q):
    tokens, parents, logits, q = verify_case(n, m, v, "bushy", torch.bfloat16, seed=3)
    got = emu.tree_verify(tokens, parents, logits, q if with_q else None, False, temperature, 5, 1)
    want = reference.tree_verify(tokens, parents, logits, q if with_q else None, False, temperature, 5, 1)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("without_replacement", [False, True])
def test_tree_verify_sampled_edge_rows(emu, without_replacement):
    """Residuals that empty at a rejection, a draft row without mass, a token repeated among the
    children (tests/test_tree.py's sampled_edge_case), a child of probability 0 (far_below_case),
    and the same on rows of 20,003 ids (unaligned, several residual passes) with q far from p, so
    most children are rejected."""
    tokens, parents, logits, q, num_nodes = sampled_edge_case()
    for seed in range(6):
        got = emu.tree_verify(tokens, parents, logits, q, without_replacement, 1.0, seed, 0, num_nodes)
        want = reference.tree_verify(tokens, parents, logits, q, without_replacement, 1.0, seed, 0, num_nodes)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    tokens, parents, logits, q = far_below_case()  # a child of probability 0 with no draft mass
    for seed in range(6):
        got = emu.tree_verify(tokens, parents, logits, q, without_replacement, 1.0, seed, 0)
        want = reference.tree_verify(tokens, parents, logits, q, without_replacement, 1.0, seed, 0)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    for v, dtype in [(20003, torch.bfloat16), (20000, torch.float32), (20000, torch.float16)]:
        tokens, parents, logits, _ = verify_case(3, 9, v, "star", dtype, seed=v % 7)
        g = torch.Generator().manual_seed(v)
        q = torch.softmax(torch.randn(3, 9, v, generator=g) * 3, -1)
        tokens[:, 1:] = torch.multinomial(q[:, 0], 8, replacement=True, generator=g)
        tokens[2, 4:] = tokens[2, 3]  # repeats
        got = emu.tree_verify(tokens, parents, logits, q, without_replacement, 1.0, 4, 3)
        want = reference.tree_verify(tokens, parents, logits, q, without_replacement, 1.0, 4, 3)
        for a, b in zip(got, want):
            assert torch.equal(a, b)


def draft_mass_case(v, where):
    """Three trees of 7 nodes (bushy) whose q rows hold all their mass, and the logits (float32)
    most of p's, on the 8 ids of one chunk: the first, one in the middle or the last; every child's
    token lies in it."""
    tokens, parents, logits, _ = verify_case(3, 7, v, "bushy", torch.float32, seed=v % 5)
    start = {"first": 0, "middle": v // 16 * 8, "last": v // 8 * 8 - 8}[where]
    g = torch.Generator().manual_seed(start)
    logits[..., start:start + 8] += 12.0
    q = torch.zeros(3, 7, v)
    q[..., start:start + 8] = torch.softmax(torch.randn(3, 7, 8, generator=g) * 1.5, -1)
    tokens[:, 1:] = start + torch.randint(0, 8, (3, 6), generator=g)
    return tokens, parents, logits, q


# max_smem: 227 KB (8 chunks a thread a round), 99 KB (6 at 16-bit logits), 48 KB (2 at 16-bit,
# 5 at float32), 20,000 bytes (1 at 16-bit, 2 at float32): the rounds of q_stage_depth.
@pytest.mark.parametrize("dtype,v,max_smem", [(torch.bfloat16, 70008, 227 * 1024), (torch.float32, 20000, 227 * 1024),
                                              (torch.float16, 4104, 227 * 1024), (torch.bfloat16, 4103, 227 * 1024),
                                              (torch.bfloat16, 70008, 99 * 1024), (torch.float16, 20000, 0),
                                              (torch.float32, 20000, 0), (torch.bfloat16, 4104, 20000),
                                              (torch.float32, 4104, 20000)])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_tree_verify_draft_mass_in_one_chunk(emu, dtype, v, max_smem, where):
    """Each q row's mass, and most of p's, on the 8 ids of one chunk: the first chunk, one in a later
    round of a thread's asynchronous copies of q (8 chunks a thread a round with 227 KB of shared
    memory: 70,008 bf16 ids take 3 rounds, 20,000 float32 2, 4,104 float16 1 and a chunk), or the
    last. A node's first pass sums q beside the row statistics and the residual passes read it again,
    both through the copies: a chunk they miss or misplace changes q's sum or the residuals, and the
    walks with it. 4,103 ids: rows read id by id. Every child's token lies in the chunk; nodes with
    children in the middle of the walks (a bushy tree), leaves read no q."""
    tokens, parents, logits, q = draft_mass_case(v, where)
    logits = logits.to(dtype)
    for seed in range(3):
        for without_replacement in (False, True):
            got = emu.tree_verify(tokens, parents, logits, q, without_replacement, 1.0, seed, 1, max_smem=max_smem)
            want = reference.tree_verify(tokens, parents, logits, q, without_replacement, 1.0, seed, 1)
            for a, b in zip(got, want):
                assert torch.equal(a, b)


def _sampling_params(n, seed):
    """Every parameter kind in one batch (greedy rows too), per-request streams."""
    g = torch.Generator().manual_seed(seed)
    return dict(temperature=torch.tensor([0.0, 0.7, 1.0, 1.3, 1.0, 0.9])[torch.arange(n) % 6],
                top_k=torch.tensor([0, 3, 0, 7, 1, 0])[torch.arange(n) % 6],
                top_p=torch.tensor([1.0, 0.8, 0.5, 1.0, 1.0, 0.9])[torch.arange(n) % 6],
                min_p=torch.tensor([0.0, 0.0, 0.1, 0.05, 0.0, 0.2])[torch.arange(n) % 6],
                seed=torch.randint(0, 2**40, (n,), generator=g), offset=torch.randint(0, 1000, (n,), generator=g))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_q,without_replacement", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("v", [37, 304])
def test_tree_verify_per_request_sampling(emu, dtype, with_q, without_replacement, v):
    """Mixed per-row temperature, top_k, top_p and min_p with per-request streams: the cut pass,
    then the walk, the child tests, the residual passes and the draw read p' through the cuts."""
    tokens, parents, logits, q = verify_case(12, 11, v, "bushy", dtype, seed=v)
    params = _sampling_params(12, v)
    num_nodes = torch.tensor([11, 5, 1, 9] * 3)
    qq = q if with_q else None
    got = emu.tree_verify(tokens, parents, logits, qq, without_replacement, num_nodes=num_nodes, **params)
    want = reference.tree_verify(tokens, parents, logits, qq, without_replacement, num_nodes=num_nodes, **params)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("with_q", [False, True])
def test_tree_verify_scalar_filters_and_streams(emu, with_q):
    """Scalar filters (one cut per node row from the scalar parameters), the scalar stream as ints
    and as one-element tensors, and per-request streams with scalar parameters."""
    tokens, parents, logits, q = verify_case(6, 9, 64, "bushy", torch.float32, seed=4)
    qq = q if with_q else None
    for seed, offset in [(7, 2), (torch.tensor([11]), torch.tensor(4)), (torch.arange(6), torch.zeros(6, dtype=torch.int64))]:
        kw = dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05, seed=seed, offset=offset)
        got = emu.tree_verify(tokens, parents, logits, qq, False, **kw)
        want = reference.tree_verify(tokens, parents, logits, qq, False, **kw)
        for a, b in zip(got, want):
            assert torch.equal(a, b)


def test_tree_verify_unchecked_sampling_values_stay_memory_safe(emu):
    """Without XKERNELS_CHECK the binding reads no per-row values: invalid ones read as off (a bad
    temperature as greedy) and the kernels stay in bounds."""
    tokens, parents, logits, q = verify_case(4, 9, 40, "bushy", torch.float32, seed=6)
    bad = dict(temperature=torch.tensor([-1.0, float("nan"), float("inf"), 1.0]),
               top_k=torch.tensor([-3, 2**31 - 1, 0, 5], dtype=torch.int32),
               top_p=torch.tensor([0.0, 2.0, float("nan"), 0.5]), min_p=torch.tensor([-1.0, 3.0, float("nan"), 0.1]),
               seed=torch.arange(4), offset=torch.arange(4))
    for qq in (None, q):
        accept_len, path, out = emu.tree_verify(tokens, parents, logits, qq, True, **bad)
        assert ((out >= -1) & (out < 40)).all() and ((path >= -1) & (path < 9)).all()
        greedy = reference.tree_verify(tokens[:3], parents[:3], logits[:3], qq, True)
        assert torch.equal(out[:3], greedy[2])


@pytest.mark.parametrize("dtype,v", [(torch.bfloat16, 20011), (torch.float32, 9001)])
@pytest.mark.parametrize("with_q", [False, True])
@pytest.mark.parametrize("clusters", [True, False])
def test_tree_verify_filtered_long_rows(emu, dtype, v, with_q, clusters):
    """Filters on rows of thousands of ids (rows that start unaligned at V = 9001), and the passes
    each row takes (the emulation's count of row passes; the walk's statistics pass is not counted,
    nor its read of q's sum, the stop row's draw by the sampling launches is, once a row, and with
    draft_probs each residual sum that streams the row and q): a top-k cut the statistics pass's
    candidates settle (top_k 50) takes none, its stop draw none either (from the kept ids, in the
    walk), nor with draft_probs its residual sums (over the kept ids; test_tree_q_emu counts them);
    a top-k beyond the candidates (1000, with top-p) two (a pass noting the top key bits the
    candidates' statistics pass did not, and the radix gather); top-p alone (at 0.9 and 0.5 of
    peaked rows: its nucleus among the candidates, its target away from a step by more than the
    bound of the warps' float sums) none; rows the walk does not visit none. With draft_probs the unsettled rows' residual sums
    come on top (at least the count without them). In a cluster each block finds an unsettled cut
    alone: its two passes twice."""
    n = 6
    tokens, parents, logits, q = verify_case(n, 9, v, "bushy", dtype, seed=v)
    logits = logits * 3
    params = dict(temperature=torch.tensor([1.0, 0.7, 1.0, 0.0, 1.2, 1.0]),
                  top_k=torch.tensor([50, 0, 1000, 5, 0, 0]), top_p=torch.tensor([1.0, 0.9, 0.9, 1.0, 0.5, 1.0]),
                  min_p=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
                  seed=torch.arange(n) + 3, offset=torch.arange(n) * 7)
    qq = q if with_q else None
    emu.take_row_passes()
    got = emu.tree_verify(tokens, parents, logits, qq, False, clusters=clusters, **params)
    passes = emu.take_row_passes()
    want = reference.tree_verify(tokens, parents, logits, qq, False, **params)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    accept_len = got[0]
    # passes a visited row, by the sequence's filters; the candidates settle sequence 0's cuts
    walk = torch.tensor([0, 0, 2, 0, 0, 0]) * (2 if clusters else 1)
    settled = torch.tensor([True, True, False, False, True, False])
    draws = (params["temperature"] > 0) & ~settled
    expected = int(((accept_len + 1) * walk).sum() + draws.sum())
    assert passes >= expected if with_q else passes == expected


def _mixed_params(n, seed):
    """Per-row filters of every kind (greedy, unfiltered, top-k alone and with top-p and/or min-p,
    top-k beyond the candidates, top-k 1, top-p alone, min-p alone) and per-request streams."""
    g = torch.Generator().manual_seed(seed)
    kinds = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (1.0, 3, 1.0, 0.0), (0.8, 20, 0.8, 0.0), (1.2, 50, 1.0, 0.05),
             (1.0, 40, 0.9, 0.02), (1.0, 600, 1.0, 0.0), (0.9, 1, 1.0, 0.0), (1.0, 0, 0.7, 0.0), (1.0, 0, 1.0, 0.1),
             (0.7, 64, 0.95, 0.0), (1.0, 300, 0.5, 0.3)]
    rows = [kinds[i % len(kinds)] for i in range(n)]
    return dict(temperature=torch.tensor([r[0] for r in rows]), top_k=torch.tensor([r[1] for r in rows]),
                top_p=torch.tensor([r[2] for r in rows]), min_p=torch.tensor([r[3] for r in rows]),
                seed=torch.randint(0, 2**40, (n,), generator=g), offset=torch.randint(0, 1000, (n,), generator=g))


@pytest.mark.parametrize("dtype,v", [(torch.float32, 304), (torch.bfloat16, 4104), (torch.float16, 4103),
                                     (torch.bfloat16, 37), (torch.float32, 1)])
@pytest.mark.parametrize("with_q,without_replacement", [(False, False), (True, False), (True, True)])
def test_tree_verify_filtered_mixed_rows(emu, dtype, v, with_q, without_replacement):
    """Every filter kind in one batch (_mixed_params), on rows the candidates settle and rows they
    do not: flat rows (every id ties: no head), rows of many ties at the cut (rounded logits), a top-k
    beyond the candidates, min-p alone, top-p alone, a NaN row and -inf rows, V = 1 and V not a
    multiple of 8 (rows read id by id), against the reference, bitwise."""
    n = 12
    tokens, parents, logits, q = verify_case(n, 7, v, "bushy", torch.float32, seed=v + 3)
    logits = logits * 2
    logits[1] = logits[1].round()  # ties at every cut
    logits[3] = logits[3].round() / 4
    logits[5, :3] = 0.0  # flat rows: the candidates hold no head
    logits[6, 1:] = 1.5
    logits[4, 0, : v // 2] = float("-inf")
    logits[7, 2] = float("nan")
    logits = logits.to(dtype)
    params = _mixed_params(n, v)
    qq = q if with_q else None
    for m_nodes in (torch.tensor([7, 3, 1, 7, 5, 7] * 2), None):
        got = emu.tree_verify(tokens, parents, logits, qq, without_replacement, num_nodes=m_nodes, **params)
        want = reference.tree_verify(tokens, parents, logits, qq, without_replacement, num_nodes=m_nodes, **params)
        for a, b in zip(got, want):
            assert torch.equal(a, b)


# Top-k with top-p, min-p, both; min-p alone (its floor above every dropped key); top-p alone at
# temperatures that keep its nucleus among the candidates, and top_p values whose target lies at
# least 1.4e-3 of the total from a step in every row of these cases (the bound of the walk's float
# sums is ~2e-4; at 0.9 and 0.95, rows within 4e-5 take the radix path, as they must).
SETTLED_FILTERS = {"top-k": dict(top_k=torch.tensor([10, 64, 30, 1]), top_p=torch.tensor([1.0, 0.9, 0.8, 1.0]),
                                 min_p=torch.tensor([0.0, 0.0, 0.05, 0.0])),
                   "min-p alone": dict(min_p=torch.tensor([0.1, 0.3, 0.05, 0.2])),
                   "top-p alone": dict(temperature=torch.tensor([0.3, 0.25, 0.35, 0.3]),
                                       top_p=torch.tensor([0.85, 0.5, 0.7, 0.75]))}


@pytest.mark.parametrize("filters", list(SETTLED_FILTERS))
@pytest.mark.parametrize("dtype,v", [(torch.bfloat16, 8200), (torch.float32, 3001)])
def test_tree_verify_settled_rows_take_no_pass(emu, dtype, v, filters):
    """Cuts the candidates settle (SETTLED_FILTERS): no row pass beyond the walk's
    statistics pass, the stop draws included (from the kept ids, in the walk), at M = 1 too; the
    same rows made flat (every id ties: the candidates hold no head) take the radix path, and their
    stop draws the sampling launches: two passes a visited row (min-p alone: one, its kept sum), one
    a draw, at least. Both bitwise as the reference."""
    n = 4
    tokens, parents, logits, _ = verify_case(n, 9, v, "chain", dtype, seed=v)
    params = {"temperature": torch.tensor([1.0, 0.8, 1.1, 1.0]), "seed": torch.arange(n) + 1,
              "offset": torch.arange(n), **SETTLED_FILTERS[filters]}
    for m in (9, 1):
        emu.take_row_passes()
        got = emu.tree_verify(tokens[:, :m], parents[:, :m], logits[:, :m], **params)
        assert emu.take_row_passes() == 0
        want = reference.tree_verify(tokens[:, :m], parents[:, :m], logits[:, :m], **params)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    flat = torch.zeros_like(logits)
    got = emu.tree_verify(tokens, parents, flat, **params)
    passes = emu.take_row_passes()
    want = reference.tree_verify(tokens, parents, flat, **params)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    per_row = 1 if filters == "min-p alone" else 2  # its kept sum; the bits and the gather
    assert passes >= int(per_row * (got[0] + 1).sum() + n)


@pytest.mark.parametrize("dtype,v", [(torch.bfloat16, 8200), (torch.float32, 3001)])
def test_tree_verify_top_p_alone_bounds_the_total(emu, dtype, v):
    """Top-p alone takes the row's total mass from the walk's float sums, within a bound (~2e-4 of
    the total here, float_sum_error): a row whose target lies inside that bound of a step but
    outside the bound of exact sums (~1e-6) takes the radix path, bitwise as the reference: two top
    ids of equal mass, a tail of e^-17.5 each, top_p 0.5, so the target lies 2e-5 (V = 3001) or
    5e-5 (V = 8200) of the total past the first. The same rows with the second id lower (the target
    well inside the first) settle with no pass."""
    n, m = 2, 4
    tokens, parents, _, _ = verify_case(n, m, v, "chain", dtype, seed=3)
    params = dict(temperature=1.0, top_p=0.5, seed=torch.arange(n) + 5, offset=torch.arange(n))
    for second, settles in ((10.0, False), (9.0, True)):
        logits = torch.full((n, m, v), -7.5)
        logits[:, :, 7] = 10.0
        logits[:, :, 11] = second
        logits = logits.to(dtype)
        emu.take_row_passes()
        got = emu.tree_verify(tokens, parents, logits, **params)
        passes = emu.take_row_passes()
        assert (passes == 0) == settles
        want = reference.tree_verify(tokens, parents, logits, **params)
        for a, b in zip(got, want):
            assert torch.equal(a, b)


def test_tree_verify_filtered_with_draft_probs_needs_room_for_the_cut(emu):
    """With 48 KB of shared memory the cut's state leaves room for one chunk of the q stage at
    float32 logits (4 KB at the filtered walk's 256 threads) but none at 16-bit ones (8 KB): that
    launch fails (cudaErrorInvalidConfiguration) instead of overrunning; every GPU the library
    builds for opts into more."""
    for dtype, fits in ((torch.float32, True), (torch.bfloat16, False)):
        tokens, parents, logits, q = verify_case(2, 5, 64, "bushy", dtype, seed=2)
        want = reference.tree_verify(tokens, parents, logits, q, False, 1.0, 3, 1, top_k=5)
        for max_smem in ((48 * 1024, 99 * 1024) if fits else (99 * 1024,)):
            got = emu.tree_verify(tokens, parents, logits, q, False, 1.0, 3, 1, max_smem=max_smem, top_k=5)
            for a, b in zip(got, want):
                assert torch.equal(a, b)
        if not fits:
            with pytest.raises(LaunchError, match="cudaError 9"):
                emu.tree_verify(tokens, parents, logits, q, False, 1.0, 3, 1, max_smem=48 * 1024, top_k=5)
