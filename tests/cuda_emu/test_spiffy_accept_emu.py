"""spiffy_accept's prepare kernel and warp leader, run by the emulation, against the reference: the
rows of the root and of each kept draft picked before the walk (at the step the rule fixes for the
node), the steps the rule does not fix picked by the walk's team, and the selection, match and plan
on a warp. Tokens, positions, steps and continuations must be the reference's exactly."""
import pytest
import torch

import xkernels
from xkernels import reference
from xkernels.reference import sampling as ref_sampling
from tests.test_dllm import MASK, step_case
from tests.test_spiffy import accept_case
from tests.test_dllm_sampling import mixed_params
from tests.cuda_emu.test_spiffy_emu import chain_case


def walked_case(n, k, length, v, dtype, params, seed, num_unmask=1, threshold=None):
    """Drafts 0..3 are the states the batch's first steps reach (walks of up to 5 steps), the others
    a graph's drafts, most never reached."""
    root, draft_logits, drafts, node_ids, block = accept_case(n, k, length, v, dtype, seed=seed)
    root[:, :, MASK] = 30.0  # only a row without a softmax could pick it
    state, logits = block.clone(), root
    for d in range(min(k - 1, 4)):
        per_row = ref_sampling.is_per_row(params.get("offset", 0), n)
        offset = params.get("offset", 0) + (d * length if per_row else d)
        state = xkernels.dllm_step(logits, state, MASK, num_unmask=num_unmask, threshold=threshold,
                                   **{**params, "offset": offset})[0]
        drafts[:, d], node_ids[:, d], logits = state, d + 1, draft_logits[:, d]
    return [root, draft_logits, drafts, node_ids, block]


def check(emu, args, clusters, **kw):
    got = emu.spiffy_accept(*args, MASK, clusters=clusters, **kw)
    want = reference.spiffy_accept(*args, MASK, **kw)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    return got


# clusters: a thread block cluster a sequence (sm_90+), else a block a sequence.
@pytest.mark.parametrize("clusters", [True, False])
@pytest.mark.parametrize("per_request", [True, False])
@pytest.mark.parametrize("num_unmask,threshold", [(1, None), (2, None), (3, None), (1, 0.3)])
def test_accept_walks_with_mixed_parameters(emu, clusters, per_request, num_unmask, threshold):
    """Greedy, sampled and filtered sequences in one batch, either stream form; steps of 1, 2 or 3
    tokens or a threshold. 8 sequences of 6 drafts: more than the emulated device's 132 SMs / 4
    nodes, so only the roots' rows are prepared and the walk picks every later step's."""
    params = mixed_params(8, 3, per_request)
    args = walked_case(8, 6, 10, 41, torch.bfloat16, params, seed=2, num_unmask=num_unmask, threshold=threshold)
    got = check(emu, args, clusters, num_unmask=num_unmask, threshold=threshold, **params)
    assert (got[0] > 2).any()


@pytest.mark.parametrize("clusters", [True, False])
@pytest.mark.parametrize("dtype,v", [(torch.float32, 304), (torch.bfloat16, 304), (torch.float32, 301)])
def test_accept_with_many_nodes(emu, clusters, dtype, v):
    """Eight kept drafts, every sequence sampled (filters on all but one), rows that take the vector
    loads (304) and rows that do not (301). 3 x 9 nodes, at most 132 SMs / 4: the drafts' rows are
    prepared too."""
    params = mixed_params(3, 5)
    params["temperature"] = torch.tensor([1.0, 0.9, 1.1])
    args = walked_case(3, 8, 12, v, dtype, params, seed=8)
    got = check(emu, args, clusters, **params)
    assert (got[0] > 3).any()


@pytest.mark.parametrize("clusters", [True, False])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_accept_edge_cases(emu, clusters, temperature):
    """No kept draft (node ids -1: one step), V = 1, L = 1, nothing masked, keep = 0."""
    args = accept_case(3, 4, 8, 50, torch.float32, seed=5)
    args[3][:] = -1
    got = check(emu, args, clusters, temperature=temperature, seed=3)
    assert (got[0] == 1).all() and (got[4] == -1).all()
    for n, length, v, k, masked in [(2, 6, 1, 1, 1.0), (1, 1, 8, 1, 1.0), (3, 5, 12, 2, 0.0), (1, 4, 16, 0, 1.0)]:
        logits, block = step_case(n, length, v, seed=3, masked_share=masked)
        drafts = block[:, None].expand(n, k, length).contiguous()
        args = [logits, logits[:, None].expand(n, k, length, v).contiguous(), drafts,
                torch.zeros(n, k, dtype=torch.int64), block]
        check(emu, args, clusters, temperature=temperature, seed=9)


def greedy_chain(threshold):
    """Sequence 0 greedy along a chain of drafts a token apart (5 steps), sequence 1 sampled with a
    filter but nothing masked: the walk takes the filtered kernel, whose picks the emulation counts
    (a T = 0 row: one pass), and every pick is sequence 0's."""
    args = chain_case(2, 12, 40, 4, seed=6)
    args[-1][1] = 3  # nothing masked
    params = dict(temperature=torch.tensor([0.0, 1.0]), top_k=torch.tensor([0, 5]), threshold=threshold)
    return args, params


@pytest.mark.parametrize("clusters", [True, False])
def test_prepared_rows_are_read_once(emu, clusters):
    """Without a threshold, a step commits one token: the prepare kernel picks the root's rows and
    each kept draft's (their steps fixed by their masked rows; 2 x 5 nodes, at most 132 SMs / 4),
    and the walk reads no row."""
    args, params = greedy_chain(None)
    emu.take_row_passes()
    got = check(emu, args, clusters, **params)
    passes = emu.take_row_passes()
    block, drafts, node_ids = args[4][0], args[2][0], args[3][0]
    masked0 = int((block == MASK).sum())
    kept = [int((d == MASK).sum()) for d, i in zip(drafts, node_ids) if i >= 0]
    assert int(got[0][0]) == 5
    assert passes == masked0 + sum(m for m in kept if m < masked0)


@pytest.mark.parametrize("clusters", [True, False])
def test_steps_a_threshold_leaves_open_are_read_by_the_walk(emu, clusters):
    """A threshold no confidence reaches commits the best row a step, as above, but the rule does
    not fix a draft's step: only the root's rows are prepared, and the walk reads each later step's."""
    args, params = greedy_chain(2.0)
    emu.take_row_passes()
    got = check(emu, args, clusters, **params)
    passes = emu.take_row_passes()
    masked0, steps = int((args[4][0] == MASK).sum()), int(got[0][0])
    assert steps == 5
    assert passes == sum(masked0 - t for t in range(steps))


def prepared_rows(args):
    """The rows spiffy_accept_prepare_kernel picks without a threshold, steps of one token: each
    sequence's masked rows of the root and of each kept draft with fewer masked rows."""
    total = 0
    for block, drafts, node_ids in zip(args[4], args[2], args[3]):
        masked0 = int((block == MASK).sum())
        kept = [int((d == MASK).sum()) for d, i in zip(drafts, node_ids) if i >= 0]
        total += masked0 + sum(m for m in kept if m < masked0)
    return total


def reads_with_and_without_candidates(emu, args, clusters, params):
    """The results (the reference's, and radix_only's the same) and the reads of rows with the
    candidate pipeline and without it (radix_only)."""
    emu.take_row_passes()
    got = check(emu, args, clusters, **params)
    once = emu.take_row_passes()
    old = emu.spiffy_accept(*args, MASK, clusters=clusters, radix_only=True, **params)
    twice = emu.take_row_passes()
    for a, b in zip(got, old):
        assert torch.equal(a, b)
    return got, once, twice


@pytest.mark.parametrize("clusters", [True, False])
def test_prepared_filtered_rows_are_read_once(emu, clusters):
    """Sampled sequences with top-k along chains of drafts (2 x 5 nodes, every step prepared): the
    candidate pipeline reads each prepared row once, where dllm_filtered_pick alone (radix_only)
    read it twice, and the walk reads none; the same results either way."""
    args = chain_case(2, 12, 40, 4, seed=6)
    params = dict(temperature=torch.tensor([1.0, 0.8]), top_k=torch.tensor([5, 3]), seed=4,
                  offset=torch.tensor([0, 9]))
    _, once, twice = reads_with_and_without_candidates(emu, args, clusters, params)
    rows = prepared_rows(args)
    assert (once, twice) == (rows, 2 * rows)


# Filters of the prepared rows, each in a batch with a greedy sequence: rows the candidates settle
# and rows they do not (top-k past the candidates, a flat row's ties at the cut) in one launch.
PIPELINE_FILTERS = [dict(top_k=5), dict(top_p=0.8), dict(min_p=0.2), dict(top_k=40, top_p=0.9, min_p=0.05),
                    dict(top_k=200), dict(top_p=0.95, min_p=0.1)]


@pytest.mark.parametrize("filters", PIPELINE_FILTERS, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
@pytest.mark.parametrize("dtype,v", [(torch.bfloat16, 304), (torch.float32, 301)])
def test_prepared_filtered_rows_match_the_radix_path(emu, filters, dtype, v):
    """The pipeline's picks are dllm_filtered_pick's: tokens, positions, steps and continuations equal
    radix_only's and the reference's, drafts' rows prepared (3 x 9 nodes); rows that take the vector
    loads (304) and rows read id by id (301: there a row that starts 16-byte aligned, which the scan
    would read by chunks, is left to the prepare kernel)."""
    n = 3
    params = dict(temperature=torch.tensor([1.0, 0.7, 0.0]), seed=torch.tensor([11, 2**33 + 5, 3]),
                  offset=torch.tensor([0, 40, 7]),
                  **{key: torch.tensor([value] * n) for key, value in filters.items()})
    args = walked_case(n, 8, 12, v, dtype, params, seed=3)
    args[0][1, 2] = 0.0  # a flat row: ties at any cut
    got = check(emu, args, True, **params)
    old = emu.spiffy_accept(*args, MASK, radix_only=True, **params)
    for a, b in zip(got, old):
        assert torch.equal(a, b)


def walked_rows(args, got):
    """The rows spiffy_accept's walk picks with a threshold no confidence reaches (a token a step;
    only the root's rows prepared): each sequence's masked rows at each step after the first."""
    return sum(sum(int((block == MASK).sum()) - t for t in range(1, int(steps)))
               for block, steps in zip(args[4], got[0]))


@pytest.mark.parametrize("clusters", [True, False])
def test_walk_filtered_rows_are_read_once(emu, clusters):
    """With a threshold, the walk picks every step after the root's: a sampled row with top-k is
    scanned once for its candidates and picked from them in the walk's block, where
    dllm_filtered_pick alone (radix_only) read it twice; the same results either way. A low
    temperature keeps the samples on the chain, so that the walks take several steps."""
    args = chain_case(2, 12, 40, 4, seed=6)
    params = dict(temperature=torch.tensor([0.05, 0.05]), top_k=torch.tensor([5, 3]), seed=4,
                  offset=torch.tensor([0, 9]), threshold=2.0)
    got, once, twice = reads_with_and_without_candidates(emu, args, clusters, params)
    rows = sum(int((block == MASK).sum()) for block in args[4]) + walked_rows(args, got)  # the roots' prepared
    assert walked_rows(args, got) > 0
    assert (once, twice) == (rows, 2 * rows)


@pytest.mark.parametrize("filters", PIPELINE_FILTERS, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
@pytest.mark.parametrize("clusters,dtype,v", [(True, torch.bfloat16, 304), (False, torch.float32, 301),
                                              (True, torch.float16, 296)])
def test_walk_filtered_rows_match_the_radix_path(emu, filters, clusters, dtype, v):
    """The walk's picks from candidates are dllm_filtered_pick's: with a threshold the walk picks
    every step after the root's, and tokens, positions, steps and continuations equal radix_only's
    and the reference's; rows the candidates settle and rows they do not (top-k past them, a flat
    row) in one batch, beside a greedy sequence."""
    n = 3
    params = dict(temperature=torch.tensor([1.0, 0.7, 0.0]), seed=torch.tensor([11, 2**33 + 5, 3]),
                  offset=torch.tensor([0, 40, 7]), threshold=0.3,
                  **{key: torch.tensor([value] * n) for key, value in filters.items()})
    args = walked_case(n, 8, 12, v, dtype, {k: w for k, w in params.items() if k != "threshold"}, seed=3,
                       threshold=0.3)
    args[1][1, 0, 2] = 0.0  # a flat row of the first draft: ties at any cut
    got = check(emu, args, clusters, **params)
    old = emu.spiffy_accept(*args, MASK, clusters=clusters, radix_only=True, **params)
    for a, b in zip(got, old):
        assert torch.equal(a, b)
    assert (got[0] > 1).any()
