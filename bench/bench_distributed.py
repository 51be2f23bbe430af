"""Vocabulary-parallel verification on gloo (CPU): bytes each rank sends per call and time,
xkernels.distributed's chain_verify and tree_verify against gathering the logits (all_gather of
the shards, and of q) and running the unsharded op on every rank. V=151936, bfloat16 logits, T=1
with draft probabilities (chain: 2 collectives; tree: up to M with the residual walk's all-reduces,
exactly M with capturable=True) and T=0 (1 collective); chain_verify K=16, N in {1, 16, 64}; tree_verify M=16 (random trees and tokens:
mostly rejected siblings, the walk's worst case), N in {1, 16}.

A standalone script (it spawns its ranks): python bench/bench_distributed.py [--world 2] [--reps 3]
Prints a markdown table. Bytes are the local tensors each rank hands to the collectives (a ring
all-gather sends (W-1)/W of W times that); times are the median over reps on rank 0.
"""

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

K, V = 16, 151936
TREE_NODES, TREE_SIZES = 16, (1, 16)


def _gathered(unsharded, local, q_local, group):
    """The baseline: all-gather the logits (and q) shards, then unsharded(logits, q) on every
    rank. Returns its output and the bytes this rank sent."""
    world = dist.get_world_size(group)
    sent, full = 0, []
    for x in (local, q_local):
        if x is None:
            full.append(None)
            continue
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x, group=group)
        full.append(torch.cat(parts, -1))
        sent += x.numel() * x.element_size()
    return unsharded(*full), sent


def _cases(start, end, sizes):
    """(label, N, T, with q, sharded call, unsharded call(logits, q), local logits, local q)."""
    import xkernels
    from xkernels import distributed

    for n in sizes:
        g = torch.Generator().manual_seed(n)
        drafts = torch.randint(0, V, (n, K), generator=g)
        local = (torch.randn(n, K + 1, end - start, generator=g) * 3).to(torch.bfloat16)
        for temperature, with_q in ((0.0, False), (1.0, True)):
            q_local = torch.rand(n, K, end - start, generator=g) / V if with_q else None
            kw = dict(temperature=temperature, seed=1)
            yield (f"chain_verify K={K}", n, temperature, with_q,
                   lambda: distributed.chain_verify(drafts, local, vocab_start=start, draft_probs=q_local, **kw),
                   lambda full, q: xkernels.chain_verify(drafts, full, draft_probs=q, **kw), local, q_local)
    m = TREE_NODES
    for n in (s for s in sizes if s in TREE_SIZES):
        g = torch.Generator().manual_seed(100 + n)
        parents = torch.stack([torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, m)])
                               for _ in range(n)])
        tokens = torch.randint(0, V, (n, m), generator=g)
        local = (torch.randn(n, m, end - start, generator=g) * 3).to(torch.bfloat16)
        for temperature, with_q in ((0.0, True), (1.0, True)):
            q_local = torch.rand(n, m, end - start, generator=g) / V
            kw = dict(temperature=temperature, seed=1)
            for capturable in (False, True):
                yield (f"tree_verify M={m}" + " capturable" * capturable, n, temperature, with_q,
                       lambda: distributed.tree_verify(tokens, parents, local, vocab_start=start, draft_probs=q_local,
                                                       capturable=capturable, **kw),
                       lambda full, q: xkernels.tree_verify(tokens, parents, full, draft_probs=q, **kw), local, q_local)


def _worker(rank, world, port, sizes, reps, threads):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from xkernels import distributed

    shard = V // world
    start, end = rank * shard, V if rank == world - 1 else (rank + 1) * shard  # the same on every rank
    rows = []
    for label, n, temperature, with_q, sharded, unsharded, local, q_local in _cases(start, end, sizes):
        for impl in ("sharded", "gather logits"):
            times = []
            for rep in range(reps + 1):
                dist.barrier()
                began = time.perf_counter()
                if impl == "sharded":
                    distributed.traffic.reset()
                    out = sharded()
                    sent = distributed.traffic.bytes
                else:
                    out, sent = _gathered(unsharded, local, q_local, None)
                if rep:  # the first is a warm-up
                    times.append(time.perf_counter() - began)
            if impl == "sharded":
                sharded_out = out
            else:
                assert all(torch.equal(a, b) for a, b in zip(out, sharded_out)), f"{label}: the paths disagree"
            rows.append((label, n, temperature, with_q, impl, sent, statistics.median(times)))
    if rank == 0:
        print("| op | N | T | draft_probs | path | bytes sent per rank per call | ms per call |")
        print("|---|---|---|---|---|---|---|")
        for label, n, t, q, impl, sent, sec in rows:
            print(f"| {label} | {n} | {t:g} | {'yes' if q else 'no'} | {impl} | {sent:,} | {1e3 * sec:.1f} |")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(args.world, port, args.sizes, args.reps, args.threads), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
