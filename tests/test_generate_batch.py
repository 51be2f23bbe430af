"""Batched decoding loses nothing: at T=0 sequence i of generate_batch is generate's ar continuation
of prompt i in every mode (ragged prompts, ragged acceptance, sequences finishing at different
steps); at T>0 each sequence follows the target's distribution. Its static caches never grow, and a
captured step replays to the eager step's tokens (GPU)."""

import numpy as np
import pytest
import torch

import xkernels
from xkernels.decoding import generate, generate_batch
from xkernels.decoding.batch import BatchDecoder, CapturedStep
from xkernels.models import StaticKVCache
from tests.test_generate import DRAFT_DTYPES, SAMPLES, VOCAB, tiny_models
from tests.utils import chi_squared_pvalue

PROMPTS = [[1, 2, 3, 4, 5], [9], [7, 7, 7, 30, 31, 2, 40, 41, 42, 11, 3], [5, 6]]
MAX_NEW = [30, 7, 19, 25]


@pytest.mark.parametrize("mode,iters,budget,draft_len", [
    ("ar", 4, 15, "auto"), ("drafter", 4, 15, "auto"), ("drafter", 4, 15, 2), ("sequential", 4, 15, "auto"),
    ("jacobi", 1, 15, "auto"), ("jacobi", 4, 15, 3), ("tree", 4, 4, "auto"), ("tree", 4, 31, "auto"),
    ("tree-jacobi", 2, 12, "auto")])
@pytest.mark.parametrize("draft_dtype", DRAFT_DTYPES)
def test_greedy_batch_emits_each_prompts_ar_tokens(mode, iters, budget, draft_len, draft_dtype):
    target, drafter, refiner = tiny_models(64)
    got, stats = generate_batch(target, PROMPTS, MAX_NEW, mode=mode, drafter=drafter, refiner=refiner, iters=iters,
                                tree_budget=budget, draft_len=draft_len, draft_dtype=draft_dtype)
    for prompt, n, tokens in zip(PROMPTS, MAX_NEW, got):
        want, _ = generate(target, prompt, n, mode="ar")
        assert tokens == want
    assert stats.new_tokens == sum(MAX_NEW)
    steps = [len(a) for a in stats.accept_lens]
    assert stats.target_calls == max(steps)
    if mode == "ar":
        assert steps == MAX_NEW
    else:  # ragged: each sequence took as many steps as its acceptance needed
        assert all(sum(a) + len(a) >= n for a, n in zip(stats.accept_lens, MAX_NEW))
        assert len(set(steps)) > 1


@pytest.mark.parametrize("mode", ["drafter", "jacobi"])
@pytest.mark.parametrize("cost", ["FREE", "MIXED", "STEEP"])
def test_any_batch_draft_length_emits_each_prompts_ar_tokens(mode, cost):
    """The batch's draft length rule under cost models that verify everything, some drafts, or
    nothing (ar steps): every sequence still emits its ar tokens."""
    import tests.test_draft_length as costs

    target, drafter, refiner = tiny_models(64)
    got, stats = generate_batch(target, PROMPTS, MAX_NEW, mode=mode, drafter=drafter, refiner=refiner,
                                cost_model=getattr(costs, cost))
    assert got == [generate(target, p, n)[0] for p, n in zip(PROMPTS, MAX_NEW)]
    if cost == "STEEP":  # probes only, backing off 1, 2, 4, ... ar steps
        assert stats.draft_calls <= 5 < stats.target_calls
    if cost == "FREE":
        assert stats.draft_calls > 5


def test_one_prompt_and_an_int_max_new_tokens():
    target, drafter, refiner = tiny_models(64)
    got, stats = generate_batch(target, [[3, 1, 4]], 5, mode="jacobi", drafter=drafter, refiner=refiner)
    assert got == [generate(target, [3, 1, 4], 5)[0]] and stats.new_tokens == 5


ROWS = 24  # rows with the counted prompt
BATCH_PROMPTS = [[1, 2, 3]] * ROWS + [[4], [5, 6, 7, 1, 2]]  # ragged rows beside the counted ones


@pytest.mark.parametrize("mode,cost", [("ar", None), ("drafter", None), ("sequential", None), ("jacobi", None),
                                       ("jacobi", "MIXED"), ("tree", None), ("tree-jacobi", None)])
def test_sampled_batch_follows_the_target(mode, cost):
    """Chi-squared of the first two tokens (T = 1) of the ROWS rows with prompt [1, 2, 3], over seeds,
    against the target's own joint distribution: every row is a sample (its noise is its own).
    Without a cost model the drafts of a block are all verified; MIXED lets the rule choose."""
    import tests.test_draft_length as costs

    target, drafter, refiner = tiny_models(VOCAB, block=4, seed=1)
    prompt = BATCH_PROMPTS[0]
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt]))[0][0, -1].float(), -1)
        p2 = torch.stack([torch.softmax(target(torch.tensor([prompt + [y]]))[0][0, -1].float(), -1)
                          for y in range(VOCAB)])
    counts = torch.zeros(VOCAB * VOCAB)
    for seed in range(SAMPLES // ROWS + 1):
        outs, _ = generate_batch(target, BATCH_PROMPTS, [2] * ROWS + [3, 1], mode=mode, drafter=drafter,
                                 refiner=refiner, iters=1, temperature=1.0, seed=seed,
                                 draft_len="auto" if cost else None, cost_model=cost and getattr(costs, cost))
        for out in outs[:ROWS]:
            counts[out[0] * VOCAB + out[1]] += 1
    assert chi_squared_pvalue(counts, p1[:, None] * p2) > 1e-3


SEEDS = [11, 5, -3, 2**62 + 9]  # one per prompt of PROMPTS


@pytest.mark.parametrize("mode", ["ar", "drafter", "sequential", "jacobi", "tree", "tree-jacobi"])
def test_a_sampled_sequence_gets_the_same_tokens_alone_and_in_any_batch(mode):
    """T = 1, every draft verified: sequence i of seed SEEDS[i] gets generate's tokens for that prompt
    and seed, and permuting the batch permutes the outputs (each sequence's noise is keyed by its
    seed and its own blocks, the ops' per-request form); other seeds give other tokens."""
    target, drafter, refiner = tiny_models(64)
    kw = dict(mode=mode, drafter=drafter, refiner=refiner, iters=2, temperature=1.0, draft_len=None, tree_budget=6)
    got, _ = generate_batch(target, PROMPTS, MAX_NEW, seed=SEEDS, **kw)
    for prompt, n, seed, tokens in zip(PROMPTS, MAX_NEW, SEEDS, got):
        assert tokens == generate(target, prompt, n, seed=seed, **kw)[0]
    perm = [2, 0, 3, 1]
    permuted, _ = generate_batch(target, [PROMPTS[i] for i in perm], [MAX_NEW[i] for i in perm],
                                 seed=[SEEDS[i] for i in perm], **kw)
    assert permuted == [got[i] for i in perm]
    other, _ = generate_batch(target, PROMPTS, MAX_NEW, seed=[s + 1 for s in SEEDS], **kw)
    assert other != got


def test_an_int_seed_gives_prompt_i_its_request_seed():
    """seed=s is seed=request_seeds(s, N): prompt 0 gets s itself (generate's), rows of one prompt
    get different seeds."""
    from xkernels.decoding.modes import request_seeds

    target, drafter, _ = tiny_models(64)
    kw = dict(mode="drafter", drafter=drafter, temperature=1.0, draft_len=None)
    got, _ = generate_batch(target, [PROMPTS[0]] * 3, 12, seed=7, **kw)
    assert got == generate_batch(target, [PROMPTS[0]] * 3, 12, seed=request_seeds(7, 3).tolist(), **kw)[0]
    assert got[0] == generate(target, PROMPTS[0], 12, seed=7, **kw)[0]
    assert len({tuple(t) for t in got}) == 3
    with pytest.raises(ValueError, match="seed must be an int or one per sequence"):
        generate_batch(target, PROMPTS, 3, seed=[1, 2])
    assert torch.equal(request_seeds(np.int64(7), 3), request_seeds(7, 3))
    with pytest.raises(ValueError, match="tree_budget must be below 65536"):  # its nodes would reach the next kind's noise
        generate_batch(target, PROMPTS, 3, mode="tree", drafter=drafter, tree_budget=1 << 16)


def test_static_cache_forward_equals_each_sequence_alone():
    """Ragged sequences in one StaticKVCache: a prefill, then a 3-token step, give every sequence
    the logits of its own tokens run with the growing cache."""
    target, _, _ = tiny_models(64)
    seqs = [[5, 9, 2, 33, 4], [8], [1, 2, 3]]
    new = torch.tensor([[10, 11, 12], [13, 14, 15], [16, 17, 18]])
    cache = StaticKVCache.for_model(target.cfg, 3, 16, torch.float64, "cpu")
    ids = torch.zeros(3, 5, dtype=torch.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    with torch.no_grad():
        target(ids, cache)
        cache.lengths.copy_(torch.tensor([len(s) for s in seqs]))
        logits, _ = target(new, cache)
        for i, s in enumerate(seqs):
            alone, _ = target(torch.tensor([s + new[i].tolist()]))
            torch.testing.assert_close(logits[i], alone[0, len(s):], atol=1e-10, rtol=1e-10)


def test_static_cache_keeps_each_accepted_path():
    """A tree step over two sequences of different lengths: after commit with tree_verify's paths,
    each sequence's entries equal a plain cache of its committed tokens."""
    target, _, _ = tiny_models(64)
    prefixes = [[3, 1, 4, 1, 5], [2, 7]]
    parents = torch.tensor([[-1, 0, 0, 1, 2, 2, 5]] * 2)
    tokens = []
    for p in prefixes:
        want, _ = generate(target, p, 3, mode="ar")
        tokens.append([p[-1], (want[0] + 1) % 64, want[0], 9, (want[1] + 1) % 64, want[1], want[2]])
    tokens = torch.tensor(tokens)
    cache = StaticKVCache.for_model(target.cfg, 2, 20, torch.float64, "cpu")
    with torch.no_grad():
        ids = torch.tensor([prefixes[0][:-1], prefixes[1][:-1] + [0, 0, 0]])
        target(ids, cache)
        cache.lengths.copy_(torch.tensor([4, 1]))
        mask = xkernels.tree_attention_mask(parents)
        logits, _ = target(tokens, cache, tree_mask=mask, tree_depth=xkernels.tree_positions(parents))
        accept_len, path, _ = xkernels.tree_verify(tokens, parents, logits.float())
        assert accept_len.tolist() == [3, 3]
        cache.commit(accept_len, 7, path)
        assert cache.lengths.tolist() == [8, 5]
        for i, p in enumerate(prefixes):
            plain = target.new_cache()
            target(torch.tensor([p + generate(target, p, 3)[0]]), plain)
            for a, b in zip(cache.k + cache.v, plain.k + plain.v):
                torch.testing.assert_close(a[i, :, : plain.length], b[0], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("mode", ["ar", "jacobi", "tree"])
def test_static_caches_never_grow(mode):
    """The step writes into buffers allocated once: the same storage and shapes after every step."""
    target, drafter, refiner = tiny_models(64)
    decoder = BatchDecoder(target, PROMPTS, 20, mode, drafter, refiner, tree_budget=6)
    before = [(t.data_ptr(), t.shape) for c in decoder.caches() for t in c.k + c.v]
    for _ in range(8):
        decoder.step()
        assert [(t.data_ptr(), t.shape) for c in decoder.caches() for t in c.k + c.v] == before
        assert int(decoder.cache.lengths.max()) < decoder.cache.capacity


def test_bad_arguments():
    target, drafter, refiner = tiny_models(16)
    with pytest.raises(ValueError, match="mode"):
        generate_batch(target, [[1]], 3, mode="beam")
    with pytest.raises(ValueError, match="drafter"):
        generate_batch(target, [[1]], 3, mode="drafter")
    with pytest.raises(ValueError, match="refiner"):
        generate_batch(target, [[1]], 3, mode="jacobi", drafter=drafter)
    with pytest.raises(ValueError, match="prompts"):
        generate_batch(target, [[1], []], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_batch(target, [[1], [2]], [3])
    with pytest.raises(ValueError, match="TargetLM"):
        generate_batch(object(), [[1]], 3)
    with pytest.raises(ValueError, match="cuda_graph"):
        generate_batch(target, [[1]], 3, cuda_graph=True)
    with pytest.raises(ValueError, match="cuda_graph=True cannot be combined with tp_group"):
        generate_batch(target, [[1]], 3, cuda_graph=True, tp_group=object())


@pytest.mark.needs_cuda
@pytest.mark.parametrize("mode,temperature", [("ar", 0.0), ("jacobi", 0.0), ("jacobi", 1.0), ("tree", 1.0),
                                              ("drafter", 1.0)])
def test_captured_step_replays_to_the_eager_steps_tokens(mode, temperature):
    """Two decoders of the same prompts on the GPU: one steps eagerly, the other through a CUDA graph
    (eager first step, then capture and replays); every step emits the same tokens."""
    target, drafter, refiner = (m.float().cuda() for m in tiny_models(64))
    with torch.inference_mode():
        eager, graphed = (BatchDecoder(target, PROMPTS, 24, mode, drafter, refiner, temperature=temperature,
                                       tree_budget=6, seed=3) for _ in range(2))
        step = CapturedStep(graphed.step)
        for _ in range(6):
            a, b = eager.step(), step()
            assert all(torch.equal(x, y) for x, y in zip(a, b))
