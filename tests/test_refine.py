import pytest
import torch

import xkernels
from xkernels import reference
from xkernels.refiner import RefinerWeights, XPressRefiner
from tests.utils import DEVICES, LOGIT_DTYPES, assert_replays_like_eager, chi_squared_pvalue

# (N, B, D, V, r, H): F = B - D fixed slots
SHAPES = [(3, 6, 5, 300, 16, 32), (2, 4, 4, 257, 32, 64), (1, 16, 15, 1000, 64, 128), (4, 3, 1, 50, 8, 16),
          (0, 4, 3, 50, 8, 16)]


# Whether this CPU runs the fused greedy float32 read (csrc/cpu/read_stats.cpp: AVX-512F) as well as
# the sliced one (a vendor GEMM per vocabulary slice, then the epilogue; csrc/cpu/refine.cpp).
FUSED_CPU_READ = xkernels.build_info()["cpu_read"] == "avx512"


@pytest.fixture(params=["gemm", "fused"])
def read(request, monkeypatch):
    """XKERNELS_REFINE_READ forced to each read the test's device has, so that the result checks
    cover both wherever they run: on the CPU the sliced read and, with AVX-512F, the fused one
    (which takes the greedy float32 read; the others stay sliced); on CUDA the cuBLAS read and
    read_fused_kernel."""
    if request.param == "fused" and request.node.callspec.params.get("device", "cpu") == "cpu" and not FUSED_CPU_READ:
        pytest.skip("this CPU has no AVX-512F: the sliced read is its only one")
    monkeypatch.setenv("XKERNELS_REFINE_READ", request.param)
    return request.param


def make_case(n, b, d, v, r, h, logits_dtype=torch.float32, weight_dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    weights = RefinerWeights(
        emb=torch.randn(v, r, generator=g) * 0.5,
        mix=torch.randn(r, b, b, generator=g).tril() * 0.3 + torch.eye(b),
        w_gate=torch.randn(h, r, generator=g) * r**-0.5,
        w_up=torch.randn(h, r, generator=g) * r**-0.5,
        w_down=torch.randn(r, h, generator=g) * h**-0.5,
        w_read=torch.randn(v, r, generator=g) * r**-0.5,
    ).to(weight_dtype)
    ctx = torch.randn(n, b, r, generator=g)
    base = (torch.randn(n, d, v, generator=g) * 2).to(logits_dtype)
    prev = torch.randint(0, v, (n, b), generator=g)
    return ctx, prev, base, weights


def to(device, *items):
    return [x.to(device) if x is not None else None for x in items]


def assert_same_tokens(got, want, scores, atol):
    """Tokens agree except where the reference's best two scores lie within rounding (atol)."""
    got = got.cpu()
    if torch.equal(got, want):
        return
    top2 = scores.topk(2, dim=-1).values
    gap = top2[..., 0] - top2[..., 1]
    differ = got != want
    assert (gap[differ] <= atol).all(), f"tokens differ where the top-2 gap is {gap[differ].min()}"


TOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 5e-2}
BF16_UNIT = 2.0**-8  # bfloat16's unit roundoff: 8 significant bits, round to nearest


def bf16_read_bound(ctx, prev, base, weights, temperature, rounds_products):
    """With bfloat16 weights the read is a bfloat16 GEMM: z is rounded to bfloat16 (|dz| <= u |z|), and
    on the CPU (oneDNN) each product z . w_read[v] is rounded to bfloat16 as well. Refined logit v then
    moves by at most e_v = u |z| . |w_v| (+ u (|z . w_v| + that)), so log_softmax(l / T)[x] moves by at
    most (e_x + max_v e_v) / T <= 2 max_v e_v / T. Returns that bound per row [N, D]."""
    from xkernels.refiner import refiner_hidden

    z = refiner_hidden(weights, ctx, prev)[:, ctx.shape[1] - base.shape[1]:]
    w = weights.w_read.float()
    err = BF16_UNIT * (z.abs() @ w.abs().T)
    if rounds_products:
        err = err + BF16_UNIT * ((z @ w.T).abs() + err)
    return 2 * err.amax(-1) / (temperature or 1.0)


def assert_logprobs_close(got, want, same, weight_dtype, bound=None):
    """float32 weights: to float32 rounding; bfloat16 weights: within the derived bound per row."""
    got = got.cpu()
    if weight_dtype == torch.float32:
        torch.testing.assert_close(got[same], want[same], atol=1e-3, rtol=1e-4)
        return
    excess = ((got - want).abs() - bound - 1e-4)[same]
    assert (excess <= 0).all(), f"logprobs differ by {excess.max()} more than the bfloat16 read's bound"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("logits_dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_refine_step_matches_reference(device, shape, logits_dtype, weight_dtype, temperature, read):
    cpu_fused = temperature == 0 and weight_dtype == logits_dtype == torch.float32
    if read == "fused" and not (cpu_fused if device == "cpu" else weight_dtype == torch.bfloat16):
        pytest.skip("no fused read applies: the same call as with gemm")
    ctx, prev, base, weights = make_case(*shape, logits_dtype, weight_dtype, seed=sum(shape))
    tokens, logprobs = xkernels.refine_step(*to(device, ctx, prev, base), weights.to(device),
                                            temperature=temperature, seed=5, offset=2)
    want_tokens, want_logprobs = reference.refine_step(ctx, prev, base, weights, temperature, 5, 2)
    _, scores = reference.perturbed_scores(reference.refine_logits(ctx, prev, base, weights), temperature, 5, 2)
    tol = max(TOL[logits_dtype], TOL[weight_dtype])
    assert_same_tokens(tokens, want_tokens, scores, tol)
    same = tokens.cpu() == want_tokens
    bound = bf16_read_bound(ctx, prev, base, weights, temperature, rounds_products=device == "cpu")
    assert_logprobs_close(logprobs, want_logprobs, same, weight_dtype, bound)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_vocabulary_of_several_gemm_slices(device, temperature, read):
    """V above the CPU's GEMM slice for 32 rows (8192 ids: 1 MB of float32 products) and not a multiple
    of its 1024-id chunks: the slices' partial results merge to the reference's sample."""
    ctx, prev, base, weights = make_case(16, 3, 2, 20003, 8, 16, seed=12)
    tokens, logprobs = xkernels.refine_step(*to(device, ctx, prev, base), weights.to(device),
                                            temperature=temperature, seed=7)
    want_tokens, want_logprobs = reference.refine_step(ctx, prev, base, weights, temperature, 7)
    assert torch.equal(tokens.cpu(), want_tokens)
    torch.testing.assert_close(logprobs.cpu(), want_logprobs, atol=1e-4, rtol=1e-4)


# The CPU's greedy float32 read on AVX-512 (csrc/cpu/read_stats.cpp) takes blocks of 64 rows in 1-4
# registers of 16, tiles of 6-8 ids, 1024-id chunks and a prefetch every 16 of r: rows = N * D of
# 1, 15, 18, 48, 65 and 130, vocabularies with short tiles and chunks, r not a multiple of 16.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,b,d,v,r", [(1, 2, 1, 1, 3), (3, 6, 5, 7, 17), (2, 9, 9, 1030, 16), (4, 13, 12, 50, 20),
                                       (5, 14, 13, 70, 8), (10, 13, 13, 2051, 33)])
def test_greedy_read_at_every_block_and_tile_shape(device, n, b, d, v, r, read):
    ctx, prev, base, weights = make_case(n, b, d, v, r, 16, seed=n + v)
    tokens, logprobs = xkernels.refine_step(*to(device, ctx, prev, base), weights.to(device))
    want_tokens, want_logprobs = reference.refine_step(ctx, prev, base, weights, 0.0, 0)
    assert_same_tokens(tokens, want_tokens, reference.refine_logits(ctx, prev, base, weights), 1e-4)
    same = tokens.cpu() == want_tokens
    torch.testing.assert_close(logprobs.cpu()[same], want_logprobs[same], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_ties_and_degenerate_rows_across_tiles_and_chunks(device, read):
    """With w_read = 0 the refined logits are the base logits exactly: ties across tiles, chunks and
    rows go to the lowest id, and rows of -inf, +inf or NaN (any lane of a register of 16 rows) get
    the reference's token and log-prob."""
    n, d, v = 6, 12, 2100
    ctx, prev, base, weights = make_case(n, d + 1, d, v, 8, 16, seed=9)
    weights = weights._replace(w_read=torch.zeros_like(weights.w_read))
    rows = base.view(n * d, v)
    rows[0, [5, 1030, 2099]] = 50.0           # the same max in three chunks
    rows[1, [2050, 2099]] = 50.0              # in the last, short chunk
    rows[2, [6, 7]] = 50.0                    # in one tile
    rows[17].fill_(-torch.inf)                # nothing drawable
    rows[18].fill_(-torch.inf)
    rows[18, 1500] = 1.0                      # a single finite id
    rows[33, 1200] = torch.inf                # +inf and NaN late in the row: earlier chunks look finite
    rows[64, 2000] = torch.nan
    rows[65, [3, 2001]] = torch.nan
    tokens, logprobs = xkernels.refine_step(*to(device, ctx, prev, base), weights.to(device))
    want_tokens, want_logprobs = reference.refine_step(ctx, prev, base, weights, 0.0, 0)
    assert torch.equal(tokens.cpu(), want_tokens)
    assert tokens.view(-1)[[0, 1, 2, 18, 33, 64, 65]].tolist() == [5, 2050, 6, 1500, 1200, 2000, 3]
    torch.testing.assert_close(logprobs.cpu(), want_logprobs, atol=1e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_only_the_lower_triangle_of_mix_is_read(device, read):
    """Slot k mixes slots j <= k: whatever lies above mix's diagonal (here NaN) changes nothing."""
    ctx, prev, base, weights = make_case(3, 6, 5, 300, 16, 32, seed=4)
    upper = torch.ones(6, 6, dtype=torch.bool).triu(1)
    poisoned = weights._replace(mix=weights.mix.masked_fill(upper, float("nan")))
    for temperature in (0.0, 1.0):
        want = xkernels.refine_step(*to(device, ctx, prev, base), weights.to(device), temperature=temperature, seed=3)
        got = xkernels.refine_step(*to(device, ctx, prev, base), poisoned.to(device), temperature=temperature, seed=3)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        prefix = prev[:, :2]
        want = xkernels.jacobi_refine(*to(device, ctx, prefix, base), weights.to(device), temperature=temperature,
                                     max_iters=5)
        got = xkernels.jacobi_refine(*to(device, ctx, prefix, base), poisoned.to(device), temperature=temperature,
                                     max_iters=5)
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_module_forward_matches_folded_weights(read):
    torch.manual_seed(0)
    n, b, d, v, hidden = 3, 8, 7, 120, 24
    model = XPressRefiner(v, hidden, b, rank=16, mlp_ratio=2).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    h = torch.randn(n, b, hidden, dtype=torch.float64)
    base = torch.randn(n, d, v, dtype=torch.float64)
    prev = torch.randint(0, v, (n, b))
    refined = model(base, h, prev)
    assert refined.shape == (n, d, v) and refined.requires_grad
    weights = model.fold()
    folded = reference.refine_logits(model.prepare(h).detach(), prev, base, weights)
    torch.testing.assert_close(folded, refined.float().detach(), atol=2e-4, rtol=1e-4)
    tokens, _ = xkernels.refine_step(model.prepare(h).detach().float(), prev, base.float(), weights.to(torch.float32))
    assert_same_tokens(tokens, refined.argmax(-1), refined.float().detach(), 1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_jacobi_converges_to_sequential(device, temperature, read):
    n, b, d, v, r, h = 6, 9, 8, 200, 16, 32
    ctx, prev, base, weights = make_case(n, b, d, v, r, h, seed=3)
    prefix = prev[:, : b - d + 1]
    args = (*to(device, ctx, prefix, base), weights.to(device))
    seq_tokens, seq_logprobs = xkernels.sequential_refine(*args, temperature=temperature, seed=9)
    want = reference.sequential_refine(ctx, prefix, base, weights, temperature, 9)
    assert torch.equal(seq_tokens.cpu(), want[0])
    torch.testing.assert_close(seq_logprobs.cpu(), want[1], atol=1e-4, rtol=1e-4)
    for passes in range(d + 2):
        tokens, logprobs, iters = xkernels.jacobi_refine(*args, max_iters=passes, temperature=temperature, seed=9)
        ref_tokens, ref_logprobs, ref_iters = reference.jacobi_refine(ctx, prefix, base, weights, passes,
                                                                     temperature, 9)
        assert torch.equal(tokens.cpu(), ref_tokens) and torch.equal(iters.cpu(), ref_iters)
        torch.testing.assert_close(logprobs.cpu(), ref_logprobs, atol=1e-4, rtol=1e-4)
        assert iters.dtype == torch.int32 and (iters <= passes).all()
        # After t passes the first t drafted slots are final.
        assert torch.equal(tokens[:, :passes].cpu(), seq_tokens[:, :passes].cpu())
        if passes >= d:
            assert torch.equal(tokens, seq_tokens)
            torch.testing.assert_close(logprobs, seq_logprobs, atol=1e-4, rtol=1e-4)
    # A converged sequence is not changed by further passes.
    few = xkernels.jacobi_refine(*args, max_iters=3, temperature=temperature, seed=9)
    many = xkernels.jacobi_refine(*args, max_iters=20, temperature=temperature, seed=9)
    done = few[2] < 3
    assert torch.equal(few[0][done], many[0][done]) and torch.equal(few[2][done], many[2][done])


def test_dspark_markov_head_is_a_special_case(read):
    """b_k = W2 W1[x_{k-1}]: no context, identity mix, a zero SwiGLU, emb = W1, w_read = W2."""
    n, b, v, r = 5, 7, 90, 12
    g = torch.Generator().manual_seed(1)
    w1, w2 = torch.randn(v, r, generator=g), torch.randn(v, r, generator=g) * 0.5
    zeros = torch.zeros(2 * r, r)
    weights = RefinerWeights(emb=w1, mix=torch.eye(b).expand(r, b, b).contiguous(), w_gate=zeros, w_up=zeros,
                             w_down=zeros.T.contiguous(), w_read=w2)
    base = torch.randn(n, b - 1, v, generator=g) * 2
    anchor = torch.randint(0, v, (n, 2), generator=g)  # the token before the block and the anchor slot
    tokens, _ = xkernels.sequential_refine(torch.zeros(n, b, r), anchor, base, weights)
    prev = anchor[:, 1]
    for k in range(b - 1):
        want = (base[:, k] + w1[prev] @ w2.T).argmax(-1)
        assert torch.equal(tokens[:, k], want)
        prev = want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["sequential", "jacobi"])
def test_sampled_blocks_follow_the_refined_model(device, op):
    """At T=1 the block (x1, x2) follows p(x1) p(x2 | x1) of the refined model (chi-squared)."""
    samples, b, d, v, r, h = 40000, 3, 2, 4, 8, 16
    ctx, prev, base, weights = make_case(1, b, d, v, r, h, seed=11)
    weights = weights._replace(w_read=weights.w_read * 6)  # a strong, token-dependent refinement
    prefix = prev[:, : b - d + 1]
    batch = [ctx.expand(samples, -1, -1).contiguous(), prefix.expand(samples, -1).contiguous(),
             base.expand(samples, -1, -1).contiguous()]
    args = (*to(device, *batch), weights.to(device))
    if op == "sequential":
        tokens, logprobs = xkernels.sequential_refine(*args, temperature=1.0, seed=4)
    else:
        tokens, logprobs, _ = xkernels.jacobi_refine(*args, max_iters=d, temperature=1.0, seed=4)
    tokens, logprobs = tokens.cpu(), logprobs.cpu()
    # The refined model's conditionals, enumerated.
    p1 = reference.refine_logits(ctx, torch.cat([prefix, torch.zeros(1, 1, dtype=torch.long)], 1), base,
                                 weights)[0, 0].softmax(-1)
    p2 = torch.stack([reference.refine_logits(ctx, torch.cat([prefix, torch.tensor([[x]])], 1), base,
                                              weights)[0, 1].softmax(-1) for x in range(v)])
    counts = torch.bincount(tokens[:, 0] * v + tokens[:, 1], minlength=v * v)
    assert chi_squared_pvalue(counts, p1[:, None] * p2) > 1e-3
    torch.testing.assert_close(logprobs[:, 0], p1.log()[tokens[:, 0]], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logprobs[:, 1], p2.log()[tokens[:, 0], tokens[:, 1]], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    ctx, prev, base, weights = to(device, *make_case(2, 5, 4, 70, 8, 16)[:3]) + [make_case(2, 5, 4, 70, 8, 16)[3].to(device)]
    w = tuple(weights)
    torch.library.opcheck(torch.ops.xkernels.refine_step.default, (ctx, prev, base, *w),
                          dict(temperature=1.0, seed=3, offset=1))
    prefix = prev[:, :2].contiguous()
    torch.library.opcheck(torch.ops.xkernels.jacobi_refine.default, (ctx, prefix, base, *w, 3), dict(temperature=0.0))
    torch.library.opcheck(torch.ops.xkernels.sequential_refine.default, (ctx, prefix, base, *w),
                          dict(temperature=1.0, seed=1))


def test_bad_inputs_name_the_argument():
    ctx, prev, base, weights = make_case(2, 5, 4, 70, 8, 16)
    prefix = prev[:, :2]
    step = lambda **kw: xkernels.refine_step(kw.get("ctx", ctx), kw.get("prev", prev), kw.get("base", base),  # noqa
                                             kw.get("weights", weights))
    cases = [
        (dict(ctx=ctx[:, :4]), "must have shape"),  # B mismatch with prev_tokens / mix
        (dict(ctx=ctx.double()), "ctx must be float32"),
        (dict(prev=prev[:, :3]), "prev_tokens must have shape"),
        (dict(prev=prev + 100), "prev_tokens holds ids outside"),
        (dict(prev=prev.short()), "prev_tokens must be int64"),
        (dict(base=base[..., :60]), "must have shape"),  # V mismatch with the weights
        (dict(base=base.double()), "base_logits must be"),
        (dict(base=torch.randn(2, 6, 70)), "drafted slots"),
        (dict(weights=weights._replace(w_read=weights.w_read[:, :7])), "w_read must have shape"),
        (dict(weights=weights._replace(emb=weights.emb.bfloat16())), "emb must have the dtype"),
        (dict(weights=weights._replace(mix=weights.mix[:, :4])), "mix must have shape"),
        (dict(weights=weights._replace(w_down=weights.w_down.T)), "w_down must have shape"),
        (dict(weights=tuple(weights)), "RefinerWeights"),
    ]
    for change, message in cases:
        with pytest.raises((RuntimeError, TypeError), match=message):
            step(**change)
    with pytest.raises(RuntimeError, match="max_iters"):
        xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=-1)
    with pytest.raises(RuntimeError, match="prefix_tokens must have shape"):
        xkernels.sequential_refine(ctx, prev, base, weights)
    with pytest.raises(RuntimeError, match="temperature"):
        xkernels.sequential_refine(ctx, prefix, base, weights, temperature=-0.5)


@pytest.mark.needs_cuda
@pytest.mark.parametrize("logits_dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cpu_and_cuda_agree(logits_dtype, weight_dtype, temperature):
    n, b, d, v, r, h = 8, 16, 15, 4099, 256, 512
    ctx, prev, base, weights = make_case(n, b, d, v, r, h, logits_dtype, weight_dtype, seed=2)
    prefix = prev[:, :2]
    # One pass: tokens agree except where the top-2 gap is within rounding (bf16 weights: both read
    # with a bf16 GEMM, the CPU's rounds its products to bf16 too).
    step = xkernels.refine_step(*to("cuda", ctx, prev, base), weights.to("cuda"), temperature=temperature, seed=1)
    _, scores = reference.perturbed_scores(reference.refine_logits(ctx, prev, base, weights), temperature, 1, 0)
    assert_same_tokens(step[0], xkernels.refine_step(ctx, prev, base, weights, temperature=temperature, seed=1)[0],
                       scores, max(TOL[logits_dtype], TOL[weight_dtype]))
    # Jacobi on CUDA: a sequence that converged holds a fixed point of the CPU's pass, to rounding.
    gpu = xkernels.jacobi_refine(*to("cuda", ctx, prefix, base), weights.to("cuda"), max_iters=4,
                                 temperature=temperature, seed=1, offset=3)
    tokens, iters = gpu[0].cpu(), gpu[2].cpu()
    done = iters < 4
    prev_final = torch.cat([prefix, tokens[:, :-1]], 1)
    again = xkernels.refine_step(ctx, prev_final, base, weights, temperature=temperature, seed=1, offset=3)[0]
    _, scores = reference.perturbed_scores(reference.refine_logits(ctx, prev_final, base, weights), temperature, 1, 3)
    assert_same_tokens(tokens[done], again[done], scores[done], max(TOL[logits_dtype], TOL[weight_dtype]))


@pytest.mark.needs_cuda
@pytest.mark.parametrize("read", ["gemm", "fused"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_both_cuda_reads_match_the_reference(monkeypatch, read, temperature):
    """XKERNELS_REFINE_READ forces the cuBLAS read or the fused one (bfloat16 weights): 15, 64 and
    150 rows (three row groups of the fused read), V not a multiple of its 64-id tiles; Jacobi too."""
    monkeypatch.setenv("XKERNELS_REFINE_READ", read)
    for n, b, d, v, r, h in [(1, 16, 15, 4099, 256, 512), (4, 17, 16, 1000, 64, 32), (10, 16, 15, 700, 24, 16)]:
        ctx, prev, base, weights = make_case(n, b, d, v, r, h, torch.bfloat16, torch.bfloat16, seed=v)
        tokens, logprobs = xkernels.refine_step(*to("cuda", ctx, prev, base), weights.to("cuda"),
                                                temperature=temperature, seed=5, offset=2)
        want_tokens, want_logprobs = reference.refine_step(ctx, prev, base, weights, temperature, 5, 2)
        _, scores = reference.perturbed_scores(reference.refine_logits(ctx, prev, base, weights), temperature, 5, 2)
        assert_same_tokens(tokens, want_tokens, scores, TOL[torch.bfloat16])
        bound = bf16_read_bound(ctx, prev, base, weights, temperature, rounds_products=False)
        assert_logprobs_close(logprobs, want_logprobs, tokens.cpu() == want_tokens, torch.bfloat16, bound)
        # Jacobi run to the end holds a fixed point of the reference's pass, to rounding.
        prefix = prev[:, : b - d + 1]
        jac = xkernels.jacobi_refine(*to("cuda", ctx, prefix, base), weights.to("cuda"), max_iters=d + 1,
                                     temperature=temperature, seed=5)[0].cpu()
        prev_final = torch.cat([prefix, jac[:, :-1]], 1)
        _, scores = reference.perturbed_scores(reference.refine_logits(ctx, prev_final, base, weights), temperature, 5, 0)
        assert_same_tokens(jac, reference.refine_step(ctx, prev_final, base, weights, temperature, 5)[0], scores,
                           TOL[torch.bfloat16])
    monkeypatch.setenv("XKERNELS_REFINE_READ", "fast")
    with pytest.raises(RuntimeError, match="XKERNELS_REFINE_READ"):
        xkernels.refine_step(*to("cuda", ctx, prev, base), weights.to("cuda"))


def test_xkernels_refine_read_forces_the_cpu_read(monkeypatch):
    """gemm: the sliced read even on AVX-512F (build_info reports the read a call would take); a
    value that is no read raises at the call, naming the variable."""
    ctx, prev, base, weights = make_case(2, 4, 3, 50, 8, 16)
    for value, fused in (("gemm", False), ("fused", FUSED_CPU_READ), ("auto", FUSED_CPU_READ)):
        monkeypatch.setenv("XKERNELS_REFINE_READ", value)
        assert xkernels.build_info()["cpu_read"] == ("avx512" if fused else "sliced")
    monkeypatch.setenv("XKERNELS_REFINE_READ", "sliced")
    with pytest.raises(RuntimeError, match="XKERNELS_REFINE_READ must be auto, gemm or fused, got 'sliced'"):
        xkernels.refine_step(ctx, prev, base, weights)


@pytest.mark.needs_cuda
def test_jacobi_is_cuda_graph_capturable():
    ctx, prev, base, weights = to("cuda", *make_case(4, 8, 7, 500, 32, 64)[:3]) + [make_case(4, 8, 7, 500, 32, 64)[3].to("cuda")]
    prefix = prev[:, :2].contiguous()
    offset = torch.zeros((), dtype=torch.int64, device="cuda")  # 0-dim: one stream for the batch
    assert_replays_like_eager(lambda: xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=4, temperature=1.0,
                                                             seed=2, offset=offset), offset)


@pytest.mark.needs_cuda
@pytest.mark.parametrize("read", ["fused", "gemm"])
@pytest.mark.parametrize("op", ["refine_step", "jacobi_refine", "sequential_refine"])
def test_bf16_reads_are_cuda_graph_capturable(monkeypatch, read, op):
    """The shipped configuration (bfloat16 weights and logits, r=256, H=512, B=16) with either read
    forced: the fused kernel (its shared-memory opt-in made before the capture) and the cuBLAS GEMM
    slices, captured once and replayed at several offsets, give what eager calls give."""
    monkeypatch.setenv("XKERNELS_REFINE_READ", read)
    ctx, prev, base, weights = make_case(2, 16, 15, 4099, 256, 512, torch.bfloat16, torch.bfloat16, seed=4)
    ctx, prev, base = to("cuda", ctx, prev, base)
    weights = weights.to("cuda")
    prefix = prev[:, :2].contiguous()
    offset = torch.zeros((), dtype=torch.int64, device="cuda")  # 0-dim: one stream for the batch
    rng = dict(temperature=1.0, seed=2, offset=offset)
    step = {"refine_step": lambda: xkernels.refine_step(ctx, prev, base, weights, **rng),
            "jacobi_refine": lambda: xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=4, **rng),
            "sequential_refine": lambda: xkernels.sequential_refine(ctx, prefix, base, weights, **rng)}[op]
    assert_replays_like_eager(step, offset)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.5])
def test_a_row_with_nan_is_a_point_mass_at_its_argmax(device, temperature):
    """The NaN is torch.argmax's pick whatever the noise (the CPU once skipped it at T > 0)."""
    ctx, prev, base, weights = make_case(2, 3, 2, 8, 4, 8, seed=1)
    weights = weights._replace(w_read=torch.zeros_like(weights.w_read))  # refined logits = base
    base[0, 1] = torch.tensor([-torch.inf, torch.nan, -torch.inf, -torch.inf, 1, 2, 3, 4])
    base[1, 0] = torch.tensor([0, 1, torch.inf, 2, torch.inf, 0, 0, 0])
    tokens, logprobs = xkernels.refine_step(*to(device, ctx, prev, base), weights.to(device),
                                            temperature=temperature, seed=3)
    want = reference.refine_step(ctx, prev, base, weights, temperature, 3)
    assert tokens[0, 1] == 1 and tokens[1, 0] == 2
    assert torch.equal(tokens.cpu(), want[0])
    assert logprobs[0, 1].isnan() and logprobs[1, 0].isnan()


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1e-3])
def test_temperature_must_be_finite_and_non_negative(bad):
    ctx, prev, base, weights = make_case(2, 5, 4, 70, 8, 16)
    with pytest.raises(RuntimeError, match="temperature must be finite and >= 0"):
        xkernels.refine_step(ctx, prev, base, weights, temperature=bad)
    with pytest.raises(ValueError, match="temperature must be finite and >= 0"):
        reference.refine_step(ctx, prev, base, weights, bad)


def test_a_temperature_whose_reciprocal_overflows_is_greedy():
    ctx, prev, base, weights = make_case(3, 5, 4, 70, 8, 16, seed=2)
    for tiny in [1e-39, 5e-324]:
        assert torch.equal(xkernels.refine_step(ctx, prev, base, weights, temperature=tiny)[0],
                           xkernels.refine_step(ctx, prev, base, weights)[0])
        assert torch.equal(reference.refine_step(ctx, prev, base, weights, tiny)[0],
                           reference.refine_step(ctx, prev, base, weights)[0])
    # Just above the limit the scaled logits overflow to +-inf: a point mass at the argmax.
    tokens, _ = xkernels.refine_step(ctx, prev, base, weights, temperature=3e-39, seed=1)
    assert torch.equal(tokens, reference.refine_step(ctx, prev, base, weights, 3e-39, 1)[0])
