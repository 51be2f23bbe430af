"""These tests need vLLM, which only the environment of run.sh (next to this file) has: the
main suite (tests/run.sh), whose environment has no vLLM, does not collect them."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # batches.py and engines.py, shared with bench/bench_vllm_sampler.py and bench/bench_vllm_xpress.py
    sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(items):
    # The engine tests last: vLLM's CPU kernel registration (each engine's, and vllm_cpu_kernels'
    # in the engine-free tests) fails once the ngram proposer has imported numba (llvmlite).
    items.sort(key=lambda item: item.path.name == "test_vllm_engine.py")


@pytest.fixture(scope="session")
def target():
    path = os.environ.get("XKERNELS_VLLM_TARGET")
    assert path and os.path.isdir(path), "run.sh exports the shipped target and sets XKERNELS_VLLM_TARGET"
    assert os.environ.get("XKERNELS_VLLM") == "1", "run.sh sets XKERNELS_VLLM=1"
    return path


@pytest.fixture(scope="session")
def plain(target):
    """vLLM without speculation, one engine for every test file: greedy tokens of the held-out
    prompts, plain and with a logit bias."""
    from engines import PROMPTS, TOKENS, close, engine, run
    from vllm import SamplingParams

    llm = engine(target)
    bias = {int(llm.get_tokenizer().encode(" the")[0]): 6.0}
    out = {"greedy": run(llm, PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0)),
           "bias": run(llm, PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0, logit_bias=bias)),
           "bias_ids": bias}
    close(llm)
    return out


@pytest.fixture
def verified(monkeypatch):
    """Records (drafts, emitted tokens per request, whether draft probabilities were given) of
    every chain_verify_ragged_ call (the sampler's, through RaggedVerifier)."""
    from xkernels import ops

    seen = []
    op = ops.chain_verify_ragged_

    def recorded(draft_tokens, *args, **kwargs):
        result = op(draft_tokens, *args, **kwargs)
        seen.append((draft_tokens.numel(), (result[1] >= 0).sum(1).tolist(), kwargs.get("draft_probs") is not None))
        return result

    monkeypatch.setattr(ops, "chain_verify_ragged_", recorded)
    return seen

