"""A first-order Markov target for the joint-law tests of the verifiers (chain and tree): the
parameter kinds decoded side by side in one batch, the filtered target's law of the decoded
tokens, and the chi-squared check of each kind against it."""

import torch
from scipy import stats

from xkernels.reference import sampling as ref_sampling

# Each filter alone and mixed, at several temperatures.
KINDS = [dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), dict(temperature=0.7, top_k=3, top_p=1.0, min_p=0.0),
         dict(temperature=1.3, top_k=0, top_p=0.7, min_p=0.0), dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2),
         dict(temperature=0.8, top_k=4, top_p=0.8, min_p=0.1)]


def kind_params(rows_per_kind):
    """The per-row temperature, top_k, top_p and min_p of rows_per_kind rows of each kind, in order."""
    return {name: torch.tensor([kind[name] for kind in KINDS for _ in range(rows_per_kind)])
            for name in ("temperature", "top_k", "top_p", "min_p")}


def joint_probs(transition_logits, kind, length):
    """The law of (x_1 .. x_length) after token 0, flat with x_1 most significant."""
    p = ref_sampling.filtered_probs(transition_logits, kind["temperature"], kind["top_k"], kind["top_p"], kind["min_p"])
    joint = p[0]
    for _ in range(length - 1):
        joint = (joint[:, None] * p[torch.arange(joint.numel()) % p.shape[0]]).reshape(-1)
    return joint


def joint_pvalue(tokens, probs):
    """tokens [R, L] int, probs [V^L] expected; cells with expected count < 5 are pooled."""
    vocab = int(round(probs.numel() ** (1 / tokens.shape[1])))
    index = torch.zeros(tokens.shape[0], dtype=torch.int64)
    for j in range(tokens.shape[1]):
        index = index * vocab + tokens[:, j]
    observed = torch.bincount(index, minlength=probs.numel()).double()
    expected = probs.double() * tokens.shape[0]
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    if exp[-1] == 0:  # nothing pooled: an id the filters drop must never be drawn
        assert obs[-1] == 0
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue


def assert_follows_each_kinds_law(tokens, transition_logits, rows_per_kind):
    """tokens [rows_per_kind * len(KINDS), L], decoded after token 0 by rows of each kind in order:
    each kind's rows follow its filtered joint law (chi-squared), and a filtered kind's rows fail
    the unfiltered law, so the check can see a wrong filter."""
    length = tokens.shape[1]
    for i, kind in enumerate(KINDS):
        part = tokens[i * rows_per_kind:(i + 1) * rows_per_kind]
        p = joint_pvalue(part, joint_probs(transition_logits, kind, length))
        assert p > 1e-4, (kind, p)
        if kind["top_k"] or kind["top_p"] < 1 or kind["min_p"]:
            plain = dict(kind, top_k=0, top_p=1.0, min_p=0.0)
            assert joint_pvalue(part, joint_probs(transition_logits, plain, length)) < 1e-6, kind
