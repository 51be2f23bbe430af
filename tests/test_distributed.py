"""xkernels.distributed on gloo: world sizes 2 and 3 with uneven shards (not multiples of 4),
spawned from pytest; every rank's outputs against the unsharded op on the whole tensors, with int
seeds and with int64 tensor seeds that are never read on the host, and (world 2) the decoding loop
with tp_group against one process. One spawn per world size runs every case (a process group costs
seconds to start on 2 cores)."""

import contextlib
import itertools
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import xkernels
from xkernels import distributed
from xkernels.refiner import RefinerWeights
from tests.utils import assert_replays_like_eager

V = 37
BOUNDS = {2: [(0, 14), (14, V)], 3: [(0, 9), (9, 22), (22, V)]}
ENVELOPE = 1e-5  # log-probabilities
# (seed, offset) pairs; the last sets the high bits, which as tensors are negative int64.
RNG = [(0, 5), (1, 5), (2**64 - 3, 2**63 + 5)]


def _as_tensors(seed, offset, device="cpu"):
    """(seed, offset) as 0-dim int64 tensors of their 64 bits: one stream for the batch, keyed by the row
    (a one-element 1-D tensor would be the per-request form, refused at N > 1)."""
    bits = lambda x: x - 2**64 if x >= 2**63 else x  # noqa: E731
    return torch.tensor(bits(seed), device=device), torch.tensor(bits(offset), device=device)


_HOST_READS = ("item", "tolist", "numpy", "__int__", "__index__", "__float__", "__bool__")


_FROM_HOST_DATA = ((torch, "tensor"), (torch, "as_tensor"), (torch, "asarray"), (torch.Tensor, "new_tensor"))


@contextlib.contextmanager
def _no_host_data():
    """Fails torch.tensor / as_tensor / asarray / Tensor.new_tensor of Python data (a number, a list):
    on a GPU that is a copy from pageable host memory, which syncs the host and breaks CUDA-graph
    capture (the H200's sharded chain_verify); on the CPU only the call itself shows it."""
    def guard(owner, name, original):
        def make(*args, **kwargs):
            data = args[1] if owner is torch.Tensor else (args[0] if args else kwargs.get("data"))
            assert isinstance(data, torch.Tensor), f"{owner.__name__}.{name} of host data on a device path"
            return original(*args, **kwargs)
        return make

    originals = [(owner, name, getattr(owner, name)) for owner, name in _FROM_HOST_DATA]
    for owner, name, original in originals:
        setattr(owner, name, guard(owner, name, original))
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


@contextlib.contextmanager
def _unread(*tensors):
    """Fails any host read (item, int(), bool(), tolist(), ...) of a tensor sharing storage with
    tensors, or of any tensor when none is given: they may only be read by kernels and tensor ops.
    With none given it also fails tensors made from host data (_no_host_data)."""
    guarded = {t.untyped_storage().data_ptr() for t in tensors}
    own = {name: torch.Tensor.__dict__.get(name) for name in _HOST_READS}

    def guard(name, original):
        def read(self, *args, **kwargs):
            assert guarded and self.untyped_storage().data_ptr() not in guarded, f"host read of a tensor: Tensor.{name}"
            return original(self, *args, **kwargs)
        return read

    for name in _HOST_READS:
        setattr(torch.Tensor, name, guard(name, getattr(torch.Tensor, name)))
    try:
        with contextlib.nullcontext() if guarded else _no_host_data():
            yield
    finally:
        for name, original in own.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)


def _same_for_either_seed(name, call, want, seed, offset, logprob_index=None, reads_host=False):
    """call(seed=, offset=) gives want with int seeds and with the tensors of their bits, and
    reads no tensor on the host in either call (the sharded ops are meant to be capturable), or
    with reads_host (a loop's stopping test) no seed tensor."""
    with contextlib.nullcontext() if reads_host else _unread():
        got = call(seed=seed, offset=offset)
    _same(name, got, want, logprob_index)
    seed_t, offset_t = _as_tensors(seed, offset)
    with _unread(seed_t, offset_t) if reads_host else _unread():
        got = call(seed=seed_t, offset=offset_t)
    _same(f"{name} (tensor seed)", got, want, logprob_index)


def _case_logits(n, rows, seed, bounds):
    """Random logits [n, rows, V] with planted edge cases: a NaN row, an all -inf row, and rows
    whose maximum ties across every shard boundary (the lower id must win)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, rows, V, generator=g) * 2
    logits[0, 1, 20] = float("nan")
    logits[1, 0] = float("-inf")
    for i, (_, end) in enumerate(bounds[:-1]):
        logits[2, i % rows, end - 1] = logits[2, i % rows, end] = 9.0
    return logits


def _shard(x, bounds, rank):
    a, b = bounds[rank]
    return x[..., a:b].contiguous(), a


def _same(name, got, want, logprob_index=None):
    for i, (g, w) in enumerate(zip(got, want)):
        if i == logprob_index:
            torch.testing.assert_close(g, w, atol=ENVELOPE, rtol=ENVELOPE, equal_nan=True, msg=f"{name}: output {i}")
        else:
            assert torch.equal(g, w), f"{name}: output {i}\n{g}\n{w}"


def _check_chain(rank, bounds):
    n, k = 5, 4
    logits = _case_logits(n, k + 1, 1, bounds)
    g = torch.Generator().manual_seed(2)
    drafts = torch.randint(0, V, (n, k), generator=g)
    drafts[3] = logits[3, :k].argmax(-1)  # accepted at T = 0, likely at T > 0
    drafts[4, 0], drafts[4, 1] = bounds[1][0] - 1, bounds[1][0]  # the last id of shard 0, the first of shard 1
    drafts[4, 2:] = logits[4, 2:k].argmax(-1)
    drafts[2, 0] = bounds[0][1] - 1  # the tie's winner
    q = torch.softmax(torch.randn(n, k, V, generator=g), -1)
    local, start = _shard(logits, bounds, rank)
    for temperature in (0.0, 1.0, 0.6):
        for probs in (None, q):
            local_q = None if probs is None else _shard(probs, bounds, rank)[0]
            for seed, offset in RNG:
                want = xkernels.chain_verify(drafts, logits, draft_probs=probs, temperature=temperature, seed=seed,
                                             offset=offset)
                _same_for_either_seed(
                    f"chain_verify T={temperature} q={probs is not None} seed={seed}",
                    lambda **rng: distributed.chain_verify(drafts, local, vocab_start=start, draft_probs=local_q,
                                                           temperature=temperature, **rng), want, seed, offset)


def _check_chain_sampling(rank, bounds):
    """Per-sequence temperatures (a greedy row among them), top-k / top-p / min-p over the whole
    vocabulary (scalars and [N] tensors, mixed in one batch; a top-k of 1 at a tie across a shard
    boundary), per-request streams and the scalar stream, with and without draft probabilities:
    the unsharded chain_verify's tokens, reading no tensor on the host."""
    n, k = 6, 3
    logits = _case_logits(n, k + 1, 7, bounds)
    g = torch.Generator().manual_seed(8)
    drafts = torch.randint(0, V, (n, k), generator=g)
    drafts[:, 0] = logits[:, 0].argmax(-1)  # the likeliest draft: accepted often, so later rows are read
    q = torch.softmax(torch.randn(n, k, V, generator=g), -1)
    local, start = _shard(logits, bounds, rank)
    local_q = _shard(q, bounds, rank)[0]
    temps = torch.tensor([1.0, 0.0, 0.7, 1.3, 1.0, 0.9])
    top_k, top_p = torch.tensor([3, 0, 1, 2, 40, 1]), torch.tensor([0.9, 0.5, 1.0, 0.6, 0.3, 0.95])
    min_p = torch.tensor([0.1, 0.0, 0.3, 0.05, 0.0, 0.2])
    cases = [dict(temperature=temps, top_k=top_k), dict(temperature=temps, top_p=top_p),
             dict(temperature=temps, min_p=min_p), dict(temperature=0.8, top_k=6, top_p=0.8, min_p=0.02),
             dict(temperature=temps, top_k=top_k.flip(0), top_p=top_p, min_p=min_p.flip(0)), dict(temperature=temps)]
    streams = [(torch.tensor([3, 3, -5, 2**40, 7, 1]), torch.tensor([0, 11, 4, 2**62, 9, 1])), (4, 2)]
    for i, case in enumerate(cases):
        for probs, shard_q in ((None, None), (q, local_q)):
            for seed, offset in streams:
                want = xkernels.chain_verify(drafts, logits, draft_probs=probs, seed=seed, offset=offset, **case)
                with _unread():
                    got = distributed.chain_verify(drafts, local, vocab_start=start, draft_probs=shard_q, seed=seed,
                                                   offset=offset, **case)
                _same(f"chain_verify case {i} q={probs is not None} per-request={torch.is_tensor(seed)}", got, want)


def _check_filter_cuts(rank, bounds):
    """filter_cuts keeps, on every rank, exactly reference.sampling.filter_mask's ids of each row:
    ties at the cut across a shard boundary (the lower id first), a top-k past the finite ids, -inf
    ids, top-p alone and within top-k, min-p, every filter off."""
    from xkernels.reference.sampling import filter_mask

    g = torch.Generator().manual_seed(9)
    a = (torch.randn(8, V, generator=g) * 2).round(decimals=1)  # rounded: many ties
    a[1, 5:20] = float("-inf")
    a[2, bounds[0][1] - 1] = a[2, bounds[0][1]] = a[2].max() + 1  # the top ties across the first boundary
    top_k = torch.tensor([3, 30, 1, 0, 10, 0, 2, 0])
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.7, 0.5, 1.0, 0.9, 1.0])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.1, 0.2, 0.0, 0.0])
    with_empty = [(0, 0), (0, V)] if len(bounds) == 2 else [(0, 14), (14, 14), (14, V)]  # an empty shard too
    for shards in (bounds, with_empty):
        local, start = _shard(a, shards, rank)
        cut_value, cut_id = distributed.filter_cuts(local, a.amax(-1), start, None, torch.ones(8, dtype=torch.bool),
                                                    top_k, top_p, min_p)
        ids = torch.arange(V)
        kept = (a > cut_value[:, None]) | ((a == cut_value[:, None]) & (ids <= cut_id[:, None]))
        for r in range(8):  # over the finite ids (filter_mask may count -inf ids into a top-k past the finite ones)
            finite = torch.isfinite(a[r])
            want = filter_mask(a[r], int(top_k[r]), float(top_p[r]), float(min_p[r])) & finite
            assert torch.equal(kept[r] & finite, want), f"filter_cuts {shards} row {r}: {kept[r].nonzero()}"
    drafts, logits = torch.tensor([[3, 30]]), a[None, :3]  # the sharded chain with an empty shard
    local, start = _shard(logits, with_empty, rank)
    kw = dict(temperature=torch.tensor([0.9]), top_k=4, top_p=0.8, seed=torch.tensor([5]), offset=torch.tensor([2]))
    _same("chain_verify with an empty shard", distributed.chain_verify(drafts, local, vocab_start=start, **kw),
          xkernels.chain_verify(drafts, logits, **kw))


def _refiner_case(bounds, n=3, b=6, d=4, r=8, h=16):
    g = torch.Generator().manual_seed(3)
    weights = RefinerWeights(emb=torch.randn(V, r, generator=g), mix=torch.randn(r, b, b, generator=g) * 0.3,
                             w_gate=torch.randn(h, r, generator=g) * 0.3, w_up=torch.randn(h, r, generator=g) * 0.3,
                             w_down=torch.randn(r, h, generator=g) * 0.3, w_read=torch.randn(V, r, generator=g))
    ctx = torch.randn(n, b, r, generator=g)
    base = _case_logits(n, d, 4, bounds)
    base[0, 1, 20] = 0.0  # keep the NaN out: it would make every pass degenerate at that slot
    prev = torch.randint(0, V, (n, b), generator=g)
    prev[0, :2] = torch.tensor([bounds[1][0] - 1, bounds[1][0]])
    prefix = prev[:, : b - d + 1].contiguous()
    return ctx, prev, prefix, base, weights


def _check_refine(rank, bounds):
    ctx, prev, prefix, base, weights = _refiner_case(bounds)
    local_base, start = _shard(base, bounds, rank)
    a, b = bounds[rank]
    local_w = weights._replace(emb=weights.emb[a:b].contiguous(), w_read=weights.w_read[a:b].contiguous())
    for temperature, (seed, offset) in ((0.0, RNG[0]), (0.8, (7, 1)), (0.8, RNG[-1])):
        kw = dict(temperature=temperature, seed=seed, offset=offset)
        _same_for_either_seed(
            f"refine_step T={temperature}",
            lambda **rng: distributed.refine_step(ctx, prev, local_base, local_w, vocab_start=start,
                                                  temperature=temperature, **rng),
            xkernels.refine_step(ctx, prev, base, weights, **kw), seed, offset, 1)
        _same_for_either_seed(
            f"jacobi_refine T={temperature}",
            lambda **rng: distributed.jacobi_refine(ctx, prefix, local_base, local_w, max_iters=3, vocab_start=start,
                                                    temperature=temperature, **rng),
            xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=3, **kw), seed, offset, 1, reads_host=True)
        for max_iters in (0, 2, 9):  # 9 > D + 1: the capturable loop stops at D + 1 passes
            with _unread():
                got = distributed.jacobi_refine(ctx, prefix, local_base, local_w, max_iters=max_iters,
                                                vocab_start=start, capturable=True, **kw)
            _same(f"jacobi_refine T={temperature} capturable max_iters={max_iters}", got,
                  xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=max_iters, **kw), 1)
        _same_for_either_seed(
            f"sequential_refine T={temperature}",
            lambda **rng: distributed.sequential_refine(ctx, prefix, local_base, local_w, vocab_start=start,
                                                        temperature=temperature, **rng),
            xkernels.sequential_refine(ctx, prefix, base, weights, **kw), seed, offset, 1)


def _check_dllm(rank, bounds):
    n, length, mask = 4, 9, bounds[1][0]  # the mask token is the first id of shard 1
    logits = _case_logits(n, length, 6, bounds)
    g = torch.Generator().manual_seed(8)
    block = torch.randint(0, V, (n, length), generator=g)
    block[torch.rand(n, length, generator=g) < 0.6] = mask
    block[:, 0] = mask  # the planted rows are masked
    block[3] = 1  # a sequence with nothing masked
    local, start = _shard(logits, bounds, rank)
    for temperature in (0.0, 1.0):
        for (num_unmask, threshold), (seed, offset) in zip(((1, None), (3, None), (40, None), (1, 0.2)),
                                                           [(3, 2)] + RNG):
            kw = dict(num_unmask=num_unmask, threshold=threshold, temperature=temperature)
            _same_for_either_seed(
                f"dllm_step T={temperature} {num_unmask} {threshold}",
                lambda **rng: distributed.dllm_step(local, block, mask, vocab_start=start, **kw, **rng),
                xkernels.dllm_step(logits, block, mask, **kw, seed=seed, offset=offset), seed, offset, 3)


def _check_tree(rank, bounds):
    n, m = 5, 8
    logits = _case_logits(n, m, 9, bounds)
    g = torch.Generator().manual_seed(10)
    parents = torch.stack([torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, m)])
                           for _ in range(n)])
    parents[3] = torch.tensor([-1, 0, 0, 0, 1, 1, 4, 4])
    tokens = torch.randint(0, V, (n, m), generator=g)
    for s in range(n):  # most children are their parent's argmax or a near one: deep accepted paths
        for i in range(1, m):
            if torch.rand(1, generator=g) < 0.6:
                tokens[s, i] = logits[s, parents[s, i]].nan_to_num(-1e9).topk(2).indices[i % 2]
    tokens[:, 0] = -1
    tokens[3, 2] = tokens[3, 1]  # duplicate siblings
    tokens[4, 1:3] = torch.tensor([bounds[1][0] - 1, bounds[1][0]])  # the edges of shard 1
    num_nodes = torch.tensor([m, 5, m, m, 3])
    q = torch.softmax(torch.randn(n, m, V, generator=g), -1)
    local, start = _shard(logits, bounds, rank)
    for temperature in (0.0, 1.0, 0.5):
        for probs, without in ((None, False), (q, False), (q, True)):
            local_q = None if probs is None else _shard(probs, bounds, rank)[0]
            for (seed, offset), capturable in itertools.product(RNG, (False, True) if probs is not None else (True,)):
                kw = dict(without_replacement=without, temperature=temperature, num_nodes=num_nodes)
                want = xkernels.tree_verify(tokens, parents, logits, draft_probs=probs, seed=seed, offset=offset, **kw)
                _same_for_either_seed(
                    f"tree_verify T={temperature} q={probs is not None} {without} seed={seed} {capturable}",
                    lambda **rng: distributed.tree_verify(tokens, parents, local, vocab_start=start,
                                                          draft_probs=local_q, capturable=capturable, **kw, **rng),
                    want, seed, offset, reads_host=not capturable)


def _residual_case(seed):
    """Trees whose children were drawn from q [6, 10, V], each sequence planting one case: 0 many
    siblings rejected in a row (q's mass on tokens the target finds unlikely), 1 repeated tokens
    among such siblings (without replacement, q's mass leaves once), 2 q rows without mass (the
    root's and node 1's), 3 a residual that empties after the first rejection (the target a
    point mass in all but name, q that mass: the next test finds the residual's sum 0), 4
    num_nodes < M, 5 a NaN row and an all -inf row (point masses at T > 0) under deep argmax
    children."""
    n, m = 6, 10
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, m, V, generator=g) * 2
    q = torch.softmax(torch.randn(n, m, V, generator=g) * 2, -1)
    parents = torch.tensor([[-1, 0, 0, 0, 0, 0, 0, 0, 1, 1], [-1, 0, 0, 0, 0, 0, 1, 1, 6, 6],
                            [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3], [-1, 0, 0, 0, 0, 1, 1, 2, 2, 3],
                            [-1, 0, 0, 1, 1, 2, 5, 5, 7, 7], [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8]])
    tokens = torch.randint(0, V, (n, m), generator=g)
    unlikely = torch.randperm(V, generator=g)[:7]
    logits[:2, :, unlikely] = -3.0
    q[0] = 0.1 / V
    q[0, :, unlikely] += 0.9 / 7
    tokens[0, 1:8] = unlikely
    q[1] = 0.4 / V  # most of q on one unlikely token, proposed twice before the root's argmax
    q[1, :, unlikely[0]] += 0.6
    tokens[1, 1:6] = torch.tensor([unlikely[0], unlikely[0], logits[1, 0].argmax(), unlikely[0], unlikely[1]])
    tokens[1, 6:8] = unlikely[2]
    q[2, :2] = 0.0
    top = int(logits[3, 0].argmax())
    logits[3, 0] = float("-inf")  # (not a large negative logit: the CPU kernels' exp floors those at e^-87)
    logits[3, 0, top] = 0.0
    q[3, 0] = 0.0
    q[3, 0, top] = 1.0
    tokens[3, 1:5] = torch.tensor([(top + 1) % V, top, (top + 2) % V, top])
    logits[5, 3, 5] = float("nan")
    logits[5, 6] = float("-inf")
    tokens[5, 1:] = logits[5, :-1].nan_to_num(-1e9).argmax(-1)
    tokens[5, 4] = 5  # the NaN's id: the argmax of a NaN row
    tokens[:, 0] = -1
    return tokens, parents, logits, q, torch.tensor([m, m, m, m, 6, m])


def _check_tree_residual(rank, bounds):
    """tree_verify with draft_probs on the planted cases against the unsharded op, here and with
    an empty shard, reading no tensor on the host; at T > 0 some run rejects all seven children of
    sequence 0's root, and sequence 3 stops at its root with the argmax."""
    world = len(bounds)
    empty = [(0, 0), (0, V)] if world == 2 else [(0, 17), (17, 17), (17, V)]
    rejected_all, root_argmax = False, True
    for case in range(3):
        tokens, parents, logits, q, num_nodes = _residual_case(20 + case)
        for shards in (bounds, empty):
            local, start = _shard(logits, shards, rank)
            local_q = _shard(q, shards, rank)[0]
            for temperature in (1.0, 0.7, 0.0):
                for without in (False, True):
                    for seed, offset in RNG + [(case, 9)] if temperature else RNG[:1]:
                        kw = dict(draft_probs=q, without_replacement=without, temperature=temperature,
                                  num_nodes=num_nodes)
                        want = xkernels.tree_verify(tokens, parents, logits, seed=seed, offset=offset, **kw)
                        kw["draft_probs"] = local_q
                        for capturable in (False, True):
                            _same_for_either_seed(
                                f"tree_verify residual case {case} {shards} T={temperature} {without} seed={seed} "
                                f"{capturable}",
                                lambda **rng: distributed.tree_verify(tokens, parents, local, vocab_start=start,
                                                                      capturable=capturable, **kw, **rng),
                                want, seed, offset, reads_host=not capturable)
                        if temperature:
                            rejected_all |= int(want[0][0]) == 0
                            root_argmax &= int(want[0][3]) == 0 and int(want[2][3, 0]) == int(logits[3, 0].argmax())
    assert rejected_all and root_argmax
    for bad in (local_q[:, :-1], local_q.double()):
        with pytest.raises(ValueError, match="draft_probs must be float32 of local_logits' shape"):
            distributed.tree_verify(tokens, parents, local, vocab_start=start, draft_probs=bad, temperature=1.0)


def _check_tree_traffic(rank, bounds):
    """With draft_probs and capturable=True the collectives do not depend on the data (the same
    count, and bytes, for two trees and logits of one shape: 1 + (M - 2) + 1 at T > 0, 1 at T = 0);
    the early stop's are fewer at T > 0; the bytes sent are O(N M), far below the logits' (V =
    4096)."""
    world = len(bounds)
    n, m, v = 4, 8, 4096
    start, end = rank * v // world, (rank + 1) * v // world
    seen = []
    for data in range(2):
        g = torch.Generator().manual_seed(30 + data)
        logits = torch.randn(n, m, v, generator=g)[..., start:end].contiguous()
        q = torch.softmax(torch.randn(n, m, v, generator=g), -1)[..., start:end].contiguous()
        parents = torch.stack([torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, m)])
                               for _ in range(n)])
        tokens = torch.randint(0, v, (n, m), generator=g)
        for temperature in (1.0, 0.0):
            counts = []
            for capturable in (True, False):
                distributed.traffic.reset()
                distributed.tree_verify(tokens, parents, logits, vocab_start=start, draft_probs=q,
                                        temperature=temperature, seed=data, capturable=capturable)
                t = distributed.traffic
                counts.append(t.collectives)
                assert t.bytes <= 64 * n * m and 100 * t.bytes < t.logits_bytes, (t.bytes, t.logits_bytes)
                if capturable:
                    seen.append((temperature, t.collectives, t.bytes))
            # These walks end before M - 1 steps: the early stop saves collectives at T > 0.
            assert counts[0] == (m if temperature else 1) and (counts[1] < counts[0]) == bool(temperature), counts
    assert seen[:2] == seen[2:], seen


def _check_bad_seeds(rank, bounds):
    """A seed or offset tensor of the wrong dtype or size (5 elements: neither 1 nor N, N being 2 or
    3 here) raises naming it, at T = 0 too (every rank alike, so the ranks' collectives stay
    matched)."""
    local, start = _shard(torch.randn(2, 2, V), bounds, rank)
    tree = torch.tensor([[-1, 3], [-1, 4]]), torch.tensor([[-1, 0], [-1, 0]])
    ctx, prev, _, base, weights = _refiner_case(bounds)
    a, b = bounds[rank]
    local_w = weights._replace(emb=weights.emb[a:b].contiguous(), w_read=weights.w_read[a:b].contiguous())
    calls = [
        lambda **kw: distributed.chain_verify(tree[0][:, 1:], local, vocab_start=start, **kw),
        lambda **kw: distributed.tree_verify(*tree, local, vocab_start=start, **kw),
        lambda **kw: distributed.dllm_step(local, torch.full((2, 2), 5), 5, vocab_start=start, **kw),
        lambda **kw: distributed.refine_step(ctx, prev, _shard(base, bounds, rank)[0], local_w, vocab_start=start,
                                             **kw),
    ]
    bad = [(dict(seed=torch.tensor(1, dtype=torch.int32)), "seed must be an int64 tensor"),
           (dict(offset=torch.arange(5)), "offset must (hold exactly one element|be an int, a one-element)")]
    for call in calls:
        for temperature in (0.0, 1.0):
            for rng, message in bad:
                with pytest.raises(RuntimeError, match=message):
                    call(temperature=temperature, **rng)


def _check_empty(rank, bounds):
    """N = 0, K = 0 and a root-only tree run the same collectives on every rank and return the
    unsharded ops' empty results."""
    local = lambda *shape: _shard(torch.randn(*shape, V), bounds, rank)  # noqa: E731
    for drafts, (logits, start) in ((torch.zeros(0, 3, dtype=torch.int64), local(0, 4)),
                                    (torch.zeros(2, 0, dtype=torch.int64), local(2, 1))):
        whole = torch.randn(*logits.shape[:2], V) if logits.numel() else torch.zeros(*logits.shape[:2], V)
        got = distributed.chain_verify(drafts, logits, vocab_start=start, temperature=1.0)
        assert [t.shape for t in got] == [t.shape for t in xkernels.chain_verify(drafts, whole, temperature=1.0)]
    logits, start = local(0, 4)
    out = distributed.dllm_step(logits, torch.zeros(0, 4, dtype=torch.int64), 3, vocab_start=start)
    assert all(t.shape == (0, 4) for t in out)
    g = torch.Generator().manual_seed(0)
    whole = torch.randn(2, 1, V, generator=g)
    got = distributed.tree_verify(torch.full((2, 1), -1), torch.full((2, 1), -1), _shard(whole, bounds, rank)[0],
                                  vocab_start=bounds[rank][0], temperature=1.0)
    _same("tree_verify root only", got, xkernels.tree_verify(torch.full((2, 1), -1), torch.full((2, 1), -1), whole,
                                                             temperature=1.0))
    q = torch.softmax(torch.randn(2, 1, V, generator=g), -1)
    got = distributed.tree_verify(torch.full((2, 1), -1), torch.full((2, 1), -1), _shard(whole, bounds, rank)[0],
                                  vocab_start=bounds[rank][0], draft_probs=_shard(q, bounds, rank)[0], temperature=1.0)
    _same("tree_verify root only with q", got, xkernels.tree_verify(
        torch.full((2, 1), -1), torch.full((2, 1), -1), whole, draft_probs=q, temperature=1.0))
    none = torch.zeros(0, 4, dtype=torch.int64)
    logits, start = local(0, 4)
    got = distributed.tree_verify(none, none, logits, vocab_start=start, draft_probs=torch.zeros_like(logits),
                                  temperature=1.0)
    assert all(t.shape == w.shape for t, w in zip(got, xkernels.tree_verify(none, none, torch.zeros(0, 4, V),
                                                                             draft_probs=torch.zeros(0, 4, V),
                                                                             temperature=1.0)))


def _check_tree_candidates(rank, bounds):
    """The tree modes' candidates from shards (VocabShard.topk_logprobs) equal the whole rows'
    (WholeVocab.topk_logprobs) bit for bit, ids by logit with ties to the lower id: bfloat16-rounded
    logits (a bfloat16 drafter's ties), ties planted across every shard boundary, rows of integers
    (ties at the k-th place), more tied ids than k in every shard, a NaN row and an all -inf row."""
    from xkernels.decoding.modes import WholeVocab
    from xkernels.decoding.tensor_parallel import VocabShard

    n, d, k = 5, 4, 6
    logits = _case_logits(n, d, 7, bounds).to(torch.bfloat16).float()
    logits[3] = logits[3].round()
    logits[4, :, ::2] = 1.0
    local, start = _shard(logits, bounds, rank)
    got = VocabShard(dist.group.WORLD, start, start + local.shape[-1], V).topk_logprobs(local, k)
    want = WholeVocab.topk_logprobs(logits, k)
    for name, g, w in zip(("log-probs", "ids"), got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"tree candidates {name}: {m}")
    assert torch.equal(want[1], torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k])


def _check_generate(rank, bounds):
    """End to end: the shipped models decoded with a vocabulary-parallel target (the loop shards
    the LM head evenly itself) give one process's tokens, one sequence and a ragged batch. The
    drafter runs in float32, and in bfloat16 whatever the CPU (its default only where oneDNN has
    native bfloat16 products), whose logits tie often: in the cases where a tie can change the
    tokens (the T = 0 argmax, the trees at T = 1), as it runs slowly without those products."""
    from xkernels import data
    from xkernels.decoding import generate, generate_batch
    from xkernels.models.shipped import load_all

    models = load_all()
    ids = models.tokenizer.encode(data.held_out_prompts("code", 1)[0]).ids
    prompts = [ids, ids[: len(ids) // 2]]  # ragged

    def decode(batch, **kw):
        return (generate_batch(models.target, prompts, [8, 5], **kw) if batch else generate(models.target, ids, 10,
                                                                                            **kw))[0]

    f32, both = (torch.float32,), (torch.float32, torch.bfloat16)
    for batch, mode, temperature, dtypes in (
            (False, "ar", 1.0, f32), (False, "drafter", 0.0, f32), (False, "jacobi", 0.0, both),
            (False, "jacobi", 1.0, f32), (False, "sequential", 1.0, f32), (False, "tree", 0.0, f32),
            (False, "tree-jacobi", 1.0, both), (True, "ar", 1.0, f32), (True, "jacobi", 0.0, f32),
            (True, "tree", 1.0, both)):
        for draft_dtype in dtypes:
            kw = dict(mode=mode, drafter=models.drafter, refiner=models.refiner, temperature=temperature, seed=3,
                      draft_len=None, draft_dtype=draft_dtype)
            alone, sharded = decode(batch, **kw), decode(batch, tp_group=dist.group.WORLD, **kw)
            name = "generate_batch" if batch else "generate"
            assert sharded == alone, f"{name} {mode} T={temperature} {draft_dtype}: {sharded} != {alone}"


def _worker(rank, world, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        checks = (_check_chain, _check_filter_cuts, _check_chain_sampling, _check_tree, _check_tree_residual, _check_tree_traffic, _check_tree_candidates,
                  _check_refine, _check_dllm, _check_bad_seeds, _check_empty)
        for check in checks + ((_check_generate,) if world == 2 else ()):
            check(rank, BOUNDS[world])
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_coins_stay_on_the_logits_device():
    """The acceptance coins are computed where the counters live, with seed tensors there too
    (meta stands in for CUDA: it refuses CPU operands the same way)."""
    seed, offset = _as_tensors(3, 4, "meta")
    for seed, offset in ((seed, offset), (torch.zeros(3, dtype=torch.int64, device="meta"), offset)):
        coins = distributed.stream_coins(seed, offset, 3, 4, "meta")
        assert coins.device.type == "meta" and coins.shape == (3, 4) and coins.dtype == torch.float32


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_ops_match_the_unsharded_ops(world):
    mp.spawn(_worker, args=(world, _free_port()), nprocs=world, join=True)


def _device_seed_steps(device):
    """The sharded ops with seed and offset tensors on `device` (one rank holding the whole vocabulary;
    BOUNDS[2] only plants the cases): name -> (sharded call, unsharded call, logprob index), and the
    offset tensor a captured graph advances."""
    n, k, m = 5, 4, 8
    logits = _case_logits(n, m, 12, BOUNDS[2]).to(device)
    g = torch.Generator().manual_seed(13)
    drafts = torch.randint(0, V, (n, k), generator=g).to(device)
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3, 3]]).repeat(n, 1).to(device)
    tokens = torch.randint(0, V, (n, m), generator=g)
    tokens[:, 0] = -1
    tokens = tokens.to(device)
    q = torch.softmax(torch.randn(n, m, V, generator=g), -1).to(device)
    block = torch.randint(0, V, (n, m), generator=g).to(device)
    block[:, ::2] = 3
    ctx, prev, prefix, base, weights = _refiner_case(BOUNDS[2])
    ctx, prev, prefix, base = ctx.to(device), prev.to(device), prefix.to(device), base.to(device)
    weights = RefinerWeights(*(w.to(device) for w in weights))
    seed, offset = _as_tensors(2**64 - 3, 4, device)
    rng = dict(temperature=1.0, seed=seed, offset=offset)
    filters = dict(top_k=torch.tensor([3, 0, 1, 5, 2]).to(device), top_p=0.9, min_p=torch.full((n,), 0.05).to(device))
    per_request = dict(temperature=1.0, seed=torch.arange(n).to(device) + 3, offset=torch.arange(n).to(device) * 9)
    chain = lambda: (drafts, logits[:, : k + 1])  # noqa: E731
    steps = {
        "chain_verify": (lambda: distributed.chain_verify(*chain(), vocab_start=0, **rng),
                         lambda: xkernels.chain_verify(*chain(), **rng), None),
        "chain_verify per request": (lambda: distributed.chain_verify(*chain(), vocab_start=0, **per_request),
                                     lambda: xkernels.chain_verify(*chain(), **per_request), None),
        "tree_verify": (lambda: distributed.tree_verify(tokens, parents, logits, vocab_start=0, **rng),
                        lambda: xkernels.tree_verify(tokens, parents, logits, **rng), None),
        "tree_verify per request": (
            lambda: distributed.tree_verify(tokens, parents, logits, vocab_start=0, draft_probs=q, capturable=True,
                                            **per_request),
            lambda: xkernels.tree_verify(tokens, parents, logits, draft_probs=q, **per_request), None),
        "tree_verify with q": (
            lambda: distributed.tree_verify(tokens, parents, logits, vocab_start=0, draft_probs=q,
                                            without_replacement=True, capturable=True, **rng),
            lambda: xkernels.tree_verify(tokens, parents, logits, draft_probs=q, without_replacement=True, **rng),
            None),
        # Filtered: the cut's shard_cut_histogram and shard_cut_pick rounds, on the device.
        "chain_verify filtered": (
            lambda: distributed.chain_verify(*chain(), vocab_start=0, **filters, **rng),
            lambda: xkernels.chain_verify(*chain(), **filters, **rng), None),
        "tree_verify filtered with q": (
            lambda: distributed.tree_verify(tokens, parents, logits, vocab_start=0, draft_probs=q, capturable=True,
                                            **filters, **rng),
            lambda: xkernels.tree_verify(tokens, parents, logits, draft_probs=q, **filters, **rng), None),
        "dllm_step": (lambda: distributed.dllm_step(logits, block, 3, vocab_start=0, **rng),
                      lambda: xkernels.dllm_step(logits, block, 3, **rng), 3),
        "refine_step": (lambda: distributed.refine_step(ctx, prev, base, weights, vocab_start=0, **rng),
                        lambda: xkernels.refine_step(ctx, prev, base, weights, **rng), 1),
        "jacobi_refine": (lambda: distributed.jacobi_refine(ctx, prefix, base, weights, max_iters=9, vocab_start=0,
                                                            capturable=True, **rng),
                          lambda: xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=9, **rng), 1),
    }
    return steps, offset


def _check_device_seeds_on_cpu(rank, world, port):
    """The CPU side of _check_cuda_graph: the same calls on gloo read no tensor on the host and make
    no tensor from host data (what would sync a GPU), and match the unsharded ops."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        steps, _ = _device_seed_steps("cpu")
        for name, (sharded, whole, logprob_index) in steps.items():
            with _unread():
                got = sharded()
            _same(name, got, whole(), logprob_index)
    finally:
        dist.destroy_process_group()


def test_sharded_ops_with_device_seeds_make_no_host_copy():
    mp.spawn(_check_device_seeds_on_cpu, args=(1, _free_port()), nprocs=1, join=True)


def _check_cuda_graph(rank, world, port):
    """One rank on NCCL with device seed and offset tensors: the sharded ops sync nothing with the
    host (sync debug mode "error"), match the unsharded ops, and a CUDA graph of them replays like
    eager calls as the offset advances in place."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        steps, offset = _device_seed_steps("cuda")
        for name, (sharded, whole, logprob_index) in steps.items():
            want = whole()
            sharded()  # warm-up: NCCL's communicator starts on the first collective
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                got = sharded()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            _same(f"{name} on CUDA", got, want, logprob_index)
            assert_replays_like_eager(sharded, offset)
        seed = offset.new_zeros(())
        with pytest.raises(RuntimeError, match="seed must be on"):
            distributed.chain_verify(torch.zeros(1, 1, dtype=torch.int64, device="cuda"),
                                     torch.zeros(1, 2, V, device="cuda"), vocab_start=0, temperature=1.0,
                                     seed=seed.cpu())
    finally:
        dist.destroy_process_group()


@pytest.mark.needs_cuda
def test_sharded_ops_take_device_seeds_and_capture():
    mp.spawn(_check_cuda_graph, args=(1, _free_port()), nprocs=1, join=True)
