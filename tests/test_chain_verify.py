import pytest
import torch

import xkernels
from xkernels import reference
from tests.utils import DEVICES, LOGIT_DTYPES, assert_chains_agree, assert_replays_like_eager, chi_squared_pvalue

SHAPES = [(5, 16, 1000), (4, 3, 33), (3, 1, 7), (6, 4, 151), (2, 0, 9), (0, 4, 11)]


def make_case(n, k, v, dtype, with_q, seed=0):
    """Random logits and drafts that match the target's argmax for a random-length prefix."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, k + 1, v, generator=g) * 3).to(dtype)
    drafts = torch.randint(0, v, (n, k), generator=g)
    if k:
        greedy = logits[:, :k].float().argmax(-1)
        keep = torch.rand(n, k, generator=g) < 0.7
        drafts = torch.where(keep, greedy, drafts)
    q = torch.softmax(torch.randn(n, k, v, generator=g) * 2, -1) if with_q else None
    return drafts, logits, q


def to(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("temperature,with_q", [(0.0, False), (0.0, True), (1.0, False), (1.0, True), (0.6, True)])
def test_matches_reference(device, dtype, shape, temperature, with_q):
    drafts, logits, q = make_case(*shape, dtype, with_q, seed=sum(shape))
    for seed, offset in [(0, 0), (123, 7), (2**63 + 5, 2**40 + 1)]:
        got = xkernels.chain_verify(*to(device, drafts, logits), draft_probs=None if q is None else q.to(device),
                                    temperature=temperature, seed=seed, offset=offset)
        want = reference.chain_verify(drafts, logits, q, temperature, seed, offset)
        assert torch.equal(got[0].cpu(), want[0])
        assert torch.equal(got[1].cpu(), want[1])


@pytest.mark.parametrize("temperature,with_q", [(1.0, False), (1.0, True), (0.7, True)])
def test_large_vocabulary_samples_match_reference(temperature, with_q):
    """The CPU kernel skips the noise of ids that cannot win (by the top bits of their Philox words);
    over many streams of a large vocabulary it still draws exactly the reference's tokens."""
    drafts, logits, q = make_case(3, 4, 20011, torch.float32, with_q, seed=5)
    for seed in range(12):
        got = xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=temperature, seed=seed, offset=seed)
        want = reference.chain_verify(drafts, logits, q, temperature, seed, seed)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("device", DEVICES)
def test_output_layout(device):
    drafts, logits, q = make_case(64, 6, 50, torch.float32, True, seed=1)
    accept_len, out = xkernels.chain_verify(*to(device, drafts, logits), draft_probs=q.to(device), temperature=1.0)
    accept_len, out = accept_len.cpu(), out.cpu()
    assert accept_len.dtype == out.dtype == torch.int64
    for s in range(64):
        a = int(accept_len[s])
        assert 0 <= a <= 6
        assert torch.equal(out[s, :a], drafts[s, :a])
        assert 0 <= out[s, a] < 50
        assert (out[s, a + 1:] == -1).all()


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_ties_go_to_lowest_index(device):
    logits = torch.zeros(3, 3, 10)
    logits[0, :, 4] = logits[0, :, 7] = 1.0  # tie between 4 and 7
    logits[2, 1, 9] = float("nan")
    logits[2, 1, 2] = float("nan")  # two NaNs: the first counts, like torch.argmax
    drafts = torch.tensor([[4, 4], [0, 0], [0, 0]])
    accept_len, out = xkernels.chain_verify(*to(device, drafts, logits))
    assert accept_len.tolist() == [2, 2, 1]
    assert out.tolist() == [[4, 4, 4], [0, 0, 0], [0, 2, -1]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("v", [3, 8, 13, 64, 1001])
def test_many_ties_match_torch_argmax(device, dtype, v):
    g = torch.Generator().manual_seed(v)
    logits = torch.randint(0, 3, (32, 5, v), generator=g).to(dtype)  # ties everywhere
    drafts = logits[:, :4].float().argmax(-1)
    accept_len, out = xkernels.chain_verify(*to(device, drafts, logits))
    assert (accept_len == 4).all()
    assert torch.equal(out.cpu(), logits.float().argmax(-1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_without_softmax_are_point_masses(device, temperature):
    v = 12
    logits = torch.randn(4, 2, v)
    logits[0, 0] = float("-inf")  # all -inf: argmax 0
    logits[1, 0, 5] = float("nan")  # NaN: argmax is the NaN
    logits[2, 0, 3] = float("inf")  # +inf: argmax is the inf
    logits[3, 0] = float("nan")
    drafts = torch.tensor([[0], [5], [4], [1]])
    accept_len, out = xkernels.chain_verify(*to(device, drafts, logits), temperature=temperature, seed=3)
    assert accept_len.tolist()[:3] == [1, 1, 0]
    assert out[2, 0].item() == 3 and out[3, 0].item() == 0 and accept_len[3].item() == 0
    want = reference.chain_verify(drafts, logits, None, temperature, 3, 0)
    assert torch.equal(accept_len.cpu(), want[0]) and torch.equal(out.cpu(), want[1])


@pytest.mark.parametrize("device", DEVICES)
def test_seed_and_offset_tensors_match_ints(device):
    drafts, logits, q = make_case(16, 5, 64, torch.float32, True, seed=4)
    drafts, logits, q = to(device, drafts, logits, q)
    ints = xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=1.0, seed=11, offset=5)
    seed_t = torch.tensor(11, device=device)  # 0-dim: the batch-row form, as an int
    offset_t = torch.tensor(5, device=device)
    tensors = xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=1.0, seed=seed_t, offset=offset_t)
    assert all(torch.equal(a, b) for a, b in zip(ints, tensors))
    other = xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=1.0, seed=11, offset=6)
    assert not torch.equal(ints[1], other[1])


def test_dlpack_arrays_are_accepted():
    drafts, logits, q = make_case(4, 3, 20, torch.float32, True)
    got = xkernels.chain_verify(drafts.numpy(), logits.numpy(), draft_probs=q.numpy(), temperature=1.0, seed=2)
    want = xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=1.0, seed=2)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(TypeError, match="target_logits"):
        xkernels.chain_verify(drafts, logits.tolist())


def test_bad_inputs_name_the_argument():
    drafts, logits, q = make_case(2, 3, 10, torch.float32, True)
    cases = [
        (dict(draft_tokens=drafts[0]), "draft_tokens"),
        (dict(draft_tokens=drafts.short()), "draft_tokens must be int64"),  # int32 is widened
        (dict(target_logits=logits[0]), "target_logits"),
        (dict(target_logits=logits[:, :3]), "target_logits must have shape"),
        (dict(target_logits=logits.double()), "target_logits must be float32"),
        (dict(draft_probs=q[:, :2]), "draft_probs must have shape"),
        (dict(draft_probs=q.double()), "draft_probs must be float32, bfloat16 or float16"),
        (dict(temperature=-1.0), "temperature must be finite and >= 0"),
        (dict(temperature=float("inf")), "temperature must be finite and >= 0"),
        (dict(temperature=float("nan")), "temperature must be finite and >= 0"),
        (dict(draft_tokens=drafts + 10), "outside"),
        (dict(draft_tokens=drafts - 20), "outside"),
        (dict(seed=torch.tensor([1, 2, 3])), "seed"),  # [N] = [2] is a seed per sequence
        (dict(offset=torch.tensor(1.0)), "offset"),
    ]
    for change, message in cases:
        args = dict(draft_tokens=drafts, target_logits=logits, draft_probs=q, temperature=1.0)
        args.update(change)
        d, t = args.pop("draft_tokens"), args.pop("target_logits")
        with pytest.raises(RuntimeError, match=message):
            xkernels.chain_verify(d, t, **args)


def test_int32_drafts_are_int64_drafts():
    drafts, logits, q = make_case(3, 4, 30, torch.float32, True, seed=2)
    for kw in (dict(), dict(temperature=1.0, seed=torch.tensor([4, 5, 6]), offset=torch.tensor([0, 9, 3]))):
        want = xkernels.chain_verify(drafts, logits, draft_probs=q, **kw)
        got = xkernels.chain_verify(drafts.int(), logits, draft_probs=q, **kw)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.needs_cuda
def test_mixed_devices_are_rejected():
    drafts, logits, q = make_case(2, 3, 10, torch.float32, True)
    with pytest.raises(RuntimeError, match="draft_tokens must be on"):
        xkernels.chain_verify(drafts, logits.cuda())
    with pytest.raises(RuntimeError, match="draft_probs must be on"):
        xkernels.chain_verify(drafts.cuda(), logits.cuda(), draft_probs=q)
    with pytest.raises(RuntimeError, match="seed must be on"):
        xkernels.chain_verify(drafts.cuda(), logits.cuda(), temperature=1.0, seed=torch.tensor(1))


@pytest.mark.needs_cuda
def test_out_of_range_drafts_on_cuda_are_rejected_safely():
    drafts, logits, _ = make_case(4, 3, 10, torch.float32, False)
    drafts[:, 0] = torch.tensor([-1, 10, 2**40, -(2**40)])
    accept_len, out = xkernels.chain_verify(drafts.cuda(), logits.cuda(), temperature=1.0)
    torch.cuda.synchronize()
    assert (accept_len == 0).all()
    assert ((out[:, 0] >= 0) & (out[:, 0] < 10)).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature,with_q", [(0.0, False), (1.0, True), (1.0, False)])
def test_opcheck(device, temperature, with_q):
    drafts, logits, q = to(device, *make_case(4, 3, 33, torch.float32, with_q))
    torch.library.opcheck(torch.ops.xkernels.chain_verify.default,
                          (drafts, logits, q, temperature, 1, 2, None, None))


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("temperature,with_q", [(0.0, False), (1.0, False), (0.8, True)])
def test_cpu_and_cuda_agree(dtype, temperature, with_q):
    drafts, logits, q = make_case(64, 16, 32000, dtype, with_q, seed=9)
    cpu = xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=temperature, seed=1, offset=2)
    gpu = xkernels.chain_verify(*to("cuda", drafts, logits), draft_probs=None if q is None else q.cuda(),
                                temperature=temperature, seed=1, offset=2)
    assert_chains_agree(gpu, cpu, drafts, logits, q, temperature, 1, 2)


@pytest.mark.needs_cuda
def test_cuda_graph_capture_advances_offset():
    drafts, logits, q = to("cuda", *make_case(8, 4, 100, torch.float32, True))
    offset = torch.zeros((), dtype=torch.int64, device="cuda")  # 0-dim: one stream for the batch
    assert_replays_like_eager(
        lambda: xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=1.0, seed=3, offset=offset), offset)


# ---- losslessness: the emitted tokens follow the target, token by token ----

V, SAMPLES = 5, 60000


def target_tables(g):
    """A target over two steps: p1[y1] and p2[y1, y2] (plus p3 for the bonus row)."""
    p1 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    p2 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    p3 = torch.softmax(torch.randn(V, V, V, generator=g) * 1.5, -1)
    return p1, p2, p3


def emitted_pair_counts(verify, with_q, seed):
    """Counts of the first two emitted tokens (y1, y2) over many independent sequences.

    Drafts come from a draft model q (or are deterministic proposals); when only one token
    is emitted, the second comes from the next decoding step, a plain sample of p2(. | y1)."""
    g = torch.Generator().manual_seed(seed)
    p1, p2, p3 = target_tables(g)
    q1 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    q2 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    if with_q:
        x1 = torch.multinomial(q1, SAMPLES, replacement=True, generator=g)
        x2 = torch.multinomial(q2[x1], 1, generator=g)[:, 0]
        draft_probs = torch.stack([q1.expand(SAMPLES, V), q2[x1]], 1)
    else:  # deterministic proposals: the draft model's argmax
        x1 = torch.full((SAMPLES,), int(q1.argmax()))
        x2 = q2[x1].argmax(-1)
        draft_probs = None
    drafts = torch.stack([x1, x2], 1)
    logits = torch.stack([p1.log().expand(SAMPLES, V), p2[x1].log(), p3[x1, x2].log()], 1)
    accept_len, out = verify(drafts, logits, draft_probs)
    y1 = out[:, 0]
    next_step = torch.multinomial(p2[y1], 1, generator=g)[:, 0]
    y2 = torch.where(accept_len >= 1, out[:, 1], next_step)
    counts = torch.bincount(y1 * V + y2, minlength=V * V).reshape(V, V)
    return counts, p1[:, None] * p2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_q", [True, False])
def test_lossless_sampling(device, with_q):
    def verify(drafts, logits, q):
        got = xkernels.chain_verify(*to(device, drafts, logits), draft_probs=None if q is None else q.to(device),
                                    temperature=1.0, seed=2024, offset=1)
        return [t.cpu() for t in got]

    counts, expected = emitted_pair_counts(verify, with_q, seed=17)
    assert chi_squared_pvalue(counts, expected) > 1e-3


def broken_verify(drafts, logits, q):
    """A wrong verifier: correct acceptance test, but it resamples from p at a rejection instead of
    from the residual normalize(max(p - q, 0)) (or p without the rejected draft)."""
    g = torch.Generator().manual_seed(5)
    n, k = drafts.shape
    p = torch.softmax(logits.float(), -1)
    p_x = p[:, :k].gather(-1, drafts[..., None])[..., 0]
    q_x = q.gather(-1, drafts[..., None])[..., 0] if q is not None else torch.ones_like(p_x)
    accepted = torch.rand(n, k, generator=g) * q_x < p_x
    accept_len = accepted.long().cumprod(-1).sum(-1)
    out = torch.full((n, k + 1), -1, dtype=torch.int64)
    for s in range(n):
        a = int(accept_len[s])
        out[s, :a] = drafts[s, :a]
        out[s, a] = torch.multinomial(p[s, a], 1, generator=g)[0]
    return accept_len, out


@pytest.mark.parametrize("with_q", [True, False])
def test_lossless_test_catches_a_wrong_residual(with_q):
    counts, expected = emitted_pair_counts(broken_verify, with_q, seed=17)
    assert chi_squared_pvalue(counts, expected) < 1e-6


def test_a_temperature_whose_reciprocal_overflows_is_greedy():
    drafts, logits, q = make_case(8, 4, 60, torch.float32, True, seed=5)
    for tiny in [1e-39, 5e-324]:
        got = xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=tiny, seed=1)
        greedy = xkernels.chain_verify(drafts, logits, draft_probs=q)
        assert torch.equal(got[1], greedy[1])
        assert torch.equal(reference.chain_verify(drafts, logits, q, tiny, 1)[1], greedy[1])


def test_rounding_tolerant_agreement_catches_a_real_difference():
    """assert_chains_agree (the CPU-vs-CUDA comparison) accepts identical results and rejects a
    changed token where the decision is not close."""
    drafts, logits, q = make_case(16, 4, 50, torch.float32, True, seed=7)
    want = reference.chain_verify(drafts, logits, q, 1.0, 1, 2)
    assert_chains_agree(want, want, drafts, logits, q, 1.0, 1, 2)
    wrong = want[1].clone()
    wrong[3, 0] = (wrong[3, 0] + 1) % 50
    with pytest.raises(AssertionError, match="sequence 3 differs"):
        assert_chains_agree((want[0], wrong), want, drafts, logits, q, 1.0, 1, 2)

