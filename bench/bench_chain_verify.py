"""chain_verify on the CPU against the plain PyTorch reference (N=32, K=16, V=32768, float32)."""

import pytest
import torch

import xkernels
from xkernels import reference

N, K, V = 32, 16, 32768


def make_inputs(temperature, agreement):
    """Target logits and drafts. At T=0 each draft equals the target's argmax with probability
    `agreement`; at T>0 drafts are sampled from a draft model q near the target."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(N, K + 1, V, generator=g) * 4
    if temperature == 0:
        drafts = torch.randint(0, V, (N, K), generator=g)
        drafts = torch.where(torch.rand(N, K, generator=g) < agreement, logits[:, :K].argmax(-1), drafts)
        return drafts, logits, None
    q_logits = logits[:, :K] + torch.randn(N, K, V, generator=g) * 0.5
    q = torch.softmax(q_logits / temperature, -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(N, K)
    return drafts, logits, q


CASES = [(0.0, 0.8), (0.0, 1.0), (1.0, None)]


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
@pytest.mark.parametrize("temperature,agreement", CASES)
def bench_chain_verify(benchmark, impl, temperature, agreement):
    drafts, logits, q = make_inputs(temperature, agreement)
    label = f"agree={agreement}" if temperature == 0 else "drafts~q, with draft_probs"
    benchmark.group = f"chain_verify N={N} K={K} V={V} f32 T={temperature} {label}"
    benchmark.extra_info["impl"] = impl
    if impl == "xkernels":
        fn = lambda: xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=temperature, seed=1)  # noqa: E731
    else:
        fn = lambda: reference.chain_verify(drafts, logits, q, temperature, 1, 0)  # noqa: E731
    accept_len, _ = benchmark(fn)
    benchmark.extra_info["mean_accept_len"] = round(accept_len.float().mean().item(), 2)
