"""The decoding loops lose nothing: at T=0 every mode emits the tokens of "ar"; at T>0 the
same distribution (chi-squared over the first two tokens)."""

import pytest
import torch

from xkernels import XPressRefiner
from xkernels.decoding import generate
from xkernels.models import BlockDrafter, DrafterConfig, TargetConfig, TargetLM
from tests.utils import chi_squared_pvalue


def tiny_models(vocab, block=8, seed=0):
    """Randomly initialised target, drafter and refiner, in float64 so that the one-token and
    the block forwards of the target round to the same float32 logits."""
    torch.manual_seed(seed)
    target = TargetLM(TargetConfig(vocab, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64))
    with torch.no_grad():
        target.embed.weight.normal_(0, 1.0)
    drafter = BlockDrafter(DrafterConfig(dim=32, mask_token_id=vocab - 1, ffn_hidden=64, block_size=block,
                                         target_layers=(0, 1)))
    refiner = XPressRefiner(vocab, 32, block, rank=16)
    with torch.no_grad():
        for p in refiner.parameters():
            p.normal_(0, 0.3)
    return target.double().eval(), drafter.double().eval(), refiner.double().eval()


# The drafter's dtypes the identity tests run, whatever the CPU supports (the loop's default is
# bfloat16 only for a float32 target on a CPU with native bfloat16 products): a bfloat16 drafter's
# logits tie often.
DRAFT_DTYPES = [pytest.param(torch.float32, id="float32"), pytest.param(torch.bfloat16, id="bfloat16")]


@pytest.mark.parametrize("mode,iters,budget", [("drafter", 4, 15), ("sequential", 4, 15), ("jacobi", 1, 15),
                                               ("jacobi", 4, 15), ("tree", 4, 4), ("tree", 4, 31),
                                               ("tree-jacobi", 2, 12)])
@pytest.mark.parametrize("draft_dtype", DRAFT_DTYPES)
def test_greedy_modes_emit_the_ar_tokens(mode, iters, budget, draft_dtype):
    target, drafter, refiner = tiny_models(64)
    for prompt in ([1, 2, 3, 4, 5], [9], [7, 7, 7, 30, 31, 2, 40, 41, 42, 11, 3]):
        want, _ = generate(target, prompt, 30, mode="ar")
        got, stats = generate(target, prompt, 30, mode=mode, drafter=drafter, refiner=refiner, iters=iters,
                              tree_budget=budget, draft_dtype=draft_dtype)
        assert got == want
        assert stats.new_tokens == 30 and stats.target_calls == len(stats.accept_lens)
        assert stats.tau == pytest.approx(30 / stats.target_calls)


VOCAB, SAMPLES = 8, 2500


def assert_two_tokens_follow_the_target(mode, samples=SAMPLES, **options):
    """Chi-squared of the first two sampled tokens (T = 1, `samples` seeds) against the target's own
    joint distribution, tiny models over VOCAB tokens."""
    target, drafter, refiner = tiny_models(VOCAB, block=4, seed=1)
    prompt = [1, 2, 3]
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt]))[0][0, -1].float(), -1)
        p2 = torch.stack([torch.softmax(target(torch.tensor([prompt + [y]]))[0][0, -1].float(), -1)
                          for y in range(VOCAB)])
    counts = torch.zeros(VOCAB * VOCAB)
    for seed in range(samples):
        out, _ = generate(target, prompt, 2, mode=mode, drafter=drafter, refiner=refiner, iters=1,
                          temperature=1.0, seed=seed, **options)
        counts[out[0] * VOCAB + out[1]] += 1
    assert chi_squared_pvalue(counts, p1[:, None] * p2) > 1e-3


@pytest.mark.parametrize("mode", ["ar", "drafter", "sequential", "jacobi", "tree", "tree-jacobi"])
def test_sampling_modes_follow_the_target(mode):
    assert_two_tokens_follow_the_target(mode)


def test_tree_attention_equals_each_path_alone():
    """A forward over [anchor + tree] under the tree mask and depth positions gives every node the
    logits of its root-to-node path run on its own with a plain causal mask after the same prefix."""
    import xkernels
    from tests.test_tree import random_tree

    target, _, _ = tiny_models(64)
    prefix = torch.tensor([[5, 9, 2, 33]])
    parents = random_tree(1, 12, "bushy", seed=3)
    tokens = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = target.new_cache()
        target(prefix, cache)
        tree_logits, _ = target(tokens, cache, tree_mask=xkernels.tree_attention_mask(parents)[0],
                                tree_depth=xkernels.tree_positions(parents)[0])
        for i in range(12):
            path, j = [], i
            while j >= 0:
                path.insert(0, j)
                j = int(parents[0, j])
            alone, _ = target(torch.cat([prefix, tokens[:, path]], 1))
            torch.testing.assert_close(tree_logits[0, i], alone[0, -1], atol=1e-10, rtol=1e-10)


def test_tree_cache_keeps_the_accepted_path():
    """After a tree step (forward, tree_verify, keep_path) the cache equals the cache of the
    committed tokens run plainly after the prefix."""
    import xkernels

    target, _, _ = tiny_models(64)
    prefix = [3, 1, 4, 1, 5]
    want, _ = generate(target, prefix, 3, mode="ar")  # the target's greedy continuation
    # Root (the anchor 5); the greedy path is 0 -> 2 -> 5 -> 6, beside wrong siblings, so the kept
    # entries move (2 -> 1, 5 -> 2, 6 -> 3).
    parents = torch.tensor([[-1, 0, 0, 1, 2, 2, 5]])
    tokens = torch.tensor([[5, (want[0] + 1) % 64, want[0], 9, (want[1] + 1) % 64, want[1], want[2]]])
    with torch.no_grad():
        cache = target.new_cache()
        target(torch.tensor([prefix[:-1]]), cache)
        logits, _ = target(tokens, cache, tree_mask=xkernels.tree_attention_mask(parents)[0],
                           tree_depth=xkernels.tree_positions(parents)[0])
        accept_len, path, out = xkernels.tree_verify(tokens, parents, logits.float())
        assert accept_len.tolist() == [3] and path[0, :4].tolist() == [0, 2, 5, 6]
        cache.keep_path(len(prefix) - 1, path, accept_len)
        plain = target.new_cache()
        target(torch.tensor([prefix + want[:3]]), plain)
        assert cache.length == plain.length == len(prefix) + 3
        for a, b in zip(cache.k + cache.v, plain.k + plain.v):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_bad_arguments():
    target, drafter, refiner = tiny_models(16)
    with pytest.raises(ValueError, match="tree_budget"):
        generate(target, [1, 2], 3, mode="tree", drafter=drafter, tree_budget=0)
    with pytest.raises(ValueError, match="refiner"):
        generate(target, [1, 2], 3, mode="tree-jacobi", drafter=drafter)
    with pytest.raises(ValueError, match="mode"):
        generate(target, [1, 2], 3, mode="beam")
    with pytest.raises(ValueError, match="drafter"):
        generate(target, [1, 2], 3, mode="drafter")
    with pytest.raises(ValueError, match="refiner"):
        generate(target, [1, 2], 3, mode="jacobi", drafter=drafter)


def test_shipped_models_lose_nothing_at_t0():
    """The shipped models, run in float64: every mode emits the tokens of "ar"."""
    from xkernels import data
    from xkernels.models.shipped import WEIGHTS, load_all

    if not (WEIGHTS / "refiner.safetensors").exists():
        pytest.skip("the models are not trained yet (python/train/)")
    models = load_all()
    target, drafter, refiner = models.target.double(), models.drafter.double(), models.refiner.double()
    for domain in data.DOMAINS:
        for text in data.held_out_prompts(domain, 2):
            ids = models.tokenizer.encode(text).ids
            want, _ = generate(target, ids, 24, mode="ar")
            for mode in ("drafter", "sequential", "jacobi", "tree", "tree-jacobi"):
                got, _ = generate(target, ids, 24, mode=mode, drafter=drafter, refiner=refiner, iters=3)
                assert got == want, (domain, mode)


@pytest.mark.parametrize("mode", ["sequential", "jacobi"])
def test_refined_proposals_follow_the_distributions_they_report(mode):
    """At T>0 a refined draft must be a sample of the q the loop hands to chain_verify: here
    x1 | x0 against q1(. | x0) recomputed from the refiner (chi-squared), with a refiner whose
    bias depends strongly on the previous token, and Jacobi stopped after one pass (unsettled)."""
    from xkernels.decoding.modes import PROPOSERS, Streams, request_seeds

    vocab, block, samples = 6, 4, 3000
    _, _, refiner = tiny_models(vocab, block=block, seed=2)
    with torch.no_grad():
        refiner.w1.weight.mul_(4)
        refiner.w2.weight.mul_(4)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(1, block, 32, generator=g, dtype=torch.float64)
    base = torch.randn(1, block - 1, vocab, generator=g) * 2
    tokens = [4, 1]  # the token before the anchor, the anchor
    proposer = PROPOSERS[mode](refiner, iters=1)
    ctx = refiner.prepare(h)
    q1 = torch.stack([(base[0, 1] + refiner.delta(ctx, torch.tensor([[4, 1, x, 0]]))[0, 2].float()).softmax(-1)
                      for x in range(vocab)]).detach()
    counts = torch.zeros(vocab, vocab)
    for seed in range(samples):
        with torch.inference_mode():
            p = proposer.propose(base, h, torch.tensor([tokens]), Streams(1.0, request_seeds(seed, 1), 0))
        if p.limit is not None and int(p.limit[0]) < 2:
            continue  # x1 is not verified: the loop never hands it to chain_verify
        x0, x1 = int(p.drafts[0, 0]), int(p.drafts[0, 1])
        counts[x0, x1] += 1
        torch.testing.assert_close(p.q[0, 1], q1[x0], atol=1e-5, rtol=1e-4)
    assert chi_squared_pvalue(counts, counts.sum(1, keepdim=True) * q1) > 1e-3


@pytest.mark.parametrize("mode", ["sequential", "jacobi"])
@pytest.mark.parametrize("temperature,iters", [(0.0, 3), (1.0, 1), (1.0, 3)])
def test_refining_the_first_slots_gives_the_whole_blocks_drafts(mode, temperature, iters):
    """A proposer that refines only the first 2 of 5 drafted slots (slots=2, vLLM's proposer at 2
    speculative tokens) drafts what the whole block's refinement drafts there: the same tokens, q
    and settled prefix (the refiner is causal), for several sequences and seeds."""
    from xkernels.decoding.modes import PROPOSERS, Streams, request_seeds

    vocab, block, n = 9, 6, 5
    _, _, refiner = tiny_models(vocab, block=block, seed=4)
    with torch.no_grad():
        refiner.w2.weight.mul_(4)  # a bias that moves the drafts
    g = torch.Generator().manual_seed(1)
    h = torch.randn(n, block, 32, generator=g, dtype=torch.float64)
    base = torch.randn(n, block - 1, vocab, generator=g) * 2
    prefix = torch.randint(0, vocab, (n, 2), generator=g)
    rng = Streams(temperature, request_seeds(3, n), 5)
    with torch.inference_mode():
        whole = PROPOSERS[mode](refiner, iters=iters).propose(base, h, prefix, rng)
        first = PROPOSERS[mode](refiner, iters=iters, slots=2).propose(base, h, prefix, rng)
    assert first.drafts.shape == (n, 2) and torch.equal(first.drafts, whole.drafts[:, :2])
    assert (first.q is None) == (temperature == 0)
    if first.q is not None:
        torch.testing.assert_close(first.q, whole.q[:, :2], atol=1e-6, rtol=1e-5)
    if whole.limit is not None:
        assert torch.equal(first.limit, whole.limit.clamp(max=2))


@pytest.mark.parametrize("mode", ["sequential", "jacobi"])
def test_refined_proposals_at_per_sequence_temperatures(mode):
    """Sampled sequences at their own temperatures in one call (Streams with a [N] temperature, how
    vLLM's proposer drafts its sampled requests) draft what each sequence drafts in a call at its
    temperature alone: the same tokens and settled prefix, q to rounding."""
    from xkernels.decoding.modes import PROPOSERS, Streams, request_seeds

    vocab, block, n = 9, 6, 6
    _, _, refiner = tiny_models(vocab, block=block, seed=5)
    with torch.no_grad():
        refiner.w2.weight.mul_(4)
    g = torch.Generator().manual_seed(2)
    h = torch.randn(n, block, 32, generator=g, dtype=torch.float64)
    base = torch.randn(n, block - 1, vocab, generator=g) * 2
    prefix = torch.randint(0, vocab, (n, 2), generator=g)
    temperatures = [0.7, 1.0, 1.3, 0.7, 2.0, 1.0]
    seeds, steps = request_seeds(8, n), torch.arange(n) * 3
    proposer = PROPOSERS[mode](refiner, iters=2)
    with torch.inference_mode():
        batch = proposer.propose(base, h, prefix, Streams(torch.tensor(temperatures), seeds, steps))
        for i, t in enumerate(temperatures):
            alone = proposer.propose(base[i:i + 1], h[i:i + 1], prefix[i:i + 1], Streams(t, seeds[i:i + 1], steps[i:i + 1]))
            assert torch.equal(batch.drafts[i], alone.drafts[0]), i
            torch.testing.assert_close(batch.q[i], alone.q[0], atol=1e-6, rtol=1e-5)
            if alone.limit is not None:
                assert int(batch.limit[i]) == int(alone.limit[0]), i
