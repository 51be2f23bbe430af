import pytest
import scipy.stats
import torch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.needs_cuda)]
LOGIT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def chi_squared_pvalue(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """p-value of observed counts against expected probabilities (cells with zero probability must be empty)."""
    counts = counts.flatten().double()
    probs = expected_probs.flatten().double()
    assert counts[probs == 0].sum() == 0, "a cell of probability zero was observed"
    keep = probs > 0
    expected = probs[keep] / probs[keep].sum() * counts.sum()
    return float(scipy.stats.chisquare(counts[keep].numpy(), expected.numpy()).pvalue)


def mixed_sampling_params(n: int, seed: int) -> dict:
    """Per-request sampling arguments of n rows with every parameter kind in one batch: greedy and
    sampled rows, each filter alone and mixed, and per-request streams."""
    g = torch.Generator().manual_seed(seed)
    temperature = torch.tensor([0.0, 0.5, 1.0, 1.5, 0.8, 1.0, 2.0, 0.0])[torch.arange(n) % 8]
    top_k = torch.randint(0, 8, (n,), generator=g)
    top_p = torch.tensor([1.0, 0.9, 0.5, 0.8, 0.3, 1.0, 0.95])[torch.arange(n) % 7]
    min_p = torch.tensor([0.0, 0.1, 0.0, 0.05, 0.0, 0.2])[torch.arange(n) % 6]
    seeds = torch.randint(0, 2**40, (n,), generator=g)
    offsets = torch.randint(0, 2**20, (n,), generator=g)
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seeds, offset=offsets)


def assert_chains_agree(got, want, drafts, logits, q, temperature, seed, offset, tol=1e-4):
    """chain_verify results of two devices: identical, except sequences whose first difference
    sits where the decision is within rounding (float64 recomputation): an acceptance test with
    u * q(x) within tol of p(x), or a sampled row whose best two perturbed scores are within tol."""
    from xkernels import reference

    got = [t.cpu() for t in got]
    n, k1, v = logits.shape
    coins = reference.acceptance_coins(seed, offset, n, k1).double()
    inv_t = reference.inverse_temperature(temperature)
    for s in (got[1] != want[1]).any(-1).nonzero().flatten().tolist():
        i = int((got[1][s] != want[1][s]).nonzero()[0])
        a = logits[s, i].double() * (inv_t if inv_t else 1.0)
        p = a.softmax(-1)
        near = False
        if i < k1 - 1 and inv_t:  # the acceptance of draft i
            x = int(drafts[s, i])
            rhs = coins[s, i] * (q[s, i, x].double() if q is not None else 1.0)
            near = abs(float(rhs - p[x])) <= tol
        if not near:  # the sampled (or greedy) token at row i
            score = a if not inv_t else a + reference.gumbel_noise(seed, offset, s, i, v).double()
            top2 = score.topk(2).values
            near = float(top2[0] - top2[1]) <= tol * max(1.0, float(top2[0].abs()))
        assert near, f"sequence {s} differs at row {i} where the decision is not within rounding"


def assert_replays_like_eager(step, offset, values=range(3)):
    """step() (ops that read the one-element offset tensor) captured once in a CUDA graph, then
    replayed with offset set to each value, returns what step() returns run eagerly (every tensor
    of its nested outputs equal)."""
    from torch.utils._pytree import tree_leaves

    step()  # warm-up: lazy initialisation must not be captured
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for value in values:
        offset.fill_(value)
        graph.replay()
        eager = step()
        assert all(torch.equal(a, b) for a, b in zip(tree_leaves(captured), tree_leaves(eager), strict=True))
