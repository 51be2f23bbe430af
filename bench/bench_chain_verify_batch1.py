"""chain_verify at batch 1 on the CPU against what a Hugging Face user verifies with today:
transformers' _speculative_sampling (K=16, float32, T=1, drafts sampled from q). The
transformers baseline gets the draft logits and takes their softmax itself; xkernels is timed
with that softmax included too ("+softmax") and given q. Skips without transformers."""

import pytest
import torch

import xkernels

transformers_utils = pytest.importorskip("transformers.generation.utils")

K = 16


def inputs(v):
    g = torch.Generator().manual_seed(0)
    target = torch.randn(1, K + 1, v, generator=g) * 4
    draft_logits = target[:, :K] + torch.randn(1, K, v, generator=g) * 0.5
    q = draft_logits.softmax(-1)
    drafts = torch.multinomial(q[0], 1, generator=g).view(1, K)
    return drafts, target, draft_logits, q


@pytest.mark.parametrize("v", [32768, 151936])
@pytest.mark.parametrize("impl", ["xkernels", "xkernels+softmax", "reference"])
def bench_batch_one(benchmark, v, impl):
    drafts, target, draft_logits, q = inputs(v)
    benchmark.group = f"batch-1 verify K={K} V={v} f32 T=1 vs transformers _speculative_sampling"
    benchmark.extra_info["impl"] = impl
    if impl == "reference":
        candidate_ids = torch.cat([torch.zeros(1, 5, dtype=torch.long), drafts], 1)
        fn = lambda: transformers_utils._speculative_sampling(candidate_ids, draft_logits, K, target)  # noqa: E731
    elif impl == "xkernels":
        fn = lambda: xkernels.chain_verify(drafts, target, draft_probs=q, temperature=1.0, seed=1)  # noqa: E731
    else:
        fn = lambda: xkernels.chain_verify(drafts, target, draft_probs=draft_logits.softmax(-1), temperature=1.0,  # noqa: E731
                                           seed=1)
    benchmark(fn)
