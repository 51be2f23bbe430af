"""chain_verify with per-request top-k/top-p on the CPU, one thread (N=8, K=4, V=151936, float32).

In each case the baseline ("reference" in the summary table) is what an engine does today:
- sort filter: vLLM's way, a full sort of every row, the top-k/top-p mask from the sorted
  cumulative softmax, scattered back, then plain sampled verification of the masked logits;
- plain sampled: verification with no filter (the cost the filter adds to);
- scalar form: the same parameters as scalars (the cost of per-row tensors).
"""

import pytest
import torch

import xkernels

N, K, V = 8, 4, 151936
TOP_K, TOP_P = 50, 0.9


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_inputs():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(N, K + 1, V, generator=g) * 3
    q = torch.softmax(logits[:, :K] + torch.randn(N, K, V, generator=g) * 0.5, -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(N, K)
    return drafts, logits, q


def sort_filter(logits, top_k, top_p):
    """Top-k then top-p by a full descending sort of each row (ties in sort order), as vLLM does."""
    ordered, order = logits.sort(-1, descending=True)
    ranks = torch.arange(logits.shape[-1])
    drop = (ranks >= top_k[..., None, None]).expand_as(logits).clone()
    probs = torch.softmax(ordered.masked_fill(drop, float("-inf")), -1)
    before = probs.cumsum(-1) - probs  # the mass ranked above each id
    drop |= before >= top_p[..., None, None]
    return torch.full_like(logits, float("-inf")).scatter(-1, order, ordered.masked_fill(drop, float("-inf")))


CASES = ["sort filter", "plain sampled", "scalar form"]


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
@pytest.mark.parametrize("case", CASES)
def bench_chain_sampling(benchmark, impl, case):
    drafts, logits, q = make_inputs()
    seeds, offsets = torch.arange(N), torch.full((N,), 100)
    top_k, top_p = torch.full((N,), TOP_K), torch.full((N,), TOP_P)
    temperature = torch.ones(N)
    benchmark.group = f"chain_verify N={N} K={K} V={V} 1 thread: {case}"
    benchmark.extra_info["impl"] = impl
    ours = lambda: xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=temperature,  # noqa: E731
                                         top_k=top_k, top_p=top_p, seed=seeds, offset=offsets)
    if impl == "xkernels":
        fn = ours
    elif case == "sort filter":
        fn = lambda: xkernels.chain_verify(drafts, sort_filter(logits, top_k, top_p), draft_probs=q,  # noqa: E731
                                           temperature=temperature, seed=seeds, offset=offsets)
    elif case == "plain sampled":
        fn = lambda: xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=1.0, seed=3)  # noqa: E731
    else:
        fn = lambda: xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=1.0, top_k=TOP_K,  # noqa: E731
                                           top_p=TOP_P, seed=3)
    accept_len, _ = benchmark.pedantic(fn, rounds=7, warmup_rounds=1)
    benchmark.extra_info["mean_accept_len"] = round(accept_len.float().mean().item(), 2)
