"""Draft-tree ops: building, masks, positions, verification (greedy and lossless at T > 0), KV
compaction. Each against xkernels.reference; the sampling modes by chi-squared tests, each shown
to reject a deliberately wrong variant kept here."""

import pytest
import torch

import xkernels
from xkernels import reference
from tests.utils import DEVICES, LOGIT_DTYPES, assert_replays_like_eager, chi_squared_pvalue


def random_tree(n, m, kind, seed=0):
    """parents [n, m] of chains, stars, deep (parent among the last 2) or bushy (any earlier) trees."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((n, m), -1, dtype=torch.int64)
    for i in range(1, m):
        if kind == "chain":
            parents[:, i] = i - 1
        elif kind == "star":
            parents[:, i] = 0
        elif kind == "deep":
            parents[:, i] = torch.randint(max(0, i - 2), i, (n,), generator=g)
        else:
            parents[:, i] = torch.randint(0, i, (n,), generator=g)
    return parents


def topk_case(n, d, k, v=50, seed=0, ties=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, d, v, generator=g)
    if ties:
        logits = logits.round()  # many equal log-probs, so equal path scores
    lp, tok = logits.log_softmax(-1).topk(k, -1)
    return lp.contiguous(), tok.contiguous()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,d,k,budget", [(4, 5, 3, 12), (3, 1, 4, 10), (2, 6, 1, 4), (3, 3, 2, 63), (2, 4, 4, 0),
                                          (0, 3, 2, 5), (5, 15, 8, 63)])
@pytest.mark.parametrize("ties", [False, True])
def test_build_draft_tree_matches_the_heap_reference(device, n, d, k, budget, ties):
    lp, tok = topk_case(n, d, k, seed=n + d + k, ties=ties)
    if n:
        lp[0, 0, -1] = float("nan")  # counts as -inf
    got = xkernels.build_draft_tree(lp.to(device), tok.to(device), budget)
    want = reference.build_draft_tree(lp, tok, budget)
    for a, b in zip(got, want):
        assert torch.equal(a.cpu(), b)
    tokens, parents, num_nodes, depth = [t.cpu() for t in got]
    assert tokens.shape == (n, budget + 1)
    possible = sum(k**t for t in range(1, d + 1))
    assert (num_nodes == min(budget, possible) + 1).all()
    if n and budget:
        assert torch.equal(depth, xkernels.tree_positions(parents, num_nodes=num_nodes))


# N = 0, budget 0 (M = 1), fewer prefixes than the budget (padding nodes), M = 8, 64 and M not a multiple of 8.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,d,k,budget", [(4, 5, 3, 12), (3, 1, 4, 10), (2, 2, 2, 9), (2, 4, 4, 0), (0, 3, 2, 5),
                                          (3, 3, 2, 7), (5, 15, 8, 63), (33, 6, 4, 20)])
@pytest.mark.parametrize("layout", ["bool", "packed"])
def test_build_draft_tree_with_mask_is_the_two_calls(device, n, d, k, budget, layout):
    lp, tok = topk_case(n, d, k, seed=n + d + k, ties=True)
    got = [t.cpu() for t in xkernels.build_draft_tree(lp.to(device), tok.to(device), budget, mask=layout)]
    want = reference.build_draft_tree_with_mask(lp, tok, budget, packed=layout == "packed")
    assert len(got) == 5
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    tree = xkernels.build_draft_tree(lp.to(device), tok.to(device), budget)
    assert torch.equal(got[4], xkernels.tree_attention_mask(tree[1], num_nodes=tree[2], layout=layout).cpu())
    if n and sum(k**t for t in range(1, d + 1)) < budget:  # fewer prefixes than the budget: padding
        assert (got[2] < budget + 1).all()
        pad = budget  # the last node, padding, sees itself alone
        row = got[4][:, pad]
        if layout == "packed":
            row = ((row[:, :, None] >> torch.arange(8, dtype=torch.uint8)) & 1).flatten(1)[:, :budget + 1].bool()
        assert row.nonzero()[:, 1].tolist() == [pad] * n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,d,k,budget", [(3, 4, 3, 20), (2, 1, 3, 9)])  # the second has padding nodes
def test_a_tree_prefix_keeps_the_first_rows_and_columns_of_its_mask(device, n, d, k, budget):
    """The decoding loop verifies the first m nodes of a best-first tree (DraftTree.prefix) under the
    first m rows and columns of the mask build_draft_tree wrote: the prefix's own mask, as a node's
    ancestors come before it and a padding node sees itself only."""
    from xkernels.decoding.modes import DraftTree

    lp, tok = topk_case(n, d, k, seed=budget, ties=True)
    tree = DraftTree(*xkernels.build_draft_tree(lp.to(device), tok.to(device), budget, mask="bool"), (lp, tok))
    for m in (1, 2, 5, budget, budget + 1):
        p = tree.prefix(m)
        assert torch.equal(p.mask, xkernels.tree_attention_mask(p.parents, num_nodes=p.num_nodes)), m


@pytest.mark.parametrize("device", DEVICES)
def test_build_draft_tree_infinite_scores(device):
    """+inf beside -inf log-probs: their sums are NaN, which count as -inf (a NaN score would order
    neither way, and the pops would depend on the search); -0.0 ties 0.0 (push order decides)."""
    lp = torch.zeros(3, 4, 5)
    lp[0, 0, 0], lp[0, 1, 1:], lp[0, 2] = float("inf"), float("-inf"), -0.0
    lp[1] = torch.tensor([0.0, -0.0, -1.0, -1.0, float("-inf")])
    lp[2, :, 1:] = float("nan")
    tok = torch.arange(3 * 4 * 5).view(3, 4, 5)
    for budget in (1, 7, 30):
        got = xkernels.build_draft_tree(lp.to(device), tok.to(device), budget)
        for a, b in zip(got, reference.build_draft_tree(lp, tok, budget)):
            assert torch.equal(a.cpu(), b)
    _, parents, _, depth = reference.build_draft_tree(lp[:1], tok[:1], 7)
    assert parents[0, :3].tolist() == [-1, 0, 1] and depth[0, 2] == 2  # the +inf path first


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["chain", "star", "deep", "bushy"])
@pytest.mark.parametrize("m", [1, 7, 8, 9, 64])
def test_masks_and_positions(device, kind, m):
    parents = random_tree(3, m, kind, seed=m)
    num_nodes = torch.tensor([m, max(1, m // 2), 1])
    for nn in (None, num_nodes):
        args = dict(num_nodes=None if nn is None else nn.to(device))
        dense = xkernels.tree_attention_mask(parents.to(device), **args).cpu()
        packed = xkernels.tree_attention_mask(parents.to(device), layout="packed", **args).cpu()
        assert torch.equal(dense, reference.tree_attention_mask(parents, nn))
        assert torch.equal(packed, reference.tree_attention_mask(parents, nn, packed=True))
        unpacked = ((packed[..., :, None] >> torch.arange(8, dtype=torch.uint8)) & 1).flatten(-2)[..., :m].bool()
        assert torch.equal(unpacked, dense)
        depth = xkernels.tree_positions(parents.to(device), **args).cpu()
        assert torch.equal(depth, reference.tree_positions(parents, nn))
        assert torch.equal(dense.sum(-1) - 1, depth)  # a node sees itself and its depth ancestors


def verify_case(n, m, v, kind, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    parents = random_tree(n, m, kind, seed)
    logits = (torch.randn(n, m, v, generator=g) * 2).to(dtype)
    tokens = torch.randint(0, v, (n, m), generator=g)
    # Plant the target's argmax among the children often, so greedy walks go deep.
    greedy = logits.float().argmax(-1)
    plant = torch.rand(n, m, generator=g) < 0.6
    tokens[:, 1:] = torch.where(plant[:, 1:], greedy.gather(1, parents[:, 1:].clamp_min(0)), tokens[:, 1:])
    tokens[:, 0] = -1
    q = torch.softmax(torch.randn(n, m, v, generator=g), -1)
    return tokens, parents, logits, q


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("kind", ["chain", "star", "deep", "bushy"])
@pytest.mark.parametrize("temperature,with_q,without_replacement",
                         [(0.0, False, False), (1.0, False, False), (1.0, True, False), (0.7, True, True)])
def test_tree_verify_matches_reference(device, dtype, kind, temperature, with_q, without_replacement):
    tokens, parents, logits, q = verify_case(6, 13, 37, kind, dtype, seed=len(kind))
    num_nodes = torch.tensor([13, 13, 5, 1, 9, 13])
    for nn in (None, num_nodes):
        got = xkernels.tree_verify(tokens.to(device), parents.to(device), logits.to(device),
                                   draft_probs=q.to(device) if with_q else None,
                                   without_replacement=without_replacement, temperature=temperature, seed=11,
                                   offset=2, num_nodes=None if nn is None else nn.to(device))
        want = reference.tree_verify(tokens, parents, logits, q if with_q else None, without_replacement,
                                     temperature, 11, 2, nn)
        for a, b in zip(got, want):
            assert torch.equal(a.cpu(), b)
        accept_len, path, out = [t.cpu() for t in got]
        for s in range(6):
            a = int(accept_len[s])
            nodes = path[s, : a + 1]
            assert nodes[0] == 0 and (path[s, a + 1:] == -1).all() and (out[s, a + 1:] == -1).all()
            assert torch.equal(parents[s, nodes[1:]], nodes[:-1])  # a root-to-node path
            assert torch.equal(out[s, :a], tokens[s, nodes[1:]])
            assert 0 <= out[s, a] < 37


@pytest.mark.needs_cuda
@pytest.mark.parametrize("temperature,with_q,without_replacement",
                         [(0.0, False, False), (1.0, False, False), (1.0, True, False), (0.7, True, True)])
def test_tree_verify_cuda_walks_alike_in_clusters_and_alone(monkeypatch, temperature, with_q, without_replacement):
    """XKERNELS_TREE_CLUSTERS=0 walks a block a sequence where the device would run a cluster of two
    (sm_90+; elsewhere both are the lone block's walk): both give the reference's lengths, paths and
    tokens on rows both blocks share (V = 8200 bf16), num_nodes too; a value other than 0 or 1
    raises at the call, naming the variable."""
    tokens, parents, logits, q = verify_case(6, 13, 8200, "bushy", torch.bfloat16, seed=8)
    num_nodes = torch.tensor([13, 13, 5, 1, 9, 13])
    want = reference.tree_verify(tokens, parents, logits, q if with_q else None, without_replacement, temperature, 11,
                                 2, num_nodes)
    for clusters in ("0", "1"):
        monkeypatch.setenv("XKERNELS_TREE_CLUSTERS", clusters)
        got = xkernels.tree_verify(tokens.cuda(), parents.cuda(), logits.cuda(),
                                   draft_probs=q.cuda() if with_q else None, without_replacement=without_replacement,
                                   temperature=temperature, seed=11, offset=2, num_nodes=num_nodes.cuda())
        for a, b in zip(got, want):
            assert torch.equal(a.cpu(), b)
    monkeypatch.setenv("XKERNELS_TREE_CLUSTERS", "yes")
    with pytest.raises(RuntimeError, match="XKERNELS_TREE_CLUSTERS"):
        xkernels.tree_verify(tokens.cuda(), parents.cuda(), logits.cuda())


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_ties_and_degenerate_rows(device):
    parents = torch.tensor([[-1, 0, 0, 1]])
    logits = torch.zeros(1, 4, 6)
    logits[0, 0, [2, 4]] = 1.0  # tie: 2 wins
    logits[0, 1, 5] = float("nan")  # a NaN row: point mass at the NaN (torch.argmax)
    tokens = torch.tensor([[-1, 4, 2, 5]])
    for temperature in (0.0, 1.0):
        accept_len, path, out = xkernels.tree_verify(tokens.to(device), parents.to(device), logits.to(device),
                                                     temperature=temperature)
        if temperature == 0:
            assert accept_len.tolist() == [1] and path.tolist()[0][:2] == [0, 2] and out.tolist()[0][:2] == [2, 0]


def joint_counts(out, accept_len, next_logits, temperature, v, seed=0):
    """Counts of the first two emitted tokens; where only one was emitted, the second is what the
    next step would draw: a plain sample of the target after it."""
    g = torch.Generator().manual_seed(seed)
    x1 = out[:, 0]
    x2 = out[:, 1].clone()
    short = accept_len == 0
    probs = torch.softmax(next_logits[x1[short]] / temperature, -1)
    x2[short] = torch.multinomial(probs, 1, generator=g)[:, 0]
    return torch.bincount(x1 * v + x2, minlength=v * v)


V_STAT, SAMPLES = 5, 40000


def stat_target(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V_STAT, generator=g) * 1.5, torch.randn(V_STAT, V_STAT, generator=g) * 1.5


def expected_joint(l0, l1, temperature):
    p1 = torch.softmax(l0 / temperature, -1)
    return p1[:, None] * torch.softmax(l1 / temperature, -1)


def deterministic_tree():
    """root -> children tokens [2, 0, 2 (a duplicate), 1]; each of those -> [3, 1]."""
    parents = [-1, 0, 0, 0, 0] + [c for c in range(1, 5) for _ in range(2)]
    tokens = [-1, 2, 0, 2, 1] + [3, 1] * 4
    return torch.tensor([parents]), torch.tensor([tokens])


def tree_logits(l0, l1, tokens, parents):
    """The target's logits after each node's path (depth-2 rows: anything)."""
    n, m = tokens.shape
    logits = torch.zeros(n, m, V_STAT)
    logits[:, 0] = l0
    depth1 = parents == 0
    logits[depth1] = l1[tokens[depth1]]
    return logits


def walk_counting_duplicates(tokens, parents, logits, temperature, seed):
    """A wrong verifier: a rejected token keeps its probability, so a duplicate child is tried twice."""
    n, m = tokens.shape
    out = torch.full((n, 2), -1)
    accept = torch.zeros(n, dtype=torch.int64)
    for s in range(n):
        node, emitted = 0, []
        while len(emitted) < 2:
            p = torch.softmax(logits[s, node] / temperature, -1)
            children = [c for c in range(m) if parents[s, c] == node]
            nxt = None
            for c in children:
                if float(reference.acceptance_coins_at(seed, 0, s, c)) < float(p[tokens[s, c]]):
                    nxt = c
                    break
            if nxt is None:
                emitted.append(int(torch.multinomial(p, 1)))
                break
            emitted.append(int(tokens[s, nxt]))
            accept[s] += 1
            node = nxt
        out[s, : len(emitted)] = torch.tensor(emitted)
    return accept, out


@pytest.mark.parametrize("variant", ["kernel", "counts duplicates twice"])
def test_deterministic_children_are_lossless(variant):
    temperature = 1.0
    l0, l1 = stat_target(1)
    parents, tokens = deterministic_tree()
    n = SAMPLES if variant == "kernel" else 6000
    parents, tokens = parents.expand(n, -1).contiguous(), tokens.expand(n, -1).contiguous()
    logits = tree_logits(l0, l1, tokens, parents)
    if variant == "kernel":
        accept_len, _, out = xkernels.tree_verify(tokens, parents, logits, temperature=temperature, seed=5)
    else:
        torch.manual_seed(0)
        accept_len, out = walk_counting_duplicates(tokens, parents, logits, temperature, 5)
    p = chi_squared_pvalue(joint_counts(out, accept_len, l1, temperature, V_STAT), expected_joint(l0, l1, temperature))
    if variant == "kernel":
        assert p > 1e-3
    else:
        assert p < 1e-6


def sampled_tree(n, q0, q1, replacement, seed=0):
    """Per sequence: 3 root children drawn from q0, each with 2 children drawn from q1[its token]."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.tensor([-1, 0, 0, 0, 1, 1, 2, 2, 3, 3]).expand(n, -1).contiguous()
    tokens = torch.full((n, 10), -1, dtype=torch.int64)
    tokens[:, 1:4] = torch.multinomial(q0.expand(n, -1), 3, replacement=replacement, generator=g)
    for j, c in enumerate(range(1, 4)):
        tokens[:, 4 + 2 * j: 6 + 2 * j] = torch.multinomial(q1[tokens[:, c]], 2, replacement=replacement, generator=g)
    q = torch.full((n, 10, V_STAT), 1.0 / V_STAT)
    q[:, 0] = q0
    q[:, 1:4] = q1[tokens[:, 1:4]]
    return tokens, parents, q


@pytest.mark.parametrize("replacement,variant", [(True, "kernel"), (False, "kernel"), (True, "ignores q"),
                                                 (False, "ignores removal")])
def test_sampled_children_are_lossless(replacement, variant):
    temperature = 0.8
    l0, l1 = stat_target(2)
    g = torch.Generator().manual_seed(3)
    q0 = torch.softmax(torch.randn(V_STAT, generator=g), -1)
    q1 = torch.softmax(torch.randn(V_STAT, V_STAT, generator=g), -1)
    tokens, parents, q = sampled_tree(SAMPLES, q0, q1, replacement)
    logits = tree_logits(l0, l1, tokens, parents)
    if variant == "ignores q":
        # Wrong: draft_probs that say nothing (every child looks free to propose): accepts too often.
        q_wrong = q.clone()
        q_wrong[:, :, :] = 1e-30
        accept_len, _, out = xkernels.tree_verify(tokens, parents, logits, draft_probs=q_wrong,
                                                  temperature=temperature, seed=7)
    else:
        wr = not replacement and variant == "kernel"
        accept_len, _, out = xkernels.tree_verify(tokens, parents, logits, draft_probs=q, without_replacement=wr,
                                                  temperature=temperature, seed=7)
    p = chi_squared_pvalue(joint_counts(out, accept_len, l1, temperature, V_STAT), expected_joint(l0, l1, temperature))
    if variant == "kernel":
        assert p > 1e-3
    else:
        assert p < 1e-6


def sampled_edge_case():
    """Rows the closed-form residual (xkernels/tree.h's TreeResidual) must get exactly right, V=5,
    root children per sequence: 0 and 1: p uniform on ids 1..4 and q = p, child token 0 (q = p = 0
    there) rejected, leaving max(p - q, 0) = 0 exactly: the argmax is emitted, with a later child
    (sequence 0: the pass that finds the residual empty stops the tests) or without (1: the draw
    finds nothing); 2: a draft row without mass (every child rejected, the draw from p); 3: one
    token three times, rejected first with odds of 9 to 1 (a rejected token is never accepted)."""
    parents = torch.tensor([[-1, 0, 0, 0]]).expand(4, -1).contiguous()
    tokens = torch.tensor([[-1, 0, 2, 3], [-1, 0, -1, -1], [-1, 2, 3, 1], [-1, 1, 1, 1]])
    num_nodes = torch.tensor([4, 2, 4, 4])
    tokens[1, 2:] = 0  # past num_nodes
    logits = torch.zeros(4, 4, 5)
    logits[:2, 0, 0] = float("-inf")
    logits[3, 0, 0] = 2.0
    q = torch.full((4, 4, 5), 0.2)
    q[:2, 0] = torch.tensor([0.0, 0.25, 0.25, 0.25, 0.25])
    q[2, 0] = 0.0
    q[3, 0] = torch.tensor([0.01, 0.9, 0.03, 0.03, 0.03])
    return tokens, parents, logits, q, num_nodes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("without_replacement", [False, True])
def test_sampled_children_edge_rows(device, without_replacement):
    tokens, parents, logits, q, num_nodes = sampled_edge_case()
    for seed in range(20):
        got = xkernels.tree_verify(tokens.to(device), parents.to(device), logits.to(device), draft_probs=q.to(device),
                                   without_replacement=without_replacement, temperature=1.0, seed=seed,
                                   num_nodes=num_nodes.to(device))
        want = reference.tree_verify(tokens, parents, logits, q, without_replacement, 1.0, seed, 0, num_nodes)
        for a, b in zip(got, want):
            assert torch.equal(a.cpu(), b)
        out = got[2].cpu()
        assert out[0, 0] == 1 and out[1, 0] == 1  # the argmax of an emptied residual
        assert got[0][2] == 0  # nothing is accepted from a draft row without mass


def far_below_case():
    """A root whose first child is improbable under p but holds all of q's mass, and whose second
    child's logit lies 120 below the row's max, where float32's exp underflows to 0, with no mass
    in q. 48 ids: every id on the vectorized paths."""
    v = 48
    logits = torch.zeros(1, 3, v)
    logits[0, 0, 1] = -5.0
    logits[0, 0, 7] = -120.0
    q = torch.zeros(1, 3, v)
    q[0, 0, 1] = 1.0
    return torch.tensor([[-1, 1, 7]]), torch.tensor([[-1, 0, 0]]), logits, q


@pytest.mark.parametrize("device", DEVICES)
def test_sampled_children_far_below_the_max(device):
    """After a rejection, a child of probability 0 in float32 stays rejected even where the draft
    gave it no mass (the CPU's vector exp once floored such weights at e^-87 and accepted it)."""
    tokens, parents, logits, q = far_below_case()
    rejected_first = 0
    for seed in range(30):
        got = xkernels.tree_verify(tokens.to(device), parents.to(device), logits.to(device), draft_probs=q.to(device),
                                   temperature=1.0, seed=seed)
        want = reference.tree_verify(tokens, parents, logits, q, False, 1.0, seed)
        for a, b in zip(got, want):
            assert torch.equal(a.cpu(), b), seed
        rejected_first += int(got[0][0]) == 0
        assert int(got[2][0, 0]) != 7
    assert rejected_first >= 25  # the second child was tested


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compact_kv(device, dtype):
    tokens, parents, logits, _ = verify_case(4, 9, 20, "bushy", seed=4)
    accept_len, path, _ = xkernels.tree_verify(tokens, parents, logits)
    cache = torch.randn(4, 3, 16, 8).to(dtype)
    want = reference.compact_kv(cache, path, accept_len, 5)
    got = xkernels.compact_kv_(cache.to(device), path.to(device), accept_len.to(device), 5)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    lp, tok = topk_case(3, 4, 3)
    torch.library.opcheck(torch.ops.xkernels.build_draft_tree.default, (lp.to(device), tok.to(device), 7))
    for packed in (False, True):
        torch.library.opcheck(torch.ops.xkernels.build_draft_tree_with_mask.default,
                              (lp.to(device), tok.to(device), 7, packed))
    parents = random_tree(3, 9, "bushy").to(device)
    nn = torch.tensor([9, 4, 1], device=device)
    torch.library.opcheck(torch.ops.xkernels.tree_attention_mask.default, (parents, nn, True))
    torch.library.opcheck(torch.ops.xkernels.tree_attention_mask.default, (parents, None, False))
    torch.library.opcheck(torch.ops.xkernels.tree_positions.default, (parents, nn))
    tokens, parents, logits, q = [t.to(device) for t in verify_case(3, 9, 20, "bushy")]
    torch.library.opcheck(torch.ops.xkernels.tree_verify.default,
                          (tokens, parents, logits, q, True, None, 1.0, None, 0, None, 1.0, None, 0.0, None, 1, None, 2, None))
    accept_len, path, _ = xkernels.tree_verify(tokens, parents, logits)
    torch.library.opcheck(torch.ops.xkernels.compact_kv_.default,
                          (torch.randn(3, 2, 12, 4, device=device), path, accept_len, 2))


def test_int32_ids_are_int64_ids():
    tokens, parents, logits, q = verify_case(2, 6, 20, "bushy")
    kw = dict(draft_probs=q, temperature=1.0, seed=torch.tensor([3, 4]), offset=torch.tensor([0, 6]))
    want = xkernels.tree_verify(tokens, parents, logits, **kw)
    got = xkernels.tree_verify(tokens.int(), parents.int(), logits, **kw)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    lp, tok = topk_case(2, 3, 2)
    assert all(torch.equal(a, b) for a, b in zip(xkernels.build_draft_tree(lp, tok.int(), 4),
                                                 xkernels.build_draft_tree(lp, tok, 4), strict=True))


def test_bad_inputs_name_the_argument():
    tokens, parents, logits, q = verify_case(2, 6, 20, "bushy")
    bad_parents = parents.clone()
    bad_parents[1, 3] = 3  # not smaller than its child
    cases = [
        (lambda: xkernels.tree_verify(tokens, bad_parents, logits), "parents is not a valid tree"),
        (lambda: xkernels.tree_attention_mask(bad_parents), "parents is not a valid tree"),
        (lambda: xkernels.tree_positions(parents.clone().fill_(0)), r"parents\[:, 0\] \(the root\) must be -1"),
        (lambda: xkernels.tree_verify(tokens + 30, parents, logits), "tokens holds ids outside"),
        (lambda: xkernels.tree_verify(tokens[:, :5], parents, logits), "tokens must have the shape of parents"),
        (lambda: xkernels.tree_verify(tokens, parents, logits[:, :5]), "target_logits must have shape"),
        (lambda: xkernels.tree_verify(tokens, parents, logits.double()), "target_logits must be"),
        (lambda: xkernels.tree_verify(tokens, parents, logits, draft_probs=q[:, :, :5]), "draft_probs must have"),
        (lambda: xkernels.tree_verify(tokens.short(), parents, logits), "tokens must be int64"),
        (lambda: xkernels.tree_verify(tokens, parents, logits, num_nodes=torch.tensor([7, 1])),
         r"num_nodes must lie in \[1, M\]"),
        (lambda: xkernels.tree_verify(tokens, parents, logits, temperature=-1.0), "temperature"),
        (lambda: xkernels.build_draft_tree(*topk_case(2, 3, 2), -1), "budget must be"),
        (lambda: xkernels.build_draft_tree(topk_case(2, 3, 2)[0].double(), topk_case(2, 3, 2)[1], 3),
         "topk_logprobs must be float32"),
        (lambda: xkernels.compact_kv_(torch.randn(2, 2, 8, 4), torch.tensor([[0, 2, 1], [0, 1, 2]]),
                                      torch.tensor([2, 0]), 1), "path must be increasing"),
        (lambda: xkernels.compact_kv_(torch.randn(2, 2, 8, 4), torch.tensor([[0, 1, 2], [0, 1, 2]]),
                                      torch.tensor([3, 0]), 1), "accept_len must lie in"),
        (lambda: xkernels.tree_attention_mask(parents, layout="dense"), "layout must be"),
        (lambda: xkernels.build_draft_tree(*topk_case(2, 3, 2), 3, mask="dense"), "mask must be"),
        (lambda: xkernels.build_draft_tree(*topk_case(2, 3, 2), 3, mask=True), "mask must be"),
        (lambda: xkernels.build_draft_tree(*topk_case(2, 3, 2), -1, mask="packed"), "budget must be"),
        (lambda: xkernels.build_draft_tree(topk_case(2, 3, 2)[0], topk_case(2, 3, 2)[1][:1], 3, mask="bool"),
         "topk_tokens must have the shape of topk_logprobs"),
    ]
    for call, message in cases:
        with pytest.raises((RuntimeError, ValueError), match=message):
            call()


@pytest.mark.needs_cuda
@pytest.mark.parametrize("temperature,with_q", [(0.0, False), (1.0, False), (1.0, True)])
def test_cpu_and_cuda_agree(temperature, with_q):
    tokens, parents, logits, q = verify_case(64, 64, 4099, "bushy", torch.bfloat16, seed=1)
    cpu = xkernels.tree_verify(tokens, parents, logits, draft_probs=q if with_q else None, temperature=temperature,
                               seed=3)
    gpu = xkernels.tree_verify(tokens.cuda(), parents.cuda(), logits.cuda(),
                               draft_probs=q.cuda() if with_q else None, temperature=temperature, seed=3)
    same = (cpu[2] == gpu[2].cpu()).all(-1)
    assert same.float().mean() > 0.95  # the rest differ only where a decision is within rounding


def test_flex_attention_mask_mod_covers_prefix_and_ancestors():
    from torch.nn.attention.flex_attention import create_mask

    from xkernels.tree import tree_block_mask, tree_mask_mod

    parents = random_tree(2, 11, "bushy", seed=5)
    num_nodes = torch.tensor([11, 6])
    dense = xkernels.tree_attention_mask(parents, num_nodes=num_nodes)
    got = create_mask(tree_mask_mod(parents, 7, num_nodes), 2, 1, 11, 18, device="cpu")[:, 0]
    assert torch.equal(got, torch.cat([torch.ones(2, 11, 7, dtype=torch.bool), dense], -1))
    block = tree_block_mask(parents, 7, num_nodes, block_size=16)
    assert block.shape[-2:] == (11, 18)


@pytest.mark.needs_cuda
def test_tree_ops_are_cuda_graph_capturable():
    lp, tok = topk_case(4, 5, 3)
    lp, tok = lp.cuda(), tok.cuda()
    offset = torch.zeros((), dtype=torch.int64, device="cuda")  # 0-dim: one stream for the batch
    logits = torch.randn(4, 13, 50, generator=torch.Generator().manual_seed(0)).cuda()

    def step():
        tokens, parents, num_nodes, _ = xkernels.build_draft_tree(lp, tok, 12)
        mask = xkernels.tree_attention_mask(parents, num_nodes=num_nodes, layout="packed")
        fused_mask = xkernels.build_draft_tree(lp, tok, 12, mask="packed")[4]
        tokens = tokens.clamp_min(0)
        return mask, fused_mask, xkernels.tree_verify(tokens, parents, logits, temperature=1.0, seed=2,
                                                      offset=offset, num_nodes=num_nodes)

    assert_replays_like_eager(step, offset)
