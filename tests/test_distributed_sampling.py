"""xkernels.distributed's per-request sampling on gloo, world sizes 2 and 3 (uneven shards and an
empty one): per-sequence temperatures (greedy rows among them), per-request streams and top-k /
top-p / min-p over the whole vocabulary, against the unsharded ops (tree_verify, chain_verify's
block method and log-probabilities, the refine ops, dllm_step). Kept apart from
test_distributed.py (minutes) so that these run in seconds."""

import contextlib
import itertools

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import xkernels
from xkernels import distributed
from tests.test_distributed import (BOUNDS, V, _as_tensors, _case_logits, _free_port, _refiner_case, _residual_case,
                                    _same, _shard, _unread)

N, M = 6, 8
TEMPS = torch.tensor([1.0, 0.0, 0.7, 1.3, 1.0, 0.9])
TOP_K, TOP_P = torch.tensor([3, 0, 1, 2, 40, 1]), torch.tensor([0.9, 0.5, 1.0, 0.6, 0.3, 0.95])
MIN_P = torch.tensor([0.1, 0.0, 0.3, 0.05, 0.0, 0.2])
STREAMS = [(torch.tensor([3, 3, -5, 2**40, 7, 1]), torch.tensor([0, 11, 4, 2**62, 9, 1])), (4, 2)]


def _tree_case(bounds):
    """Trees [N, M] over rounded logits (ties at the cuts; _case_logits' NaN row, all -inf row and
    maxima tied across every shard boundary): most children their parent's best or second-best
    token (deep paths), some random (often outside the cut), duplicate siblings, the edges of
    shard 1, and one sequence of 5 nodes."""
    logits = _case_logits(N, M, 41, bounds).round(decimals=1)
    g = torch.Generator().manual_seed(42)
    parents = torch.stack([torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, M)])
                           for _ in range(N)])
    parents[3] = torch.tensor([-1, 0, 0, 0, 1, 1, 4, 4])
    tokens = torch.randint(0, V, (N, M), generator=g)
    for s in range(N):
        for i in range(1, M):
            if torch.rand(1, generator=g) < 0.6:
                tokens[s, i] = logits[s, parents[s, i]].nan_to_num(-1e9).topk(2).indices[i % 2]
    tokens[:, 0] = -1
    tokens[3, 2] = tokens[3, 1]
    tokens[4, 1:3] = torch.tensor([bounds[1][0] - 1, bounds[1][0]])
    q = torch.softmax(torch.randn(N, M, V, generator=g), -1)
    return tokens, parents, logits, q, torch.tensor([M, 5, M, M, M, M])


def _call_tree(tokens, parents, local, start, local_q, capturable, kw, rng, num_nodes):
    return distributed.tree_verify(tokens, parents, local, vocab_start=start, draft_probs=local_q,
                                   capturable=capturable, num_nodes=num_nodes, **kw, **rng)


def _check_tree_sampling(rank, bounds):
    """The unsharded tree_verify's outputs for every case, stream form, kind of children and
    capturable, at the shards given and with an empty shard; no tensor read on the host (the
    residual walk's early stop reads its flags, but no seed tensor). The filters change some
    unsharded result, so a sharded walk that ignored them would fail here."""
    tokens, parents, logits, q, num_nodes = _tree_case(bounds)
    cases = _cases(TEMPS, TOP_K, TOP_P, MIN_P)
    empty = [(0, 0), (0, V)] if len(bounds) == 2 else [(0, 14), (14, 14), (14, V)]
    filters_matter = False
    for shards in (bounds, empty):
        local, start = _shard(logits, shards, rank)
        local_q = _shard(q, shards, rank)[0]
        for i, case in enumerate(cases):
            for (probs, shard_q, without), (seed, offset) in itertools.product(
                    ((None, None, False), (q, local_q, False), (q, local_q, True)), STREAMS):
                kw = dict(without_replacement=without, **case)
                want = xkernels.tree_verify(tokens, parents, logits, draft_probs=probs, seed=seed, offset=offset,
                                            num_nodes=num_nodes, **kw)
                filters_matter |= not all(torch.equal(a, b) for a, b in zip(want, xkernels.tree_verify(
                    tokens, parents, logits, draft_probs=probs, seed=seed, offset=offset, num_nodes=num_nodes,
                    **_unfiltered(kw))))
                for capturable in (False, True) if probs is not None else (True,):
                    reads = contextlib.nullcontext() if not torch.is_tensor(seed) else _unread(seed, offset)
                    with reads if probs is not None and not capturable else _unread():
                        got = _call_tree(tokens, parents, local, start, shard_q, capturable, kw,
                                         dict(seed=seed, offset=offset), num_nodes)
                    _same(f"tree_verify {shards} case {i} q={probs is not None} {without} "
                          f"per-request={torch.is_tensor(seed)} capturable={capturable}", got, want)
    assert filters_matter


def _flat_case(seed):
    """A flat target and a sharp q, children drawn from q: the ids a filter drops hold much of the
    target's mass where q has little, so the residual's sum over the kept ids differs much from the
    whole row's."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, M, V, generator=g) * 0.5
    q = torch.softmax(torch.randn(N, M, V, generator=g) * 4, -1)
    parents = torch.tensor([-1, 0, 0, 0, 0, 1, 1, 2]).repeat(N, 1)
    tokens = torch.multinomial(q[torch.arange(N)[:, None], parents.clamp(min=0)].reshape(-1, V), 1,
                               generator=g).view(N, M)
    tokens[:, 0] = -1
    return tokens, parents, logits, q, torch.full((N,), M)


def _check_tree_residual_filtered(rank, bounds):
    """Children drawn from q under filters, on test_distributed's planted residual cases (long runs
    of rejected siblings, repeated tokens, q rows without mass, a residual that empties, a NaN row)
    and on flat targets with a sharp q (_flat_case): after each rejection the next test needs the residual's sum over the kept ids only, so a sum
    over the whole row, or a draw outside the cut, shows here."""
    seed, offset = STREAMS[0]
    for data in range(5):
        tokens, parents, logits, q, num_nodes = _residual_case(20 + data) if data < 3 else _flat_case(data)
        local, start = _shard(logits, bounds, rank)
        local_q = _shard(q, bounds, rank)[0]
        for i, case in enumerate([dict(temperature=1.0, top_k=12), dict(temperature=TEMPS, top_p=TOP_P.clamp(min=0.6)),
                                  dict(temperature=0.9, min_p=0.02), dict(temperature=TEMPS, top_k=TOP_K + 8,
                                                                          top_p=0.9, min_p=MIN_P / 4)]):
            for without in (False, True):
                kw = dict(without_replacement=without, seed=seed + data, offset=offset, num_nodes=num_nodes, **case)
                want = xkernels.tree_verify(tokens, parents, logits, draft_probs=q, **kw)
                with _unread():
                    got = distributed.tree_verify(tokens, parents, local, vocab_start=start, draft_probs=local_q,
                                                  capturable=True, **kw)
                _same(f"tree_verify residual case {data} filters {i} {without}", got, want)


def _check_tree_alone(rank, bounds):
    """With per-request streams each sequence verified alone gets its row of the batch, and a
    permuted batch gives the permuted rows (sharded, filtered, with and without q)."""
    tokens, parents, logits, q, num_nodes = _tree_case(bounds)
    local, start = _shard(logits, bounds, rank)
    local_q = _shard(q, bounds, rank)[0]
    seed, offset = STREAMS[0]
    case = _cases(TEMPS, TOP_K, TOP_P, MIN_P)[4]
    for shard_q in (None, local_q):
        batch = _call_tree(tokens, parents, local, start, shard_q, True, case, dict(seed=seed, offset=offset),
                           num_nodes)
        for s in range(N):
            one = slice(s, s + 1)
            kw = {k: v[one] if torch.is_tensor(v) else v for k, v in case.items()}
            alone = _call_tree(tokens[one], parents[one], local[one], start, None if shard_q is None else shard_q[one],
                               True, kw, dict(seed=seed[one], offset=offset[one]), num_nodes[one])
            _same(f"tree_verify sequence {s} alone q={shard_q is not None}", alone, [t[one] for t in batch])
        perm = torch.tensor([4, 0, 5, 2, 1, 3])
        kw = {k: v[perm] if torch.is_tensor(v) else v for k, v in case.items()}
        got = _call_tree(tokens[perm], parents[perm], local[perm], start, None if shard_q is None else shard_q[perm],
                         True, kw, dict(seed=seed[perm], offset=offset[perm]), num_nodes[perm])
        _same(f"tree_verify permuted q={shard_q is not None}", got, [t[perm] for t in batch])


def _check_tree_filter_traffic(rank, bounds):
    """capturable=True with filters: the collectives do not depend on the data (two trees and
    logits of one shape), one more all-gather and filter_cuts' (top-k 8, top-p 8, min-p none) than
    without filters, and the bytes stay O(N M) (without filters far below the logits', V = 4096;
    the cut's histograms are 48 KB a row whatever V: more than this test's 8 KB rows, and than a
    served row's 38 KB shard at V = 151936 over 8 ranks in bf16, but far below that row's 304 KB)."""
    world = len(bounds)
    n, m, v = 4, 6, 4096
    start, end = rank * v // world, (rank + 1) * v // world
    seen = []
    for data in range(2):
        g = torch.Generator().manual_seed(50 + data)
        logits = torch.randn(n, m, v, generator=g)[..., start:end].contiguous()
        q = torch.softmax(torch.randn(n, m, v, generator=g), -1)[..., start:end].contiguous()
        parents = torch.stack([torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, m)])
                               for _ in range(n)])
        tokens = torch.randint(0, v, (n, m), generator=g)
        counts = []
        for filters in ({}, dict(top_k=torch.tensor([5, 0, 50, 1]), top_p=0.9, min_p=torch.tensor([0.0, 0.1, 0, 0]))):
            distributed.traffic.reset()
            distributed.tree_verify(tokens, parents, logits, vocab_start=start, draft_probs=q,
                                    temperature=torch.tensor([1.0, 0.5, 0.0, 2.0]), seed=torch.arange(n),
                                    offset=torch.full((n,), 7), capturable=True, **filters)
            t = distributed.traffic
            counts.append(t.collectives)
            seen.append((t.collectives, t.bytes))
            # Per row: the walk's few numbers; the cut's 256-bucket int64 histograms, 8 rounds each (counts
            # for top-k, 2,048 B a round; masses in two parts for top-p, 4,096 B).
            per_row = 64 + (8 * 2048 + 8 * 4096 if filters else 0)
            assert t.bytes <= per_row * n * m and (filters or 100 * t.bytes < t.logits_bytes), (t.bytes, t.logits_bytes)
        assert counts == [m, m + 8 + 8 + 1], counts
    assert seen[:2] == seen[2:], seen


def _check_a_cut_among_masses_below_2_to_the_minus_31(rank, bounds):
    """A top-p cut that falls among 30,000 tied ids of mass e^-23 each (below 2^-31 of the max's, so a
    31-bit fixed point would drop them all and cut at the max): the exact sums keep what
    filter_mask keeps, ~15,000 of them, on any world size."""
    from xkernels.reference.sampling import filter_mask

    world, v = len(bounds), 30001
    a = torch.full((2, v), -23.0)
    a[0, 7] = a[1, v - 2] = 0.0
    tail = torch.exp(torch.tensor(-23.0)).double() * (v - 1)
    top_p = torch.tensor([(1 + tail / 2) / (1 + tail), (1 + tail / 3) / (1 + tail)], dtype=torch.float32)
    shards = [(v * i // world, v * (i + 1) // world) for i in range(world)]
    local, start = _shard(a, shards, rank)
    cut_value, cut_id = distributed.filter_cuts(local, a.amax(-1), start, None, torch.ones(2, dtype=torch.bool),
                                                None, top_p)
    kept = (a > cut_value[:, None]) | ((a == cut_value[:, None]) & (torch.arange(v) <= cut_id[:, None]))
    for r in range(2):
        want = filter_mask(a[r], 0, float(top_p[r]), 0.0)
        assert 9000 < int(want.sum()) < 16000 and torch.equal(kept[r], want), (r, int(kept[r].sum()), int(want.sum()))


def _check_cuts_do_not_depend_on_the_shards(rank, bounds):
    """filter_cuts gives bitwise the same cuts sharded as this test's world, with an empty shard, and
    whole on one rank (its masses are exact integer sums), without a host read, and keeps what
    reference filter_mask keeps: ties across shard boundaries, -inf ids, a top-k past the finite
    ids, top-p alone and within top-k, min-p; float32, bf16-valued and flat rows; bf16 logits
    scaled per row, with an ignored id."""
    from xkernels.reference.sampling import filter_mask

    world = len(bounds)
    g = torch.Generator().manual_seed(60)
    a = (torch.randn(9, V, generator=g) * 2).round(decimals=1)
    a[1, 5:20] = float("-inf")
    a[2, bounds[0][1] - 1] = a[2, bounds[0][1]] = a[2].max() + 1
    a[7] = a[7].bfloat16().float()
    a[8] = 0.5  # one value: every cut falls among ties
    top_k = torch.tensor([3, 30, 1, 0, 10, 0, 2, 4, 5])
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.7, 0.5, 1.0, 0.9, 0.8, 0.3])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.1, 0.2, 0.0, 0.05, 0.0])
    with_empty = [(0, 0), (0, V)] if world == 2 else [(0, 14), (14, 14), (14, V)]
    whole = [(0, V)] + [(V, V)] * (world - 1)
    logits = (torch.randn(9, V, generator=g) * 3).bfloat16()
    scale = torch.linspace(0.5, 2.0, 9)
    ignore = bounds[0][1]  # the first id of the second shard
    scaled = logits.float() * scale[:, None]
    scaled[:, ignore] = float("-inf")
    for rows, kw, big_m in ((a, {}, a.amax(-1)), (logits, dict(scale=scale, ignore_id=ignore), scaled.amax(-1))):
        cuts = []
        for shards in (bounds, with_empty, whole):
            local, start = _shard(rows, shards, rank)
            with _unread():
                cuts.append(distributed.filter_cuts(local, big_m, start, None, torch.ones(9, dtype=torch.bool),
                                                    top_k, top_p, min_p, **kw))
        for shards, got in zip(("with an empty shard", "whole"), cuts[1:]):
            _same(f"filter_cuts {shards} scaled={bool(kw)}", got, cuts[0])
        b = a if not kw else scaled
        kept = (b > cuts[0][0][:, None]) | ((b == cuts[0][0][:, None]) & (torch.arange(V) <= cuts[0][1][:, None]))
        for r in range(9):
            finite = torch.isfinite(b[r])
            want = filter_mask(b[r], int(top_k[r]), float(top_p[r]), float(min_p[r])) & finite
            assert torch.equal(kept[r] & finite, want), f"filter_cuts scaled={bool(kw)} row {r}"


def _check_bounded_cuts_are_the_rounds(rank, bounds):
    """filter_cuts with top_k_bound (one shard_cut_candidates pass and 1 all-gather) gives bitwise
    the rounds' cuts, top-p within top-k and min-p included, sharded, with an empty shard and whole,
    on rows with ties across shard boundaries, -inf ids, a k past the finite ids, a flat row, bf16
    logits scaled per row with an ignored id; inactive rows may hold any k; a k outside the bound
    raises (on the CPU, where the check costs no sync)."""
    world = len(bounds)
    g = torch.Generator().manual_seed(61)
    a = (torch.randn(7, V, generator=g) * 2).round(decimals=1)
    a[1, 5:20] = float("-inf")
    a[1, 20:] = float("-inf")  # 5 finite ids: a k of 9 keeps them all
    a[2, bounds[0][1] - 1] = a[2, bounds[0][1]] = a[2].max() + 1
    a[6] = 0.5
    top_k = torch.tensor([3, 9, 1, 16, 10, 7, 5])
    top_p = torch.tensor([1.0, 0.9, 0.5, 0.7, 0.5, 0.99, 0.3])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.2, 0.1, 0.0, 0.0])
    active = torch.tensor([True, True, True, True, True, True, False])
    with_empty = [(0, 0), (0, V)] if world == 2 else [(0, 14), (14, 14), (14, V)]
    whole = [(0, V)] + [(V, V)] * (world - 1)
    logits = (torch.randn(7, V, generator=g) * 3).bfloat16()
    scale = torch.linspace(0.5, 2.0, 7)
    ignore = bounds[0][1]
    scaled = logits.float() * scale[:, None]
    scaled[:, ignore] = float("-inf")
    k_inactive = torch.where(active, top_k, 0)  # an inactive row's k is not read
    for rows, kw, big_m in ((a, {}, a.amax(-1)), (logits, dict(scale=scale, ignore_id=ignore), scaled.amax(-1))):
        for filters in ((top_k, None, None), (top_k, top_p, None), (k_inactive, top_p, min_p)):
            for shards in (bounds, with_empty, whole):
                local, start = _shard(rows, shards, rank)
                want = distributed.filter_cuts(local, big_m, start, None, active, *filters, **kw)
                distributed.traffic.reset()
                got = distributed.filter_cuts(local, big_m, start, None, active, *filters, **kw, top_k_bound=16)
                assert distributed.traffic.collectives == 1, distributed.traffic.collectives
                _same(f"bounded filter_cuts {shards} scaled={bool(kw)} top_p={filters[1] is not None}", got, want)
    local, start = _shard(a, bounds, rank)
    for bound, k, message in ((8, top_k, "top_k in \\[1, 8\\], got 9"), (16, torch.where(active, 0, top_k), "got 0"),
                              (0, top_k, "top_k_bound must be in")):
        with pytest.raises(ValueError, match=message):
            distributed.filter_cuts(local, a.amax(-1), start, None, active, k, top_p, top_k_bound=bound)


def _check_top_k_bound_in_every_function(rank, bounds):
    """Each function with filters takes top_k_bound: per-row top_k (0 on greedy rows), top_p and
    min_p give the same outputs with the bound as without, in 15 fewer collectives a cut (the
    rounds' 16 all-reduces become 1 all-gather), reading no tensor on the host beyond the CPU's
    check of the bound."""
    tokens, parents, logits, q, num_nodes = _tree_case(bounds)
    local, start = _shard(logits, bounds, rank)
    local_q = _shard(q, bounds, rank)[0]
    top_k = torch.where(TEMPS > 0, TOP_K.clamp(min=1), 0)
    kw = dict(temperature=TEMPS, top_k=top_k, top_p=TOP_P, min_p=MIN_P, seed=STREAMS[0][0], offset=STREAMS[0][1])
    ctx, prev, prefix, base, weights = _refiner_case(bounds)
    local_base = _shard(base.round(decimals=1), bounds, rank)[0]
    a, b = bounds[rank]
    local_w = weights._replace(emb=weights.emb[a:b].contiguous(), w_read=weights.w_read[a:b].contiguous())
    n = ctx.shape[0]
    refine_kw = {name: t[:n] for name, t in kw.items()}
    block = torch.randint(0, V, (N, M), generator=torch.Generator().manual_seed(63))
    block[:, ::2] = bounds[1][0]
    calls = {
        "tree_verify": lambda **b: distributed.tree_verify(tokens, parents, local, vocab_start=start, draft_probs=local_q,
                                                          num_nodes=num_nodes, capturable=True, **kw, **b),
        "chain_verify": lambda **b: distributed.chain_verify(tokens[:, 1:].clamp(min=0), local, vocab_start=start,
                                                            draft_probs=local_q[:, 1:], method="block", **kw, **b),
        "dllm_step": lambda **b: distributed.dllm_step(local, block, bounds[1][0], vocab_start=start, num_unmask=2,
                                                      **kw, **b),
        "jacobi_refine": lambda **b: distributed.jacobi_refine(ctx, prefix, local_base, local_w, max_iters=2,
                                                              vocab_start=start, capturable=True, **refine_kw, **b),
        "sequential_refine": lambda **b: distributed.sequential_refine(ctx, prefix, local_base, local_w,
                                                                      vocab_start=start, **refine_kw, **b),
    }
    for name, call in calls.items():
        distributed.traffic.reset()
        want = call()
        rounds = distributed.traffic.collectives
        distributed.traffic.reset()
        got = call(top_k_bound=40)
        cuts = rounds - distributed.traffic.collectives
        assert cuts > 0 and cuts % 15 == 0, (name, rounds, distributed.traffic.collectives)
        for i, (x, y) in enumerate(zip(got, want)):  # bitwise, NaNs (dllm_step's confidences) included
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True, msg=f"{name} with top_k_bound: output {i}")


def _cases(temps, top_k, top_p, min_p):
    """Every parameter kind alone with per-sequence temperatures, all as scalars, all as mixed
    tensors, none, and filters under an all-greedy call."""
    return [dict(temperature=temps, top_k=top_k), dict(temperature=temps, top_p=top_p),
            dict(temperature=temps, min_p=min_p), dict(temperature=0.8, top_k=6, top_p=0.8, min_p=0.02),
            dict(temperature=temps, top_k=top_k.flip(0), top_p=top_p, min_p=min_p.flip(0)), dict(temperature=temps),
            dict(temperature=0.0, top_k=2, top_p=0.5)]


def _unfiltered(case):
    return {k: v for k, v in case.items() if k not in ("top_k", "top_p", "min_p")}


def _check_refine_sampling(rank, bounds):
    """refine_step, jacobi_refine (early stop and capturable) and sequential_refine with
    per-sequence parameters and both stream forms: the unsharded ops' tokens, log-probabilities
    within 1e-5; no tensor read on the host but jacobi_refine's stopping flag."""
    ctx, prev, prefix, base, weights = _refiner_case(bounds)
    base = base.round(decimals=1)  # ties at the cuts
    local_base, start = _shard(base, bounds, rank)
    a, b = bounds[rank]
    local_w = weights._replace(emb=weights.emb[a:b].contiguous(), w_read=weights.w_read[a:b].contiguous())
    cases = _cases(torch.tensor([0.9, 0.0, 1.2]), torch.tensor([3, 0, 1]), torch.tensor([0.8, 1.0, 0.5]),
                   torch.tensor([0.05, 0.0, 0.2]))
    streams = [(torch.tensor([5, -2, 2**40]), torch.tensor([3, 0, 2**50])), (4, 2)]
    filters_matter = False
    for i, case in enumerate(cases):
        for seed, offset in streams:
            kw = dict(seed=seed, offset=offset, **case)
            name = f"case {i} per-request={torch.is_tensor(seed)}"
            want = xkernels.refine_step(ctx, prev, base, weights, **kw)
            filters_matter |= not torch.equal(want[0], xkernels.refine_step(ctx, prev, base, weights,
                                                                            **_unfiltered(kw))[0])
            with _unread():
                got = distributed.refine_step(ctx, prev, local_base, local_w, vocab_start=start, **kw)
            _same(f"refine_step {name}", got, want, 1)
            want = xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=3, **kw)
            with _unread(seed, offset) if torch.is_tensor(seed) else contextlib.nullcontext():
                got = distributed.jacobi_refine(ctx, prefix, local_base, local_w, max_iters=3, vocab_start=start, **kw)
            _same(f"jacobi_refine {name}", got, want, 1)
            with _unread():
                got = distributed.jacobi_refine(ctx, prefix, local_base, local_w, max_iters=3, vocab_start=start,
                                                capturable=True, **kw)
            _same(f"jacobi_refine capturable {name}", got, want, 1)
            with _unread():
                got = distributed.sequential_refine(ctx, prefix, local_base, local_w, vocab_start=start, **kw)
            _same(f"sequential_refine {name}", got, xkernels.sequential_refine(ctx, prefix, base, weights, **kw), 1)
    assert filters_matter


def _check_dllm_sampling(rank, bounds):
    """dllm_step with per-sequence parameters and both stream forms (the mask token, the first id
    of shard 1, ties the top of sequence 2 across the boundary: the filters must rank it -inf), at
    several unmasking rules: the unsharded op's outputs, reading no tensor on the host."""
    n, length, mask = 4, 9, bounds[1][0]
    logits = _case_logits(n, length, 61, bounds).round(decimals=1)
    g = torch.Generator().manual_seed(62)
    block = torch.randint(0, V, (n, length), generator=g)
    block[torch.rand(n, length, generator=g) < 0.6] = mask
    block[:, 0] = mask
    local, start = _shard(logits, bounds, rank)
    cases = _cases(torch.tensor([1.0, 0.0, 0.7, 1.3]), torch.tensor([2, 0, 1, 5]), torch.tensor([0.8, 1.0, 0.6, 0.9]),
                   torch.tensor([0.1, 0.0, 0.2, 0.0]))
    streams = [(torch.tensor([3, 9, -4, 2**41]), torch.tensor([0, 18, 5, 2**45])), (4, 2)]
    filters_matter = False
    for i, case in enumerate(cases):
        for (num_unmask, threshold), (seed, offset) in itertools.product(((3, None), (1, 0.2)), streams):
            kw = dict(num_unmask=num_unmask, threshold=threshold, seed=seed, offset=offset, **case)
            want = xkernels.dllm_step(logits, block, mask, **kw)
            filters_matter |= not torch.equal(want[0], xkernels.dllm_step(logits, block, mask, **_unfiltered(kw))[0])
            with _unread():
                got = distributed.dllm_step(local, block, mask, vocab_start=start, **kw)
            _same(f"dllm_step case {i} {num_unmask} {threshold} per-request={torch.is_tensor(seed)}", got, want, 3)
    assert filters_matter


def _chain_case(bounds, k=4):
    """Chains [N, K] over rounded logits (ties at the cuts; _case_logits' NaN row in a sampled
    sequence, the all -inf row, maxima tied across the shard boundaries): most drafts their row's
    best or second-best token (long prefixes, where block and token-wise verification part), some
    random (often outside the cut), the edges of shard 1; q a softened copy of the target (block
    verification recovers prefixes after a rejection only where q resembles p)."""
    logits = _case_logits(N, k + 1, 71, bounds).round(decimals=1)
    g = torch.Generator().manual_seed(72)
    drafts = torch.randint(0, V, (N, k), generator=g)
    for s in range(N):
        for i in range(k):
            if torch.rand(1, generator=g) < 0.75:
                drafts[s, i] = logits[s, i].nan_to_num(-1e9).topk(2).indices[int(torch.rand(1, generator=g) < 0.3)]
    drafts[4, :2] = torch.tensor([bounds[1][0] - 1, bounds[1][0]])
    q = torch.softmax(logits[:, :k].nan_to_num(0.0, 0.0, 0.0) * 0.8 + torch.randn(N, k, V, generator=g), -1)
    return drafts, logits, q


def _check_chain_methods(rank, bounds):
    """chain_verify with method="token" and "block" and return_logprobs, every case of _cases (greedy
    rows among sampled ones, filters, an all-greedy call), with and without q, both stream forms,
    at the shards given and with an empty shard: the unsharded op's accept lengths and tokens,
    log-probabilities within 1e-5, reading no tensor on the host. Some cases accept other lengths
    block-wise than token-wise, so a sharded block that verified token-wise fails here. Block adds
    exactly 1 collective with q (the residual sums), none without; a bad method raises naming it."""
    drafts, logits, q = _chain_case(bounds)
    empty = [(0, 0), (0, V)] if len(bounds) == 2 else [(0, 14), (14, 14), (14, V)]
    methods_differ = False
    for shards in (bounds, empty):
        local, start = _shard(logits, shards, rank)
        local_q = _shard(q, shards, rank)[0]
        for i, case in enumerate(_cases(TEMPS, TOP_K, TOP_P, MIN_P)):
            for (probs, shard_q), (seed, offset) in itertools.product(((None, None), (q, local_q)), STREAMS):
                kw = dict(seed=seed, offset=offset, return_logprobs=True, **case)
                want = {m: xkernels.chain_verify(drafts, logits, draft_probs=probs, method=m, **kw)
                        for m in ("token", "block")}
                methods_differ |= not torch.equal(want["token"][0], want["block"][0])
                collectives = {}
                for method in ("token", "block"):
                    name = f"chain_verify {method} {shards} case {i} q={probs is not None} per-request={torch.is_tensor(seed)}"
                    distributed.traffic.reset()
                    with _unread():
                        got = distributed.chain_verify(drafts, local, vocab_start=start, draft_probs=shard_q,
                                                       method=method, **kw)
                    collectives[method] = distributed.traffic.collectives
                    _same(name, got, want[method], 2)
                    kw_plain = {**kw, "return_logprobs": False}
                    plain = distributed.chain_verify(drafts, local, vocab_start=start, draft_probs=shard_q,
                                                     method=method, **kw_plain)
                    _same(f"{name} without logprobs", plain, want[method][:2])
                sampled = torch.is_tensor(case["temperature"]) or case["temperature"] > 0
                extra = 1 if probs is not None and sampled else 0
                assert collectives["block"] == collectives["token"] + extra, (i, probs is not None, collectives)
    assert methods_differ
    local, start = _shard(logits, bounds, rank)
    with pytest.raises(ValueError, match="method"):
        distributed.chain_verify(drafts, local, vocab_start=start, temperature=1.0, method="tree")


def _check_bad_parameters(rank, bounds):
    """Per-row parameters of the wrong length or device, and scalars out of range, raise naming
    the argument before any collective (every rank alike)."""
    tokens, parents, logits, _, _ = _tree_case(bounds)
    local, start = _shard(logits, bounds, rank)
    call = lambda **kw: distributed.tree_verify(tokens, parents, local, vocab_start=start, **kw)  # noqa: E731
    bad = [(dict(temperature=torch.ones(N + 1)), "temperature must be a scalar or have shape"),
           (dict(temperature=1.0, top_k=torch.ones(N - 1, dtype=torch.int64)), "top_k must be a scalar or have shape"),
           (dict(temperature=1.0, top_p=torch.ones(N, device="meta")), "top_p must be on"),
           (dict(temperature=1.0, top_k=-1), "top_k must be >= 0"),
           (dict(temperature=1.0, top_p=0.0), r"top_p must be in \(0, 1\]"),
           (dict(temperature=1.0, min_p=1.5), r"min_p must be in \[0, 1\]")]
    for kw, message in bad:
        with pytest.raises(ValueError, match=message):
            call(**kw)
    with pytest.raises(RuntimeError, match="offset"):  # the per-request form of another length
        call(temperature=TEMPS, seed=torch.arange(N), offset=torch.arange(N + 1))
    seed, offset = _as_tensors(3, 4)  # the scalar stream as tensors still works, unread
    with _unread():
        got = call(temperature=TEMPS, top_k=TOP_K, seed=seed, offset=offset)
    _same("tree_verify scalar tensor stream", got, xkernels.tree_verify(tokens, parents, logits, temperature=TEMPS,
                                                                        top_k=TOP_K, seed=seed, offset=offset))


def _worker(rank, world, port):
    import os

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for check in (_check_tree_sampling, _check_tree_residual_filtered, _check_tree_alone, _check_tree_filter_traffic,
                      _check_cuts_do_not_depend_on_the_shards, _check_bounded_cuts_are_the_rounds,
                      _check_a_cut_among_masses_below_2_to_the_minus_31, _check_top_k_bound_in_every_function,
                      _check_refine_sampling, _check_dllm_sampling, _check_chain_methods, _check_bad_parameters):
            check(rank, BOUNDS[world])
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_tree_sampling_matches_the_unsharded_op(world):
    mp.spawn(_worker, args=(world, _free_port()), nprocs=world, join=True)
