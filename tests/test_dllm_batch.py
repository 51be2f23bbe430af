"""Batched block diffusion decoding: every sequence's tokens and calls are dllm_generate's (ragged
prompts, a threshold that completes blocks at different steps, different max_new_tokens, Spiffy),
at T = 0 and T > 0; at T > 0 each sequence's first token follows the model's distribution."""

import pytest
import torch

from xkernels.decoding import dllm_generate, dllm_generate_batch
from xkernels.spiffy import DraftGraph, SpiffyConfig
from tests.test_spiffy import hand_graph, tiny_model
from tests.utils import chi_squared_pvalue


@pytest.mark.parametrize("threshold", [None, 0.3])
def test_greedy_batch_decodes_what_each_prompt_decodes_alone(threshold):
    model = tiny_model()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 64, (n,), generator=g) for n in (5, 1, 13, 8)]
    max_new = [20, 9, 16, 3]
    got, stats = dllm_generate_batch(model, prompts, max_new, block_size=8, threshold=threshold)
    for prompt, n, tokens, mine in zip(prompts, max_new, got, stats.sequences):
        want, alone = dllm_generate(model, prompt, n, block_size=8, threshold=threshold)
        assert torch.equal(tokens, want)
        assert (mine.model_calls, mine.steps_per_call) == (alone.model_calls, alone.steps_per_call)
    assert stats.new_tokens == sum(max_new)
    if threshold is None:  # one position per step
        assert stats.steps == sum(-(-n // 8) * 8 for n in max_new)


def test_sampled_first_token_follows_the_model():
    """The first token of a block of one position (T = 1), 48 rows of one prompt per call: its
    distribution is the model's softmax at that position."""
    model = tiny_model(seed=3)
    prompt = torch.tensor([5, 9, 11])
    with torch.no_grad():
        cache = model.new_cache()
        model.commit(prompt.view(1, -1), cache)
        block = torch.full((1, 1), model.cfg.mask_id)
        logits = model(block, cache)[0, 0].float()
        logits[model.cfg.mask_id] = float("-inf")
        p = torch.softmax(logits, -1)
    counts = torch.zeros(64)
    for seed in range(40):
        out, _ = dllm_generate_batch(model, [prompt] * 48 + [torch.tensor([3])], 1, block_size=1, temperature=1.0,
                                     seed=seed)
        for tokens in out[:48]:
            counts[int(tokens[0])] += 1
    assert chi_squared_pvalue(counts, p) > 1e-3


@pytest.mark.parametrize("threshold", [None, 0.3])
def test_a_sampled_sequence_decodes_what_it_decodes_alone(threshold):
    """T = 1: sequence i of seed seeds[i] gets dllm_generate's tokens for that prompt and seed
    (ragged blocks: each sequence's noise is keyed by its seed, block and step), and permuting the
    batch permutes the outputs."""
    model = tiny_model()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 64, (n,), generator=g) for n in (5, 1, 13, 8)]
    max_new, seeds = [20, 9, 16, 3], [4, 40, -1, 2**63 - 1]
    got, _ = dllm_generate_batch(model, prompts, max_new, block_size=8, threshold=threshold, temperature=1.0,
                                 seed=seeds)
    for prompt, n, seed, tokens in zip(prompts, max_new, seeds, got):
        want, _ = dllm_generate(model, prompt, n, block_size=8, threshold=threshold, temperature=1.0, seed=seed)
        assert torch.equal(tokens, want)
    perm = [3, 1, 0, 2]
    permuted, _ = dllm_generate_batch(model, [prompts[i] for i in perm], [max_new[i] for i in perm], block_size=8,
                                      threshold=threshold, temperature=1.0, seed=[seeds[i] for i in perm])
    assert all(torch.equal(a, got[i]) for a, i in zip(permuted, perm))


CHAIN = DraftGraph([[]] + [[(i, 0) for i in range(d)] for d in range(1, 5)], [(d, d + 1) for d in range(4)])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("threshold", [None, 0.3])
def test_batched_spiffy_decodes_and_calls_what_each_sequence_does_alone(temperature, threshold):
    """With Spiffy, sequence i (ragged prompts and lengths, its own seed) gets dllm_generate's tokens,
    and its own count of model calls, steps per call and drafts verified: the batch rows' drafts are
    filled from each sequence's own last step distribution, and a finished sequence drafts nothing."""
    model = tiny_model()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(2, 64, (n,), generator=g) for n in (5, 1, 13, 8)]
    max_new, seeds = [20, 9, 16, 3], [4, 40, -1, 2**63 - 1]
    for graph, keep in [(CHAIN, 4), (hand_graph(), 5)]:
        spiffy = SpiffyConfig(graph, keep)
        got, stats = dllm_generate_batch(model, prompts, max_new, block_size=8, threshold=threshold,
                                         temperature=temperature, seed=seeds, spiffy=spiffy)
        vanilla_calls = 0
        for prompt, n, seed, tokens, mine in zip(prompts, max_new, seeds, got, stats.sequences):
            kwargs = dict(block_size=8, threshold=threshold, temperature=temperature, seed=seed)
            want, alone = dllm_generate(model, prompt, n, spiffy=spiffy, **kwargs)
            assert torch.equal(tokens, want)
            assert (mine.model_calls, mine.steps_per_call, mine.drafts) == \
                (alone.model_calls, alone.steps_per_call, alone.drafts)
            vanilla_calls += dllm_generate(model, prompt, n, **kwargs)[1].model_calls
        assert stats.drafts == sum(s.drafts for s in stats.sequences) > 0
        if threshold is None:  # one token per step: the drafts save calls
            assert sum(s.model_calls for s in stats.sequences) < vanilla_calls


@pytest.mark.parametrize("block_size, max_new, keep", [(1, 3, 2), (8, 1, 3), (8, 5, 0), (4, [1, 7], 8)])
def test_batched_spiffy_at_edge_shapes(block_size, max_new, keep):
    """Blocks of one position (never a second call to draft in), one new token, no drafts kept,
    more drafts than a short block can use: each sequence still decodes and calls as alone."""
    model = tiny_model()
    prompts, seeds = [torch.tensor([3, 4]), torch.tensor([9])], [1, 2]
    spiffy = SpiffyConfig(hand_graph(), keep)
    got, stats = dllm_generate_batch(model, prompts, max_new, block_size=block_size, spiffy=spiffy, temperature=1.0,
                                     seed=seeds)
    lengths = max_new if isinstance(max_new, list) else [max_new] * 2
    for prompt, n, seed, tokens, mine in zip(prompts, lengths, seeds, got, stats.sequences):
        want, alone = dllm_generate(model, prompt, n, block_size=block_size, spiffy=spiffy, temperature=1.0, seed=seed)
        assert torch.equal(tokens, want) and (mine.model_calls, mine.drafts) == (alone.model_calls, alone.drafts)


def test_profiling_times_the_phases_and_changes_nothing():
    """profile=True fills phase_seconds (the model, materialize, the batched mask, the step) within
    the run's seconds, for both loops, with the tokens of an unprofiled run."""
    model = tiny_model()
    prompts = [torch.tensor([5, 9, 11]), torch.tensor([7])]
    spiffy = SpiffyConfig(hand_graph(), 3)
    want, plain = dllm_generate_batch(model, prompts, 12, block_size=8, spiffy=spiffy)
    got, stats = dllm_generate_batch(model, prompts, 12, block_size=8, spiffy=spiffy, profile=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and not plain.phase_seconds
    assert set(stats.phase_seconds) == {"model", "draft", "mask", "step"}
    assert sum(stats.phase_seconds.values()) <= stats.seconds
    alone, single = dllm_generate(model, prompts[0], 12, block_size=8, spiffy=spiffy, profile=True)
    assert torch.equal(alone, want[0]) and set(single.phase_seconds) == {"model", "draft", "step"}
    assert sum(single.phase_seconds.values()) <= single.seconds


def test_a_next_block_completed_in_the_call_that_finished_the_last_is_committed_with_it(monkeypatch):
    """Blocks of 4 at a low threshold: a walk completes its block on a draft and the next block's
    first step, taken in the same call, completes that one too; the next call commits both (at
    the loop's block size, not the model's 8). Every sequence still gets vanilla's tokens, and in
    the batch its own calls, steps per call and drafts; the case is checked to occur."""
    model = tiny_model()
    seeds = [2, 3, 4, 5, 0]
    prompts = [torch.randint(2, 64, (3 + s,), generator=torch.Generator().manual_seed(s)) for s in seeds]
    max_new = [24, 23, 17, 24, 5]
    spiffy = SpiffyConfig(hand_graph(), 5)
    kwargs = dict(block_size=4, threshold=0.2, temperature=1.0)
    got, stats = dllm_generate_batch(model, prompts, max_new, seed=seeds, spiffy=spiffy, **kwargs)
    forward_copies, two = type(model).forward_copies, []

    def counting(self, blocks, cache, commit=None, follows=None, commit_block_size=None):
        two.append(commit is not None and cache.length > 0 and commit.shape[1] == 2 * blocks.shape[1])
        return forward_copies(self, blocks, cache, commit, follows, commit_block_size)

    monkeypatch.setattr(type(model), "forward_copies", counting)
    for prompt, n, seed, tokens, mine in zip(prompts, max_new, seeds, got, stats.sequences):
        want, alone = dllm_generate(model, prompt, n, seed=seed, spiffy=spiffy, **kwargs)
        assert torch.equal(want, dllm_generate(model, prompt, n, seed=seed, **kwargs)[0])
        assert torch.equal(tokens, want)
        assert (mine.model_calls, mine.steps_per_call, mine.drafts) == \
            (alone.model_calls, alone.steps_per_call, alone.drafts)
    assert any(two)
