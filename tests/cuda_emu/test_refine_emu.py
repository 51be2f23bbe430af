"""The refine ops' CUDA kernels, run by the emulation, against the references."""
import pytest
import torch

from xkernels import reference
from tests.test_refine import TOL, assert_logprobs_close, assert_same_tokens, bf16_read_bound, make_case

# (N, B, D, V, r, H): vocabulary tails (V not a multiple of 4), one drafted slot, F = 0, rows over
# several front row groups, channels over several mix blocks, units and channels not a multiple of 8.
SHAPES = [(3, 6, 5, 77, 16, 32), (2, 4, 4, 40, 32, 24), (1, 3, 1, 19, 8, 16), (5, 5, 4, 130, 24, 40),
          (9, 5, 4, 150, 48, 40)]
# GEMM slices: one for the whole vocabulary, or one chunk each (slice_bytes below one row's chunk).
SLICE_BYTES = {"one slice": 1 << 20, "a slice per chunk": 0}


# The reads a pass can take: float32 weights always take the GEMM (a forced fused read falls back
# to it); bfloat16 weights either.
READS = [(torch.float32, "auto"), (torch.float32, "fused"), (torch.bfloat16, "gemm"), (torch.bfloat16, "fused")]


def check_refine_step(emu, shape, logits_dtype, weight_dtype, temperature, **kw):
    ctx, prev, base, weights = make_case(*shape, logits_dtype, weight_dtype, seed=sum(shape))
    tokens, logprobs, _ = emu.refine("refine_step", ctx, prev, base, weights, temperature, 5, 2, **kw)
    want_tokens, want_logprobs = reference.refine_step(ctx, prev, base, weights, temperature, 5, 2)
    _, scores = reference.perturbed_scores(reference.refine_logits(ctx, prev, base, weights), temperature, 5, 2)
    assert_same_tokens(tokens, want_tokens, scores, max(TOL[logits_dtype], TOL[weight_dtype]))
    # The emulated GEMM, like cuBLAS's bf16 GEMM with float32 output, and the fused read's
    # tensor cores round only z.
    bound = bf16_read_bound(ctx, prev, base, weights, temperature, rounds_products=False)
    assert_logprobs_close(logprobs, want_logprobs, tokens == want_tokens, weight_dtype, bound)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight_dtype,read", READS)
@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("slices", list(SLICE_BYTES))
def test_refine_step(emu, shape, logits_dtype, weight_dtype, read, temperature, slices):
    if read == "fused" and slices != "one slice":
        pytest.skip("the fused read has no GEMM slices")
    check_refine_step(emu, shape, logits_dtype, weight_dtype, temperature, num_sms=8,
                      slice_bytes=SLICE_BYTES[slices], read=read)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_gemm_read_slices_of_several_chunks(emu, shape, weight_dtype, temperature):
    """Slices of several chunks each, as the binding's budget makes them past N=64 (N=128 at D=15: 2
    slices of 32 chunks), here about half the vocabulary a slice."""
    n, b, d, v, r, h = shape
    slice_bytes = (n * d * 4 + r * (4 if weight_dtype == torch.float32 else 2)) * (v // 2)
    plan, _ = emu.refine_plan(n, b, d, r, h, v, n * d, True, weight_dtype, num_sms=132, slice_bytes=slice_bytes,
                              mode="gemm")
    assert plan.chunks_per_slice > 1 and plan.slices > 1
    check_refine_step(emu, shape, torch.bfloat16, weight_dtype, temperature, num_sms=132, slice_bytes=slice_bytes,
                      read="gemm")


# The GEMM read's epilogue (N, B, D, V, r, H): N = 1 and B = 1; V = 1 (no whole group of 4 ids), 8,
# 77 (a partial last group), 150 and 1002 (every other row of products 16-byte aligned), 1000, and
# 4101 (two chunks of the largest size, at 1 SM).
EPILOGUE_SHAPES = [(1, 1, 1, 1, 8, 8), (1, 1, 1, 8, 8, 8), (1, 1, 1, 77, 16, 8), (9, 5, 4, 150, 16, 8),
                   (2, 3, 3, 1002, 8, 8), (2, 2, 2, 1000, 8, 8), (1, 2, 2, 4101, 8, 8)]


def shifted(x):
    """x's values one element past an aligned address: rows of no 16-byte (or 8-byte) alignment."""
    flat = torch.empty(x.numel() + 1, dtype=x.dtype)
    out = flat[1:].view(x.shape)
    out.copy_(x)
    return out


@pytest.mark.parametrize("shape", EPILOGUE_SHAPES)
@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_vector_loads_of_the_epilogue_equal_scalar_loads(emu, shape, logits_dtype, weight_dtype):
    """read_epilogue reads whole groups of aligned rows by one load each, kEpilogueBytesAhead a thread
    in flight, and unaligned rows id by id, each thread in the same order of groups: with the base
    logits shifted off alignment every group takes the scalar loads, and tokens and log-probabilities
    are bitwise the aligned run's, for one GEMM or a slice a chunk, greedy and filtered (the kept
    logits), and Jacobi's first pass without a read (no products); the aligned run agrees with the
    reference."""
    ctx, prev, base, weights = make_case(*shape, logits_dtype, weight_dtype, seed=sum(shape))
    prefix = prev[:, : shape[1] - shape[2] + 1]
    cases = [(0.0, {}, ["refine_step"]), (0.7, dict(top_k=3, top_p=0.9), ["refine_step", "jacobi_refine"])]
    for temperature, filters, ops in cases:
        for slice_bytes in SLICE_BYTES.values():
            kw = dict(num_sms=1, slice_bytes=slice_bytes, read="gemm", max_iters=1, **filters)
            for op in ops:
                tokens = prev if op == "refine_step" else prefix
                got = emu.refine(op, ctx, tokens, base, weights, temperature, 5, 2, **kw)
                unaligned = emu.refine(op, ctx, tokens, shifted(base), weights, temperature, 5, 2, **kw)
                for a, b in zip(got, unaligned):
                    assert torch.equal(a, b), (op, temperature, filters, slice_bytes)
    check_refine_step(emu, shape, logits_dtype, weight_dtype, 0.7, num_sms=1, slice_bytes=1 << 20, read="gemm")


# The fused read's edge shapes (N, B, D, V, r, H): rows (N * D) 1, 15, 16, 17, 33 (a padded fourth
# row tile), 64, 130 (three row groups); V below one tile of 64 ids, exactly one, not a multiple;
# r = 8 and 24 (depth padded to 16), up to the largest rank, 256.
FUSED_SHAPES = [(1, 3, 1, 19, 8, 16), (1, 16, 15, 150, 32, 16), (2, 9, 8, 64, 16, 16), (1, 18, 17, 130, 24, 16),
                (3, 12, 11, 70, 16, 16), (4, 17, 16, 100, 64, 16), (10, 14, 13, 90, 16, 16), (1, 2, 1, 40, 256, 8)]


@pytest.mark.parametrize("shape", FUSED_SHAPES)
@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("num_sms", [1, 132])  # one block a group striding over the tiles, or one a tile
def test_fused_read_edge_shapes(emu, shape, logits_dtype, temperature, num_sms):
    check_refine_step(emu, shape, logits_dtype, torch.bfloat16, temperature, num_sms=num_sms, read="fused")


@pytest.mark.parametrize("read", ["gemm", "fused"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_seed_and_offset_from_device_memory(emu, read, temperature):
    ctx, prev, base, weights = make_case(2, 5, 4, 70, 16, 16, weight_dtype=torch.bfloat16, seed=12)
    prefix = prev[:, :2]
    for op, tokens in [("refine_step", prev), ("jacobi_refine", prefix), ("sequential_refine", prefix)]:
        want = emu.refine(op, ctx, tokens, base, weights, temperature, 77, 5, max_iters=3, read=read)
        got = emu.refine(op, ctx, tokens, base, weights, temperature, 0, 0, max_iters=3, read=read,
                         seed_tensor=torch.tensor([77]), offset_tensor=torch.tensor([5]))
        for a, b in zip(got, want):
            assert torch.equal(a, b), op


PLAN_SHAPES = [(0, 4, 3, 50, 8, 16), (1, 1, 1, 1, 1, 1), (1, 16, 15, 151936, 256, 512), (32, 16, 15, 151936, 256, 512),
               (3, 64, 64, 2**31 - 2, 1024, 1), (10**6, 2, 1, 5, 4, 4), (1, 2, 1, 63, 8, 1), (8, 16, 15, 151936, 256, 512),
               (1, 65, 64, 65, 24, 4), (5, 17, 16, 200000, 136, 8)]


@pytest.mark.parametrize("num_sms", [1, 4, 132])
@pytest.mark.parametrize("slice_bytes", [0, 1000, 20 << 20])
@pytest.mark.parametrize("mode", ["auto", "gemm", "fused"])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_read_plan_covers_the_vocabulary(emu, num_sms, slice_bytes, mode, weight_dtype):
    """The binding's planning: chunks of whole Philox groups tile [0, V), slices tile the chunks; or
    the fused read's row groups cover the rows and each group's blocks the tiles of 64 ids; for empty,
    tiny and huge shapes alike (an empty batch once divided by zero on the host)."""
    for n, b, d, v, r, h in PLAN_SHAPES:
        for rows in {0, 1, 15, 16, 17, 64, 65, 128, 129, n, n * d}:
            for read in (True, False):
                plan, workspace = emu.refine_plan(n, b, d, r, h, v, rows, read, weight_dtype, num_sms=num_sms,
                                                  slice_bytes=slice_bytes, mode=mode)
                fusable = read and weight_dtype == torch.bfloat16 and r % 8 == 0 and r <= 256
                assert plan.fused == (fusable and (mode == "fused" or (mode == "auto" and rows <= 128)))
                assert (workspace > 0) == (n > 0)  # an empty batch needs none
                if plan.fused:
                    assert plan.m_tiles == (1 if rows <= 16 else 2 if rows <= 32 else 4)
                    assert plan.groups == -(-max(rows, 1) // (16 * plan.m_tiles))
                    assert plan.tiles == -(-v // 64) and 1 <= plan.blocks <= plan.tiles
                    # about two blocks an SM in all; one partial result a (row, block)
                    assert plan.groups * plan.blocks <= max(2 * num_sms + plan.groups, plan.groups)
                    assert plan.groups * plan.blocks < 2**31 and plan.partials == plan.blocks
                    ld = -(-r // 16) * 16 + 8
                    prod_rows = max(16 * plan.m_tiles, 32)
                    assert plan.smem_bytes == (16 * plan.m_tiles + 64) * ld * 2 + (prod_rows * 68 + 16 * plan.m_tiles * 64) * 4
                    assert plan.smem_bytes <= 227 * 1024 // 2  # two blocks an SM
                    continue
                chunk, chunks, per_slice, slice_, slices = plan.chunk, plan.chunks, plan.chunks_per_slice, plan.slice, plan.slices
                assert chunk % 4 == 0 and 4 <= chunk <= 4096 and plan.partials == chunks
                assert chunks == -(-v // chunk) and 1 <= per_slice <= chunks and slice_ == per_slice * chunk
                assert slices == -(-chunks // per_slice) and (slices - 1) * slice_ < v <= slices * slice_
                if not read:
                    assert slices == 1
                elif per_slice > 1:  # a slice's working set, its products and w_read rows, fits the budget
                    w_bytes = 4 if weight_dtype == torch.float32 else 2
                    assert (max(rows, 1) * 4 + r * w_bytes) * min(slice_, v) <= slice_bytes
                    if slices > 1:  # and takes as many ids as fit, to chunk rounding
                        fit = slice_bytes // (max(rows, 1) * 4 + r * w_bytes) // 4 * 4
                        assert fit - slice_ < 4 * per_slice


def test_read_plan_at_the_bindings_budget(emu):
    """The binding's budget of a GEMM slice (kRefineGemmBytes, 1 GiB: its products in HBM) makes the
    shipped shape's read one GEMM and one epilogue launch to N=64 (bf16, r=256, D=15): at N=32, 480
    rows, 38 chunks of 4096 ids (the L2-sized slices of before took 14 GEMMs of 3 chunks of 3772);
    at N=128 the products (1.2 GB) take two slices."""
    budget = 1 << 30
    for n, per_slice in [(1, 38), (8, 38), (32, 38), (64, 38), (128, 32)]:
        plan, _ = emu.refine_plan(n, 16, 15, 256, 512, 151936, 15 * n, True, torch.bfloat16, slice_bytes=budget,
                                  mode="gemm")
        assert (plan.chunk, plan.chunks, plan.chunks_per_slice) == (4096, 38, per_slice), n
        assert plan.slices == (1 if n <= 64 else 2)


@pytest.mark.parametrize("mode", ["auto", "fused"])
def test_fused_read_needs_its_device_and_layout(emu, mode):
    """The fused read takes bfloat16 tensor cores (compute capability 8 or more) and 16-byte loads of
    w_read rows (r a multiple of 8, w_read 16-byte aligned); elsewhere the plan is the GEMM's."""
    args = (1, 16, 15, 256, 512, 151936, 15, True, torch.bfloat16)  # n, b, d, r, h, v, rows, read
    assert emu.refine_plan(*args, mode=mode)[0].fused
    assert not emu.refine_plan(*args, mode=mode, cc_major=7)[0].fused
    assert not emu.refine_plan(*args, mode=mode, w_read_offset=8)[0].fused
    assert emu.refine_plan(*args, mode=mode, w_read_offset=16)[0].fused
    for r in (260, 12):
        assert not emu.refine_plan(1, 16, 15, r, 512, 151936, 15, True, torch.bfloat16, mode=mode)[0].fused


@pytest.mark.parametrize("op", ["refine_step", "jacobi_refine", "sequential_refine"])
def test_an_empty_batch_launches_nothing(emu, op):
    ctx, prev, base, weights = make_case(0, 4, 3, 50, 8, 16)
    tokens = prev if op == "refine_step" else prev[:, :2]
    got = emu.refine(op, ctx, tokens, base, weights, 1.0, 1, max_iters=3)
    assert got[0].shape == (0, 3) and got[1].shape == (0, 3) and got[2].shape == (0,)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("num_sms", [1, 16])
@pytest.mark.parametrize("slice_bytes", [0, 1 << 20])
def test_jacobi_and_sequential(emu, temperature, num_sms, slice_bytes):
    n, b, d, v, r, h = 4, 7, 6, 90, 16, 32
    ctx, prev, base, weights = make_case(n, b, d, v, r, h, seed=3)
    prefix = prev[:, : b - d + 1]
    seq = emu.refine("sequential_refine", ctx, prefix, base, weights, temperature, 9, num_sms=num_sms,
                     slice_bytes=slice_bytes)
    want = reference.sequential_refine(ctx, prefix, base, weights, temperature, 9)
    assert torch.equal(seq[0], want[0])
    torch.testing.assert_close(seq[1], want[1], atol=1e-4, rtol=1e-4)
    for passes in [0, 1, 2, d, d + 3]:
        got = emu.refine("jacobi_refine", ctx, prefix, base, weights, temperature, 9, max_iters=passes,
                         num_sms=num_sms, slice_bytes=slice_bytes)
        ref = reference.jacobi_refine(ctx, prefix, base, weights, passes, temperature, 9)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[2], ref[2])
        torch.testing.assert_close(got[1], ref[1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("read", ["gemm", "fused"])
@pytest.mark.parametrize("num_sms", [1, 16])
def test_bf16_jacobi_reaches_sequential(emu, temperature, read, num_sms):
    """The bfloat16 read (GEMM or fused) inside the device-side Jacobi loop, where converged
    sequences' rows drop out pass by pass: at max_iters >= D it equals the sequential decode of
    the same kernels, and every number of passes matches the reference's tokens."""
    n, b, d, v, r, h = 5, 7, 6, 90, 32, 32
    ctx, prev, base, weights = make_case(n, b, d, v, r, h, torch.bfloat16, torch.bfloat16, seed=6)
    prefix = prev[:, : b - d + 1]
    kw = dict(read=read, num_sms=num_sms)
    seq = emu.refine("sequential_refine", ctx, prefix, base, weights, temperature, 3, **kw)
    for passes in [0, 1, 2, d, d + 4]:
        jac = emu.refine("jacobi_refine", ctx, prefix, base, weights, temperature, 3, max_iters=passes, **kw)
        ref = reference.jacobi_refine(ctx, prefix, base, weights, passes, temperature, 3)
        assert torch.equal(jac[0], ref[0]) and torch.equal(jac[2], ref[2])
        if passes >= d:
            assert torch.equal(jac[0], seq[0]) and (jac[2] <= d + 1).all()
            torch.testing.assert_close(jac[1], seq[1])


@pytest.mark.parametrize("weight_dtype,read", [(torch.float32, "auto"), (torch.bfloat16, "gemm")])
@pytest.mark.parametrize("shape", [(3, 5, 4, 61, 17, 23), (9, 4, 3, 30, 33, 15)])
def test_front_with_odd_units_and_channels(emu, weight_dtype, read, shape):
    """Odd hidden units and channels: a front warp's second output past the end (skipped), blocks of
    16 outputs half used, 9 row groups of which the last is partial (its rows not live)."""
    check_refine_step(emu, shape, torch.float32, weight_dtype, 0.7, num_sms=8, slice_bytes=SLICE_BYTES["one slice"],
                      read=read)


def test_hidden_size_beyond_shared_memory(emu):
    """A hidden size far above what shared memory holds (the front reads hid from global memory)."""
    ctx, prev, base, weights = make_case(1, 3, 2, 40, 16, 12400, seed=8)
    tokens, logprobs, _ = emu.refine("refine_step", ctx, prev, base, weights, 0.0)
    want = reference.refine_step(ctx, prev, base, weights)
    assert torch.equal(tokens, want[0])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_out_of_range_tokens_read_a_zero_row(emu, temperature):
    ctx, prev, base, weights = make_case(2, 4, 3, 30, 8, 16, seed=4)
    prev[0, 1], prev[1, 0] = -5, 30
    tokens, logprobs, _ = emu.refine("refine_step", ctx, prev, base, weights, temperature, 1)
    zero_row = weights._replace(emb=torch.cat([weights.emb, torch.zeros(1, 8)]),
                                w_read=torch.cat([weights.w_read, torch.zeros(1, 8)]))
    clamped = torch.where((prev < 0) | (prev >= 30), 30, prev)
    want = reference.refine_step(ctx, clamped, torch.cat([base, torch.full((2, 3, 1), -torch.inf)], -1), zero_row,
                                 temperature, 1)
    assert torch.equal(tokens, want[0])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("filters", [{}, dict(top_k=3, top_p=0.9), dict(min_p=0.2)])  # the merged result kept
def test_a_row_with_nan_is_a_point_mass_at_its_argmax(emu, temperature, weight_dtype, filters):
    ctx, prev, base, weights = make_case(2, 3, 2, 8, 16, 8, weight_dtype=weight_dtype, seed=1)
    weights = weights._replace(w_read=torch.zeros_like(weights.w_read))
    base[0, 1] = torch.tensor([-torch.inf, torch.nan, -torch.inf, -torch.inf, 1, 2, 3, 4])
    base[1, 0] = torch.tensor([0, 1, torch.inf, 2, torch.inf, 0, 0, 0])
    tokens, logprobs, _ = emu.refine("refine_step", ctx, prev, base, weights, temperature, 3, **filters)
    want = reference.refine_step(ctx, prev, base, weights, temperature, 3, **filters)
    assert torch.equal(tokens, want[0])
    assert logprobs[0, 1].isnan() and logprobs[1, 0].isnan()


@pytest.mark.parametrize("weight_dtype,read", READS)
@pytest.mark.parametrize("slices", list(SLICE_BYTES))
def test_per_sequence_sampling_and_per_request_streams(emu, weight_dtype, read, slices):
    """Greedy, plain sampled and top-k / top-p / min-p sequences in one launch, each with its own
    seed and offset: every op equals the reference (float32 weights; bfloat16 ones round the
    read), and a sequence alone equals it in the batch."""
    from tests.test_refine_sampling import mixed_params, reference_call

    if read == "fused" and slices != "one slice":
        pytest.skip("the fused read has no GEMM slices")
    n = 6
    ctx, prev, base, weights = make_case(n, 5, 4, 130, 16, 24, weight_dtype=weight_dtype, seed=13)
    prefix = prev[:, :2]
    params = mixed_params(n, 6)
    kw = dict(num_sms=8, slice_bytes=SLICE_BYTES[slices], read=read, max_iters=5)
    for op, tokens in [("refine_step", prev), ("jacobi_refine", prefix), ("sequential_refine", prefix)]:
        got_tokens, got_logprobs, _ = emu.refine(op, ctx, tokens, base, weights, **params, **kw)
        if weight_dtype == torch.float32:
            want_tokens, want_logprobs = reference_call(op, ctx, prev, base, weights, **params)
            assert torch.equal(got_tokens, want_tokens), op
            torch.testing.assert_close(got_logprobs, want_logprobs, atol=1e-4, rtol=1e-4)
        for i in (0, 2, 5):  # greedy, top_k, every filter
            alone = emu.refine(op, ctx[i:i + 1], tokens[i:i + 1], base[i:i + 1], weights,
                               **{k: v[i:i + 1] for k, v in params.items()}, **kw)
            assert torch.equal(alone[0][0], got_tokens[i]), (op, i)
            torch.testing.assert_close(alone[1][0], got_logprobs[i], atol=1e-5, rtol=1e-5)


# The reads of the 6 filtered rows below (2 sequences of 3 slots), by filtered_pick alone
# (pick_only) at 8 SMs and at 132, and through the candidate pipeline. filtered_pick's first read
# gathers the ranking's first ids, down to the top_k-th largest partial maximum (or their least,
# 3 partial results a row at 8 SMs, 36 at 132): they hold top-k's cut whenever top_k <= the
# partials (20 and 36 at 132 SMs), and on these rows at 50 and 37 too; top-p alone guesses from the
# maxima's masses (half its rows at 3 partials). Where the gather does not hold the cut, the cut's
# radix passes follow it (a gather that draws: 2 reads), 3 where more than 2,048 ids lie at or
# above top-k's bin. Min-p alone draws in the first read. The pipeline reads a row with top-k or
# top-p once (its one slice of 3,001 ids keeps its best 64) and draws from the candidates where
# they settle the cut, as on every row here but top_k=2500, which filtered_pick then reads as
# alone (6 + 18); min-p alone draws in the one read of its slices (min_p_slices_kernel).
READS_OF_FILTERED_ROWS = [
    (dict(top_k=50), (12, 6), 6),
    (dict(top_k=20), (12, 6), 6),
    (dict(top_k=36), (12, 6), 6),
    (dict(top_k=37), (12, 6), 6),
    (dict(top_p=0.9), (9, 6), 6),
    (dict(top_k=20, top_p=0.8), (12, 6), 6),
    (dict(top_k=2500, top_p=0.9), (18, 18), 24),
    (dict(min_p=0.05), (6, 6), 6),
    (dict(top_k=50, min_p=0.5), (12, 6), 6),  # min-p moves the cut above top-k's: from the ranked ids, or the hook's floor draw
    (dict(top_p=0.9, min_p=0.5), (9, 6), 6),
    (dict(top_k=50, top_p=0.9, min_p=0.5), (12, 6), 6),
]


def filtered_rows_case(case, filters, n=5, d=3, v=3001, **kw):
    ctx, prev, base, weights = make_case(n, 4, d, v, 16, 8, seed=21, **kw)
    base = {"plain": base * 2, "flat": base * 0.2, "ties": (base * 2).round()}[case]
    on = torch.tensor([1, 1, 0, 0, 0], dtype=torch.bool)  # greedy, and unfiltered sampled, rows besides
    params = dict(temperature=torch.tensor([1.0, 0.8, 0.0, 0.7, 1.0]),
                  top_k=torch.where(on, filters.get("top_k", 0), 0).int(),
                  top_p=torch.where(on, filters.get("top_p", 1.0), 1.0),
                  min_p=torch.where(on, filters.get("min_p", 0.0), 0.0),
                  seed=torch.arange(n) * 7919, offset=torch.arange(n) * 3)
    params["top_k"][2] = 5  # a greedy row's filter does nothing
    return (ctx, prev, base, weights), params


@pytest.mark.parametrize("filters,pick_reads,pipeline_reads", READS_OF_FILTERED_ROWS)
@pytest.mark.parametrize("case", ["plain", "flat", "ties"])
def test_reads_of_a_filtered_row(emu, filters, pick_reads, pipeline_reads, case):
    """filtered_pick alone, and the candidate pipeline before it, read each filtered row's kept
    logits as READS_OF_FILTERED_ROWS says (and no other row), and their tokens and log-probabilities
    equal the reference's, on plain rows, flat ones (top-p's cut far below the top: its guess falls
    short, many bins drawn in the gather) and rows of few distinct values (the cut inside a run of
    ties, broken to the lower id)."""
    args, params = filtered_rows_case(case, filters)
    want_tokens, want_logprobs = reference.refine_step(*args, **params)
    for num_sms, pick_only, reads in [(8, True, pick_reads[0]), (132, True, pick_reads[1]),
                                      (8, False, pipeline_reads), (132, False, pipeline_reads)]:
        assert emu.refine_plan(5, 4, 3, 16, 8, 3001, 15, True, num_sms=num_sms)[0].partials == {8: 3, 132: 36}[num_sms]
        emu.take_row_passes()
        tokens, logprobs, _ = emu.refine("refine_step", *args, **params, num_sms=num_sms, pick_only=pick_only)
        counted = emu.take_row_passes()
        assert torch.equal(tokens, want_tokens), (num_sms, pick_only)
        torch.testing.assert_close(logprobs, want_logprobs, atol=1e-4, rtol=1e-4)
        if case == "plain":
            assert counted == reads, (num_sms, pick_only)


@pytest.mark.parametrize("pick_only,reads_8,reads_132", [(True, 9, 6), (False, 6, 6)])
def test_one_read_on_the_fused_read_is_the_radix_passes_result(emu, pick_only, reads_8, reads_132):
    """filtered_pick alone on the fused read's kept logits: its partial results (one a block: 16 at 8
    SMs, 47 at 132) bound top_k=47 at 132 SMs: one read there; at 8 the first read holds the cut on
    3 of the 6 rows, the radix passes follow on the others. The candidate pipeline settles every row
    in one read at both. The logits are the same products either way, so tokens and log-probabilities
    of the filtered rows (their sums fixed point) are bitwise equal, by either path."""
    args, params = filtered_rows_case("plain", dict(top_k=47, top_p=0.8, min_p=0.05), weight_dtype=torch.bfloat16)
    got = {}
    for num_sms, reads in [(8, reads_8), (132, reads_132)]:
        plan = emu.refine_plan(5, 4, 3, 16, 8, 3001, 15, True, torch.bfloat16, num_sms=num_sms, mode="fused")[0]
        assert plan.fused and plan.partials == {8: 16, 132: 47}[num_sms]
        emu.take_row_passes()
        got[num_sms] = emu.refine("refine_step", *args, **params, num_sms=num_sms, read="fused", pick_only=pick_only)[:2]
        assert emu.take_row_passes() == reads
    assert torch.equal(got[8][0], got[132][0]) and torch.equal(got[8][1][:2], got[132][1][:2])
    torch.testing.assert_close(got[8][1], got[132][1])  # the others' float sums merge 16 or 47 partials
    other = emu.refine("refine_step", *args, **params, num_sms=8, read="fused", pick_only=not pick_only)[:2]
    assert torch.equal(other[0], got[8][0]) and torch.equal(other[1][:2], got[8][1][:2])


@pytest.mark.parametrize("filters", [dict(top_k=20), dict(top_p=0.9), dict(top_k=30, top_p=0.9, min_p=0.1),
                                     dict(min_p=0.1)])
@pytest.mark.parametrize("finite", [5, 40, 600])
def test_a_filtered_row_with_few_finite_ids(emu, filters, finite):
    """Rows whose ids past the first `finite` are -inf, so that most partial results' maxima are -inf:
    filtered_pick's first read's bound then gathers every finite id (fewer than top_k at 5: the cut
    keeps them all, as the reference's); the candidate pipeline declines a row with fewer finite ids
    than top_k and settles the others."""
    args, params = filtered_rows_case("plain", filters)
    args[2][:, :, finite:] = float("-inf")
    want_tokens, want_logprobs = reference.refine_step(*args, **params)
    for num_sms, pick_only in [(8, True), (132, True), (8, False), (132, False)]:
        tokens, logprobs, _ = emu.refine("refine_step", *args, **params, num_sms=num_sms, pick_only=pick_only)
        assert torch.equal(tokens, want_tokens), (num_sms, pick_only)
        torch.testing.assert_close(logprobs, want_logprobs, atol=1e-4, rtol=1e-4)


def test_more_partial_results_than_the_buffer(emu):
    """One row of 10,001 ids at 1,024 SMs: 2,501 partial results (chunks of 4 ids), more than the
    2,048 the bound ranks. top_k=300 lies beyond the pipeline's 192 candidates (3 slices), so
    filtered_pick takes the row after the pipeline's read; any 2,048 partials bound top-k alike, so
    its first read still picks the row: 2 reads."""
    ctx, prev, base, weights = make_case(1, 4, 1, 10001, 16, 8, seed=5)
    params = dict(temperature=torch.tensor([1.0]), top_k=torch.tensor([300], dtype=torch.int32),
                  top_p=torch.tensor([0.95]), seed=torch.tensor([3]), offset=torch.tensor([0]))
    plan = emu.refine_plan(1, 4, 1, 16, 8, 10001, 1, True, num_sms=1024)[0]
    assert plan.partials == 2501
    emu.take_row_passes()
    tokens, logprobs, _ = emu.refine("refine_step", ctx, prev, base, weights, **params, num_sms=1024)
    assert emu.take_row_passes() == 2
    want_tokens, want_logprobs = reference.refine_step(ctx, prev, base, weights, **params)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logprobs, want_logprobs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("op", ["refine_step", "jacobi_refine", "sequential_refine"])
@pytest.mark.parametrize("filters", [dict(top_k=400), dict(top_p=0.9), dict(top_k=200, top_p=0.8, min_p=0.01),
                                     dict(top_p=0.9, min_p=0.02), dict(min_p=0.05)])
def test_the_pipeline_settles_rows_of_many_slices(emu, op, filters):
    from tests.test_refine_sampling import reference_call

    """Rows of 40,001 ids (10 slices of the candidate pipeline, 640 candidates): top-k within them,
    top-p alone (the total's bounds from the slices' mass sums) and with min-p, min-p alone (its
    slices' draws merged), in every op's launch
    sequences (Jacobi's converged sequences and final slots, the sequential op's one-slot launches):
    a filtered row is read once, and tokens and log-probabilities equal the reference's."""
    n, d = 3, 2
    ctx, prev, base, weights = make_case(n, 4, d, 40001, 16, 8, seed=9)
    base = base * 3
    on = torch.tensor([1, 0, 1], dtype=torch.bool)  # an unfiltered sampled sequence between
    params = dict(temperature=torch.tensor([1.0, 0.9, 0.7]),
                  top_k=torch.where(on, filters.get("top_k", 0), 0).int(),
                  top_p=torch.where(on, filters.get("top_p", 1.0), 1.0),
                  min_p=torch.where(on, filters.get("min_p", 0.0), 0.0),
                  seed=torch.tensor([11, 12, 13]), offset=torch.tensor([0, 5, 9]))
    tokens = prev if op == "refine_step" else prev[:, :4 - d + 1]  # the loops' prefix (b = 4)
    emu.take_row_passes()
    got_tokens, got_logprobs, _ = emu.refine(op, ctx, tokens, base, weights, **params, num_sms=132, max_iters=d + 1)
    passes = emu.take_row_passes()
    want_tokens, want_logprobs = reference_call(op, ctx, prev, base, weights, **params)
    assert torch.equal(got_tokens, want_tokens)
    torch.testing.assert_close(got_logprobs, want_logprobs, atol=1e-4, rtol=1e-4)
    if op == "refine_step":
        assert passes == 2 * d  # the two filtered sequences' rows, once each


@pytest.mark.parametrize("v", [3001, 3000, 40001])  # rows read id by id, by 16-byte loads; 1 or 10 slices
@pytest.mark.parametrize("case", ["plain", "flat", "ties"])
def test_min_p_alone_from_slices_is_filtered_picks(emu, v, case):
    """Min-p alone through min_p_slices_kernel: the tokens filtered_pick alone (pick_only) draws, and
    log-probabilities within float rounding of its (the kept mass summed slice by slice, not in its
    block's order), at 8 and 132 SMs (3 or 36 partial results give the top)."""
    args, params = filtered_rows_case(case, dict(min_p=0.05), v=v)
    for num_sms in (8, 132):
        new = emu.refine("refine_step", *args, **params, num_sms=num_sms)
        old = emu.refine("refine_step", *args, **params, num_sms=num_sms, pick_only=True)
        assert torch.equal(new[0], old[0]), num_sms
        torch.testing.assert_close(new[1], old[1], atol=1e-6, rtol=1e-6)
