"""dllm_step, the LLaDA low-confidence unmasking step, against its reference; its sampling by
chi-squared (with a wrong temperature shown to fail)."""
import math

import pytest
import torch

import xkernels
from xkernels import reference
from tests.utils import DEVICES, LOGIT_DTYPES, chi_squared_pvalue

MASK = 7


def step_case(n, length, v, dtype=torch.float32, seed=0, masked_share=0.6):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, length, v, generator=g) * 2).to(dtype)
    block = torch.randint(0, v, (n, length), generator=g)
    block[block == MASK] = 0
    block[torch.rand(n, length, generator=g) < masked_share] = MASK
    return logits, block


def near_tie_case(n, length, v, level, seed):
    """Every position masked; every logit `level` but three ids a row, late in it, one float step above
    (the argmax a sampling pass starts from). The Gumbel-max scores then sit where the sampler's skip
    test (sampling.h's gumbel_cannot_win) decides, and at level 2^20, where scores round to steps of
    1/8, near-ties become exact ties that go to the lower id."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.full((n, length, v), level)
    up = torch.nextafter(torch.tensor(level), torch.tensor(math.inf)).item()
    logits.scatter_(2, torch.randint(v // 2, v, (n, length, 3), generator=g), up)
    return logits, torch.full((n, length), MASK)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("level", [0.0, -3000.5, 2.0**20])
def test_draws_at_near_ties_match_the_reference(device, level):
    """The sampler skips the logs of ids that provably cannot win; on rows built so that many nearly
    do, it must still draw exactly the reference's token (which scores every id)."""
    for seed in range(6):
        logits, block = near_tie_case(2, 6, 1000, level, seed)
        got = xkernels.dllm_step(logits.to(device), block.to(device), MASK, num_unmask=6, temperature=1.0, seed=seed)
        want = reference.dllm_step(logits, block, MASK, num_unmask=6, temperature=1.0, seed=seed)
        assert torch.equal(got[2].cpu(), want[2])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
@pytest.mark.parametrize("num_unmask,threshold", [(1, None), (3, None), (40, None), (1, 0.2), (1, 0.99)])
def test_matches_reference(device, dtype, temperature, num_unmask, threshold):
    logits, block = step_case(5, 16, 37, dtype, seed=num_unmask)
    block[2] = 3  # a sequence with nothing masked
    got = xkernels.dllm_step(logits.to(device), block.to(device), MASK, num_unmask=num_unmask, threshold=threshold,
                             temperature=temperature, seed=9, offset=4)
    want = reference.dllm_step(logits, block, MASK, num_unmask, threshold, temperature, 9, 4)
    for a, b in zip(got[:3], want[:3]):
        assert torch.equal(a.cpu(), b)
    torch.testing.assert_close(got[3].cpu(), want[3], atol=1e-5, rtol=1e-4)
    new_block, positions, tokens, _ = [t.cpu() for t in got]
    assert (positions[2] == -1).all() and torch.equal(new_block[2], block[2])
    for s in (0, 1, 3, 4):
        count = int((positions[s] >= 0).sum())
        masked = int((block[s] == MASK).sum())
        assert count >= min(1, masked)
        if threshold is None:
            assert count == min(num_unmask, masked)
        chosen = positions[s, :count]
        assert (chosen.diff() > 0).all() and (block[s, chosen] == MASK).all()
        assert torch.equal(new_block[s, chosen], tokens[s, :count])


@pytest.mark.parametrize("device", DEVICES)
def test_ties_go_to_the_lowest_position_and_nan_ranks_last(device):
    logits = torch.zeros(1, 5, 6)
    logits[0, :, 2] = 3.0  # every row alike: equal confidences
    logits[0, 0, 4] = float("nan")
    block = torch.full((1, 5), MASK)
    block[0, 1] = 1
    _, positions, tokens, conf = xkernels.dllm_step(logits.to(device), block.to(device), MASK, num_unmask=2)
    assert positions.tolist()[0][:3] == [2, 3, -1] and tokens.tolist()[0][:2] == [2, 2]
    assert conf[0, 0].isnan() and conf[0, 1] == float("-inf")


@pytest.mark.parametrize("variant", ["kernel", "wrong temperature"])
def test_sampled_token_follows_the_tempered_target(variant):
    samples, v, temperature = 30000, 5, 0.8
    g = torch.Generator().manual_seed(2)
    row = torch.randn(v, generator=g) * 1.5
    logits = row.expand(samples, 1, v).contiguous()
    block = torch.full((samples, 1), MASK)
    _, _, tokens, _ = xkernels.dllm_step(logits, block, MASK, temperature=temperature, seed=5)
    counts = torch.bincount(tokens[:, 0], minlength=v)
    expected = torch.softmax(row / (temperature if variant == "kernel" else 0.5), -1)
    p = chi_squared_pvalue(counts, expected)
    assert p > 1e-3 if variant == "kernel" else p < 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    logits, block = step_case(3, 8, 20)
    torch.library.opcheck(torch.ops.xkernels.dllm_step.default,
                          (logits.to(device), block.to(device), MASK, 2, None, 1.0, None, 0, None, 1.0, None, 0.0,
                           None, 3, None, 1, None))
    torch.library.opcheck(torch.ops.xkernels.dllm_step.default,
                          (logits.to(device), block.to(device), MASK, 1, 0.5, 0.0, None, 0, None, 1.0, None, 0.0,
                           None, 0, None, 0, None))


def test_bad_inputs_name_the_argument():
    logits, block = step_case(2, 8, 20)
    cases = [
        (lambda: xkernels.dllm_step(logits[0], block, MASK), "logits must have shape"),
        (lambda: xkernels.dllm_step(logits.double(), block, MASK), "logits must be"),
        (lambda: xkernels.dllm_step(logits, block[:, :5], MASK), "block_tokens must have shape"),
        (lambda: xkernels.dllm_step(logits, block.short(), MASK), "block_tokens must be int64"),
        (lambda: xkernels.dllm_step(logits, block, MASK, num_unmask=0), "num_unmask must be >= 1"),
        (lambda: xkernels.dllm_step(logits, block, MASK, threshold=float("nan")), "threshold must be finite"),
        (lambda: xkernels.dllm_step(logits, block, MASK, temperature=-1.0), "temperature"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()


@pytest.mark.needs_cuda
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cpu_and_cuda_agree(temperature):
    logits, block = step_case(16, 32, 4099, torch.bfloat16, seed=1)
    cpu = xkernels.dllm_step(logits, block, MASK, num_unmask=4, temperature=temperature, seed=2)
    gpu = xkernels.dllm_step(logits.cuda(), block.cuda(), MASK, num_unmask=4, temperature=temperature, seed=2)
    assert (cpu[1] == gpu[1].cpu()).all(-1).float().mean() > 0.9  # the rest only where confidences near-tie
