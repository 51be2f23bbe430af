"""The xPress proposer (xkernels.integrations.vllm_xpress.XPressProposer) with XKernelsRejectionSampler.

Engine-free: its drafts and draft probabilities, verified by the sampler, give the first and second
emitted tokens the target's filtered law at T > 0 (chi-squared; the same drafts verified against a
q they were not drawn from are rejected, so the check can fail); a block drafted in a batch of
blocks after other contexts is the block drafted alone. In vLLM's engine on the shipped target:
greedy tokens equal vLLM's without speculation on held-out prompts (the `plain` fixture,
conftest.py), sampled requests verify its draft probabilities, and a seeded sampled request gives
the same tokens alone and in a batch."""

from types import SimpleNamespace

import pytest
import torch
from batches import filtered_probs, pooled_pvalue, report, sampling_metadata, spec_metadata, vllm_cpu_kernels
from engines import PROMPTS, TOKENS, accepted_drafts, close, engine, model_runner, run
from vllm import SamplingParams
from vllm.v1.sample.sampler import Sampler

from xkernels.decoding.modes import request_seeds
from xkernels.integrations.vllm import XKernelsRejectionSampler
from xkernels.integrations.vllm_xpress import XPressProposer
from xkernels.models import shipped
from xkernels.models.static_cache import StaticKVCache

XPRESS = {"method": "custom_class", "model": "xkernels.integrations.vllm_xpress.XPressProposer",
          "num_speculative_tokens": 7}
T, TOP_K, TRIALS = 1.0, 20, 3000


def config(drafts, prefix_caching=False):
    return SimpleNamespace(cache_config=SimpleNamespace(enable_prefix_caching=prefix_caching),
                           speculative_config=SimpleNamespace(num_speculative_tokens=drafts))


def test_refuses_prefix_caching_and_too_many_drafts():
    with pytest.raises(ValueError, match="enable_prefix_caching=False"):
        XPressProposer(config(7, prefix_caching=True))
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        XPressProposer(config(16))
    with pytest.raises(RuntimeError, match="XKERNELS_VLLM=1"):
        XPressProposer(config(2)).propose([[1]], None, None)


@pytest.fixture
def one_thread():
    """One torch thread, as vLLM runs the proposer (it reduces the engine process to one). On a
    shared 2-core machine the default two threads wait on each other at every small op: the 3000
    blocks below took twice as long with two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_sampled_tokens_follow_the_filtered_target(one_thread):
    vllm_cpu_kernels()
    torch.manual_seed(0)  # the sampler's seeds (no request ids given) come from torch's global stream
    proposer = XPressProposer(config(2))
    target = shipped.load_target()
    tok = shipped.load_tokenizer()
    prompt = tok.encode("def count_words(text):\n    words = text.split()\n    return").ids
    anchor, pos = 29, len(prompt)  # any token; the law holds after any context
    with torch.inference_mode():
        _, hidden = target(torch.tensor([prompt]), hidden_layers=proposer.drafter.cfg.target_layers)
    state = proposer._state("r", 0)
    proposer._commit([(state, torch.cat(hidden, -1)[0], torch.arange(pos))])
    # The trials as blocks of batches (each block its own seed), cut where Jacobi had not settled.
    drafts, probs, chunk = [], [], 250
    for seed in range(TRIALS // chunk):
        for tokens, q in proposer.blocks([state.context] * chunk, [anchor] * chunk, [prompt[-1]] * chunk,
                                         [T] * chunk, request_seeds(seed, chunk)):
            drafts.append(tokens)
            probs.append(q.clone())
    # The target's rows over [anchor, drafts] of every trial, in the runner's layout: the anchor's
    # row once, the drafts' rows after copies of its cache (only the draft tokens run per trial).
    with torch.inference_mode():
        prefix = target.new_cache()
        row0 = target(torch.tensor([prompt + [anchor]]), prefix)[0][0, -1]
        k = max(map(len, drafts))
        cache = StaticKVCache.for_model(target.cfg, TRIALS, pos + 1 + k, torch.float32, "cpu")
        for i in range(TRIALS):
            cache.load(i, prefix.k, prefix.v)
        cache.lengths.fill_(pos + 1)
        after, _ = target(torch.tensor([d + [0] * (k - len(d)) for d in drafts]), cache)
        p1 = filtered_probs(row0[None], [T], [TOP_K])[0]
        support = p1.nonzero().reshape(-1)
        second = target(torch.cat([torch.tensor(prompt + [anchor]).expand(len(support), -1), support[:, None]], 1))[0]
        p2_given = torch.zeros(len(p1), len(p1), dtype=torch.float64)
        p2_given[support] = filtered_probs(second[:, -1], [T] * len(support), [TOP_K] * len(support))
    rows = torch.cat([torch.cat([row0[None], after[i, : len(d)]]) for i, d in enumerate(drafts)]).float()
    md = spec_metadata(drafts)
    sm = sampling_metadata(TRIALS, len(p1), temperature=[T] * TRIALS, top_k=[TOP_K] * TRIALS)
    sampler = XKernelsRejectionSampler(Sampler(), SimpleNamespace(rejection_sample_method="token"))
    g = torch.Generator().manual_seed(0)

    def laws(draft_probs):
        out = sampler(md, draft_probs, rows.clone(), sm).sampled_token_ids.long()
        t1 = out[:, 0]
        # Where the step emitted one token, the next step samples the second from the target.
        t2 = torch.where(out[:, 1] >= 0, out[:, 1],
                         torch.multinomial(p2_given[t1].float(), 1, generator=g).reshape(-1))
        return (pooled_pvalue(torch.bincount(t1, minlength=len(p1)).double(), p1),
                pooled_pvalue(torch.bincount(t2, minlength=len(p1)).double(), p1.double() @ p2_given))

    first, second_p = laws(torch.cat(probs).contiguous())
    assert first > 1e-4 and second_p > 1e-4, (first, second_p)
    # The same drafts verified against a q they were not drawn from (sharpened): off the target's law.
    sharp = torch.cat(probs).pow(3)
    wrong = laws((sharp / sharp.sum(-1, keepdim=True)).contiguous())
    assert min(wrong) < 1e-3, wrong  # fixed seeds: 1.6e-6 on the run this was set from
    report(f"xPress proposer + XKernelsRejectionSampler, T={T} top_k={TOP_K}, {TRIALS} trials: chi-squared p "
           f"{first:.3f} (first token), {second_p:.3f} (second); with a wrong q {min(wrong):.1e}")


def test_blocks_do_not_depend_on_the_batch():
    """A block's drafts and q drafted alone equal its row in a batch of blocks after longer and
    shorter contexts, other anchors, seeds and temperatures (the padded, masked drafter pass and
    the per-request streams): the drafts exactly, q up to the rounding of the batched products
    (last bits), where a padded position left visible would move it far more."""
    proposer = XPressProposer(config(7))
    target, tok = shipped.load_target(), shipped.load_tokenizer()
    texts = ["def count_words(text):\n    words = text.split()\n    return", "x = 1\n",
             "Question: Ann has 3 pens and buys 4 more. How many pens does Ann have now?\nAnswer: Ann has"]
    contexts = []
    for name, text in enumerate(texts):
        ids = tok.encode(text).ids
        with torch.inference_mode():
            _, hidden = target(torch.tensor([ids]), hidden_layers=proposer.drafter.cfg.target_layers)
        state = proposer._state(name, 0)
        proposer._commit([(state, torch.cat(hidden, -1)[0], torch.arange(len(ids)))])
        contexts.append((state.context, ids[-1]))
    ctx, prev = contexts[0]
    for temperature in (0.0, 0.9):
        alone = proposer.blocks([ctx], [29], [prev], [temperature], request_seeds([11], 1))[0]
        batch = proposer.blocks([c for c, _ in contexts[1:]] + [ctx], [5, 40, 29], [p for _, p in contexts[1:]] + [prev],
                                [1.0, temperature, temperature], request_seeds([3, 4, 11], 3))[2]
        assert alone[0] == batch[0], (temperature, alone[0], batch[0])
        assert (alone[1] is None) == (temperature == 0)
        if alone[1] is not None:
            torch.testing.assert_close(alone[1], batch[1], rtol=1e-4, atol=1e-9)


def test_engine_greedy_equals_no_speculation_sampled_verifies_q_and_seeded_is_batch_invariant(target, plain,
                                                                                              verified):
    llm = engine(target, speculative_config=XPRESS, enable_prefix_caching=False)
    try:
        runner = model_runner(llm)
        assert isinstance(runner.drafter, XPressProposer) and runner.use_aux_hidden_state_outputs
        assert isinstance(runner.rejection_sampler, XKernelsRejectionSampler)
        assert run(llm, PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0)) == plain["greedy"]
        drafts = sum(t for t, _, _ in verified)
        assert drafts > 0 and accepted_drafts(verified) > 0, verified
        report(f"engine, xPress (7 tokens), greedy, {len(PROMPTS)} prompts x {TOKENS} tokens: tokens equal vLLM's "
               f"without speculation; {drafts} drafts, {accepted_drafts(verified)} accepted, "
               f"{len(verified)} verify calls")
        # Sampled: a seeded request alone, then at the second row of a batch of mixed parameters
        # (its blocks drafted in one pass with the others').
        seeded = SamplingParams(max_tokens=TOKENS, temperature=0.8, top_p=0.95, seed=3)
        alone = run(llm, PROMPTS[:1], seeded)[0]
        others = [SamplingParams(max_tokens=TOKENS, temperature=0),
                  SamplingParams(max_tokens=TOKENS, temperature=1.0, top_k=20),
                  SamplingParams(max_tokens=TOKENS, temperature=0.6)]
        verified.clear()
        batch = run(llm, PROMPTS[1:2] + PROMPTS[:1] + PROMPTS[2:], others[:1] + [seeded] + others[1:])
        assert any(t for t, _, _ in verified)
        assert all(with_probs for t, _, with_probs in verified if t), "xPress's q reached the op"
        assert accepted_drafts(verified) > 0
        assert batch[1] == alone
        report("engine, xPress, a seeded sampled request (T=0.8, top-p 0.95) alone and in a batch of 4 of mixed "
               f"parameters: the same {len(alone)} tokens")
    finally:
        close(llm)
