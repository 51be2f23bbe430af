"""The draft-tree ops on the CPU against their plain PyTorch references (N=32 trees of M=64 nodes,
budget 63, V=32768, float32)."""

import pytest
import torch

import xkernels
from xkernels import reference

N, D, TOPK, BUDGET, V = 32, 15, 8, 63, 32768
M = BUDGET + 1


def tree_inputs():
    g = torch.Generator().manual_seed(0)
    lp, tok = torch.randn(N, D, V, generator=g).log_softmax(-1).topk(TOPK, -1)
    return lp.contiguous(), tok.contiguous()


def verify_inputs(temperature):
    """A best-first tree over marginals close to the target's, the target's logits at every node,
    and (T > 0) the children's draft distributions with children drawn from them."""
    g = torch.Generator().manual_seed(1)
    tokens, parents, num_nodes, _ = xkernels.build_draft_tree(*tree_inputs(), BUDGET)
    logits = torch.randn(N, M, V, generator=g) * 4
    # Plant the target's argmax on the first child of most nodes, so the walks go deep.
    for i in range(1, M):
        p = parents[:, i]
        first = (parents[:, 1:i] == p[:, None]).sum(-1) == 0
        plant = first & (torch.rand(N, generator=g) < 0.8)
        logits[plant, p[plant], tokens[plant, i]] = logits[plant, p[plant]].max(-1).values + 2
    q = None
    if temperature > 0:
        q = torch.softmax(logits / temperature + torch.randn(N, M, V, generator=g) * 0.5, -1)
    return tokens, parents, logits, q


def rejecting_inputs():
    """verify_inputs' trees and target logits with draft distributions far from the target (their
    own random logits) and every child's token drawn from its parent's q: most children are
    rejected, so the residual passes (one a rejection but the last) and the residual draw dominate."""
    tokens, parents, logits, _ = verify_inputs(0.0)
    g = torch.Generator().manual_seed(2)
    q = torch.softmax(torch.randn(N, M, V, generator=g) * 4, -1)
    draws = torch.multinomial(q.view(N * M, V), M, replacement=True, generator=g).view(N, M, M)
    # Child i's token: draw i of its parent's row.
    drawn = draws.gather(1, parents.clamp_min(0)[:, None, :]).squeeze(1)
    return torch.where(parents >= 0, drawn, tokens), parents, logits, q


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
def bench_build_draft_tree(benchmark, impl):
    lp, tok = tree_inputs()
    benchmark.group = f"build_draft_tree N={N} D={D} k={TOPK} budget={BUDGET}"
    benchmark.extra_info["impl"] = impl
    fn = xkernels.build_draft_tree if impl == "xkernels" else reference.build_draft_tree
    benchmark(fn, lp, tok, BUDGET)


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
@pytest.mark.parametrize("layout", ["bool", "packed"])
def bench_tree_attention_mask(benchmark, impl, layout):
    _, parents, _, _ = xkernels.build_draft_tree(*tree_inputs(), BUDGET)
    benchmark.group = f"tree_attention_mask N={N} M={M} {layout}"
    benchmark.extra_info["impl"] = impl
    if impl == "xkernels":
        benchmark(lambda: xkernels.tree_attention_mask(parents, layout=layout))
    else:
        benchmark(lambda: reference.tree_attention_mask(parents, packed=layout == "packed"))


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
@pytest.mark.parametrize("layout", ["bool", "packed"])
def bench_build_draft_tree_with_mask(benchmark, impl, layout):
    """The tree and its mask from one op (build_draft_tree(mask=layout)) against the two calls an
    engine makes without it (the baseline, "reference" in the summary table)."""
    lp, tok = tree_inputs()
    benchmark.group = f"build_draft_tree mask={layout} vs two calls N={N} budget={BUDGET}"
    benchmark.extra_info["impl"] = impl
    if impl == "xkernels":
        benchmark(lambda: xkernels.build_draft_tree(lp, tok, BUDGET, mask=layout))
    else:
        def two_calls():
            tree = xkernels.build_draft_tree(lp, tok, BUDGET)
            return tree, xkernels.tree_attention_mask(tree[1], num_nodes=tree[2], layout=layout)

        benchmark(two_calls)


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
@pytest.mark.parametrize("temperature,with_q", [(0.0, False), (1.0, False), (1.0, True)])
def bench_tree_verify(benchmark, impl, temperature, with_q):
    tokens, parents, logits, q = verify_inputs(temperature)
    q = q if with_q else None
    benchmark.group = (f"tree_verify N={N} M={M} V={V} f32 T={temperature}"
                       + (" draft_probs" if with_q else ""))
    benchmark.extra_info["impl"] = impl
    if impl == "xkernels":
        fn = lambda: xkernels.tree_verify(tokens, parents, logits, draft_probs=q, temperature=temperature, seed=1)  # noqa: E731
    else:
        fn = lambda: reference.tree_verify(tokens, parents, logits, q, False, temperature, 1)  # noqa: E731
    accept_len, _, _ = benchmark.pedantic(fn, rounds=3 if impl == "reference" else 20, warmup_rounds=1)
    benchmark.extra_info["mean_accept_len"] = round(accept_len.float().mean().item(), 2)


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
@pytest.mark.parametrize("without_replacement", [False, True])
def bench_tree_verify_rejecting(benchmark, impl, without_replacement):
    tokens, parents, logits, q = rejecting_inputs()
    benchmark.group = (f"tree_verify N={N} M={M} V={V} f32 T=1.0 draft_probs far from p"
                       + (" w/o repl." if without_replacement else ""))
    benchmark.extra_info["impl"] = impl
    if impl == "xkernels":
        fn = lambda: xkernels.tree_verify(tokens, parents, logits, draft_probs=q,  # noqa: E731
                                          without_replacement=without_replacement, temperature=1.0, seed=1)
    else:
        fn = lambda: reference.tree_verify(tokens, parents, logits, q, without_replacement, 1.0, 1)  # noqa: E731
    accept_len, _, _ = benchmark.pedantic(fn, rounds=3 if impl == "reference" else 20, warmup_rounds=1)
    benchmark.extra_info["mean_accept_len"] = round(accept_len.float().mean().item(), 2)
