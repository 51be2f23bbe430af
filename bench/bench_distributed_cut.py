"""The whole-vocabulary cut of xkernels.distributed on one CPU thread (gloo, world size 1): the
sharded tree_verify of N=8 trees of M=5 nodes over V_local=75968 bf16 logits (per-sequence
temperatures, per-request streams), plain and with top_k=50, top_p=0.9 (per-row tensors: the
radix rounds; with top_k_bound=50, or a scalar top_k: shard_cut_candidates); filter_cuts of those
40 rows both ways (16 shard_cut_histogram rounds, or one shard_cut_candidates pass); each round of
shard_cut_histogram along the 50th-ranked key, counts and masses, and shard_cut_candidates, each
beside its torch reference (the ratio). Best of 3 time.perf_counter runs.

A standalone script: python bench/bench_distributed_cut.py (bench/floors.md, shard_row_stats)."""

import os
import socket
import time

import torch
import torch.distributed as dist

from xkernels import distributed, ops, reference
from xkernels.reference.shard_cut import CUT_SHIFTS, cut_rank_keys


def _best(call, reps=3):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    n, m, v = 8, 5, 75968
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(n, m, v, generator=g) * 3).bfloat16()
    parents = torch.tensor([[-1, 0, 0, 1, 1]]).repeat(n, 1)
    tokens = logits.float().argmax(-1).gather(1, parents.clamp(min=0))  # each child its parent's argmax
    tokens[:, 0] = -1
    kw = dict(temperature=torch.ones(n), seed=torch.arange(n), offset=torch.zeros(n, dtype=torch.int64))
    per_row = dict(top_k=torch.full((n,), 50), top_p=torch.full((n,), 0.9))
    for name, extra in (("plain", {}), ("per-row top_k=50, top_p=0.9 (rounds)", per_row),
                        ("per-row top_k=50, top_p=0.9, top_k_bound=50", dict(per_row, top_k_bound=50))):
        t = _best(lambda: distributed.tree_verify(tokens, parents, logits, vocab_start=0, **kw, **extra))
        print(f"tree_verify N={n} M={m} V_local={v} bf16 {name}: {t * 1e3:.1f} ms")
    rows = n * m
    flat = logits.reshape(rows, v)
    scale, row_max = torch.ones(rows), flat.float().amax(-1)
    for name, bound in (("rounds", None), ("top_k_bound=50", 50)):
        t = _best(lambda: distributed.filter_cuts(flat, row_max, 0, None, torch.ones(rows, dtype=torch.bool),
                                                  torch.full((rows,), 50), torch.full((rows,), 0.9), None,
                                                  top_k_bound=bound))
        print(f"filter_cuts {rows} rows bf16 top_k=50 top_p=0.9, {name}: {t * 1e3:.1f} ms")
    for count in (50, 1024):
        line = []
        for name, kw in (("keys", {}), ("keys and masses", dict(row_max=row_max))):
            op = _best(lambda: ops.shard_cut_candidates(flat, scale, count, 0, **kw))
            ref = _best(lambda: reference.shard_cut_candidates(flat, scale, count, 0, **kw))
            line.append(f"{name} {op * 1e3:.2f} ms (reference {ref * 1e3:.0f} ms, {ref / op:.0f}x)")
        print(f"shard_cut_candidates {rows} rows bf16 count {count}: " + ", ".join(line))
    path = cut_rank_keys(flat.float(), torch.arange(v)).sort(1).values[:, 49]
    for shift in CUT_SHIFTS:
        prefix = path >> (shift + 8) if shift < 56 else torch.zeros_like(path)
        line = []
        for name, kw in (("counts", {}), ("masses", dict(row_max=row_max))):
            op = _best(lambda: ops.shard_cut_histogram(flat, scale, prefix, shift, 0, **kw))
            ref = _best(lambda: reference.shard_cut_histogram(flat, scale, prefix, shift, 0, **kw))
            line.append(f"{name} {op * 1e3:.2f} ms (reference {ref * 1e3:.0f} ms, {ref / op:.0f}x)")
        print(f"shard_cut_histogram {rows} rows bf16 shift {shift}: " + ", ".join(line))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
