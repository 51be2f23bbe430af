"""The Spiffy ops on the CPU against their plain PyTorch references: the shipped draft graph over a
block of L=32 with 24 masked positions, V=32768, float32; N=4 sequences (accept: keep=8 drafts
whose logits equal the root's, so it walks a chain of accepted drafts)."""

import pytest
import torch

import xkernels
from xkernels import reference
from xkernels.spiffy import shipped_graph

N, L, V, KEEP, MASK = 4, 32, 32768, 8, 1


def inputs():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(N, L, V, generator=g) * 3
    block = torch.randint(2, V, (N, L), generator=g)
    block[:, torch.randperm(L, generator=g)[:24]] = MASK
    return logits, block


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def bench_spiffy_materialize(benchmark, impl, temperature):
    logits, block = inputs()
    graph = shipped_graph()
    benchmark.group = f"spiffy_materialize N={N} L={L} V={V} G={len(graph)} keep={KEEP} T={temperature}"
    benchmark.extra_info["impl"] = impl
    if impl == "xkernels":
        fn = lambda: xkernels.spiffy_materialize(logits, block, MASK, graph, keep=KEEP, temperature=temperature)  # noqa: E731
    else:
        fn = lambda: reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr,  # noqa: E731
                                                  graph.children, KEEP, temperature)
    benchmark.pedantic(fn, rounds=3 if impl == "reference" else 20, warmup_rounds=1)


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def bench_spiffy_accept(benchmark, impl, temperature):
    logits, block = inputs()
    drafts, node_ids, _ = xkernels.spiffy_materialize(logits, block, MASK, shipped_graph(), keep=KEEP)
    draft_logits = logits[:, None].expand(N, KEEP, L, V).contiguous()
    benchmark.group = f"spiffy_accept N={N} L={L} V={V} K={KEEP} T={temperature}"
    benchmark.extra_info["impl"] = impl
    fn = xkernels.spiffy_accept if impl == "xkernels" else reference.spiffy_accept
    steps = benchmark.pedantic(
        lambda: fn(logits, draft_logits, drafts, node_ids, block, MASK, temperature=temperature, seed=1),
        rounds=3 if impl == "reference" else 20, warmup_rounds=1)[0]
    benchmark.extra_info["mean_steps"] = round(steps.float().mean().item(), 2)


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
@pytest.mark.parametrize("packed", [False, True])
def bench_spiffy_attention_mask(benchmark, impl, packed):
    n, drafts, prefix = 8, 16, 512
    lens = torch.randint(prefix // 2, prefix + 1, (n,), generator=torch.Generator().manual_seed(0))
    benchmark.group = f"spiffy_attention_mask N={n} D={drafts} L={L} prefix={prefix} {'packed' if packed else 'bool'}"
    benchmark.extra_info["impl"] = impl
    if impl == "xkernels":
        benchmark(lambda: xkernels.spiffy_attention_mask(drafts, L, lens, max_prefix_len=prefix,
                                                         layout="packed" if packed else "bool"))
    else:
        benchmark(lambda: reference.spiffy_attention_mask(lens, drafts, L, prefix, packed))
