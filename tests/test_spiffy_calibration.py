"""Spiffy's calibration set: what it decodes is never what the graphs are evaluated on, and
calibrate() is select_graph over calibration_walks (the greedy choice nests: a smaller budget keeps
a prefix of a larger one's nodes)."""

import torch

from xkernels import data
from xkernels.decoding.spiffy_calibration import calibrate, calibration_prompts, calibration_walks, select_graph
from tests.test_spiffy import tiny_model


class _Chars:
    """A stand-in tokenizer: one id per character."""

    class _Ids:
        def __init__(self, text):
            self.ids = [ord(c) % 4096 for c in text]

    def encode(self, text):
        return self._Ids(text)


def test_calibration_prompts_share_nothing_with_the_held_out_prompts():
    prompts = calibration_prompts(_Chars(), 24)
    assert len(prompts) == 24 * len(data.DOMAINS)
    for domain in data.DOMAINS:
        calibration = set(data.training_prompts(domain, 24, rng_seed=7))
        every_held_out = set(data.held_out_prompts(domain, 10**4 if domain == "code" else 2000))
        assert len(calibration) == 24 and not calibration & every_held_out
        # no held-out prompt starts a calibration prompt or the other way round (a shared opening)
        assert not any(a.startswith(b) or b.startswith(a) for a in calibration for b in every_held_out)


def test_calibrate_keeps_the_most_frequent_connected_nodes_of_the_walks():
    model = tiny_model()
    prompts = [torch.randint(2, 64, (n,), generator=torch.Generator().manual_seed(n)) for n in (4, 9)]
    walks = calibration_walks(model, prompts, depth=3, block_size=8, max_new_tokens=16)
    assert walks and all(len(w) <= 3 for w in walks)
    small = calibrate(model, prompts, budget=3, depth=3, block_size=8, max_new_tokens=16)
    large = select_graph(walks, budget=6)
    assert small.nodes == select_graph(walks, budget=3).nodes
    assert len(large) <= 6 and set(small.nodes) <= set(large.nodes)
    counts = dict(zip(large.nodes, large.meta["counts"]))
    assert counts[frozenset()] == len(walks)  # the root: every walk starts there
    seen = [node for walk in walks for node in walk]
    assert all(counts[node] == seen.count(node) for node in large.nodes[1:])
    # the first node chosen is the most frequent first step
    first = max((w[0] for w in walks if w), key=seen.count)
    assert seen.count(large.nodes[1]) == seen.count(first)
