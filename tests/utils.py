import pytest
import scipy.stats
import torch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.needs_cuda)]
LOGIT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def chi_squared_pvalue(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """p-value of observed counts against expected probabilities (cells with zero probability must be empty)."""
    counts = counts.flatten().double()
    probs = expected_probs.flatten().double()
    assert counts[probs == 0].sum() == 0, "a cell of probability zero was observed"
    keep = probs > 0
    expected = probs[keep] / probs[keep].sum() * counts.sum()
    return float(scipy.stats.chisquare(counts[keep].numpy(), expected.numpy()).pvalue)
