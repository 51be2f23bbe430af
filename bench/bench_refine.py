"""xPress refinement on the CPU (V=32768, r=256, B=16, D=15): the fused ops against the eager
reference, refine_step against the bare read GEMM of its dtype, Jacobi against the sequential
decode, and the largest single allocation of each. The read against both peers in one run:
`python -m pytest bench_refine.py -k "refine_step and not jacobi"`, or in interleaved rounds (robust to a
busy machine): `python bench/bench_refine.py [--threads 1]`."""

import pytest
import torch

import xkernels
from xkernels import reference
from xkernels.refiner import RefinerWeights

V, R, B, D, H = 32768, 256, 16, 15, 512


def make_inputs(n, dtype, vocab=V):
    g = torch.Generator().manual_seed(0)
    weights = RefinerWeights(
        emb=torch.randn(vocab, R, generator=g) * 0.5, mix=torch.randn(R, B, B, generator=g).tril() * 0.1 + torch.eye(B),
        w_gate=torch.randn(H, R, generator=g) * R**-0.5, w_up=torch.randn(H, R, generator=g) * R**-0.5,
        w_down=torch.randn(R, H, generator=g) * H**-0.5, w_read=torch.randn(vocab, R, generator=g) * R**-0.5,
    ).to(dtype)
    ctx = torch.randn(n, B, R, generator=g)
    base = (torch.randn(n, D, vocab, generator=g) * 3).to(dtype)
    prev = torch.randint(0, vocab, (n, B), generator=g)
    return ctx, prev, base, weights


def largest_allocation(fn):
    """Bytes of the largest single CPU allocation made while fn runs (torch profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0), default=0)


def calls(op, impl, ctx, prev, base, weights, temperature):
    prefix = prev[:, :2]
    if op == "refine_step":
        if impl == "xkernels":
            return lambda: xkernels.refine_step(ctx, prev, base, weights, temperature=temperature, seed=1)
        return lambda: reference.refine_step(ctx, prev, base, weights, temperature, 1)
    if op == "jacobi_refine x4":
        if impl == "xkernels":
            return lambda: xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=4, temperature=temperature)
        return lambda: reference.jacobi_refine(ctx, prefix, base, weights, 4, temperature)
    if op == "refine_step vs bare z @ w_read.T":  # the GEMM the fused read cannot avoid, as the baseline
        if impl == "xkernels":
            return lambda: xkernels.refine_step(ctx, prev, base, weights, temperature=temperature, seed=1)
        # In the weights' dtype: with bfloat16 the vendor's bf16 GEMM (oneDNN, AMX where the CPU has it).
        z = torch.randn(ctx.shape[0] * D, R, generator=torch.Generator().manual_seed(3)).to(weights.w_read.dtype)
        w_read = weights.w_read
        return lambda: z @ w_read.T
    # sequential (15 serial steps, the baseline) against Jacobi with 4 passes, both xkernels
    if impl == "xkernels":
        return lambda: xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=4, temperature=temperature)
    return lambda: xkernels.sequential_refine(ctx, prefix, base, weights, temperature=temperature)


CASES = [(op, n, dtype, 0.0) for op in ["refine_step", "jacobi_refine x4", "sequential vs jacobi x4"]
         for n in (1, 4) for dtype in (torch.float32, torch.bfloat16)] + [("refine_step", 1, torch.float32, 1.0)] + [
    ("refine_step vs bare z @ w_read.T", n, dtype, 0.0) for n in (1, 4) for dtype in (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize("impl", ["xkernels", "reference"])
@pytest.mark.parametrize("op,n,dtype,temperature", CASES)
def bench_refine(benchmark, impl, op, n, dtype, temperature):
    ctx, prev, base, weights = make_inputs(n, dtype)
    fn = calls(op, impl, ctx, prev, base, weights, temperature)
    benchmark.group = f"{op} N={n} {str(dtype).replace('torch.', '')} T={temperature}"
    benchmark.extra_info["impl"] = impl
    benchmark.extra_info["largest_alloc_MB"] = round(largest_allocation(fn) / 2**20, 2)
    benchmark.pedantic(fn, rounds=3 if impl == "reference" and temperature else 8, warmup_rounds=1)


def interleaved(ns=(1, 4), rounds=15):
    """refine_step, the bare read GEMM of its dtype and the eager reference, timed in interleaved
    rounds (each round runs all three in turn, so a busy machine slows them alike, starting with a
    different one each round); medians in ms.
    With one thread the clock is the thread's CPU time, which time spent descheduled on a shared
    machine does not inflate; with more, wall-clock time."""
    import time

    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter

    rows = []
    for n in ns:
        for dtype in (torch.float32, torch.bfloat16):
            ctx, prev, base, weights = make_inputs(n, dtype)
            fns = {name: calls(op, impl, ctx, prev, base, weights, 0.0)
                   for name, op, impl in [("refine_step", "refine_step", "xkernels"),
                                          ("bare GEMM", "refine_step vs bare z @ w_read.T", "reference"),
                                          ("eager reference", "refine_step", "reference")]}
            times = {name: [] for name in fns}
            for fn in fns.values():
                fn()  # warm-up
            order = list(fns.items())
            for r in range(rounds):
                # Each round starts with the next one: whatever runs first finds the caches the eager
                # reference's large temporaries left, and each runs after each of the others alike.
                for name, fn in order[r % len(order):] + order[:r % len(order)]:
                    start = clock()
                    fn()
                    times[name].append(clock() - start)
            med = {name: sorted(t)[len(t) // 2] * 1e3 for name, t in times.items()}
            rows.append((n, str(dtype).replace("torch.", ""), med))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {rounds} interleaved rounds, medians (ms"
          f" of {'thread CPU time' if clock is time.thread_time else 'wall-clock time'})")
    print(f"{'case':<22} {'refine_step':>12} {'bare GEMM':>10} {'eager':>9} {'vs GEMM':>8} {'vs eager':>9}")
    for n, dtype, med in rows:
        ours, gemm, eager = med["refine_step"], med["bare GEMM"], med["eager reference"]
        print(f"{f'N={n} {dtype} T=0':<22} {ours:>12.2f} {gemm:>10.2f} {eager:>9.2f} {ours / gemm:>7.2f}x "
              f"{eager / ours:>8.2f}x")


def orientation(rows=(15, 60, 120), rounds=21):
    """The read's GEMM both ways round, as the CPU op runs it (w_read @ z.T: products id-major) and as
    eager code writes it (z @ w_read.T), interleaved; minimum and median thread CPU time in ms."""
    import time

    g = torch.Generator().manual_seed(0)
    w = torch.randn(V, R, generator=g) * R**-0.5
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, V={V}, r={R}, {rounds} rounds (ms)")
    print(f"{'case':<16} {'z @ w.T min/med':>16} {'w @ z.T min/med':>16} {'ratio of min':>13}")
    for dtype in (torch.float32, torch.bfloat16):
        wd = w.to(dtype)
        for m in rows:
            z = torch.randn(m, R, generator=g).to(dtype)
            fns = [lambda: z @ wd.T, lambda: wd @ z.T]
            times = [[], []]
            for fn in fns:
                fn()
            for r in range(rounds):
                for i in (r % 2, 1 - r % 2):
                    start = time.thread_time()
                    fns[i]()
                    times[i].append(time.thread_time() - start)
            lo = [min(t) * 1e3 for t in times]
            med = [sorted(t)[len(t) // 2] * 1e3 for t in times]
            print(f"{str(dtype).replace('torch.', '') + f' {m} rows':<16} {lo[0]:>7.2f}/{med[0]:<8.2f} "
                  f"{lo[1]:>7.2f}/{med[1]:<8.2f} {lo[0] / lo[1]:>12.2f}x")


def sampling(n=2, rounds=7, vocab=151936):
    """refine_step's per-sequence sampling forms side by side in interleaved rounds (bfloat16, V =
    151936 by default): the scalar form, per-row temperatures (equal and differing) with
    per-request streams, and per-row top_k=50 + top_p=0.9 and top_p=0.9 alone (filtered rows
    leave the fused read); minimum and median thread CPU time in ms."""
    import time

    ctx, prev, base, weights = make_inputs(n, torch.bfloat16, vocab)
    rows = dict(seed=torch.arange(n), offset=torch.zeros(n, dtype=torch.int64))
    forms = {"scalar T=1": dict(temperature=1.0, seed=3),
             "per-row T=1": dict(temperature=torch.ones(n), **rows),
             "per-row T differing": dict(temperature=torch.linspace(0.7, 1.3, n), **rows),
             "top_k=50 top_p=0.9": dict(temperature=torch.ones(n), top_k=torch.full((n,), 50),
                                        top_p=torch.full((n,), 0.9), **rows),
             "top_p=0.9": dict(temperature=torch.ones(n), top_p=torch.full((n,), 0.9), **rows)}
    fns = {name: (lambda kw=kw: xkernels.refine_step(ctx, prev, base, weights, **kw)) for name, kw in forms.items()}
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    order = list(fns.items())
    for r in range(rounds):
        for name, fn in order[r % len(order):] + order[:r % len(order)]:
            start = time.thread_time()
            fn()
            times[name].append(time.thread_time() - start)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, N={n} D={D} V={vocab} r={R} bfloat16, "
          f"{rounds} interleaved rounds (ms of thread CPU time)")
    for name, t in times.items():
        print(f"{name:<22} min {min(t) * 1e3:>9.1f}  median {sorted(t)[len(t) // 2] * 1e3:>9.1f}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=interleaved.__doc__)
    parser.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's choice)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--orientation", action="store_true", help=orientation.__doc__.split(",")[0])
    parser.add_argument("--sampling", action="store_true", help=sampling.__doc__.split(":")[0])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.orientation:
        orientation(rounds=args.rounds)
    elif args.sampling:
        sampling(rounds=args.rounds)
    else:
        interleaved(rounds=args.rounds)
