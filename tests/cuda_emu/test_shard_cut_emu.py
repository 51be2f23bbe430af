"""The CUDA kernels of shard_cut_histogram, shard_cut_pick and shard_cut_candidates, run by the
emulation, against the references and the CPU kernels: every round along a real key, rows over
several blocks and a single id, the three weight modes, the ignored id, ids just below 2^31,
prefixes no key has, shared sums whose 32-bit words carry, picks of rows over several blocks, at
every lane boundary of the warp's scan and of any values, the candidates of rows
with ties, NaNs, -inf and flat rows at counts from 0 to 4096 (a select that ends early, one that
runs every round, fewer ids than the count), empty launches."""
import pytest
import torch

from xkernels import ops, reference
from xkernels.reference.shard_cut import CUT_SHIFTS, cut_rank_keys, cut_weight_values
from tests.test_shard_cut import assert_histograms_match, cut_case, modes, pick_case, scaled, weight_values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("r,vocab_start,v", [(3, 0, 1), (2, 7, 300), (2, 8, 1032), (2, 1024, 5003),
                                             (1, 2**31 - 2 - 2049, 2049)])  # 1032: 16-byte loads
@pytest.mark.parametrize("mode", ["count", "mass", "mass within a cut"])
def test_matches_reference_round_after_round(emu, dtype, r, vocab_start, v, mode):
    logits = cut_case(r, v, dtype, seed=v)
    scale = torch.linspace(0.6, 1.4, r)
    ignore = vocab_start + v // 3 if v > 1 else -1
    a = scaled(logits, scale, vocab_start, ignore)
    kw = modes(a)[mode]
    path = cut_rank_keys(a, torch.arange(vocab_start, vocab_start + v)).sort(1).values[:, min(9, v - 1)]
    for shift in CUT_SHIFTS:
        prefix = path >> (shift + 8) if shift < 56 else torch.zeros_like(path)
        want = reference.shard_cut_histogram(logits, scale, prefix, shift, vocab_start, ignore_id=ignore, **kw)
        got = emu.shard_cut_histogram(logits, scale, prefix, shift, vocab_start, ignore_id=ignore, **kw)
        assert_histograms_match(got, want, mode != "count")
        if mode == "count":  # the CPU kernel's counts, bit for bit
            cpu = ops.shard_cut_histogram(logits, scale, prefix, shift, vocab_start, ignore_id=ignore, **kw)
            assert torch.equal(got, cpu)


def test_rows_take_several_blocks(emu):
    """The grid splits a long row over blocks (each adds its shared histogram into the row's) and
    a short one not; both sum to the reference, read id by id or in 16-byte chunks."""
    assert emu.shard_cut_blocks_per_row(2, 5003) == 3 and emu.shard_cut_blocks_per_row(2, 300) == 1
    assert emu.shard_cut_blocks_per_row(1000, 10**6) == 1  # enough rows fill the chip alone
    for v, dtype in ((5003, torch.float32), (8200, torch.bfloat16)):  # id by id; 16-byte chunks
        logits = cut_case(2, v, dtype, seed=1)
        scale, prefix = torch.ones(2), torch.zeros(2, dtype=torch.int64)
        row_max = logits.float().amax(-1).nan_to_num(nan=0.0)
        got = emu.shard_cut_histogram(logits, scale, prefix, 56, 3, row_max=row_max)
        want = reference.shard_cut_histogram(logits, scale, prefix, 56, 3, row_max=row_max)
        assert_histograms_match(got, want, True)


def test_prefixes_no_key_has_and_empty_launches(emu):
    """Any prefix value (the kernel cannot check it without a host sync) gives empty histograms, and
    rows or shards of nothing launch nothing: the zero-filled output stands."""
    logits = cut_case(3, 77, seed=2)
    scale = torch.ones(3)
    for shift, prefix in [(48, torch.tensor([-1, 2**62, 255])), (0, torch.tensor([2**63 - 1, -(2**63), 12345]))]:
        got = emu.shard_cut_histogram(logits, scale, prefix, shift, 0, row_max=logits.amax(-1))
        want = reference.shard_cut_histogram(logits, scale, prefix, shift, 0, row_max=logits.amax(-1))
        assert torch.equal(got, want) and got[0].sum() == 0
    assert not emu.shard_cut_histogram(torch.zeros(0, 9), torch.ones(0), torch.zeros(0).long(), 56, 0).any()
    assert not emu.shard_cut_histogram(torch.zeros(2, 0), torch.ones(2), torch.zeros(2).long(), 56, 0).any()


@pytest.mark.parametrize("r,parts", [(1, 1), (40, 2), (300, 1), (300, 2)])  # a warp a row: 300 is 38 blocks of 8
def test_pick_matches_reference(emu, r, parts):
    hist, prefix, before, target = pick_case(r, parts, seed=r)
    want = reference.shard_cut_pick(hist, prefix, before, target)
    got = emu.shard_cut_pick(hist, prefix, before, target)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(got[0], ops.shard_cut_pick(hist, prefix, before, target)[0])


def test_histogram_sums_carry_exactly(emu):
    """A block sums each bucket in two 32-bit words (the high one takes the low one's carries): with
    weights near 2^31 (the hi parts, and the lo parts of small masses) the low word wraps every few
    ids, and the totals still equal the exact int64 sums of the ids' own weights
    (shard_cut_candidates weighs each id with the same exp), and the counts v 2^31, bit for bit."""
    v = 4000  # two blocks a row, about 2,000 ids each
    logits = 5.0 - torch.rand(2, v, generator=torch.Generator().manual_seed(5)) * 0.01
    logits[0, 1::2] -= 6.0 + torch.arange(v // 2) / v  # masses below 2^-8: lo parts up to 2^31 too
    logits[1] = 5.0  # a flat row: every mass exactly 1, 2^31 in its hi part
    scale, prefix, row_max = torch.ones(2), torch.zeros(2, dtype=torch.int64), logits.amax(-1)
    hist = emu.shard_cut_histogram(logits, scale, prefix, 56, 0, row_max=row_max)
    _, weights = emu.shard_cut_candidates(logits, scale, v, 0, row_max=row_max)
    assert torch.equal(hist.sum(2), weights.sum(1))
    assert (weights[:, :, 1] != 0).any() and torch.equal(hist[1, 0].sum(), torch.tensor(v * 2**31))
    counts = emu.shard_cut_histogram(logits, scale, prefix, 56, 0)
    assert torch.equal(counts.sum(2), torch.tensor([[v * 2**31, 0]] * 2))


@pytest.mark.parametrize("parts", [1, 2])
def test_pick_at_every_lane_boundary(emu, parts):
    """A lane scans 8 buckets: targets reached at bucket 0, at a lane's first and last bucket, at
    the last bucket and never (255), each with the weight before it from the lanes below."""
    buckets = torch.tensor([0, 1, 7, 8, 9, 15, 16, 127, 128, 247, 248, 254, 255, 256])
    r = len(buckets)
    hist = torch.zeros(r, parts, 256, dtype=torch.int64)
    hist[:, 0] = 2**31
    if parts == 2:
        hist[:, 1] = 5 + torch.arange(256)
    before = torch.tensor([[3 * 2**31, 7]] * r)
    prefix = torch.arange(r, dtype=torch.int64)
    cum = before[:, :parts, None] + hist.cumsum(2)  # through each bucket
    target = cut_weight_values(cum)[torch.arange(r), buckets.clamp(max=255)]
    target[-1] = float("inf")
    want = reference.shard_cut_pick(hist, prefix, before, target)
    got = emu.shard_cut_pick(hist, prefix, before, target)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(got[0] % 256, buckets.clamp(max=255))


def test_pick_of_any_values_and_no_rows(emu):
    """Wrapping sums and NaN or infinite targets: the reference's buckets, nothing UBSan flags."""
    g = torch.Generator().manual_seed(4)
    hist = torch.randint(-(2**62), 2**62, (6, 2, 256), generator=g)
    prefix = torch.randint(-(2**62), 2**62, (6,), generator=g)
    before = torch.randint(-(2**62), 2**62, (6, 2), generator=g)
    target = torch.tensor([0.0, -1e30, 1e30, float("nan"), float("inf"), 2.0**62], dtype=torch.float64)
    want = reference.shard_cut_pick(hist, prefix, before, target)
    got = emu.shard_cut_pick(hist, prefix, before, target)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    empty = emu.shard_cut_pick(hist[:0], prefix[:0], before[:0], target[:0])
    assert empty[0].shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab_start,v,count", [(0, 1, 1), (7, 300, 0), (7, 300, 5), (8, 1032, 1032), (3, 1031, 2000),
                                                 (1024, 5003, 64), (0, 9000, 4096), (2**31 - 2 - 2049, 2049, 33)])
def test_candidates_match_reference(emu, dtype, vocab_start, v, count):
    """Keys bit for bit as the reference and the CPU kernel (1032 ids: 16-byte loads; 9000: a sort
    of 4096 keys); masses within an ulp of torch's exp (the CPU kernel's exp is another)."""
    logits = cut_case(4, v, dtype, seed=v + count)
    if v >= 2000:
        logits[2, :1500] = 0.25  # a flat run: the count-th key among 1500 ties, every round
    scale = torch.linspace(0.6, 1.4, 4)
    ignore = vocab_start + v // 3 if v > 1 else -1
    row_max = scaled(logits, scale, vocab_start, ignore).amax(-1).nan_to_num(nan=0.0)
    want = reference.shard_cut_candidates(logits, scale, count, vocab_start, ignore_id=ignore, row_max=row_max)
    got = emu.shard_cut_candidates(logits, scale, count, vocab_start, ignore_id=ignore, row_max=row_max)
    cpu = ops.shard_cut_candidates(logits, scale, count, vocab_start, ignore_id=ignore, row_max=row_max)
    assert torch.equal(got[0], want[0]) and torch.equal(got[0], cpu[0])
    torch.testing.assert_close(weight_values(got[1].transpose(1, 2)), weight_values(want[1].transpose(1, 2)),
                               rtol=1e-6, atol=2.0**40)
    keys, weights = emu.shard_cut_candidates(logits, scale, count, vocab_start, ignore_id=ignore)
    assert torch.equal(keys, want[0]) and weights.shape == (4, 0, 2)


def test_candidate_masses_are_the_histograms(emu):
    """Each candidate's mass is bitwise what shard_cut_histogram's kernel gives its id (the last
    round isolates one key): the two paths of filter_cuts weigh an id alike on a GPU too."""
    logits = cut_case(3, 2000, torch.bfloat16, seed=4)
    scale = torch.tensor([1.0, 0.7, 1.9])
    row_max = scaled(logits, scale, 11, -1).amax(-1).nan_to_num(nan=0.0)
    keys, weights = emu.shard_cut_candidates(logits, scale, 6, 11, row_max=row_max)
    for j in range(6):
        hist = emu.shard_cut_histogram(logits, scale, keys[:, j] >> 8, 0, 11, row_max=row_max)
        at = hist.gather(2, (keys[:, j] & 255)[:, None, None].expand(-1, 2, 1))[..., 0]
        assert torch.equal(at, weights[:, j]), j


def test_candidates_of_empty_launches(emu):
    for r, v, count in [(0, 8, 4), (3, 0, 4), (3, 8, 0)]:
        keys, weights = emu.shard_cut_candidates(torch.zeros(r, v), torch.ones(r), count, 4, row_max=torch.zeros(r))
        want = reference.shard_cut_candidates(torch.zeros(r, v), torch.ones(r), count, 4)[0]
        assert keys.shape == (r, count) and not weights.any()
        if count:  # the launch writes every key, fillers included (the buffer starts at 0xA5 bytes)
            assert torch.equal(keys, want)


def edge_rows(v, dtype, seed):
    """Rows for the candidates' edge cases, each a [rows, v] tensor of dtype: ties at the count-th
    key (values rounded to a few), a flat row, one that rises with the id (every id beats the last:
    a warp's buffer fills and is sorted again and again), one that falls, rows of -inf and NaN with
    a few finite ids, +0 and -0 mixed, +inf, and a spike of 200 ties above a random row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(v, dtype=torch.float32)
    rows = [(torch.randn(v, generator=g) * 2).round(), torch.full((v,), 0.5), ids * 0.01, ids * -0.01,
            torch.full((v,), float("-inf")), torch.full((v,), float("nan")), torch.randn(v, generator=g),
            torch.where(ids % 2 == 0, 0.0, -0.0), torch.randn(v, generator=g) * 0.1]
    rows[4][::97] = 1.0
    rows[5][v // 2] = 3.0
    rows[6][::7], rows[6][1::5], rows[6][-1] = float("nan"), float("-inf"), float("inf")
    rows[8][::max(1, v // 200)] = 4.0
    return torch.stack(rows).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("v", [1, 9, 300, 1032, 4099])
@pytest.mark.parametrize("aligned", [True, False])
def test_candidates_one_pass_against_the_radix_select(emu, dtype, v, aligned):
    """Counts up to 128 take one pass a row (warps keep the keys below a rising threshold), larger
    ones the radix select: a count's keys and masses are bitwise the first of a larger count's, so
    both paths agree on every edge row (ties at the threshold, flat, rising, NaN, -inf, +-0), read
    in 16-byte chunks or id by id (a row that does not start 16-byte aligned), and the one pass
    reads each row once, the radix select more often."""
    logits = edge_rows(v, dtype, seed=v)
    r = logits.shape[0]
    if not aligned:  # the same values one element into a buffer: the rows no longer 16-byte aligned
        logits = torch.cat([logits.new_zeros(1), logits.reshape(-1)])[1:].view(r, v)
    scale = torch.linspace(0.7, 1.3, r)
    vocab_start = 2**31 - 2 - v  # ids up to 2^31 - 3
    ignore = vocab_start + v // 2
    row_max = scaled(logits, scale, vocab_start, ignore).nan_to_num(nan=0.0).amax(-1).clamp(min=0.0)
    emu.take_row_passes()
    radix = emu.shard_cut_candidates(logits, scale, 129, vocab_start, ignore_id=ignore, row_max=row_max)
    assert emu.take_row_passes() >= 2 * r  # a round and the gather at least
    want = reference.shard_cut_candidates(logits, scale, 129, vocab_start, ignore_id=ignore)[0]
    assert torch.equal(radix[0], want)
    for count in (1, 2, 33, 50, 127, 128):
        keys, weights = emu.shard_cut_candidates(logits, scale, count, vocab_start, ignore_id=ignore, row_max=row_max)
        assert emu.take_row_passes() == r, count
        assert torch.equal(keys, radix[0][:, :count]) and torch.equal(weights, radix[1][:, :count]), count
        assert torch.equal(keys, ops.shard_cut_candidates(logits, scale, count, vocab_start, ignore_id=ignore)[0])


def test_candidates_one_pass_of_empty_shards(emu):
    """A shard of no ids, or of ids all NaN or -inf: every key the keep-all filler, masses 0."""
    for logits in (torch.zeros(2, 0), torch.full((2, 40), float("nan")), torch.full((2, 40), float("-inf"))):
        keys, weights = emu.shard_cut_candidates(logits, torch.ones(2), 50, 9, row_max=torch.zeros(2))
        assert torch.equal(keys, reference.shard_cut_candidates(logits, torch.ones(2), 50, 9)[0])
        assert not weights.any()
