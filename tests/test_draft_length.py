"""The draft length rule: its cost model and choices, and that any choice it makes keeps every mode
lossless (ar's tokens at T = 0, the target's distribution at T > 0)."""

import pytest

from xkernels.decoding import generate
from xkernels.decoding.draft_length import MAX_SKIP, CostModel, DraftLengthRule
from tests.test_generate import assert_two_tokens_follow_the_target, tiny_models

FREE = CostModel({1: 1.0, 64: 1.0})  # verifying costs nothing more than an ar step: verify everything
STEEP = CostModel({1: 1.0, 2: 50.0})  # a draft costs fifty ar steps: never verify one
MIXED = CostModel({1: 1.0, 4: 1.6, 16: 3.0})


def test_cost_model_interpolates_between_measured_lengths():
    cost = CostModel({1: 2.0, 3: 4.0, 7: 6.0})
    assert [cost(n) for n in (1, 2, 3, 5, 7, 20)] == [2.0, 3.0, 4.0, 5.0, 6.0, 6.0]


def test_cost_model_measures_every_length_up_to_the_block():
    target, _, _ = tiny_models(16)
    cost = CostModel.measure(target.float(), max_tokens=10, context=8, repeats=1)
    assert sorted(cost.seconds) == [1, 2, 3, 4, 6, 8, 10]
    assert all(s > 0 for s in cost.seconds.values())


def test_free_verification_verifies_every_draft():
    rule = DraftLengthRule(FREE)
    assert rule.choose([0.1] * 15, spent=0.0) == 15
    assert rule.draft_now()


def test_a_block_that_does_not_pay_backs_off_and_a_paying_one_resumes():
    rule = DraftLengthRule(STEEP)
    skips = []
    for _ in range(9):
        assert rule.draft_now()
        assert rule.choose([0.9] * 15, spent=2.0) == 0  # drafting at all cost 2 ar steps
        skipped = 0
        while not rule.draft_now():
            skipped += 1
        skips.append(skipped)
        rule.skip = 0
    assert skips == [1, 2, 4, 8, 16, 32, 64, 64, 64] and MAX_SKIP == 64
    rule.cost = FREE
    assert rule.choose([0.9] * 15, spent=0.0) == 15 and rule.backoff == 0 and rule.draft_now()


def test_the_choice_trades_expected_tokens_against_cost():
    """Confident drafts up to slot 3 and hopeless ones after: the rule verifies exactly 3."""
    rule = DraftLengthRule(CostModel({1: 1.0, 16: 2.5}))
    assert rule.choose([1.0, 1.0, 1.0] + [0.0] * 12, spent=0.2) == 3


def test_a_batch_verifies_the_width_its_sequences_pay_for_together():
    """One sequence confident for 3 slots, one for none: each extra slot costs 0.1 ar steps, so the
    batch verifies 3 (the first sequence's expected tokens pay for both); with only the hopeless
    sequence, none."""
    rule = DraftLengthRule(CostModel({1: 1.0, 16: 2.5}))
    assert rule.choose_batch([[1.0, 1.0, 1.0] + [0.0] * 12, [0.0] * 15], spent=0.2) == 3
    assert rule.choose_batch([[0.0] * 15, []], spent=0.2) == 0


def test_weighed_probes_skip_as_many_ar_steps_as_the_block_cost():
    """A hopeless block that cost 4 ar steps (3 drafting, 1 verifying): the next 4, then 8, ... blocks
    are ar steps with weigh_probes, 1, then 2, ... without."""
    for weigh, want in ((True, [4, 8, 16]), (False, [1, 2, 4])):
        rule = DraftLengthRule(CostModel({1: 1.0, 16: 16.0}), weigh_probes=weigh)
        skips = []
        for _ in range(3):
            assert rule.choose_batch([[0.0] * 15, [0.0] * 15], spent=3.0) == 0
            skips.append(rule.skip)
            rule.skip = 0
        assert skips == want


def test_measured_choice_runs_the_faster_step_and_probes_the_other():
    """Blocks commit 10 tokens/s and ar steps 20 (after 2 unmeasured steps of each): ar runs, and
    blocks are retried after 1, 2, 4, ... ar steps; once blocks measure faster, they run."""
    from xkernels.decoding.draft_length import MeasuredChoice

    choice = MeasuredChoice(warmup=2)
    kinds = []
    for _ in range(40):
        kind = choice.draft_now()
        kinds.append(kind)
        choice.observe(kind, 10 if kind else 20, 1.0)
    assert kinds[:6] == [True] * 3 + [False] * 3
    probes = [i for i, k in enumerate(kinds[6:]) if k]
    assert [b - a - 1 for a, b in zip(probes, probes[1:])] == [1, 2, 4, 8, 16][: len(probes) - 1]
    kind = False
    while not kind:  # blocks became fast: the next probe reveals it and flips the choice
        kind = choice.draft_now()
        choice.observe(kind, 100 if kind else 20, 1.0)
    later = []
    for _ in range(20):
        later.append(choice.draft_now())
        choice.observe(later[-1], 100 if later[-1] else 20, 1.0)
    assert sum(later) >= 15


def test_a_tree_is_cut_to_its_paying_nodes():
    """Best-first nodes: 1 under the root, 2 under 1 (both confident), then 3 under the root and 4
    under 2 (hopeless); at 0.3 ar steps per extra node only the first two pay."""
    rule = DraftLengthRule(CostModel({1: 1.0, 16: 5.5}))
    assert rule.choose_nodes([1.0, 1.0, 0.0, 0.0], [0, 1, 0, 2], spent=0.2) == 2
    assert rule.choose_nodes([1.0, 1.0, 1.0, 1.0], [0, 1, 0, 2], spent=0.2) == 4


def test_calibration_follows_the_outcomes():
    rule = DraftLengthRule(FREE)
    assert rule.calibrated(0.95) == pytest.approx(0.95)
    for _ in range(200):
        rule.observe(0.95, False)
        rule.observe(0.05, True)
    assert rule.calibrated(0.95) < 0.02 and rule.calibrated(0.05) > 0.98
    assert rule.calibrated(1.0) == rule.calibrated(0.95)  # the top bucket is closed


@pytest.mark.parametrize("cost", [FREE, STEEP, MIXED], ids=["free", "steep", "mixed"])
@pytest.mark.parametrize("mode", ["drafter", "sequential", "jacobi", "tree", "tree-jacobi"])
def test_any_draft_length_emits_the_ar_tokens(mode, cost):
    target, drafter, refiner = tiny_models(64)
    for prompt in ([1, 2, 3, 4, 5], [9]):
        want, _ = generate(target, prompt, 30, mode="ar")
        got, stats = generate(target, prompt, 30, mode=mode, drafter=drafter, refiner=refiner, iters=2,
                              draft_len="auto", cost_model=cost)
        assert got == want
        if cost is STEEP:  # nothing verified: every call commits one token
            assert stats.target_calls == 30 and set(stats.accept_lens) == {0}


@pytest.mark.parametrize("mode", ["drafter", "jacobi", "tree"])
def test_sampling_with_a_chosen_draft_length_follows_the_target(mode):
    assert_two_tokens_follow_the_target(mode, draft_len="auto", cost_model=CostModel({1: 1.0, 2: 1.05, 4: 1.3}))


@pytest.mark.parametrize("mode", ["drafter", "jacobi", "tree-jacobi"])
def test_a_bfloat16_drafter_emits_the_ar_tokens(mode):
    """The drafter's precision changes what it proposes, never what the loop emits."""
    import torch

    target, drafter, refiner = tiny_models(64)
    for prompt in ([1, 2, 3, 4, 5], [9]):
        want, _ = generate(target, prompt, 30, mode="ar")
        got, stats = generate(target, prompt, 30, mode=mode, drafter=drafter, refiner=refiner, iters=2,
                              draft_len=None, draft_dtype=torch.bfloat16)
        assert got == want and stats.draft_calls == stats.target_calls


def test_draft_len_is_checked():
    target, drafter, _ = tiny_models(16)
    with pytest.raises(ValueError, match="draft_len"):
        generate(target, [1, 2], 3, mode="drafter", drafter=drafter, draft_len="longest")
    with pytest.raises(ValueError, match="draft_len"):
        generate(target, [1, 2], 3, mode="drafter", drafter=drafter, draft_len=-1)
