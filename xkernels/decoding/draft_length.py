"""How many drafts a block verifies: a cost model of the target on this machine and a rule that
reads only the drafts' own distributions (never the target's logits, so the output of every mode
stays what it is with a fixed draft length: ar's tokens at T = 0, the target's distribution at
T > 0).

Each drafted slot i has a confidence c_i (the largest probability of its draft distribution, read
through a calibration learned while decoding). Verifying the first k drafts commits, if they are
accepted independently with those probabilities, E(k) = 1 + sum_{j<=k} prod_{i<=j} c_i tokens
(the bonus token included) and costs S + c(k + 1): S the drafter and refinement already spent,
c(n) the target's forward of n tokens. The rule verifies one more draft while that raises
E(k) / (S + c(k + 1)): a stopping rule, so whether slot i is verified depends on the slots before
it and on slot i's distribution, never on the token drawn there, which keeps sampling exact.
When even the chosen rate is below ar's, 1 / c(1), drafting does not pay for itself on this text
and this machine: the next blocks run as plain ar steps (no drafter call), 1, 2, 4, ... up to
MAX_SKIP in a row while it keeps not paying, and drafting resumes as soon as a block pays again.
At T > 0 the choices depend on measured times, so a seeded run reproduces its samples only with
the same cost model (pass one, or a fixed draft_len, to pin it).
"""

import time
from dataclasses import dataclass
from typing import Dict, Sequence

import torch

MAX_SKIP = 64
_MEASURED_LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


@dataclass(frozen=True)
class CostModel:
    """Seconds of one target forward by the number of tokens it takes, at a short context
    (linear between measured lengths, flat past the last)."""

    seconds: Dict[int, float]

    def __call__(self, tokens: int) -> float:
        lengths = sorted(self.seconds)
        if tokens <= lengths[0]:
            return self.seconds[lengths[0]]
        for lo, hi in zip(lengths, lengths[1:]):
            if tokens <= hi:
                w = (tokens - lo) / (hi - lo)
                return (1 - w) * self.seconds[lo] + w * self.seconds[hi]
        return self.seconds[lengths[-1]]

    @staticmethod
    @torch.inference_mode()
    def measure(target, max_tokens: int = 16, context: int = 96, repeats: int = 5, batch: int = 1) -> "CostModel":
        """Times the target's forward of n tokens (for each of `batch` sequences) after a context of
        `context` tokens, best of `repeats`, for n up to max_tokens (about 50 forwards: 0.2 s for the
        shipped models on a CPU at batch 1), made non-decreasing in n."""
        device = target.lm_head.weight.device
        cache = target.new_cache()
        target(torch.zeros(batch, context, dtype=torch.int64, device=device), cache)
        seconds = {}
        for n in [m for m in _MEASURED_LENGTHS if m < max_tokens] + [max_tokens]:
            tokens = torch.zeros(batch, n, dtype=torch.int64, device=device)
            best = float("inf")
            for _ in range(repeats + 1):  # the first call warms up
                began = time.perf_counter()
                logits, _ = target(tokens, cache)
                logits[0, -1, 0].item()  # waits for the device
                best = min(best, time.perf_counter() - began)
                cache.crop(context)
            seconds[n] = max([best] + list(seconds.values()))  # more tokens never cost less: noise
        return CostModel(seconds)


def measured_cost_model(target, max_tokens: int, batch: int = 1) -> CostModel:
    """CostModel.measure, once per target, batch size and intra-op thread count (kept on the target)."""
    key = (max_tokens, batch, torch.get_num_threads(), str(target.lm_head.weight.device))
    models = target.__dict__.setdefault("_xkernels_cost_models", {})
    if key not in models:
        models[key] = CostModel.measure(target, max_tokens, batch=batch)
    return models[key]


class DraftLengthRule:
    """The rule above, with its state across the blocks of one decode.

    Draft probabilities are read through a calibration learned while decoding: per tenth of
    [0, 1], the fraction of verified drafts the target accepted (a draft counts once the drafts
    before it were accepted), starting from two pseudo-drafts at the bucket's own probability.
    The shipped drafter is underconfident on math and overconfident on code; the outcomes are of
    blocks already verified, so the choice still never reads the current block's target logits."""

    BUCKETS = 10

    def __init__(self, cost: CostModel, weigh_probes: bool = False):
        """weigh_probes: a block that did not pay is followed by backoff times its own cost in ar
        steps of ar steps, so that probing takes a bounded share of the time however many ar steps
        a block costs (a batch on a CPU: 3 to 8)."""
        self.cost, self.weigh_probes = cost, weigh_probes
        self.skip, self.backoff = 0, 0
        centers = [(b + 0.5) / self.BUCKETS for b in range(self.BUCKETS)]
        self.tried = [2.0] * self.BUCKETS
        self.accepted = [2.0 * c for c in centers]

    def _bucket(self, p: float) -> int:
        return min(int(p * self.BUCKETS), self.BUCKETS - 1)

    def calibrated(self, p: float) -> float:
        b = self._bucket(p)
        return self.accepted[b] / self.tried[b]

    def observe(self, p: float, accepted: bool) -> None:
        """A verified draft of probability p whose predecessors were accepted: was it?"""
        b = self._bucket(p)
        self.tried[b] += 1.0
        self.accepted[b] += float(accepted)

    def draft_now(self) -> bool:
        """False while the blocks that follow a block that did not pay run as ar steps."""
        if self.skip:
            self.skip -= 1
            return False
        return True

    def _paid(self, rate: float, block_seconds: float = 0.0) -> None:
        """Backs off (the next blocks skip the drafter) when a block's rate is below ar's."""
        if rate * self.cost(1) < 1.0:
            self.backoff = min(max(1, 2 * self.backoff), MAX_SKIP)
            self.skip = self.backoff
            if self.weigh_probes:
                self.skip *= max(1, round(block_seconds / self.cost(1)))
        else:
            self.backoff = 0

    def choose(self, confidence: Sequence[float], spent: float) -> int:
        """How many drafts of a chain to verify, given each slot's confidence and the seconds already
        spent on this block; also decides whether the next blocks draft at all."""
        return self.choose_batch([confidence], spent)

    def choose_batch(self, confidences: Sequence[Sequence[float]], spent: float) -> int:
        """The same for a batch verified in one call of every sequence's first k drafts (the cost
        model's forward is the batch's): the k that maximizes the tokens all sequences expect per
        second, against ar's len(confidences) tokens per c(1). A sequence with fewer confidences
        than k (finished, or an unsettled draft) expects nothing from the slots it lacks."""
        reach = [1.0] * len(confidences)
        k, expected = 0, float(len(confidences))
        rate = expected / (spent + self.cost(1))
        for j in range(max(map(len, confidences), default=0)):
            gain = 0.0
            for n, c in enumerate(confidences):
                if j < len(c):
                    reach[n] *= self.calibrated(c[j])
                    gain += reach[n]
            longer = (expected + gain) / (spent + self.cost(j + 2))
            if not longer > rate:
                break
            k, expected, rate = j + 1, expected + gain, longer
        self._paid(rate / max(len(confidences), 1), spent + self.cost(k + 1))
        return k

    def choose_nodes(self, node_probs: Sequence[float], node_parents: Sequence[int], spent: float) -> int:
        """How many of a best-first tree's draft nodes to verify (a prefix of such a tree is a tree):
        node i (1-based, parent node_parents[i-1], 0 the root) is reached with the product of the
        calibrated probabilities on its path. The tree is a function of the marginals alone, so the
        whole of it may be read."""
        reach, expected, rates = [1.0], [1.0], [1.0 / (spent + self.cost(1))]
        for parent, p in zip(node_parents, node_probs):
            reach.append(reach[parent] * self.calibrated(p))
            expected.append(expected[-1] + reach[-1])
            rates.append(expected[-1] / (spent + self.cost(len(expected))))
        k = max(range(len(rates)), key=rates.__getitem__)
        self._paid(rates[k])
        return k


class MeasuredChoice:
    """For a loop of two fixed-shape steps, a speculative block and an ar step (a captured CUDA graph
    each, or trees on the CPU), where the per-block rule above would need a host read between
    drafting and verifying: run the one with more tokens per second, as measured on the steps
    themselves (on the device and in the mode they run, the host read that ends each included).
    The other is retried after 1, 2, 4, ... MAX_SKIP steps, as its rate changes with the text.
    Each kind's first `warmup` steps (eager, then the capture) are not measured."""

    def __init__(self, warmup: int = 2):
        self.rate = {True: None, False: None}  # tokens per second of drafting / ar steps
        self.seen = {True: 0, False: 0}
        self.warmup, self.wait, self.backoff = warmup, 0, 0

    def draft_now(self) -> bool:
        for kind in (True, False):
            if self.rate[kind] is None:
                return kind
        best = self.rate[True] >= self.rate[False]
        if self.wait:
            self.wait -= 1
            return best
        self.backoff = min(max(1, 2 * self.backoff), MAX_SKIP)
        self.wait = self.backoff
        return not best  # a probe of the slower step

    def observe(self, drafted: bool, tokens: int, seconds: float) -> None:
        """A step of that kind committed `tokens` (over the batch) in `seconds`."""
        self.seen[drafted] += 1
        if self.seen[drafted] <= self.warmup:
            return
        before = None if None in self.rate.values() else self.rate[True] >= self.rate[False]
        rate, old = tokens / max(seconds, 1e-9), self.rate[drafted]
        self.rate[drafted] = rate if old is None else 0.5 * (old + rate)
        if before is not None and before != (self.rate[True] >= self.rate[False]):
            self.backoff = self.wait = 0  # the better step changed: probe afresh
