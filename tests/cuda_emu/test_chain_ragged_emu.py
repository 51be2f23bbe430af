"""chain_verify_ragged_'s CUDA kernel, run by the emulation, against the reference."""
import pytest
import torch

from xkernels.reference import chain as ref_chain


def _case(counts, vocab, seed, dtype=torch.float32, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor(counts, dtype=torch.int64).cumsum(0)
    t, n = int(cu[-1]) if counts else 0, len(counts)
    logits = (torch.randn(t + n, vocab, generator=g) * scale).to(dtype)
    drafts = torch.randint(0, vocab, (t,), generator=g)
    # a few drafts equal to their row's argmax, so greedy rows accept some
    rows = torch.arange(t) + torch.repeat_interleave(torch.arange(n), torch.tensor(counts, dtype=torch.int64))
    drafts[::2] = logits.float()[rows].argmax(-1)[::2]
    q = torch.softmax(torch.randn(t, vocab, generator=g), -1)
    return drafts, cu, logits, q


def _params(n, seed):
    g = torch.Generator().manual_seed(seed)
    return dict(temperature=torch.tensor([0.0, 0.7, 1.0, 1.3, 1.0, 0.9])[torch.arange(n) % 6],
                top_k=torch.tensor([0, 3, 0, 7, 1, 0])[torch.arange(n) % 6],
                top_p=torch.tensor([1.0, 0.8, 0.5, 1.0, 1.0, 0.9])[torch.arange(n) % 6],
                min_p=torch.tensor([0.0, 0.0, 0.1, 0.05, 0.0, 0.2])[torch.arange(n) % 6],
                seed=torch.randint(0, 2**40, (n,), generator=g), offset=torch.randint(0, 1000, (n,), generator=g))


def _check(got, want):
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], atol=2e-5, rtol=1e-5, equal_nan=True)


# (counts, V): zero-draft requests, a tail past the block's 256 threads, one id, odd sizes, rows
# over several rounds of batched loads (9001: most rows start unaligned, a tail of one id).
SHAPES = [([2, 0, 3, 1], 37), ([1, 2], 300), ([0, 0], 5), ([3], 1), ([4, 1, 0, 2, 3, 1], 19), ([2, 1], 9001)]


@pytest.mark.parametrize("counts,vocab", SHAPES)
@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("with_q", [False, True])
def test_matches_reference(emu, counts, vocab, method, with_q):
    drafts, cu, logits, q = _case(counts, vocab, sum(counts) + vocab)
    q = q if with_q else None
    params = _params(len(counts), vocab)
    got = emu.chain_verify_ragged(drafts, cu, logits, 4, q, method=method, **params)
    want = ref_chain.chain_verify_ragged(drafts, cu, logits, 4, q, method=method, **params)
    _check(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_logits_and_scalar_streams(emu, dtype):
    drafts, cu, logits, q = _case([2, 3, 1], 40, 3, dtype)
    for seed, offset in [(7, 2), (torch.tensor([11]), torch.tensor(4)), (2**63 + 5, torch.tensor([1, 2, 3]))]:
        got = emu.chain_verify_ragged(drafts, cu, logits, 3, q, temperature=0.8, top_k=5, top_p=0.9, seed=seed,
                                      offset=offset)
        want = ref_chain.chain_verify_ragged(drafts, cu, logits, 3, q, temperature=0.8, top_k=5, top_p=0.9, seed=seed,
                                             offset=offset)
        _check(got, want)


def test_largest_logits_in_the_last_ids(emu):
    """V = 9001 float32 rows: the first starts 16-byte aligned and ends in a partial chunk (its last
    id read alone), the others start unaligned (every id read one by one); the largest logits are
    the last ids, which every cut and sum must count."""
    drafts, cu, logits, q = _case([3, 2, 1, 2], 9001, 21)
    logits[:, -3:] = torch.tensor([6.0, 7.0, 8.0])
    params = _params(4, 21)
    for method in ("token", "block"):
        got = emu.chain_verify_ragged(drafts, cu, logits, 3, q, method=method, **params)
        want = ref_chain.chain_verify_ragged(drafts, cu, logits, 3, q, method=method, **params)
        _check(got, want)


def test_ties_at_the_cut(emu):
    """Equal logits at a top-k and a top-p cut: the lower ids are kept (the ordered tie pass)."""
    row = torch.tensor([0.0, 2.0, 1.0, 2.0, 2.0, 1.0, 2.0, 1.0, -1.0, 1.0, 0.5, 1.0] * 30)  # V = 360
    logits = row.repeat(4, 1)
    cu = torch.tensor([0, 0, 0, 0])
    drafts = torch.empty(0, dtype=torch.int64)
    for case in (dict(top_k=3), dict(top_k=130), dict(top_p=0.3), dict(top_k=200, top_p=0.6), dict(min_p=0.5)):
        for s in range(3):
            seeds = torch.arange(4) + 10 * s
            got = emu.chain_verify_ragged(drafts, cu, logits, 0, temperature=1.0, seed=seeds,
                                          offset=torch.zeros(4, dtype=torch.int64), **case)
            want = ref_chain.chain_verify_ragged(drafts, cu, logits, 0, temperature=1.0, seed=seeds,
                                                 offset=torch.zeros(4, dtype=torch.int64), **case)
            _check(got, want)


def test_values_the_host_did_not_check_stay_memory_safe(emu):
    """Without XKERNELS_CHECK the binding reads no values: cu that decreases or runs past T, drafts
    outside [0, V), requests longer than max_spec_len, invalid per-row parameters."""
    vocab = 20
    logits = torch.randn(9, vocab)
    drafts = torch.tensor([3, -1, 2**40, 25, 4, 5])
    for cu in (torch.tensor([2, 1, 6]), torch.tensor([-4, 9, 100]), torch.tensor([6, 6, 6])):
        out, emitted, lp = emu.chain_verify_ragged(
            drafts, cu, logits, 2, temperature=torch.tensor([1.0, float("nan"), -1.0]), top_k=torch.tensor([-3, 2, 0]),
            top_p=torch.tensor([0.0, 2.0, float("nan")]), min_p=torch.tensor([-1.0, 3.0, 0.5]), seed=1, offset=2)
        assert ((out >= -1) & (out < vocab)).all() and ((emitted >= 1) & (emitted <= 3)).all()


def test_empty_batch(emu):
    out, emitted, lp = emu.chain_verify_ragged(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64),
                                               torch.empty(0, 8), 2, temperature=1.0)
    assert out.shape == (0, 3) and emitted.shape == (0,)


# Passes over a row of 20011 ids (3 slices in bfloat16, 5 in float32) for requests of no drafts (one
# row each, and its sample): greedy reads it once; unfiltered, its statistics (its slices') and the
# sample; a
# filtered row its slices once (candidates.cuh) where the candidates settle its cut (1: the sample
# draws from its kept ids), else also the radix path's statistics, gather and sample (4: top-k
# beyond the candidates, top-p alone whose nucleus holds ~900 of these flat ids). Min-p alone
# settles where its floor lies above every key the slices dropped.
# Logits * 3.
PASS_CASES = [(dict(temperature=0.0, top_k=50), 1), (dict(temperature=1.0), 2), (dict(temperature=1.0, top_k=50), 1),
              (dict(temperature=1.0, top_p=0.9), 4), (dict(temperature=0.2, top_p=0.9), 1),
              (dict(temperature=0.5, top_k=50, top_p=0.9), 1), (dict(temperature=1.0, top_k=1000, top_p=0.9), 4),
              (dict(temperature=1.0, min_p=0.1), 1),  # its floor above every dropped key: settled
              # min-p moves these cuts (15-30 ids pass it), above the candidates' least key
              (dict(temperature=1.0, top_k=50, min_p=0.1), 1), (dict(temperature=1.0, top_p=0.9, min_p=0.1), 1),
              (dict(temperature=1.0, top_k=50, top_p=0.9, min_p=0.1), 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pass_counts(emu, dtype):
    g = torch.Generator().manual_seed(8)
    logits = (torch.randn(1, 20011, generator=g) * 3).to(dtype)
    none = torch.empty(0, dtype=torch.int64)
    for params, want in PASS_CASES:
        emu.take_row_passes()
        got = emu.chain_verify_ragged(none, torch.tensor([0]), logits, 0, seed=3, **params)
        assert emu.take_row_passes() == want, params
        _check(got, ref_chain.chain_verify_ragged(none, torch.tensor([0]), logits, 0, seed=3, **params))


def _rows_case(emu, logits, params, seed=5):
    """Each row of `logits` a request of no drafts under `params`: the emulation against the
    reference; returns the passes over rows it made."""
    rows = logits.shape[0]
    none = torch.empty(0, dtype=torch.int64)
    cu = torch.zeros(rows, dtype=torch.int64)
    seeds = torch.arange(rows) + seed
    offsets = torch.zeros(rows, dtype=torch.int64)
    emu.take_row_passes()
    got = emu.chain_verify_ragged(none, cu, logits, 0, seed=seeds, offset=offsets, **params)
    passes = emu.take_row_passes()
    _check(got, ref_chain.chain_verify_ragged(none, cu, logits, 0, seed=seeds, offset=offsets, **params))
    return passes


# Rows the candidates cannot settle take the radix path (4 passes a row), with the same results:
# a flat row (every key tied with the dropped ones), ties at the cut, a top-k past the candidates,
# min-p alone with its floor below a dropped key; rows they settle take 1 (the bonus draw from the
# kept ids; a point mass's too).
FALLBACK_CASES = [
    ("flat", lambda g: torch.zeros(2, 5000), dict(top_k=10), 14),  # the radix path splits the ties: 6 a row
    ("flat top-p", lambda g: torch.zeros(2, 5000), dict(top_p=0.5), 16),
    ("ties at the cut", lambda g: torch.randint(0, 3, (2, 5000), generator=g).float(), dict(top_k=100), 8),
    ("huge top-k", lambda g: torch.randn(2, 9000, generator=g) * 3, dict(top_k=2500), 8),
    ("top-k within the head", lambda g: torch.randn(2, 9000, generator=g) * 3, dict(top_k=40, top_p=0.7), 2),
    ("min-p alone", lambda g: torch.randn(2, 9000, generator=g) * 3, dict(min_p=0.2), 2),
    ("min-p alone, floor in the tail", lambda g: torch.randn(2, 9000, generator=g) * 3, dict(min_p=0.0001), 8),
    ("top-p alone, peaked", lambda g: torch.randn(2, 9000, generator=g) * 9, dict(top_p=0.95), 2),
    ("top-p and min-p", lambda g: torch.randn(2, 9000, generator=g) * 3, dict(top_p=0.95, min_p=0.05), 2),
    ("V = 1", lambda g: torch.randn(3, 1, generator=g), dict(top_p=0.5), 3),
    ("NaN and inf rows", lambda g: torch.tensor([[0.0, float("nan"), 1.0] * 700, [float("inf"), 0.0, 1.0] * 700]),
     dict(top_k=5, top_p=0.9), 2),
    ("-inf ids", lambda g: torch.where(torch.arange(3000) % 3 == 0, torch.randn(2, 3000, generator=g),
                                       torch.tensor(float("-inf"))), dict(top_k=900), 8),
]


@pytest.mark.parametrize("name,make,params,passes", FALLBACK_CASES, ids=[c[0] for c in FALLBACK_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_candidates_settle_or_fall_back(emu, name, make, params, passes, dtype):
    logits = make(torch.Generator().manual_seed(4)).to(dtype)
    assert _rows_case(emu, logits, dict(temperature=1.0, **params)) == passes


@pytest.mark.parametrize("vocab", [700, 8192 * 5 + 3, 4096 * 40 + 16])
def test_rows_of_one_and_many_slices(emu, vocab):
    """One slice; several (the last partial, a tail of 3 ids); more than 32 slices' worth of
    chunks in float32 (each slice then takes more than one round of loads). A mix of every filter
    kind, with drafts (token-wise and block), where the candidates settle nearly every row."""
    g = torch.Generator().manual_seed(vocab)
    counts = [2, 1, 3]
    cu = torch.tensor(counts).cumsum(0)
    logits = torch.randn(sum(counts) + len(counts), vocab, generator=g) * 6
    drafts = torch.randint(0, vocab, (sum(counts),), generator=g)
    params = dict(temperature=torch.tensor([1.0, 0.7, 1.3]), top_k=torch.tensor([20, 0, 5]),
                  top_p=torch.tensor([0.9, 0.8, 1.0]), min_p=torch.tensor([0.0, 0.0, 0.3]),
                  seed=torch.tensor([1, 2, 3]), offset=torch.tensor([0, 5, 9]))
    for method in ("token", "block"):
        got = emu.chain_verify_ragged(drafts, cu, logits, 3, method=method, **params)
        _check(got, ref_chain.chain_verify_ragged(drafts, cu, logits, 3, method=method, **params))


@pytest.mark.parametrize("vocab", [700, 8192 * 5 + 3, 4096 * 40 + 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unfiltered_rows_of_one_and_many_slices(emu, vocab, dtype):
    """Greedy and plain sampled requests (no filter): each row's statistics are its slices' (launch
    0c), merged in slice order by select; the rows kernel reads none of them. With drafts and q,
    token-wise and block, a row with a NaN and one with +inf (point masses) among them; the sampled
    rows are read twice (the slices' statistics, the sample), greedy ones once."""
    g = torch.Generator().manual_seed(vocab)
    counts = [2, 1, 3, 0]
    cu = torch.tensor(counts).cumsum(0)
    logits = (torch.randn(sum(counts) + len(counts), vocab, generator=g) * 4).to(dtype)
    logits[1, vocab // 2] = float("nan")
    logits[4, vocab - 1] = float("inf")
    drafts = torch.randint(0, vocab, (sum(counts),), generator=g)
    q = torch.softmax(torch.randn(sum(counts), vocab, generator=g), -1)
    params = dict(temperature=torch.tensor([1.0, 0.0, 0.7, 1.3]), seed=torch.tensor([1, 2, 3, 4]),
                  offset=torch.tensor([0, 5, 9, 2]))
    for method in ("token", "block"):
        got = emu.chain_verify_ragged(drafts, cu, logits, 3, q, method=method, **params)
        _check(got, ref_chain.chain_verify_ragged(drafts, cu, logits, 3, q, method=method, **params))
    none = torch.empty(0, dtype=torch.int64)
    rows = logits[:4].float().nan_to_num(0.0, 1.0, -1.0).to(dtype)
    emu.take_row_passes()
    got = emu.chain_verify_ragged(none, torch.zeros(4, dtype=torch.int64), rows, 0, **params)
    assert emu.take_row_passes() == 2 + 1 + 2 + 2
    _check(got, ref_chain.chain_verify_ragged(none, torch.zeros(4, dtype=torch.int64), rows, 0, **params))


def test_block_verification_where_the_residuals_decide(emu):
    """Drafts drawn from a q near the target's p', so that the prefix weights stay away from 0 and
    1 and each row's Z_i (the residual launch's sum, over the row and its q) moves the accepted
    length: many requests of 5 drafts with every sampled parameter kind, against the reference
    (the residuals halved change a few requests' lengths)."""
    g = torch.Generator().manual_seed(31)
    n, k, vocab = 256, 5, 40
    counts = [k] * n
    cu = torch.tensor(counts).cumsum(0)
    logits = torch.randn(n * (k + 1), vocab, generator=g) * 2
    params = _params(n, 3)
    temperature = params["temperature"].clamp(min=0.5)  # sampled requests: block verification's walk
    rows = torch.cat([torch.arange(r * (k + 1), r * (k + 1) + k) for r in range(n)])
    t = torch.repeat_interleave(temperature, k)[:, None]
    q = torch.softmax(logits[rows] / t + torch.randn(n * k, vocab, generator=g), -1)
    drafts = torch.multinomial(q, 1, generator=g)[:, 0]
    params["temperature"] = temperature
    got = emu.chain_verify_ragged(drafts, cu, logits, k, q, method="block", **params)
    want = ref_chain.chain_verify_ragged(drafts, cu, logits, k, q, method="block", **params)
    _check(got, want)
    assert 1 < got[1].float().mean() < k  # decisions within the block: the residuals matter


def _peaked_q_case(counts, vocab, seed):
    """_case with drafts drawn from a peaked q (rejections and residual draws common: q decides)."""
    drafts, cu, logits, _ = _case(counts, vocab, seed)
    q = torch.softmax(torch.randn(drafts.shape[0], vocab, generator=torch.Generator().manual_seed(seed)) * 3, -1)
    drafts = torch.multinomial(q, 1).reshape(-1) if drafts.numel() else drafts
    return drafts, cu, logits, q


# Draft probabilities in bfloat16 / float16, read in their dtype by the walk (q(x), the residual
# draw's loads) and the residual kernel (block verification): the outputs of the same values in
# float32, bit for bit, and the reference's.
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("counts,vocab", [([2, 0, 3, 1], 301), ([4, 4], 64), ([1], 1)])
def test_16_bit_draft_probs(emu, q_dtype, method, counts, vocab):
    torch.manual_seed(vocab)
    drafts, cu, logits, q = _peaked_q_case(counts, vocab, 5)
    q16 = q.to(q_dtype)
    params = _params(len(counts), 7)
    got = emu.chain_verify_ragged(drafts, cu, logits, 4, q16, method=method, **params)
    want = emu.chain_verify_ragged(drafts, cu, logits, 4, q16.float(), method=method, **params)
    assert all(torch.equal(g.nan_to_num(9.0), w.nan_to_num(9.0)) for g, w in zip(got, want))
    _check(got, ref_chain.chain_verify_ragged(drafts, cu, logits, 4, q16, method=method, **params))


# Without a logprobs buffer (null in the launch) the kernels write none, and the tokens and counts
# are those with one.
@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("with_q", [False, True])
@pytest.mark.parametrize("counts,vocab", [([2, 0, 3, 1], 37), ([0, 0], 5), ([3], 1)])
def test_without_logprobs(emu, method, with_q, counts, vocab):
    drafts, cu, logits, q = _case(counts, vocab, 3)
    params = _params(len(counts), 5)
    got = emu.chain_verify_ragged(drafts, cu, logits, 4, q if with_q else None, method=method, logprobs=False,
                                  **params)
    want = emu.chain_verify_ragged(drafts, cu, logits, 4, q if with_q else None, method=method, **params)
    assert got[2] is None and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _ref_flagged(drafts, cu, logits, max_spec_len, q, method, params, errors):
    """The reference's outputs and error words (it ORs into `errors` as the kernel does)."""
    return ref_chain.chain_verify_ragged(drafts, cu, logits, max_spec_len, q, method=method, errors=errors, **params)


@pytest.mark.parametrize("method", ["token", "block"])
def test_error_flag(emu, method):
    """Each invalid per-row value ORs its bit (xkernels.errors.SamplingError) into its request's word,
    on top of what the word held; valid values set none; the tokens are the reference's (the values
    read as off)."""
    from tests.test_error_flags import INVALID
    counts = [2, 0, 3, 1, 2, 1]
    drafts, cu, logits, q = _case(counts, 300, 8)
    n = len(counts)
    for name, value, bit in INVALID:
        params = _params(n, 5)
        row = params[name].clone().to(torch.int64 if name == "top_k" else params[name].dtype)
        row[2] = value  # request 2 only
        params[name] = row
        held = torch.tensor([0, 0, 32, 0, 1, 0], dtype=torch.int32)  # 32: no bit of ours; 1 on a valid request
        errors, ref_errors = held.clone(), held.clone()
        got = emu.chain_verify_ragged(drafts, cu, logits, 4, q, method=method, errors=errors, **params)
        want = _ref_flagged(drafts, cu, logits, 4, q, method, params, ref_errors)
        assert errors.tolist() == ref_errors.tolist() == [0, 0, 32 | int(bit), 0, 1, 0], (name, value)
        _check(got, want)
    errors = torch.zeros(n, dtype=torch.int32)
    emu.chain_verify_ragged(drafts, cu, logits, 4, q, method=method, errors=errors, **_params(n, 5))
    assert errors.tolist() == [0] * n


def test_error_flag_on_unchecked_counts_and_empty_batch(emu):
    """Every request's word is written whatever cu holds (memory-safe counts), and an empty batch
    writes nothing."""
    logits = torch.randn(9, 20)
    drafts = torch.tensor([3, -1, 2**40, 25, 4, 5])
    for cu in (torch.tensor([2, 1, 6]), torch.tensor([-4, 9, 100])):
        errors = torch.zeros(3, dtype=torch.int32)
        emu.chain_verify_ragged(drafts, cu, logits, 2, temperature=torch.tensor([1.0, float("nan"), -1.0]),
                                top_k=torch.tensor([-3, 2, 0]), top_p=torch.tensor([0.0, 0.5, float("nan")]),
                                min_p=torch.tensor([0.0, 3.0, 0.5]), seed=1, offset=2, errors=errors)
        assert errors.tolist() == [2 | 4, 1 | 8, 1 | 4]
    errors = torch.empty(0, dtype=torch.int32)
    emu.chain_verify_ragged(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64), torch.empty(0, 8), 2,
                            temperature=1.0, errors=errors)
