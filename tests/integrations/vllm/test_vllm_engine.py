"""vLLM's engine on the shipped target (exported by run.sh to $XKERNELS_VLLM_TARGET), with
speculative decoding verified by xkernels through the plugin (run.sh sets XKERNELS_VLLM=1):
greedy tokens equal vLLM's without speculation, ngram drafts and a draft model's probabilistic
drafts; logit bias holds under speculation; a seeded sampled request gives the same tokens alone
and in a batch. The prompts are new text, not from the training data (xkernels/data.py)."""

import gc
import os

import pytest
from batches import report
from vllm import LLM, SamplingParams

import xkernels
from xkernels.integrations.vllm import XKernelsRejectionSampler

PROMPTS = [
    "def count_vowels(text):\n    total = 0\n    for ch in text:\n        if ch in 'aeiou':\n            total += 1\n"
    "    return total\n\n\ndef count_digits(text):\n    total = 0\n    for ch in text:\n",
    "class Queue:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def size(self):\n        return len(self.items)\n\n    def pop(self):\n",
    "Question: Omar has 14 bolts. Omar buys 9 more bolts. Then Omar gives away 5 bolts. "
    "How many bolts does Omar have now?\nAnswer:",
    "Question: Priya has 8 tickets. Priya gets 3 bags with 4 tickets in each bag. "
    "How many tickets does Priya have now?\nAnswer:",
]
TOKENS = 40


@pytest.fixture(scope="module")
def target():
    path = os.environ.get("XKERNELS_VLLM_TARGET")
    assert path and os.path.isdir(path), "run.sh exports the shipped target and sets XKERNELS_VLLM_TARGET"
    assert os.environ.get("XKERNELS_VLLM") == "1", "run.sh sets XKERNELS_VLLM=1"
    return path


@pytest.fixture
def verified(monkeypatch):
    """Records (drafts, emitted tokens per request) of every chain_verify_ragged call."""
    seen = []
    op = xkernels.chain_verify_ragged

    def recorded(draft_tokens, *args, **kwargs):
        out = op(draft_tokens, *args, **kwargs)
        seen.append((draft_tokens.numel(), (out[0] >= 0).sum(1).tolist(), kwargs.get("draft_probs") is not None))
        return out

    monkeypatch.setattr(xkernels, "chain_verify_ragged", recorded)
    return seen


def engine(target, **kwargs):
    return LLM(model=target, max_model_len=512, max_num_seqs=8, seed=0, dtype="float32", **kwargs)


def rejection_sampler(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.rejection_sampler


def run(llm, prompts, params):
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def close(llm):
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def plain(target):
    """vLLM without speculation: greedy tokens, plain and with a logit bias."""
    llm = engine(target)
    bias = {int(llm.get_tokenizer().encode(" the")[0]): 6.0}
    out = {"greedy": run(llm, PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0)),
           "bias": run(llm, PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0, logit_bias=bias)),
           "bias_ids": bias}
    close(llm)
    return out


NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def accepted_drafts(seen):
    return sum(max(n - 1, 0) for _, emitted, _ in seen for n in emitted)


# The draft-model engine comes before the ngram one: vLLM's CPU kernel registration, which each
# engine repeats, fails in a process where the ngram proposer has imported numba (llvmlite).
def test_draft_model_probabilistic_greedy_equals_no_speculation(target, plain, verified):
    llm = engine(target, speculative_config={"method": "draft_model", "model": target, "num_speculative_tokens": 3,
                                              "draft_sample_method": "probabilistic"})
    try:
        assert isinstance(rejection_sampler(llm), XKernelsRejectionSampler)
        assert run(llm, PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0)) == plain["greedy"]
        assert accepted_drafts(verified) > 0
        report(f"engine, draft model (the target itself, 3 tokens, probabilistic), greedy: tokens equal vLLM's "
               f"without speculation; {sum(t for t, _, _ in verified)} drafts, {accepted_drafts(verified)} accepted")
        verified.clear()
        run(llm, PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0.8, top_p=0.95, seed=3))
        assert any(with_probs for _, _, with_probs in verified), "the draft model's probabilities reached the op"
        assert accepted_drafts(verified) > 0
    finally:
        close(llm)


def test_ngram_greedy_logit_bias_and_seeded_sampling(target, plain, verified):
    llm = engine(target, speculative_config=NGRAM)
    try:
        assert isinstance(rejection_sampler(llm), XKernelsRejectionSampler)
        assert run(llm, PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0)) == plain["greedy"]
        drafts = sum(t for t, _, _ in verified)
        assert drafts > 0 and accepted_drafts(verified) > 0, verified
        report(f"engine, ngram (4 tokens), greedy, {len(PROMPTS)} prompts x {TOKENS} tokens: tokens equal vLLM's "
               f"without speculation; {drafts} drafts, {accepted_drafts(verified)} accepted, {len(verified)} verify calls")
        verified.clear()
        got = run(llm, PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0, logit_bias=plain["bias_ids"]))
        assert got == plain["bias"]
        assert got != plain["greedy"]  # the bias changes the text, and speculation keeps it
        assert accepted_drafts(verified) > 0

        # Sampled: a seeded request alone and among other sampled requests of mixed parameters.
        seeded = SamplingParams(max_tokens=TOKENS, temperature=0.8, top_k=20, top_p=0.9, seed=1234)
        alone = run(llm, PROMPTS[:1], seeded)[0]
        others = [SamplingParams(max_tokens=TOKENS, temperature=1.0, min_p=0.05),
                  SamplingParams(max_tokens=TOKENS, temperature=0.6, top_p=0.8),
                  SamplingParams(max_tokens=TOKENS, temperature=0)]
        verified.clear()
        batch = run(llm, PROMPTS, [seeded] + others)
        assert batch[0] == alone
        assert accepted_drafts(verified) > 0
    finally:
        close(llm)
