"""GPU timings of the xkernels ops beside the peers a user would pick instead, with the bytes each must read.

    python bench/gpu_bench.py [--only SECTION ...] [--json out.jsonl] [--profile] [--no-compile | --compile-only]
    python bench/gpu_bench.py --sanitize SECTION [--racecheck]  the small edge cases of one section, for compute-sanitizer
    python bench/gpu_bench.py --profile-once [--only SECTION ...]  one call of each case, for Nsight Compute
    add --dry-run to any: CPU tensors, tiny shapes, one call a timing (bench/gpu_check.sh --dry-run)

Sections, in the default order (the redesigned kernels first): tree, spiffy, dllm, refine, chain.
Each row reports CUDA-event medians, the op's floor (bytes over the datasheet bandwidth) and its
fraction of the read bandwidth this GPU achieves, measured in the same run (a bfloat16 sum over
4 GiB). Peers: eager PyTorch, for the refine read the bare cuBLAS GEMM of the same shapes, and
(chain, refine) torch.compile of the eager code and, where CuPy is installed, chain_verify timed
again with cupyx.profiler.benchmark (DLPack) as a cross-check of the event timings. Compiling costs
tens of seconds a case, so they are timed at one case a section (chain_verify T=1 with q, refine
N=8), each compile bounded by --compile-bound seconds (a case over it is recorded as skipped);
--no-compile leaves them out and --compile-only times them alone (beside the op, for the ratio).
--profile adds each case's CUDA kernels (torch.profiler). --profile-once runs each case's op once
after warm-up, inside an NVTX range named after the case and cudaProfilerStart/Stop, so that
`ncu --profile-from-start off --nvtx` sees one launch of each kernel and names its case
(bench/ncu_table.py). --json appends one JSON line per row, so sections run as separate processes
(bench/gpu_check.sh) add to one file and a crash in one leaves the others' rows.
"""

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import time

import torch

import xkernels
from xkernels.reference.shard_cut import cut_rank_keys

PEAK_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "B200": 8.0e12, "A100": 2.0e12}

# The estimates of bench/floors.md (H200, microseconds) for the code as it is, printed beside each
# measurement: guesses until a GPU run calibrates them.
ESTIMATE_US = {("chain_verify", 0.0, False): 88, ("chain_verify", 1.0, False): 106, ("chain_verify", 1.0, True): 112,
               ("refine_step", 1): 38, ("refine_step", 8): 58, ("refine_step", 32): 265, ("jacobi_refine", 1): 158,
               ("build_draft_tree",): 15, ("tree_attention_mask",): 5, ("build_draft_tree mask=packed",): 17,
               ("tree_verify", 0.0, None): 14, ("tree_verify", 1.0, None): 42, ("tree_verify", 1.0, "float32"): 140,
               ("tree_verify", 1.0, "bfloat16"): 125,
               ("dllm_step T=0",): 38, ("dllm_step T=1",): 120, ("spiffy_materialize",): 128, ("spiffy_accept",): 500,
               ("spiffy_attention_mask",): 5, ("chain_verify_ragged",): 500, ("chain_verify_ragged block",): 650,
               ("tree_verify mixed",): 170, ("dllm_step T=1 top_k=50 top_p=0.9",): 54,
               ("spiffy_materialize top_k=50 top_p=0.9",): 180, ("refine_step top_k=50 top_p=0.9",): 100,
               ("shard_cut_histogram first round",): 15, ("shard_cut_histogram first round mass",): 18,
               ("shard_cut_histogram later round",): 6, ("shard_cut_pick",): 4, ("shard_cut_candidates",): 20}


def time_events(fn, warmup=25, iters=200):
    """Median microseconds of fn on the current stream, one event pair per call."""
    for _ in range(warmup):
        fn()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs) * 1e3


def time_once(fn, **_):
    """Microseconds of one call on the host: the dry run's and --profile-once's timing, which checks
    the flow, not the speed."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e6


def time_cupy(fn, args):
    try:
        import cupy
        import cupyx.profiler
    except ImportError:
        return None
    cupy_args = [None if a is None else cupy.from_dlpack(a) for a in args]
    result = cupyx.profiler.benchmark(lambda: fn(*cupy_args), n_repeat=200, n_warmup=25)
    return float(cupy.asnumpy(cupy.median(cupy.asarray(result.gpu_times[0])))) * 1e6


def peak_bandwidth():
    name = torch.cuda.get_device_name()
    for key, value in PEAK_BYTES_PER_S.items():
        if key in name:
            return name, value
    return name, None


def achievable_bandwidth(device, nbytes, timer):
    """Bytes per second of a bfloat16 sum over nbytes: the read bandwidth a kernel can reach."""
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    return nbytes / (timer(lambda: x.sum(), warmup=3, iters=20) * 1e-6)


class PeerTimeout(BaseException):
    """A peer's compile ran past the bound (Bench.peer). Not an Exception, so that the compiler's own
    handlers (which wrap Exceptions in theirs) let it through."""


@contextlib.contextmanager
def time_bound(seconds):
    """Raises PeerTimeout in the main thread once `seconds` have passed (SIGALRM): a compile that
    waits on inductor's worker processes is interrupted too."""
    def expire(*_):
        raise PeerTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Bench:
    """Context of one run: the device and shapes (the GPU's, or the dry run's CPU and tiny ones), the
    timer, the bandwidths rows are compared with, and which peers and profiles to take."""

    def __init__(self, profile=False, compile_peers="yes", dry_run=False, once=False, compile_bound=45.0,
                 once_seconds=float("inf")):
        self.dry_run = dry_run
        self.once = once  # --profile-once: each case's op once, for ncu; no extras, no peers
        # ncu writes its report when the program ends: past this, cases are left out, not profiled,
        # so that the program ends before the step's limit kills it and the report with it.
        self.once_deadline = time.monotonic() + once_seconds
        self.device = "cpu" if dry_run else "cuda"
        self.time = time_once if dry_run or once else time_events
        self.name, self.peak = ("cpu (dry run)", None) if dry_run else peak_bandwidth()
        # The rows' fractions need a bandwidth; --profile-once's rows are not timings, so a small sum does.
        size = 1 << 20 if dry_run else 64 << 20 if once else 4 << 30
        self.achievable = achievable_bandwidth(self.device, size, self.time)
        self.profile = profile
        self.compile_peers = compile_peers  # "yes", "no" (--no-compile) or "only" (--compile-only)
        self.compile_bound = compile_bound
        print(f"device: {self.name}; datasheet {self.peak / 1e12 if self.peak else '?'} TB/s; "
              f"achievable read {self.achievable / 1e12:.2f} TB/s (bf16 sum over {size >> 20} MiB)", flush=True)

    def shape(self, full, tiny):
        """The case's shape on the GPU, or the dry run's."""
        return tiny if self.dry_run else full

    @property
    def main(self):
        """Whether to time the op's own rows' extras (eager, cuBLAS, other reads; not the compile peers)."""
        return self.compile_peers != "only" and not self.once

    def peer_case(self, case, peer):
        """Whether to time the torch.compile and CuPy peers at this case: at `peer` only, the one
        case a section they are timed at (a compile costs tens of seconds)."""
        return self.compile_peers != "no" and not self.once and case == peer

    def cases(self, every, peer):
        """The cases to run: `every`, or with --compile-only the peers' case alone."""
        return [peer] if self.compile_peers == "only" else every

    def compile(self, fn):
        # The dry run traces with dynamo but skips inductor's code generation (a C++ compile a graph).
        return torch.compile(fn, backend="eager" if self.dry_run else "inductor")

    def peer(self, fn, **kw):
        """(microseconds, None) of a peer, or (None, why) where it fails, as torch.compile may, or where
        its first call (the compile) takes over compile_bound seconds: never fatal."""
        try:
            with time_bound(self.compile_bound):
                fn()
            return round(self.time(fn, **kw), 1), None
        except PeerTimeout:
            torch._dynamo.reset()  # drop the half-made compile
            why = f"skipped: first call (compile) over {self.compile_bound:g} s"
        except Exception as e:  # noqa: BLE001
            why = f"failed: {e!r}"[:400]
        print(f"peer {why}", flush=True)
        return None, why

    def graphed(self, fn):
        """fn captured in a CUDA graph, as its replay (the dry run: fn itself), to time a call without
        the host's launches beside the eager timing."""
        if self.dry_run:
            return fn
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (cuBLAS's workspace, lazy state)
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay

    def cupy(self, fn, args):
        return None if self.dry_run else time_cupy(fn, args)

    def bandwidth(self, row, bytes_moved, us, prefix=""):
        """Adds the floor (datasheet) and the fraction of the achievable bandwidth reached."""
        row[prefix + "bytes"] = bytes_moved
        row[prefix + "floor_us"] = None if self.peak is None else round(bytes_moved / self.peak * 1e6, 1)
        row[prefix + "achievable_us"] = round(bytes_moved / self.achievable * 1e6, 1)
        row[prefix + "fraction_of_achievable"] = round(bytes_moved / (us * 1e-6) / self.achievable, 3)

    def kernels(self, fn, calls=5):
        """The kernels one call of fn launches, with their time per call (torch.profiler; the dry
        run's CPU ops)."""
        from torch.profiler import ProfilerActivity, profile

        cuda = self.device == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        for _ in range(3):
            fn()
        sync()
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                fn()
            sync()
        total = (lambda e: e.device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
        rows = sorted(((total(e) / calls, e.count // calls, e.key) for e in prof.key_averages() if total(e) > 0),
                      reverse=True)
        return [f"{t:.1f} us x{c} {k[:90]}" for t, c, k in rows[:6]]

    def profile_once(self, label, fn):
        """fn once after warm-up, inside an NVTX range `label` and cudaProfilerStart/Stop: what
        `ncu --profile-from-start off --nvtx` profiles, each kernel named with its case."""
        if time.monotonic() > self.once_deadline:
            print(f"left out (--profile-seconds): {label}", flush=True)
            return
        for _ in range(2):  # lazy state and workspaces out of the profiled call
            fn()
        cuda = self.device == "cuda"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(label.replace(":", ";"))  # ncu's CSV separates its fields with ':'
            torch.cuda.profiler.start()
        fn()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            torch.cuda.nvtx.range_pop()
        print(f"profiled once: {label}", flush=True)

    def emit(self, results, row, fn=None):
        if self.once:
            sampling = ["T=" + str(row["temperature"])] if "temperature" in row else []
            q = row.get("draft_probs")  # True, or the dtype's name where a case runs several
            sampling += ["with q" if q is True else f"with {q} q"] if q else []
            return self.profile_once(" ".join([row["op"], row["shape"], *sampling]), fn)
        if self.profile and fn is not None:
            row["kernels"] = self.kernels(fn)
        results.append(row)
        print(json.dumps(row), flush=True)


def chain_verify_inputs(n, k, v, dtype, temperature, with_q, seed=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    logits = (torch.randn(n, k + 1, v, device=device, generator=g) * 4).to(dtype)
    if temperature == 0:
        drafts = torch.randint(0, v, (n, k), device=device, generator=g)
        agree = torch.rand(n, k, device=device, generator=g) < 0.8
        return torch.where(agree, logits[:, :k].float().argmax(-1), drafts), logits, None
    q = torch.softmax((logits[:, :k].float() + torch.randn(n, k, v, device=device, generator=g) * 0.5) / temperature, -1)
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(n, k)
    return drafts, logits, q if with_q else None


def eager_chain_verify(drafts, logits, q, temperature):
    """What one writes in eager PyTorch (vLLM-style): fp32 softmax of every row, then the test."""
    k = drafts.shape[1]
    if temperature == 0:
        top = logits.argmax(-1)
        accept_len = (drafts == top[:, :k]).long().cumprod(-1).sum(-1)
        return accept_len, top.gather(1, accept_len[:, None])
    p = torch.softmax(logits.float() / temperature, -1)
    p_x = p[:, :k].gather(-1, drafts[..., None])[..., 0]
    q_x = q.gather(-1, drafts[..., None])[..., 0] if q is not None else torch.ones_like(p_x)
    u = torch.rand_like(p_x)
    accept_len = (u * q_x < p_x).long().cumprod(-1).sum(-1)
    row = p.gather(1, accept_len[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0]
    if q is not None:
        q_row = torch.cat([q, torch.zeros_like(q[:, :1])], 1).gather(
            1, accept_len[:, None, None].expand(-1, 1, q.shape[-1]))[:, 0]
        row = (row - q_row).clamp_min(0)
    return accept_len, torch.multinomial(row, 1)


def bench_chain_verify(results, bench):
    n, k, v = bench.shape((64, 16, 151936), (2, 3, 97))
    every, peer = [(0.0, False), (1.0, False), (1.0, True)], (1.0, True)
    for temperature, with_q in bench.cases(every, peer):
        drafts, logits, q = chain_verify_inputs(n, k, v, torch.bfloat16, temperature, with_q, device=bench.device)
        op = lambda d, l, qq: xkernels.chain_verify(d, l, draft_probs=qq, temperature=temperature, seed=1)  # noqa: E731
        ours = bench.time(lambda: op(drafts, logits, q))
        row = dict(op="chain_verify", shape=f"N={n} K={k} V={v} bf16", temperature=temperature,
                   draft_probs=with_q, us=round(ours, 1))
        if bench.main:
            eager = bench.time(lambda: eager_chain_verify(drafts, logits, q, temperature))
            accept_len, _ = op(drafts, logits, q)
            # The design reads every target row once, then (T > 0) one row per sequence again (and its q row).
            read = n * (k + 1) * v * 2 + (n * v * (2 + (4 if with_q else 0)) if temperature > 0 else 0)
            row.update(mean_accept_len=round(accept_len.float().mean().item(), 2), eager_us=round(eager, 1),
                       speedup_vs_eager=round(eager / ours, 2),
                       h200_estimate_us=ESTIMATE_US[("chain_verify", temperature, with_q)])
            bench.bandwidth(row, read, ours)
        if bench.peer_case((temperature, with_q), peer):
            eager_compiled = bench.compile(eager_chain_verify)
            compiled_us, why = bench.peer(lambda: eager_compiled(drafts, logits, q, temperature), warmup=3, iters=100)
            cupy_us = bench.cupy(op, [drafts, logits, q])
            row.update(compiled_eager_us=compiled_us, compiled_note=why,
                       speedup_vs_compiled=None if compiled_us is None else round(compiled_us / ours, 2),
                       cupy_us=None if cupy_us is None else round(cupy_us, 1))
        bench.emit(results, row, lambda: op(drafts, logits, q))


def ragged_inputs(counts, v, dtype, seed=0, device="cuda"):
    """vLLM's flat layout for requests of `counts` drafts (drawn from q), per-request parameters
    mixing greedy, plain, top-k 50 and top-p 0.9 rows, per-request seeds and offsets."""
    g = torch.Generator(device=device).manual_seed(seed)
    n = len(counts)
    sizes = torch.tensor(counts, dtype=torch.int64, device=device)
    cu = sizes.cumsum(0)
    t = sum(counts)
    logits = (torch.randn(t + n, v, device=device, generator=g) * 4).to(dtype)
    rows = torch.arange(t, device=device) + torch.repeat_interleave(torch.arange(n, device=device), sizes)
    q = torch.softmax(logits[rows].float() + torch.randn(t, v, device=device, generator=g) * 0.5, -1)
    drafts = torch.multinomial(q, 1, generator=g)[:, 0]
    kind = torch.arange(n, device=device) % 4
    params = dict(temperature=torch.where(kind == 0, 0.0, 1.0).float(), top_k=torch.where(kind == 2, 50, 0),
                  top_p=torch.where(kind == 3, 0.9, 1.0).float(), seed=torch.arange(n, device=device),
                  offset=torch.full((n,), 1000, device=device))
    return drafts, cu, logits, q, params


def bench_chain_ragged(results, bench):
    """chain_verify_ragged, vLLM's layout: N=64 requests of 0-16 drafts, mixed per-request parameters."""
    n, v = bench.shape((64, 151936), (4, 97))
    counts = [(5 * i) % 17 for i in range(n)]
    drafts, cu, logits, q, params = ragged_inputs(counts, v, torch.bfloat16, device=bench.device)
    width = max(counts) + 1
    for method, name in (("token", "chain_verify_ragged"), ("block", "chain_verify_ragged block")):
        fn = lambda: xkernels.chain_verify_ragged(drafts, cu, logits, max_spec_len=width - 1, draft_probs=q,  # noqa: E731
                                                  method=method, **params)
        time_cases(results, bench, [(name, f"N={n} T={sum(counts)} V={v} bf16 mixed top-k/top-p", fn,
                                     (sum(counts) + n) * v * 2, {})])


def refine_inputs(n, b, v, r, h, dtype=torch.bfloat16, seed=0, device="cuda"):
    from xkernels.refiner import RefinerWeights

    g = torch.Generator(device=device).manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, device=device, generator=g)  # noqa: E731
    weights = RefinerWeights(emb=rand(v, r) * 0.5, mix=rand(r, b, b).tril() * 0.1 + torch.eye(b, device=device),
                             w_gate=rand(h, r) * r**-0.5, w_up=rand(h, r) * r**-0.5, w_down=rand(r, h) * h**-0.5,
                             w_read=rand(v, r) * r**-0.5).to(dtype)
    ctx = rand(n, b, r)
    base = (rand(n, b - 1, v) * 3).to(dtype)
    prev = torch.randint(0, v, (n, b), device=device, generator=g)
    return ctx, prev, base, weights


@contextlib.contextmanager
def forced_env(name, value):
    """Environment variable `name` set to `value` (the ops read XKERNELS_REFINE_READ and
    XKERNELS_TREE_CLUSTERS at each call), restored after."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name)
        if saved is not None:
            os.environ[name] = saved


def refine_read(read):
    """The refine read forced to `read` (XKERNELS_REFINE_READ)."""
    return forced_env("XKERNELS_REFINE_READ", read)


def refine_reads(fn, timer, **kw):
    """{read: (microseconds, result)} of fn with the refine read forced to the cuBLAS GEMM and to the
    fused kernel."""
    out = {}
    for read in ("gemm", "fused"):
        with refine_read(read):
            out[read] = (round(timer(fn, **kw), 1), fn())
    return out


def bench_refine(results, bench):
    from xkernels import reference

    b, v, r, h = bench.shape((16, 151936, 256, 512), (4, 97, 16, 32))
    peer_n = bench.shape(8, 2)
    for n in bench.cases(bench.shape((1, 8, 32), (1, 2)), peer_n):
        ctx, prev, base, weights = refine_inputs(n, b, v, r, h, device=bench.device)
        prefix = prev[:, :2].contiguous()
        step_fn = lambda: xkernels.refine_step(ctx, prev, base, weights)  # noqa: E731
        step = bench.time(step_fn)
        row = dict(op="refine_step / jacobi_refine", shape=f"N={n} B={b} V={v} r={r} bf16", pass_us=round(step, 1))
        if bench.main:
            jacobi = bench.time(lambda: xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=4), iters=50)
            sequential = bench.time(lambda: xkernels.sequential_refine(ctx, prefix, base, weights), iters=50)
            eager = bench.time(lambda: reference.refine_step(ctx, prev, base, weights), iters=50)
            # The bare read: cuBLAS's product of the drafted rows' z with w_read, no epilogue; and the form
            # the op's read runs (float32 products of bfloat16 operands).
            z = torch.randn(n * (b - 1), r, device=bench.device, dtype=weights.w_read.dtype)
            gemm = bench.time(lambda: z @ weights.w_read.T)
            gemm_fp32_out = bench.peer(lambda: torch.mm(z, weights.w_read.T, out_dtype=torch.float32))[0]
            iters = xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=4)[2]
            # Both reads side by side (pass_us above: the one the plan picks); at T=0 their tokens
            # differ only where two logits lie within float32 accumulation-order rounding.
            step_reads = refine_reads(step_fn, bench.time)
            # The cuBLAS read's pass eager (a GEMM and an epilogue launch a slice from the host) and
            # replayed from a CUDA graph (the GPU's time alone): their gap is the host's cost.
            with refine_read("gemm"):
                step_gemm_graph = bench.graphed(step_fn)
            step_gemm_graph_us = round(bench.time(step_gemm_graph), 1)
            jacobi_reads = refine_reads(lambda: xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=4),
                                        bench.time, iters=50)
            floor_bytes = v * r * 2 + n * (b - 1) * v * 2  # w_read once, the base logits once
            row.update(pass_gemm_read_us=step_reads["gemm"][0], pass_fused_read_us=step_reads["fused"][0],
                       pass_reads_same_tokens=round((step_reads["gemm"][1][0] == step_reads["fused"][1][0])
                                                    .float().mean().item(), 4),
                       pass_gemm_read_graph_us=step_gemm_graph_us,
                       jacobi4_gemm_read_us=jacobi_reads["gemm"][0], jacobi4_fused_read_us=jacobi_reads["fused"][0],
                       pass_h200_estimate_us=ESTIMATE_US.get(("refine_step", n)),
                       cublas_read_gemm_us=round(gemm, 1), cublas_read_gemm_fp32_out_us=gemm_fp32_out,
                       pass_vs_gemm=round(step / gemm, 2), jacobi4_us=round(jacobi, 1),
                       jacobi4_h200_estimate_us=ESTIMATE_US.get(("jacobi_refine", n)),
                       jacobi4_mean_passes=round(iters.float().mean().item(), 2),
                       sequential15_us=round(sequential, 1), eager_reference_pass_us=round(eager, 1),
                       speedup_pass_vs_eager=round(eager / step, 2))
            bench.bandwidth(row, floor_bytes, step, prefix="pass_")
            bench.bandwidth(row, floor_bytes, step_reads["fused"][0], prefix="pass_fused_read_")
            if n == peer_n:  # per-request filters: filtered_pick_kernel after the pass (floors.md, refine)
                filtered = per_request_filters(n, bench.device)
                row.update(pass_top_k50_top_p09_us=round(
                               bench.time(lambda: xkernels.refine_step(ctx, prev, base, weights, **filtered)), 1),
                           pass_top_k50_top_p09_h200_estimate_us=ESTIMATE_US[("refine_step top_k=50 top_p=0.9",)])
        if bench.peer_case(n, peer_n):
            ref_compiled = bench.compile(reference.refine_step)
            compiled_us, why = bench.peer(lambda: ref_compiled(ctx, prev, base, weights), warmup=3, iters=50)
            row.update(compiled_reference_pass_us=compiled_us, compiled_note=why,
                       speedup_pass_vs_compiled=None if compiled_us is None else round(compiled_us / step, 2))
        bench.emit(results, row, step_fn)


def tree_inputs(n, budget, v, dtype, seed=0, device="cuda"):
    """A best-first tree over random marginals, target logits at every node with the argmax
    planted on most first children (walks of a few nodes), and children's draft distributions."""
    g = torch.Generator(device=device).manual_seed(seed)
    lp, tok = torch.randn(n, 15, v, device=device, generator=g).log_softmax(-1).topk(8, -1)
    tokens, parents, num_nodes, _ = xkernels.build_draft_tree(lp.contiguous(), tok.contiguous(), budget)
    m = budget + 1
    logits = torch.randn(n, m, v, device=device, generator=g) * 4
    rows = torch.arange(n, device=device)
    for i in range(1, m):
        p = parents[:, i]
        first = (parents[:, 1:i] == p[:, None]).sum(-1) == 0
        plant = first & (torch.rand(n, device=device, generator=g) < 0.8)
        logits[rows[plant], p[plant], tokens[plant, i]] = 100.0
    q = torch.softmax(logits + torch.randn(n, m, v, device=device, generator=g), -1)
    return lp.contiguous(), tok.contiguous(), tokens, parents, logits.to(dtype), q


def bench_tree(results, bench):
    n, budget, v = bench.shape((64, 63, 151936), (2, 6, 97))
    m = budget + 1
    lp, tok, tokens, parents, logits, q = tree_inputs(n, budget, v, torch.bfloat16, device=bench.device)

    def two_calls():  # what build_draft_tree(mask=) replaces
        tree = xkernels.build_draft_tree(lp, tok, budget)
        return xkernels.tree_attention_mask(tree[1], num_nodes=tree[2], layout="packed")

    cases = [("build_draft_tree", lambda: xkernels.build_draft_tree(lp, tok, budget), ("build_draft_tree",)),
             ("tree_attention_mask packed", lambda: xkernels.tree_attention_mask(parents, layout="packed"),
              ("tree_attention_mask",)),
             ("build_draft_tree mask=packed", lambda: xkernels.build_draft_tree(lp, tok, budget, mask="packed"),
              ("build_draft_tree mask=packed",))]
    for name, fn, est in cases:
        row = dict(op=name, shape=f"N={n} budget={budget}", us=round(bench.time(fn), 1),
                   h200_estimate_us=ESTIMATE_US[est])
        if name == "build_draft_tree mask=packed" and bench.main:  # the two calls in the same run
            two = bench.time(two_calls)
            row.update(two_calls_us=round(two, 1), one_op_vs_two_calls=round(row["us"] / two, 2))
        bench.emit(results, row, fn)
    # Draft probabilities in float32 and in bfloat16 (an EAGLE drafter's dtype, read as it is).
    for temperature, q_dtype in [(0.0, None), (1.0, None), (1.0, torch.float32), (1.0, torch.bfloat16)]:
        qq = None if q_dtype is None else q.to(q_dtype)
        op = lambda: xkernels.tree_verify(tokens, parents, logits, draft_probs=qq, temperature=temperature, seed=1)  # noqa: E731
        us = bench.time(op, iters=50)
        with forced_env("XKERNELS_TREE_CLUSTERS", "0"):  # a block a sequence, in the same run
            alone = bench.time(op, iters=50)
        accept_len, _, _ = op()
        visited = (accept_len + 1).sum().item()
        # Every visited row once, plus (draft_probs) its q row and residual passes (at least one).
        read = visited * v * (2 + (0 if qq is None else qq.element_size() * 3))
        with_q = None if qq is None else str(q_dtype).removeprefix("torch.")
        row = dict(op="tree_verify", shape=f"N={n} M={m} V={v} bf16", temperature=temperature, draft_probs=with_q,
                   mean_accept_len=round(accept_len.float().mean().item(), 2), us=round(us, 1),
                   block_a_sequence_us=round(alone, 1), vs_block_a_sequence=round(us / alone, 2),
                   h200_estimate_us=ESTIMATE_US[("tree_verify", temperature, with_q)])
        bench.bandwidth(row, read, us)
        bench.emit(results, row, op)
    # Per-request parameters mixed in the batch (greedy rows, each filter), per-request streams: the
    # walk cuts each row it visits (one selection pass from L2 beyond its read; bench/floors.md).
    kinds = torch.arange(n, device=bench.device) % 4
    mixed = dict(temperature=torch.tensor([0.0, 1.0, 0.7, 1.0], device=bench.device)[kinds],
                 top_k=torch.tensor([0, 50, 0, 20], device=bench.device)[kinds],
                 top_p=torch.tensor([1.0, 1.0, 0.9, 0.8], device=bench.device)[kinds],
                 min_p=torch.tensor([0.0, 0.0, 0.0, 0.05], device=bench.device)[kinds],
                 seed=torch.arange(n, device=bench.device), offset=torch.zeros(n, dtype=torch.int64, device=bench.device))
    op = lambda: xkernels.tree_verify(tokens, parents, logits, draft_probs=q, **mixed)  # noqa: E731
    us = bench.time(op, iters=50)
    with forced_env("XKERNELS_TREE_CLUSTERS", "0"):  # a block a sequence, in the same run
        alone = bench.time(op, iters=50)
    accept_len, _, _ = op()
    visited = (accept_len + 1).sum().item()
    row = dict(op="tree_verify mixed", shape=f"N={n} M={m} V={v} bf16", draft_probs=True,
               mean_accept_len=round(accept_len.float().mean().item(), 2), us=round(us, 1),
               block_a_sequence_us=round(alone, 1), vs_block_a_sequence=round(us / alone, 2),
               h200_estimate_us=ESTIMATE_US[("tree_verify mixed",)])
    bench.bandwidth(row, visited * v * (2 + 4 * 3), us)  # as the T=1 draft_probs row's floor
    bench.emit(results, row, op)


def spiffy_inputs(n, length, v, dtype, masked=24, seed=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    logits = (torch.randn(n, length, v, device=device, generator=g) * 3).to(dtype)
    block = torch.randint(2, v, (n, length), device=device, generator=g)
    block[:, torch.randperm(length, device=device, generator=g)[:masked]] = 1
    return logits, block


def per_request_filters(n, device):
    """Temperature 1 with per-row top_k=50 and top_p=0.9, and a stream per sequence."""
    return dict(temperature=torch.ones(n, device=device), top_k=torch.full((n,), 50, device=device),
                top_p=torch.full((n,), 0.9, device=device), seed=torch.arange(n, device=device),
                offset=torch.zeros(n, dtype=torch.int64, device=device))


def time_cases(results, bench, cases, iters=100):
    """Rows of (name, shape, fn, bytes moved, extra fields) cases: the time, the estimate, the bandwidth."""
    for name, shape, fn, moved, extra in cases:
        us = bench.time(fn, iters=iters)
        row = dict(op=name, shape=shape, us=round(us, 1), h200_estimate_us=ESTIMATE_US[(name,)], **extra)
        bench.bandwidth(row, moved, us)
        bench.emit(results, row, fn)


def bench_dllm(results, bench):
    """dllm_step at LLaDA's vocabulary (126464) and block (32), 24 of 32 positions masked, bfloat16 logits."""
    n, length, v, masked = bench.shape((16, 32, 126464, 24), (2, 8, 97, 5))
    logits, block = spiffy_inputs(n, length, v, torch.bfloat16, masked=masked, device=bench.device)
    rows_bytes = int((block == 1).sum()) * v * 2  # every masked row once
    shape = f"N={n} L={length} V={v} bf16"
    filtered = per_request_filters(n, bench.device)
    time_cases(results, bench, [
        ("dllm_step T=0", shape, lambda: xkernels.dllm_step(logits, block, 1), rows_bytes, {}),
        ("dllm_step T=1", shape, lambda: xkernels.dllm_step(logits, block, 1, temperature=1.0, seed=1), rows_bytes,
         {}),
        # Per-request filters and streams: dllm_filtered_kernel picks those rows (bench/floors.md, dllm_step).
        ("dllm_step T=1 top_k=50 top_p=0.9", shape, lambda: xkernels.dllm_step(logits, block, 1, **filtered),
         rows_bytes, {})])


def bench_spiffy(results, bench):
    """The Spiffy ops at LLaDA's vocabulary (126464) and block (32), bfloat16 logits, the shipped
    graph. accept: keep=16 drafts whose logits equal the root's (deep walks), at V=32768."""
    from xkernels.spiffy import shipped_graph

    n, length, v, small_v, keep, masked, prefix = bench.shape((16, 32, 126464, 32768, 16, 24, 1024),
                                                              (2, 8, 97, 61, 3, 5, 9))
    # The dry run's block (8) is shorter than the graph's deepest position rank: keep the nodes inside it.
    graph = graph_within(shipped_graph(), length, small_v, bench.device)
    logits, block = spiffy_inputs(n, length, v, torch.bfloat16, masked=masked, device=bench.device)
    root, block2 = spiffy_inputs(n, length, small_v, torch.bfloat16, masked=masked, seed=1, device=bench.device)
    drafts, node_ids, _ = xkernels.spiffy_materialize(root, block2, 1, graph, keep=keep)
    draft_logits = root[:, None].expand(n, keep, length, small_v).contiguous()
    steps = xkernels.spiffy_accept(root, draft_logits, drafts, node_ids, block2, 1, seed=1)[0]
    # each step reads the masked rows of the node it stands on (masked, masked - 1, ...)
    accept_bytes = sum(sum(masked - t for t in range(int(s))) for s in steps.tolist()) * small_v * 2
    lens = torch.full((n,), prefix, device=bench.device)
    filtered = {key: x for key, x in per_request_filters(n, bench.device).items() if key not in ("seed", "offset")}
    time_cases(results, bench, [
        ("spiffy_materialize", f"N={n} L={length} V={v} bf16 keep={keep}",
         lambda: xkernels.spiffy_materialize(logits, block, 1, graph, keep=keep),
         int((block == 1).sum()) * v * 2, {}),
        # Per-sequence filters: spiffy_filtered_rows_kernel reads those rows (bench/floors.md, Spiffy).
        ("spiffy_materialize top_k=50 top_p=0.9", f"N={n} L={length} V={v} bf16 keep={keep}",
         lambda: xkernels.spiffy_materialize(logits, block, 1, graph, keep=keep, **filtered),
         int((block == 1).sum()) * v * 2, {}),
        ("spiffy_accept", f"N={n} L={length} V={small_v} bf16 keep={keep}",
         lambda: xkernels.spiffy_accept(root, draft_logits, drafts, node_ids, block2, 1, temperature=1.0, seed=1),
         accept_bytes, dict(mean_steps=round(steps.float().mean().item(), 2))),
        ("spiffy_attention_mask", f"N={n} L={length} keep={keep} prefix={prefix}",
         lambda: xkernels.spiffy_attention_mask(keep, length, lens, max_prefix_len=prefix, layout="packed"),
         n * (1 + keep) * length * (prefix + (1 + keep) * length) // 8, {})])


def bench_shard(results, bench):
    """shard_cut_histogram at one rank's shard of Qwen's vocabulary over 8 ranks (151936 / 8 = 18992
    ids), the 40 rows of 8 trees of 5 nodes, bfloat16: the first round (every id a candidate, most in
    a few buckets), with masses, and a later one (a few candidates); the pick between two rounds;
    shard_cut_candidates of 50 keys and masses (a bounded top-k of 50 with top-p: its whole cut)."""
    rows, v = bench.shape((40, 18992), (3, 61))
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, v, generator=g) * 3).bfloat16().to(bench.device)
    scale = torch.ones(rows, device=bench.device)
    row_max = logits.float().amax(-1)
    keys = cut_rank_keys(logits.float().cpu(), torch.arange(v))
    later = (keys.sort(1).values[:, 49] >> 24).to(bench.device)  # the 50th-ranked key's prefix at shift 16
    zero = torch.zeros(rows, dtype=torch.int64, device=bench.device)
    shape, moved = f"R={rows} V_local={v} bf16", rows * v * 2
    hist = xkernels.shard_cut_histogram(logits, scale, zero, 56, 0, row_max=row_max)
    before = torch.zeros(rows, 2, dtype=torch.int64, device=bench.device)
    target = torch.full((rows,), 0.9 * 2.0**62, dtype=torch.float64, device=bench.device)
    time_cases(results, bench, [
        ("shard_cut_histogram first round", shape, lambda: xkernels.shard_cut_histogram(logits, scale, zero, 56, 0),
         moved, {}),
        ("shard_cut_histogram first round mass", shape,
         lambda: xkernels.shard_cut_histogram(logits, scale, zero, 56, 0, row_max=row_max), moved, {}),
        ("shard_cut_histogram later round", shape,
         lambda: xkernels.shard_cut_histogram(logits, scale, later, 16, 0, row_max=row_max), moved, {}),
        ("shard_cut_pick", f"R={rows} P=2", lambda: xkernels.shard_cut_pick(hist, zero, before, target),
         rows * 2 * 256 * 8, {}),
        ("shard_cut_candidates", shape + " count=50",
         lambda: xkernels.shard_cut_candidates(logits, scale, 50, 0, row_max=row_max), moved, {})])


# Edge cases that must stay memory-safe, per section: odd and tiny V, K=0, N=0, bad ids, degenerate rows.
# Each section runs in its own process under compute-sanitizer, so one that dies leaves the others.
# racecheck=True: the cases for racecheck, which looks at shared memory only and costs far more a
# launch than memcheck: bfloat16 logits alone (the dtype changes the loads, not the shared-memory
# code), and in the refine section the fused read alone, so that no cuBLAS GEMM runs under it (the
# H200 run of 2026-12-04: racecheck failed inside sequential_refine's cuBLAS call, a kernel its
# --kernel-name filter was to leave alone; float32 weights always take cuBLAS's SGEMM).
# Each takes the device, so that tests/test_gpu_check.py runs every case on the CPU: a case that is
# not valid fails CI there instead of a GPU window.

def expect_error(match, fn):
    """fn() must raise a RuntimeError whose message matches `match` (an argument check, before any launch)."""
    try:
        fn()
    except RuntimeError as e:
        if not re.search(match, str(e)):
            raise AssertionError(f"expected an error matching {match!r}, got: {e}") from e
        return
    raise AssertionError(f"expected an error matching {match!r}; nothing was raised")


def run_case(device, fn, corrupt=None, match=None):
    """fn() on a case's inputs. corrupt() writes ids or parents out of range into them: on CUDA, whose
    ops check values only under XKERNELS_CHECK=1, fn() then runs on the corrupted inputs, which the
    kernels must survive memory-safely; the CPU ops always check values, so there fn() runs on the
    clean inputs and must then refuse the corrupted ones with the message `match`."""
    if corrupt is None:
        return fn()
    if device == "cpu" or os.environ.get("XKERNELS_CHECK", "0") not in ("", "0"):
        fn()
        corrupt()
        return expect_error(match, fn)
    corrupt()
    return fn()


def dtypes(racecheck, *every):
    """The logits' dtypes a sanitizer case runs: all, or under racecheck bfloat16 alone."""
    return (torch.bfloat16,) if racecheck else every


CHAIN_CASES = ((3, 4, 7), (2, 0, 5), (0, 3, 9), (0, 0, 9), (5, 16, 4099), (2, 2, 1))  # N, K, V


def sanitize_chain(device="cuda", cases=CHAIN_CASES, racecheck=False):
    for n, k, v in cases:
        for dtype in dtypes(racecheck, torch.float32, torch.bfloat16, torch.float16):
            for temperature, with_q in [(0.0, False), (1.0, False), (0.7, True)]:
                drafts, logits, q = chain_verify_inputs(n, k, v, dtype, temperature, True, device=device)
                if n:
                    logits[0, 0] = float("nan")
                    logits[-1, 0] = float("-inf")

                def corrupt():
                    drafts[0, 0] = -5
                    drafts[-1, -1] = v + 100

                run_case(device, lambda: xkernels.chain_verify(drafts, logits, draft_probs=q if with_q else None,
                                                               temperature=temperature),
                         corrupt if n and k else None, "draft_tokens holds ids outside")


RAGGED_CASES = (([2, 0, 3], 37), ([0], 5), ([], 9), ([4, 1], 4099), ([1, 1], 1))  # draft counts, V


def sanitize_chain_ragged(device="cuda", cases=RAGGED_CASES, racecheck=False):
    for counts, v in cases:
        for method in ("token", "block"):
            for dtype in dtypes(racecheck, torch.float32, torch.bfloat16):
                drafts, cu, logits, q, params = ragged_inputs(counts, v, dtype, device=device)
                if counts:
                    logits[0] = float("nan")

                def corrupt():
                    drafts[0] = v + 7
                    cu[-1] = sum(counts) + 50

                run_case(device, lambda: xkernels.chain_verify_ragged(drafts, cu, logits, max_spec_len=4, draft_probs=q,
                                                                      method=method, **params),
                         corrupt if sum(counts) else None, "cu_num_draft_tokens must end at T")


REFINE_CASES = ((3, 5, 97, 16, 32), (2, 16, 1000, 256, 512), (0, 4, 10, 8, 16), (1, 4, 300, 16, 12400),
                (2, 2, 1, 16, 16), (1, 2, 7, 16, 16))  # N, B, V, r, H


def sanitize_refine(device="cuda", cases=REFINE_CASES, racecheck=False):
    # Both CUDA reads (racecheck: the fused one); on the CPU (the cases' check) the read changes no argument check.
    reads = ("auto",) if device != "cuda" else ("fused",) if racecheck else ("gemm", "fused")
    for n, b, v, r, h in cases:
        for dtype in dtypes(racecheck, torch.float32, torch.bfloat16):
            ctx, prev, base, weights = refine_inputs(n, b, v, r, h, dtype, device=device)
            prefix = prev[:, :2]  # F = B - D = 1 fixed slot

            # Per-request filters and streams: filtered_pick_kernel on the kept logits.
            filtered = dict(per_request_filters(n, device), min_p=torch.full((n,), 0.05, device=device))

            def passes():
                for sampling in (dict(temperature=0.0), dict(temperature=1.0), filtered):
                    for read in reads:
                        with refine_read(read):
                            xkernels.refine_step(ctx, prev, base, weights, **sampling)
                            xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=3, **sampling)
                            xkernels.sequential_refine(ctx, prefix, base, weights, **sampling)

            def corrupt():
                prev[0, 0] = -3  # read as a zero embedding row (prefix is a view of prev)

            run_case(device, passes, corrupt if n else None, "prev_tokens holds ids outside")
    # B = 1 leaves no slot to draft: refused before any launch.
    ctx, prev, base, weights = refine_inputs(1, 1, 7, 16, 16, device=device)
    expect_error(r"base_logits must have between 1 and B=1 drafted slots, got D=0",
                 lambda: xkernels.refine_step(ctx, prev, base, weights))


TREE_CASES = ((3, 12, 97), (2, 63, 1000), (0, 4, 10), (2, 0, 10))  # N, budget, V


def sanitize_tree(device="cuda", cases=TREE_CASES, racecheck=False):
    # budget 0: a tree of the root alone (M = 1), so no node below it to corrupt.
    for n, budget, v in cases:
        for dtype in dtypes(racecheck, torch.float32, torch.bfloat16):
            lp, tok, tokens, parents, logits, q = tree_inputs(n, budget, v, dtype, device=device)
            xkernels.build_draft_tree(lp, tok, budget)
            for layout in ("bool", "packed"):
                xkernels.build_draft_tree(lp, tok, budget, mask=layout)
            xkernels.tree_attention_mask(parents, layout="packed")
            xkernels.tree_positions(parents)

            def verify_and_compact():
                for temperature, with_q, wr in [(0.0, False, False), (1.0, False, False), (1.0, True, False),
                                                (0.7, True, True)]:
                    accept_len, path, _ = xkernels.tree_verify(tokens, parents, logits,
                                                               draft_probs=q if with_q else None,
                                                               without_replacement=wr, temperature=temperature)
                cache = torch.randn(n, 2, budget + 8, 16, device=device, dtype=dtype)
                xkernels.compact_kv_(cache, path, accept_len, 3)

            def corrupt():
                tokens[0, 1] = v + 5  # never accepted, never read
                parents[-1, 2] = 7  # invalid: walks stop there

            run_case(device, verify_and_compact, corrupt if n and budget >= 2 else None, "parents is not a valid tree")


DLLM_CASES = ((2, 32, 1000), (1, 7, 33), (0, 4, 10))  # N, L, V


def sanitize_dllm(device="cuda", cases=DLLM_CASES, racecheck=False):
    for n, length, v in cases:
        for dtype in dtypes(racecheck, torch.float32, torch.bfloat16):
            logits = torch.randn(n, length, v, device=device).to(dtype)
            block = torch.full((n, length), 5, device=device)
            if n:
                block[0, ::2] = 1
                logits[0, 0, 3] = float("nan")
            for temperature, threshold in [(0.0, None), (1.0, None), (0.7, 0.5)]:
                xkernels.dllm_step(logits, block, 5, num_unmask=3, threshold=threshold, temperature=temperature)
            # Filters on a row with a NaN and on ties (a flat row), per-request streams.
            if n:
                logits[-1, -1] = 0.5
            xkernels.dllm_step(logits, block, 5, num_unmask=3, **per_request_filters(n, device),
                               min_p=torch.full((n,), 0.05, device=device))


def graph_within(graph, length, v, device):
    """The nodes of `graph` whose operations all lie inside a block of `length` positions and v ids,
    with the edges between them: a valid graph for that block (a node's parents hold a subset of its
    operations, so every node kept keeps its parents)."""
    from xkernels.reference import SPIFFY_MAX_RANK
    from xkernels.spiffy import DraftGraph

    top = min(v, SPIFFY_MAX_RANK)
    kept = [g for g, ops in enumerate(graph.nodes) if all(i < length and j < top for i, j in ops)]
    where = {g: k for k, g in enumerate(kept)}
    return DraftGraph([graph.nodes[g] for g in kept],
                      [(where[a], where[b]) for a, b in graph.edges if a in where and b in where], device=device)


SPIFFY_CASES = ((2, 32, 1000, 8), (1, 7, 33, 3), (0, 4, 10, 2), (3, 40, 5, 31))  # N, L, V, keep
# racecheck timed out at 90 s on SPIFFY_CASES (H200, 2026-12-04): a third of the first case's rows
# (V past one 256-id tile still), the small cases as they are, no N=0 (no launch).
SPIFFY_RACECHECK_CASES = ((2, 16, 300, 8), (1, 7, 33, 3), (3, 40, 5, 31))


def sanitize_spiffy(device="cuda", cases=SPIFFY_CASES, racecheck=False):
    from xkernels.spiffy import shipped_graph

    shipped = shipped_graph(device=device)
    for n, length, v, keep in cases:
        valid = graph_within(shipped, length, v, device)
        keep = min(keep, len(valid) - 1)
        for dtype in dtypes(racecheck, torch.float32, torch.bfloat16):
            logits, block = spiffy_inputs(n, length, v, dtype, masked=min(length, 24), device=device)
            if n:
                logits[0, 0, 3] = float("nan")
                block[-1] = v - 1  # nothing masked (the mask id is 1)
            graph = [valid]

            def walks():
                for sampling in (dict(temperature=0.0), dict(temperature=0.7),
                                 dict(per_request_filters(n, device), min_p=0.05)):
                    stream = {k: sampling.pop(k) for k in ("seed", "offset") if k in sampling}
                    drafts, node_ids, _ = xkernels.spiffy_materialize(logits, block, 1, graph[0], keep=keep,
                                                                      **sampling)
                    draft_logits = logits[:, None].expand(n, keep, length, v).contiguous()
                    for threshold in (None, 0.3):
                        xkernels.spiffy_accept(logits, draft_logits, drafts, node_ids, block, 1, threshold=threshold,
                                               **sampling, **(stream or dict(seed=2)))

            def corrupt():
                graph[0] = shipped  # ranks past this block or vocabulary: nodes the kernels must skip

            run_case(device, walks, corrupt if len(valid) < len(shipped) else None,
                     r"graph_ranks: node \d+ has (position|vocabulary) rank")
            lens = torch.tensor([3, 0, 9, 5][: max(n, 1)], device=device)
            xkernels.spiffy_attention_mask(keep, length, lens, max_prefix_len=9,
                                           layout="packed" if dtype == torch.bfloat16 else "bool")


SHARD_CASES = ((3, 7, 0), (2, 5003, 11), (0, 4, 0), (2, 0, 5), (1, 3, 2**31 - 5))  # R, V_local, vocab_start


def sanitize_shard(device="cuda", cases=SHARD_CASES, racecheck=False):
    for r, v, start in cases:
        for dtype in dtypes(racecheck, torch.float32, torch.bfloat16, torch.float16):
            logits = (torch.randn(r, v) * 3).to(dtype).to(device)
            if r and v:
                logits[0, 0] = float("nan")
            scale, zero = torch.ones(r, device=device), torch.zeros(r, dtype=torch.int64, device=device)
            row_max = torch.zeros(r, device=device)  # below the rows' maxima too: the clamp
            keep = dict(keep_value=torch.zeros(r, device=device), keep_id=torch.full((r,), start + 2, device=device))
            for shift, prefix in ((56, zero), (48, zero - 1), (0, zero + 2**62)):  # prefixes no key has, too
                xkernels.shard_cut_histogram(logits, scale, prefix, shift, start, ignore_id=start + 1)
                hist = xkernels.shard_cut_histogram(logits, scale, prefix, shift, start, row_max=row_max, **keep)
                for target in (0.0, 2.0**61, float("nan")):
                    xkernels.shard_cut_pick(hist, prefix, torch.zeros(r, 2, dtype=torch.int64, device=device),
                                            torch.full((r,), target, dtype=torch.float64, device=device))
            for count in (0, 1, min(v + 3, 4096), 4096):  # fewer ids than the count; 4096 keys sorted in shared memory
                xkernels.shard_cut_candidates(logits, scale, count, start, ignore_id=start + 1, row_max=row_max)


# In the order bench/gpu_check.sh times them: the kernels redesigned since the last GPU run first.
# Each section: its timings, its sanitizer cases, their list, and the list under racecheck.
SECTIONS = {"tree": (bench_tree, sanitize_tree, TREE_CASES, TREE_CASES),
            "spiffy": (bench_spiffy, sanitize_spiffy, SPIFFY_CASES, SPIFFY_RACECHECK_CASES),
            "dllm": (bench_dllm, sanitize_dllm, DLLM_CASES, DLLM_CASES),
            "refine": (bench_refine, sanitize_refine, REFINE_CASES, REFINE_CASES),
            "chain": (bench_chain_verify, sanitize_chain, CHAIN_CASES, CHAIN_CASES),
            "ragged": (bench_chain_ragged, sanitize_chain_ragged, RAGGED_CASES, RAGGED_CASES),
            "shard": (bench_shard, sanitize_shard, SHARD_CASES, SHARD_CASES)}
COMPILE_SECTIONS = ("refine", "chain")  # the sections with torch.compile or CuPy peers


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sanitize", nargs="+", choices=list(SECTIONS),
                        help="run these sections' small edge cases only")
    parser.add_argument("--racecheck", action="store_true", help="with --sanitize: the cases sized for racecheck")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), default=list(SECTIONS),
                        help="the sections to time (default: all)")
    parser.add_argument("--json", help="append the rows here, one JSON object a line")
    parser.add_argument("--profile", action="store_true", help="add each case's CUDA kernels and their times")
    parser.add_argument("--profile-once", action="store_true",
                        help="each case's op once after warm-up, in an NVTX range and cudaProfilerStart/Stop (for "
                             "ncu --profile-from-start off --nvtx); no peers, no rows")
    parser.add_argument("--profile-seconds", type=float, default=float("inf"),
                        help="with --profile-once: leave out the cases that come after this many seconds")
    parser.add_argument("--compile-bound", type=float, default=45.0,
                        help="seconds a peer's compile may take before its case is skipped (default 45)")
    peers = parser.add_mutually_exclusive_group()
    peers.add_argument("--no-compile", dest="compile_peers", action="store_const", const="no", default="yes",
                       help="leave out the torch.compile and CuPy peers")
    peers.add_argument("--compile-only", dest="compile_peers", action="store_const", const="only",
                       help="time only those peers (and the op, for the ratio), of the sections that have them")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU tensors and tiny shapes, one call a timing: checks the flow, not the speed")
    args = parser.parse_args()
    if args.sanitize:
        device = "cpu" if args.dry_run else "cuda"
        for section in args.sanitize:
            _, sanitize, cases, racecheck_cases = SECTIONS[section]
            cases = racecheck_cases if args.racecheck else cases
            # The dry run's flow: each section's first case (tests/test_gpu_check.py runs them all). Each
            # case's seconds in the log, to size the cases that come near the sanitizer step's limit.
            for case in cases[:1] if args.dry_run else cases:
                start = time.perf_counter()
                sanitize(device, (case,), racecheck=args.racecheck)
                if device == "cuda":
                    torch.cuda.synchronize()
                print(f"{section} case {case}: {time.perf_counter() - start:.1f} s", flush=True)
            print(f"sanitize cases of {section} ran", flush=True)
        return
    bench = Bench(profile=args.profile, compile_peers="no" if args.profile_once else args.compile_peers,
                  dry_run=args.dry_run, once=args.profile_once, compile_bound=args.compile_bound,
                  once_seconds=args.profile_seconds)
    for section in args.only:
        if args.compile_peers == "only" and section not in COMPILE_SECTIONS:
            continue
        results = []
        SECTIONS[section][0](results, bench)
        if args.json:
            with open(args.json, "a") as f:
                for row in results:
                    f.write(json.dumps(dict(row, device=bench.name, torch=torch.__version__,
                                            achievable_tb_s=round(bench.achievable / 1e12, 2))) + "\n")


if __name__ == "__main__":
    main()
