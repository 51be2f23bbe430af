"""The Spiffy CUDA kernels, run by the emulation, against the references."""
import pytest
import torch

from xkernels import reference
from xkernels.spiffy import DraftGraph
from tests.test_dllm import MASK, step_case
from tests.test_spiffy import accept_case, hand_graph
from tests.test_dllm_sampling import dllm_step_at, mixed_params


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
    """Rows long enough for several vector-loaded slices each (masked_row_slices: 64 KB or more a
    slice, so 2 at bfloat16 and 4 at float32), merged by pass 2."""
    logits, block = step_case(2, 6, 49160, dtype, seed=5)
    logits[0, 1, [100, 40000]] = 9.0  # a tie across slices
    graph = hand_graph()
    got = emu.spiffy_materialize(logits, block, MASK, graph, 4, temperature, num_sms=num_sms)
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children, 4,
                                        temperature)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("filters", [{}, dict(temperature=1.0, top_p=0.5)])  # the candidate launches too
@pytest.mark.parametrize("n,length,v", [(0, 4, 16), (2, 0, 16), (2, 4, 1)])
def test_materialize_edge_shapes(emu, n, length, v, filters):
    logits, block = step_case(n, length, v, seed=1, masked_share=1.0)
    graph = hand_graph()
    got = emu.spiffy_materialize(logits, block, MASK, graph, 2, **filters)
    # the reference cannot stack the rows of an empty block under filters: they change nothing there
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children, 2,
                                        **(filters if length else {}))
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


def top_token_graph(positions):
    """A node per (position rank, token rank < 8) under the root: keeping them all lists every
    position's top tokens in the drafts, tie order included."""
    nodes = [[]] + [[(i, j)] for i in range(positions) for j in range(8)]
    return DraftGraph(nodes, [(0, g) for g in range(1, len(nodes))])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("v", [301, 49160])  # 49160: rows split over slices
def test_materialize_top_tokens_of_hard_rows(emu, dtype, temperature, v):
    """Each row's top 8 tokens where spiffy_rows' bound (the 8th best of the threads' maxima) is
    tight or breaks: the top 10 ids in one thread's chunks, 12 ids tied at the top (the tie order by
    id), -0 and +0 tied at the top of a negative row, and rows whose candidates overflow the list,
    which fall back to insertion and read the row a second time: a flat row, a row of two values,
    a row of -inf only. A NaN row (no tokens) besides."""
    n, length = 2, 4
    logits, block = step_case(n, length, v, dtype, seed=4)
    block[:] = MASK
    ids = torch.arange(v)
    in_thread_0 = ids[ids % 2048 == 0][:10]  # chunks 0, 256, 512, ... of 8 or 4 ids: thread 0's
    logits[0, 0] = 1.0
    logits[0, 1] = (ids % 2).to(dtype)
    logits[0, 2, in_thread_0] = (20 + torch.arange(len(in_thread_0))).to(dtype)
    logits[0, 3, ids[6::(v // 12)][:12]] = 15.0
    logits[1, 0] = -logits[1, 0].abs() - 1
    zeros = ids[3::(v // 10)][:10]
    logits[1, 0, zeros] = torch.tensor([0.0, -0.0] * 5, dtype=dtype)
    logits[1, 1] = float("-inf")
    logits[1, 2, [9, 40]] = float("nan")
    graph = top_token_graph(length)
    emu.take_row_passes()
    got = emu.spiffy_materialize(logits, block, MASK, graph, len(graph) - 1, temperature)
    counted = emu.take_row_passes()
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children,
                                        len(graph) - 1, temperature)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], atol=1e-5, rtol=1e-4, equal_nan=True)
    assert counted == n * length + 3  # the flat, two-value and -inf rows twice


def check_accept(emu, args, clusters, num_unmask=1, threshold=None, temperature=0.0, seed=5, offset=11):
    got = emu.spiffy_accept(*args, MASK, num_unmask, threshold, temperature, seed, offset, clusters=clusters)
    want = reference.spiffy_accept(*args, MASK, num_unmask, threshold=threshold, temperature=temperature, seed=seed,
                                   offset=offset)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    return got


# clusters: a thread block cluster of kAcceptCluster blocks a sequence (sm_90+), else a block a sequence.
@pytest.mark.parametrize("clusters", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("threshold", [None, 0.2])
@pytest.mark.parametrize("v", [301, 304])  # 304: rows that take the vector loads
def test_accept_matches_reference(emu, clusters, dtype, temperature, threshold, v):
    args = accept_case(4, 6, 10, v, dtype, seed=2)
    args[-1][3] = 3  # nothing masked
    check_accept(emu, args, clusters, threshold=threshold, temperature=temperature)


def chain_case(n, length, v, depth, seed):
    """Drafts along a chain of `depth` nodes (rank-0 tokens at positions 0, 1, ...) whose logits all
    equal the root's: the walk follows the chain, a step a node, as far as the drafts reach. The
    drafts are kept in reverse order, so each step matches at the last one it can."""
    logits, block = step_case(n, length, v, seed=seed)
    chain = DraftGraph([[]] + [[(i, 0) for i in range(d)] for d in range(1, depth + 1)],
                       [(d, d + 1) for d in range(depth)])
    drafts, node_ids, _ = reference.spiffy_materialize(logits, block, MASK, chain.ranks, chain.child_ptr,
                                                       chain.children, depth)
    draft_logits = logits[:, None].expand(n, depth, length, v).contiguous()
    return [logits, draft_logits, drafts.flip(1).contiguous(), node_ids.flip(1).contiguous(), block]


@pytest.mark.parametrize("clusters", [True, False])
def test_accept_follows_a_chain_of_drafts(emu, clusters):
    got = check_accept(emu, chain_case(1, 10, 40, 4, seed=4), clusters, num_unmask=2, seed=1, offset=3)
    assert int(got[0][0]) == 3 and int(got[4][0]) == 0  # steps of two tokens: the drafts of 2 and 4 tokens match


@pytest.mark.parametrize("clusters", [True, False])
@pytest.mark.parametrize("n,length,v,depth", [(1, 24, 61, 20), (3, 12, 64, 11), (5, 3, 9, 3), (2, 1, 5, 1),
                                              (17, 6, 9, 3)])
def test_accept_walks_many_steps(emu, clusters, n, length, v, depth):
    """Walks of up to depth + 1 steps, the last draft matching each time; 3 masked rows or 1 (fewer
    than the cluster's blocks: idle blocks only meet the others), V odd or below a vector; 17
    sequences, more clusters of 8 than the emulated device runs at once: clusters of 4."""
    args = chain_case(n, length, v, depth, seed=n + length)
    got = check_accept(emu, args, clusters, seed=2)
    assert int(got[0].max()) > 1 or length == 1


@pytest.mark.parametrize("clusters", [True, False])
def test_accept_without_a_match_and_with_bad_ids(emu, clusters):
    """No kept draft matches (one step), node ids out of range or -1, tokens no vocabulary holds:
    values the CUDA op cannot check (a host read) are only compared; ASan would report a stray access."""
    args = chain_case(4, 8, 33, 3, seed=7)
    drafts, node_ids = args[2], args[3]
    drafts[0] = 2**62  # never equal to the block
    node_ids[1] = torch.tensor([99, -5, 2**40])
    node_ids[2] = -1  # nothing kept
    drafts[3, 0, 0] = -(2**62)
    got = check_accept(emu, args, clusters)
    assert got[0][0] == 1 and got[4][0] == -1 and got[4][2] == -1


@pytest.mark.parametrize("clusters", [True, False])
@pytest.mark.parametrize("n,length,v,k,masked", [(1, 4, 16, 0, 1.0), (3, 5, 12, 2, 0.0), (2, 6, 1, 1, 1.0),
                                                 (1, 1, 8, 1, 1.0)])
def test_accept_edge_shapes(emu, clusters, n, length, v, k, masked):
    """keep = 0, nothing masked (no step), V = 1, L = 1."""
    logits, block = step_case(n, length, v, seed=3, masked_share=masked)
    drafts = block[:, None].expand(n, k, length).contiguous()
    args = [logits, logits[:, None].expand(n, k, length, v).contiguous(), drafts, torch.zeros(n, k, dtype=torch.int64),
            block]
    check_accept(emu, args, clusters)


@pytest.mark.parametrize("n,length", [(0, 32), (16, 32), (17, 32), (5, 0), (1, 1)])
def test_accept_plan(emu, n, length):
    """What the binding plans: a cluster of 8 blocks a sequence when the device runs clusters and
    all n of them at once (the emulated device: 132 SMs, one block an SM, so 16), else of 4; one
    block without clusters. The workspace holds per position of each node (here the root: k = 0) a
    confidence and a pick, per position a byte and a row index, and two walk records a sequence (a
    step's plan and the next's), each region 256-byte aligned."""
    align = lambda b: (b + 255) // 256 * 256  # noqa: E731
    nl = n * length
    bytes_ = align(4 * nl) + align(8 * nl) + align(nl) + align(8 * nl) + align(48 * n)
    assert emu.spiffy_accept_plan(n, length, clusters=True) == (8 if n <= 16 else 4, bytes_)
    assert emu.spiffy_accept_plan(n, length, clusters=False) == (1, bytes_)
    assert emu.spiffy_accept_plan(2**31 // 8, 1)[0] == 1  # the grid (n * 8 blocks) would not fit


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("n,num_drafts,block_size,max_prefix", [(4, 3, 4, 13), (0, 3, 4, 13), (3, 0, 1, 0),
                                                                  (2, 2, 5, 70), (4100, 1, 4, 3), (3, 4, 16, 500),
                                                                  (2, 1, 8, 16), (5, 3, 32, 1037)])
def test_attention_mask_matches_reference(emu, packed, n, num_drafts, block_size, max_prefix):
    """Rows longer than a warp, a grid that strides (32,800 rows over 4096 blocks of 8), empty cases;
    rows of 16-byte stores between a bytewise head and tail (rows not 16-byte aligned, rows of
    whole 16-byte words, rows under 16 bytes), intervals that start and end inside a word, a
    negative prefix length (no prefix key)."""
    lens = torch.arange(n) % (max_prefix + 1)
    if n >= 3:
        lens[1] = -4
    got = emu.spiffy_attention_mask(lens, num_drafts, block_size, max_prefix, packed)
    if n == 0:  # the reference's packed view cannot infer a size of an empty batch
        assert got.numel() == 0
        return
    assert torch.equal(got, reference.spiffy_attention_mask(lens, num_drafts, block_size, max_prefix, packed))


@pytest.mark.parametrize("clusters", [True, False])
@pytest.mark.parametrize("per_request", [True, False])
def test_accept_per_sequence_parameters_and_streams(emu, clusters, per_request):
    """spiffy_accept with every parameter kind mixed in one batch (the row cut of the root's and
    the drafts' rows) and either stream form (per request: step d at offset[n] + d * L) against the
    reference, on drafts that are the steps the batch takes, so that walks go deep."""
    n, length = 8, 10
    root, draft_logits, drafts, node_ids, block = accept_case(n, 3, length, 41, torch.float32, seed=2)
    root[:, :, MASK] = 30.0
    params = mixed_params(n, 3, per_request)
    state, logits = block.clone(), root
    for d in range(3):
        state = dllm_step_at(logits, state, params, d, length)[0]
        drafts[:, d], node_ids[:, d], logits = state, d + 1, draft_logits[:, d]
    got = emu.spiffy_accept(root, draft_logits, drafts, node_ids, block, MASK, clusters=clusters, **params)
    want = reference.spiffy_accept(root, draft_logits, drafts, node_ids, block, MASK, **params)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert (got[0] > 2).any()


@pytest.mark.parametrize("v", [301, 49160])  # 49160: rows split over slices
def test_materialize_per_sequence_parameters(emu, v):
    logits, block = step_case(8, 12, v, torch.bfloat16, seed=1)
    params = mixed_params(8, 2)
    del params["seed"], params["offset"]
    graph = hand_graph()
    got = emu.spiffy_materialize(logits, block, MASK, graph, 3, num_sms=132, **params)
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children, 3,
                                        **params)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("filters,passes", [
    (dict(top_k=50), 2),
    (dict(top_p=0.9), 2),
    (dict(top_k=20, top_p=0.8), 2),
    (dict(top_k=50, min_p=0.5), 2),  # min-p moves the cut above top-k's: the head holds its ids
    (dict(top_k=3000, top_p=0.9), 5),  # top-k beyond the candidates: the radix path's 3 passes
    (dict(min_p=0.05), 2),  # min-p alone: its floor above every dropped key, its ids all in the head
    (dict(top_k=2500), 3),  # fewer finite ids than k: the counts' pass, the cut keeps all
])
def test_materialize_filtered_row_passes(emu, filters, passes):
    """A masked row whose sequence filters is read by the slices pass (its statistics and top tokens,
    as every masked row) and by the candidates' scan; a row the candidates do not settle also by the
    radix path (bench/floors.md's filters table): its statistics pass noting the top key bits (not
    for min-p alone, whose top is select's), its gathers, min-p alone's kept sum (where its floor
    lies at or below a key the candidates dropped). Greedy and
    unfiltered masked rows are read once, unmasked rows never. The scores are those of p' (a wrong
    kept sum moves them)."""
    n, length, v = 5, 6, 3001
    logits, block = step_case(n, length, v, torch.float32, seed=9)
    logits = logits * 3
    few = filters.get("top_k") == 2500
    if few:
        logits[0, :, 2000:] = float("-inf")  # 2000 finite ids in sequence 0's rows
    temperature = torch.tensor([1.0, 0.8, 0.0, 0.7, 1.0])
    on = torch.tensor([1, 1, 0, 0, 0], dtype=torch.bool)  # greedy, and unfiltered sampled, rows besides
    params = dict(temperature=temperature, top_k=torch.where(on, filters.get("top_k", 0), 0).int(),
                  top_p=torch.where(on, filters.get("top_p", 1.0), 1.0),
                  min_p=torch.where(on, filters.get("min_p", 0.0), 0.0))
    params["top_k"][2] = 5  # a greedy row's filter does nothing
    if few:
        params["top_k"][1] = 0  # sequence 1 without a filter
    graph = hand_graph()
    emu.take_row_passes()
    got = emu.spiffy_materialize(logits, block, MASK, graph, 3, **params)
    counted = emu.take_row_passes()
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children, 3,
                                        **params)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], atol=1e-5, rtol=1e-4)
    masked = (block == MASK).sum(1)
    assert masked.min() > 0 and masked.sum() < n * length
    filtered = masked[:1].sum() if few else masked[:2].sum()
    assert counted == passes * int(filtered) + int(masked.sum() - filtered)


def filter_params(rows):
    """Per-sequence parameters from (temperature, top_k, top_p, min_p) tuples."""
    t, k, p, m = zip(*rows)
    return dict(temperature=torch.tensor(t), top_k=torch.tensor(k, dtype=torch.int32), top_p=torch.tensor(p),
                min_p=torch.tensor(m))


def check_materialize(emu, logits, block, params, keep, num_sms=132):
    """Every position's top tokens, their log probabilities under p' (the scores of top_token_graph's
    nodes) and the positions' order (the drafts) against the reference; returns the emulation's."""
    graph = top_token_graph(logits.shape[1])
    got = emu.spiffy_materialize(logits, block, MASK, graph, keep, num_sms=num_sms, **params)
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children, keep,
                                        **params)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], atol=1e-5, rtol=1e-4)
    return got


# (temperature, top_k, top_p, min_p) of each sequence of the mixed cases: top-k, top-p, both, min-p
# alone, greedy with filters, top-k beyond the candidates (alone and with top-p), top-k of 1, top-p
# and min-p, all three, unfiltered, top-p alone at a low temperature.
MIXED = [(1.0, 50, 1.0, 0.0), (0.7, 0, 0.9, 0.0), (1.3, 20, 0.8, 0.0), (1.0, 0, 1.0, 0.1), (0.0, 5, 0.5, 0.1),
         (1.0, 3000, 1.0, 0.0), (1.0, 2500, 0.9, 0.0), (0.8, 1, 1.0, 0.0), (1.0, 0, 0.5, 0.05), (1.1, 40, 0.9, 0.2),
         (1.0, 0, 1.0, 0.0), (0.5, 0, 0.95, 0.0)]


@pytest.mark.parametrize("dtype,v", [(torch.float32, 3001), (torch.bfloat16, 3008), (torch.float16, 20011)])
def test_materialize_mixed_filtered_rows(emu, dtype, v):
    """Each filter kind beside the others, on rows the candidates settle and rows they do not (a
    flat row, a row of ties, half the ids -inf, min-p alone, top-k beyond them), rows holding a NaN
    or +inf (no cut), an -inf row, the mask token on top of a row (never a candidate), V not a
    multiple of 8 (unaligned rows) and several slices a row (v = 20011); keep = 1 besides."""
    logits, block = step_case(len(MIXED), 4, v, dtype, seed=v)
    logits = logits * 2
    block[:, 0] = MASK
    logits[0, 1, MASK] = 40.0
    logits[1, 0] = 0.0
    logits[2, 0] = torch.randint(0, 3, (v,), generator=torch.Generator().manual_seed(v)).to(dtype)
    logits[3, 1, 11] = float("nan")
    logits[4, 2, 5] = float("inf")
    logits[5, 0, :v // 2] = float("-inf")
    logits[6, 3] = float("-inf")
    logits[8, 0] = (logits[8, 0] * 6).round() / 6
    logits[9, 2, MASK] = 10.0
    params = filter_params(MIXED)
    check_materialize(emu, logits, block, params, 8 * 4)
    check_materialize(emu, logits, block, params, 1, num_sms=4)


@pytest.mark.parametrize("v", [1, 5, 9])
def test_materialize_filtered_rows_of_a_small_vocabulary(emu, v):
    logits, block = step_case(4, 3, v, seed=v, masked_share=1.0)
    check_materialize(emu, logits, block, filter_params([(1.0, 1, 0.5, 0.0), (1.0, 0, 0.6, 0.3), (0.7, 2, 1.0, 0.0),
                                                         (1.0, 0, 1.0, 0.5)]), 8 * 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_materialize_settled_and_radix_cuts_agree(emu, dtype):
    """The same rows in two sequences under filters that cut them alike: top-p alone, which the
    candidates settle, and top-p after a top-k past the row's 40 finite ids (a cut that keeps all),
    which they cannot: the radix path. Bitwise the same scores and drafts (the cut and the kept
    fixed-point sum agree), each path counted: 2 passes a settled row, 5 a radix one."""
    length, v = 3, 49160
    g = torch.Generator().manual_seed(2)
    row = torch.full((length, v), float("-inf"))
    row[:, torch.randperm(v, generator=g)[:40]] = torch.randn(length, 40, generator=g) * 2
    logits = torch.stack([row, row]).to(dtype)
    block = torch.full((2, length), MASK)
    graph = top_token_graph(length)
    keep = len(graph) - 1
    emu.take_row_passes()
    settled = emu.spiffy_materialize(logits[:1], block[:1], MASK, graph, keep, num_sms=132,
                                     **filter_params([(1.0, 0, 0.8, 0.0)]))
    assert emu.take_row_passes() == 2 * length
    radix = emu.spiffy_materialize(logits[1:], block[1:], MASK, graph, keep, num_sms=132,
                                   **filter_params([(1.0, 60, 0.8, 0.0)]))
    assert emu.take_row_passes() == 5 * length
    for a, b in zip(settled, radix):
        assert torch.equal(a, b)
    assert (settled[2] == 0).any() and (settled[2] > 0).any()  # the cut drops some top tokens
    check_materialize(emu, logits, block, filter_params([(1.0, 0, 0.8, 0.0), (1.0, 60, 0.8, 0.0)]), keep)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_materialize_filtered_rows_without_a_softmax_and_of_ties(emu, dtype):
    """Filtered rows holding a NaN or +inf (scored as they are, no cut), of -inf only, and of runs
    of ties (the cut inside a run, broken to the lower id), each filter kind in one batch, over a
    vocabulary of several slices (both the slices pass's and the candidates')."""
    n, length, v = 6, 5, 49160
    logits, block = step_case(n, length, v, dtype, seed=12)
    logits[1] = (logits[1] * 2).round() / 2  # few distinct values
    logits[2, 0, 7] = float("nan")
    logits[3, 1, 9] = float("inf")
    logits[4, 2] = float("-inf")
    block[:, :3] = MASK
    params = dict(temperature=torch.tensor([1.0, 0.9, 1.1, 0.7, 1.0, 1.3]),
                  top_k=torch.tensor([40, 0, 7, 0, 3, 30000], dtype=torch.int32),
                  top_p=torch.tensor([1.0, 0.6, 1.0, 0.9, 0.5, 0.95]),
                  min_p=torch.tensor([0.0, 0.0, 0.2, 0.1, 0.0, 0.01]))
    graph = hand_graph()
    got = emu.spiffy_materialize(logits, block, MASK, graph, 4, num_sms=132, **params)
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children, 4,
                                        **params)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], atol=1e-5, rtol=1e-4, equal_nan=True)
