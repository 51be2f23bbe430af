"""vLLM's engine on the shipped target (exported by run.sh to $XKERNELS_VLLM_TARGET), with
speculative decoding verified by xkernels through the plugin (run.sh sets XKERNELS_VLLM=1):
greedy tokens equal vLLM's without speculation (the `plain` fixture, conftest.py), ngram drafts and
a draft model's probabilistic drafts; logit bias holds under speculation; a seeded sampled request
gives the same tokens alone and in a batch. The prompts are held-out text (engines.py)."""

from batches import report
from engines import PROMPTS, TOKENS, accepted_drafts, close, engine, model_runner, run
from vllm import SamplingParams

from xkernels.integrations.vllm import XKernelsRejectionSampler

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


# The draft-model engine comes before the ngram one: vLLM's CPU kernel registration, which each
# engine repeats, fails in a process where the ngram proposer has imported numba (llvmlite).
def test_draft_model_probabilistic_greedy_equals_no_speculation(target, plain, verified):
    llm = engine(target, speculative_config={"method": "draft_model", "model": target, "num_speculative_tokens": 3,
                                              "draft_sample_method": "probabilistic"})
    try:
        assert isinstance(model_runner(llm).rejection_sampler, XKernelsRejectionSampler)
        assert run(llm, PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0)) == plain["greedy"]
        assert accepted_drafts(verified) > 0
        report(f"engine, draft model (the target itself, 3 tokens, probabilistic), greedy: tokens equal vLLM's "
               f"without speculation; {sum(t for t, _, _ in verified)} drafts, {accepted_drafts(verified)} accepted")
        verified.clear()
        # Sampled, a few steps: the drafter's probabilities reach the op and drafts are accepted.
        run(llm, PROMPTS, SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, seed=3))
        assert any(with_probs for _, _, with_probs in verified), "the draft model's probabilities reached the op"
        assert accepted_drafts(verified) > 0
    finally:
        close(llm)


def test_ngram_greedy_logit_bias_and_seeded_sampling(target, plain, verified):
    llm = engine(target, speculative_config=NGRAM)
    try:
        assert isinstance(model_runner(llm).rejection_sampler, XKernelsRejectionSampler)
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
