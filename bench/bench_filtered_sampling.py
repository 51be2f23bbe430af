"""What per-request top-k/top-p costs in the sampling ops beyond chains, on the CPU, one thread:
tree_verify (N=8 trees of M=16 nodes, V=151936, with draft probabilities) and dllm_step (bench_spiffy's
inputs: N=4 blocks of L=32 with 24 masked positions, V=32768), float32.

In each case the baseline ("reference" in the summary table) is:
- plain sampled: the same op, per-request streams, without filters (the cost the filter adds to);
- sort filter: vLLM's way, a full sort of every row for the top-k/top-p mask (bench_chain_sampling's
  sort_filter), then the op without filters on the masked logits.
"""

import pytest
import torch

import xkernels
from bench_chain_sampling import TOP_K, TOP_P, one_thread, sort_filter  # noqa: F401 (a fixture)
from bench_spiffy import MASK, inputs as dllm_inputs
from bench_spiffy import L as DLLM_L, N as DLLM_N, V as DLLM_V

TREE_N, TREE_M, TREE_V = 8, 16, 151936
CASES = ["plain sampled", "sort filter"]


def tree_inputs():
    g = torch.Generator().manual_seed(0)
    parents = torch.tensor([-1] + [(i - 1) // 2 for i in range(1, TREE_M)]).expand(TREE_N, -1).contiguous()
    logits = torch.randn(TREE_N, TREE_M, TREE_V, generator=g) * 3
    q = torch.softmax(logits + torch.randn(TREE_N, TREE_M, TREE_V, generator=g) * 0.5, -1)
    # Child i's token: drawn from its parent's q (the root's token is unused).
    drawn = torch.multinomial(q.view(-1, TREE_V), 1, generator=g).view(TREE_N, TREE_M)
    tokens = torch.where(parents >= 0, drawn.gather(1, parents.clamp_min(0)), -1)
    return tokens, parents, logits, q


def per_request(n):
    return dict(temperature=torch.ones(n), seed=torch.arange(n), offset=torch.full((n,), 64))


def filters(n):
    return dict(top_k=torch.full((n,), TOP_K), top_p=torch.full((n,), TOP_P))


def pick(impl, case, run, logits, n):
    """The callable of impl: the filtered op, or the case's baseline."""
    if impl == "xkernels":
        return lambda: run(logits, **per_request(n), **filters(n))
    if case == "plain sampled":
        return lambda: run(logits, **per_request(n))
    return lambda: run(sort_filter(logits, *filters(n).values()), **per_request(n))


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
@pytest.mark.parametrize("case", CASES)
def bench_tree_verify_filtered(benchmark, impl, case):
    tokens, parents, logits, q = tree_inputs()
    benchmark.group = f"tree_verify N={TREE_N} M={TREE_M} V={TREE_V} 1 thread: {case}"
    benchmark.extra_info["impl"] = impl
    run = lambda x, **kw: xkernels.tree_verify(tokens, parents, x, draft_probs=q, **kw)  # noqa: E731
    accept_len, _, _ = benchmark.pedantic(pick(impl, case, run, logits, TREE_N), rounds=3, warmup_rounds=1)
    benchmark.extra_info["mean_accept_len"] = round(accept_len.float().mean().item(), 2)


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
@pytest.mark.parametrize("case", CASES)
def bench_dllm_step_filtered(benchmark, impl, case):
    logits, block = dllm_inputs()
    benchmark.group = f"dllm_step N={DLLM_N} L={DLLM_L} V={DLLM_V} 1 thread: {case}"
    benchmark.extra_info["impl"] = impl
    run = lambda x, **kw: xkernels.dllm_step(x, block, MASK, **kw)  # noqa: E731
    benchmark.pedantic(pick(impl, case, run, logits, DLLM_N), rounds=3, warmup_rounds=1)
