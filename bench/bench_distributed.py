"""Vocabulary-parallel chain verification on gloo (CPU): bytes each rank sends per call and time,
xkernels.distributed.chain_verify against gathering the logits (all_gather of the shards) and
running the unsharded chain_verify on every rank. K=16, V=151936, bfloat16 logits, T=1 with
draft probabilities (the 2-collective path) and T=0 (1 collective), N in {1, 16, 64}.

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


def _gathered_chain_verify(drafts, local, q_local, temperature, group):
    """The baseline: all-gather the logits (and q) shards, then the unsharded op on every rank."""
    import xkernels

    world = dist.get_world_size(group)
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local, group=group)
    sent = local.numel() * local.element_size()
    q = None
    if q_local is not None:
        q_parts = [torch.empty_like(q_local) for _ in range(world)]
        dist.all_gather(q_parts, q_local, group=group)
        q = torch.cat(q_parts, -1)
        sent += q_local.numel() * q_local.element_size()
    out = xkernels.chain_verify(drafts, torch.cat(parts, -1), draft_probs=q, temperature=temperature, seed=1)
    return out, sent


def _worker(rank, world, port, sizes, reps, threads):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from xkernels import distributed

    shard = V // world
    start, end = rank * shard, V if rank == world - 1 else (rank + 1) * shard  # the same on every rank
    rows = []
    for n in sizes:
        g = torch.Generator().manual_seed(n)
        drafts = torch.randint(0, V, (n, K), generator=g)
        local = (torch.randn(n, K + 1, end - start, generator=g) * 3).to(torch.bfloat16)
        for temperature, with_q in ((0.0, False), (1.0, True)):
            q_local = torch.rand(n, K, end - start, generator=g) / V if with_q else None
            for impl in ("sharded", "gather logits"):
                times = []
                for rep in range(reps + 1):
                    dist.barrier()
                    began = time.perf_counter()
                    if impl == "sharded":
                        distributed.traffic.reset()
                        out = distributed.chain_verify(drafts, local, vocab_start=start, draft_probs=q_local,
                                                       temperature=temperature, seed=1)
                        sent = distributed.traffic.bytes
                    else:
                        out, sent = _gathered_chain_verify(drafts, local, q_local, temperature, None)
                    if rep:  # the first is a warm-up
                        times.append(time.perf_counter() - began)
                if impl == "sharded":
                    sharded_out = out
                else:
                    assert all(torch.equal(a, b) for a, b in zip(out, sharded_out)), "the paths disagree"
                rows.append((n, temperature, with_q, impl, sent, statistics.median(times)))
    if rank == 0:
        print(f"| N | T | draft_probs | path | bytes sent per rank per call | ms per call |")
        print("|---|---|---|---|---|---|")
        for n, t, q, impl, sent, sec in rows:
            print(f"| {n} | {t:g} | {'yes' if q else 'no'} | {impl} | {sent:,} | {1e3 * sec:.1f} |")
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
