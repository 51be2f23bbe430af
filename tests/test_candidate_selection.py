"""The decoding loop's candidate selections are functions of their inputs with one tie rule, the
lower id first, on every device: the tree modes' top-k candidates, the drafts' argmax with its
confidence, and the draft length rule's choice of nodes. (The sharded candidates equal these bit
for bit: tests/test_distributed.py; build_draft_tree's ties: tests/test_tree.py.)"""

import pytest
import torch

from xkernels.decoding.candidates import topk_lower_id
from xkernels.decoding.draft_length import CostModel, DraftLengthRule
from xkernels.decoding.modes import TreeVerifier, WholeVocab
from tests.utils import DEVICES


def tied_logits(n, d, v, seed=0):
    """bfloat16-rounded logits (a bfloat16 drafter's: many exact ties) with planted cases: a row of
    integers (ties at the k-th place), a row of zeros and -0.0, and a NaN beside +-inf."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, d, v, generator=g) * 3).to(torch.bfloat16).float()
    logits[0, 0] = logits[0, 0].round()
    logits[0, 1] = 0.0
    logits[0, 1, 1::3] = -0.0
    logits[1, 0, [5, v - 1]] = float("inf")
    logits[1, 0, v // 2] = float("nan")
    logits[1, 0, :3] = float("-inf")
    return logits


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("v,k", [(50, 8), (5000, 8), (5000, 64), (7, 7)])
def test_tree_candidates_rank_by_logit_ties_to_the_lower_id(device, v, k):
    logits = tied_logits(2, 3, v).to(device)
    lp, ids = WholeVocab.topk_logprobs(logits, k)
    # torch.sort ranks NaN above every number too, and a stable sort keeps ties in id order.
    assert torch.equal(ids, torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k])
    want = torch.log_softmax(logits.double(), -1).gather(-1, ids).float()
    torch.testing.assert_close(lp, want, rtol=0, atol=1e-6, equal_nan=True)
    # The tree built from them is then one function of the logits, wherever it is built.
    tree, on_cpu = (TreeVerifier(budget=12, topk=k).build(x) for x in (logits, logits.cpu()))
    for name in ("tokens", "parents", "num_nodes"):
        assert torch.equal(getattr(tree, name).cpu(), getattr(on_cpu, name))


@pytest.mark.parametrize("device", DEVICES)
def test_topk_of_given_ids_ranks_padding_last(device):
    """Merged shard candidates: ids other than positions, padding (-1) after a tied real entry."""
    values = torch.tensor([[2.0, float("-inf"), 2.0, float("-inf"), 1.0]], device=device)
    ids = torch.tensor([[9, -1, 4, 30, 7]], device=device)
    got_values, got_ids = topk_lower_id(values, 5, ids)
    assert got_ids.tolist() == [[4, 9, 7, 30, -1]]
    assert got_values.tolist() == [[2.0, 2.0, 1.0, float("-inf"), float("-inf")]]


@pytest.mark.parametrize("device", DEVICES)
def test_the_drafts_argmax_takes_the_lower_id_of_the_logits(device):
    """softmax rounds logits 1e-8 apart to one probability; the draft is still the logits' argmax
    (the sharded argmax's), its confidence the largest probability."""
    logits = torch.tensor([[0.0, 1e-8, -1.0], [3.0, 1.0, 3.0]], device=device)
    confidence, drafts = WholeVocab.top(logits)
    assert drafts.tolist() == [1, 0]
    torch.testing.assert_close(confidence, torch.softmax(logits, -1).amax(-1))


def test_the_draft_length_rule_takes_the_fewest_nodes_on_a_tie():
    """Nodes that add no expected tokens at a flat cost tie every prefix's rate: the rule verifies
    none of them rather than any longer prefix."""
    rule = DraftLengthRule(CostModel({1: 1.0}))
    rule.calibrated = lambda p: 0.0
    assert rule.choose_nodes([0.9, 0.5, 0.5], [0, 1, 0], spent=0.0) == 0
    rule = DraftLengthRule(CostModel({1: 1.0}))
    rule.calibrated = lambda p: 1.0 if p > 0.7 else 0.0
    assert rule.choose_nodes([0.9, 0.5, 0.5], [0, 1, 0], spent=0.0) == 1
