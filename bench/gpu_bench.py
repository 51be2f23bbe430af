"""GPU timings of the xkernels ops beside the peers a user would pick instead, with the bytes each must read.

    python bench/gpu_bench.py [--only SECTION ...] [--json out.jsonl] [--profile]
    python bench/gpu_bench.py --sanitize SECTION  the small edge cases of one section, for compute-sanitizer

Sections: chain, refine, tree, spiffy. Each row reports CUDA-event medians, the op's floor (bytes over
the datasheet bandwidth) and its fraction of the read bandwidth this GPU achieves, measured in the
same run (a bfloat16 sum over 4 GiB). Peers: eager PyTorch, torch.compile of the eager code, and for
the refine read the bare cuBLAS GEMM of the same shapes. --profile adds each case's CUDA kernels
(torch.profiler). --json appends one JSON line per row, so sections run as separate processes
(bench/gpu_check.sh) add to one file and a crash in one leaves the others' rows.
Where CuPy is installed, chain_verify is timed again with cupyx.profiler.benchmark (DLPack) as a
cross-check of the event timings.
"""

import argparse
import json
import os
import statistics

import torch

import xkernels

PEAK_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "B200": 8.0e12, "A100": 2.0e12}

# The design estimates of bench/floors.md (H200, microseconds), printed beside each measurement.
ESTIMATE_US = {("chain_verify", 0.0, False): 88, ("chain_verify", 1.0, False): 106, ("chain_verify", 1.0, True): 112,
               ("refine_step", 1): 38, ("refine_step", 8): 58, ("refine_step", 32): 165, ("jacobi_refine", 1): 158,
               ("build_draft_tree",): 15, ("tree_attention_mask",): 5, ("tree_verify", 0.0, False): 20,
               ("tree_verify", 1.0, False): 37, ("tree_verify", 1.0, True): 60,
               ("dllm_step T=0",): 35, ("dllm_step T=1",): 70, ("spiffy_materialize",): 65, ("spiffy_accept",): 75,
               ("spiffy_attention_mask",): 5}


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


def achievable_bandwidth(gigabytes=4):
    """Bytes per second of a bfloat16 sum over `gigabytes` GiB: the read bandwidth a kernel can reach."""
    x = torch.ones(gigabytes * (1 << 29), dtype=torch.bfloat16, device="cuda")
    us = time_events(lambda: x.sum(), warmup=3, iters=20)
    return gigabytes * (1 << 30) / (us * 1e-6)


class Bench:
    """Timing context of one run: the bandwidths rows are compared with, and the profile option."""

    def __init__(self, profile=False):
        self.name, self.peak = peak_bandwidth()
        self.achievable = achievable_bandwidth()
        self.profile = profile
        print(f"device: {self.name}; datasheet {self.peak / 1e12 if self.peak else '?'} TB/s; "
              f"achievable read {self.achievable / 1e12:.2f} TB/s (bf16 sum over 4 GiB)", flush=True)

    def bandwidth(self, row, bytes_moved, us, prefix=""):
        """Adds the floor (datasheet) and the fraction of the achievable bandwidth reached."""
        row[prefix + "bytes"] = bytes_moved
        row[prefix + "floor_us"] = None if self.peak is None else round(bytes_moved / self.peak * 1e6, 1)
        row[prefix + "achievable_us"] = round(bytes_moved / self.achievable * 1e6, 1)
        row[prefix + "fraction_of_achievable"] = round(bytes_moved / (us * 1e-6) / self.achievable, 3)

    def kernels(self, fn, calls=5):
        """The CUDA kernels one call of fn launches, with their time per call (torch.profiler)."""
        from torch.profiler import ProfilerActivity, profile

        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        rows = sorted(((e.device_time_total / calls, e.count // calls, e.key) for e in prof.key_averages()
                       if e.device_time_total > 0), reverse=True)
        return [f"{t:.1f} us x{c} {k[:90]}" for t, c, k in rows[:6]]

    def emit(self, results, row, fn=None):
        if self.profile and fn is not None:
            row["kernels"] = self.kernels(fn)
        results.append(row)
        print(json.dumps(row), flush=True)


def time_peer(fn, **kw):
    """time_events of a peer, or None (printed) where it fails, as torch.compile may: never fatal."""
    try:
        return round(time_events(fn, **kw), 1)
    except Exception as e:  # noqa: BLE001
        print(f"peer failed: {e!r}"[:400], flush=True)
        return None


def chain_verify_inputs(n, k, v, dtype, temperature, with_q, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(n, k + 1, v, device="cuda", generator=g) * 4).to(dtype)
    if temperature == 0:
        drafts = torch.randint(0, v, (n, k), device="cuda", generator=g)
        agree = torch.rand(n, k, device="cuda", generator=g) < 0.8
        return torch.where(agree, logits[:, :k].float().argmax(-1), drafts), logits, None
    q = torch.softmax((logits[:, :k].float() + torch.randn(n, k, v, device="cuda", generator=g) * 0.5) / temperature, -1)
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
    n, k, v = 64, 16, 151936
    for temperature, with_q in [(0.0, False), (1.0, False), (1.0, True)]:
        drafts, logits, q = chain_verify_inputs(n, k, v, torch.bfloat16, temperature, with_q)
        op = lambda d, l, qq: xkernels.chain_verify(d, l, draft_probs=qq, temperature=temperature, seed=1)  # noqa: E731
        ours = time_events(lambda: op(drafts, logits, q))
        eager = time_events(lambda: eager_chain_verify(drafts, logits, q, temperature))
        eager_compiled = torch.compile(eager_chain_verify)
        compiled_us = time_peer(lambda: eager_compiled(drafts, logits, q, temperature), warmup=3, iters=100)
        cupy_us = time_cupy(op, [drafts, logits, q])
        accept_len, _ = op(drafts, logits, q)
        # The design reads every target row once, then (T > 0) one row per sequence again (and its q row).
        read = n * (k + 1) * v * 2 + (n * v * (2 + (4 if with_q else 0)) if temperature > 0 else 0)
        row = dict(op="chain_verify", shape=f"N={n} K={k} V={v} bf16", temperature=temperature,
                   draft_probs=with_q, mean_accept_len=round(accept_len.float().mean().item(), 2),
                   us=round(ours, 1), eager_us=round(eager, 1), compiled_eager_us=compiled_us,
                   speedup_vs_eager=round(eager / ours, 2),
                   speedup_vs_compiled=None if compiled_us is None else round(compiled_us / ours, 2),
                   cupy_us=None if cupy_us is None else round(cupy_us, 1),
                   h200_estimate_us=ESTIMATE_US[("chain_verify", temperature, with_q)])
        bench.bandwidth(row, read, ours)
        bench.emit(results, row, lambda: op(drafts, logits, q))


def refine_inputs(n, b, v, r, h, dtype=torch.bfloat16, seed=0):
    from xkernels.refiner import RefinerWeights

    g = torch.Generator(device="cuda").manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, device="cuda", generator=g)  # noqa: E731
    weights = RefinerWeights(emb=rand(v, r) * 0.5, mix=rand(r, b, b).tril() * 0.1 + torch.eye(b, device="cuda"),
                             w_gate=rand(h, r) * r**-0.5, w_up=rand(h, r) * r**-0.5, w_down=rand(r, h) * h**-0.5,
                             w_read=rand(v, r) * r**-0.5).to(dtype)
    ctx = rand(n, b, r)
    base = (rand(n, b - 1, v) * 3).to(dtype)
    prev = torch.randint(0, v, (n, b), device="cuda", generator=g)
    return ctx, prev, base, weights


def refine_reads(fn, **kw):
    """{read: (microseconds, result)} of fn with the refine read forced to the cuBLAS GEMM and to the
    fused kernel (XKERNELS_REFINE_READ, which the ops read at each call)."""
    saved, out = os.environ.get("XKERNELS_REFINE_READ"), {}
    try:
        for read in ("gemm", "fused"):
            os.environ["XKERNELS_REFINE_READ"] = read
            out[read] = (round(time_events(fn, **kw), 1), fn())
    finally:
        os.environ.pop("XKERNELS_REFINE_READ")
        if saved is not None:
            os.environ["XKERNELS_REFINE_READ"] = saved
    return out


def bench_refine(results, bench):
    from xkernels import reference

    b, v, r, h = 16, 151936, 256, 512
    for n in (1, 8, 32):
        ctx, prev, base, weights = refine_inputs(n, b, v, r, h)
        prefix = prev[:, :2].contiguous()
        step_fn = lambda: xkernels.refine_step(ctx, prev, base, weights)  # noqa: E731
        step = time_events(step_fn)
        jacobi = time_events(lambda: xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=4), iters=50)
        sequential = time_events(lambda: xkernels.sequential_refine(ctx, prefix, base, weights), iters=50)
        eager = time_events(lambda: reference.refine_step(ctx, prev, base, weights), iters=50)
        ref_compiled = torch.compile(reference.refine_step)
        compiled_us = time_peer(lambda: ref_compiled(ctx, prev, base, weights), warmup=3, iters=50)
        # The bare read: cuBLAS's product of the drafted rows' z with w_read, no epilogue; and the form
        # the op's read runs (float32 products of bfloat16 operands).
        z = torch.randn(n * (b - 1), r, device="cuda", dtype=weights.w_read.dtype)
        gemm = time_events(lambda: z @ weights.w_read.T)
        gemm_fp32_out = time_peer(lambda: torch.mm(z, weights.w_read.T, out_dtype=torch.float32))
        iters = xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=4)[2]
        # Both reads side by side (pass_us above: the one the plan picks); at T=0 their tokens
        # differ only where two logits lie within float32 accumulation-order rounding.
        step_reads = refine_reads(step_fn)
        jacobi_reads = refine_reads(lambda: xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=4), iters=50)
        floor_bytes = v * r * 2 + n * (b - 1) * v * 2  # w_read once, the base logits once
        row = dict(op="refine_step / jacobi_refine", shape=f"N={n} B={b} V={v} r={r} bf16", pass_us=round(step, 1),
                   pass_gemm_read_us=step_reads["gemm"][0], pass_fused_read_us=step_reads["fused"][0],
                   pass_reads_same_tokens=round((step_reads["gemm"][1][0] == step_reads["fused"][1][0])
                                                .float().mean().item(), 4),
                   jacobi4_gemm_read_us=jacobi_reads["gemm"][0], jacobi4_fused_read_us=jacobi_reads["fused"][0],
                   pass_h200_estimate_us=ESTIMATE_US[("refine_step", n)], cublas_read_gemm_us=round(gemm, 1),
                   cublas_read_gemm_fp32_out_us=gemm_fp32_out, pass_vs_gemm=round(step / gemm, 2),
                   jacobi4_us=round(jacobi, 1), jacobi4_h200_estimate_us=ESTIMATE_US.get(("jacobi_refine", n)),
                   jacobi4_mean_passes=round(iters.float().mean().item(), 2),
                   sequential15_us=round(sequential, 1), eager_reference_pass_us=round(eager, 1),
                   compiled_reference_pass_us=compiled_us, speedup_pass_vs_eager=round(eager / step, 2),
                   speedup_pass_vs_compiled=None if compiled_us is None else round(compiled_us / step, 2))
        bench.bandwidth(row, floor_bytes, step, prefix="pass_")
        bench.bandwidth(row, floor_bytes, step_reads["fused"][0], prefix="pass_fused_read_")
        bench.emit(results, row, step_fn)


def tree_inputs(n, budget, v, dtype, seed=0):
    """A best-first tree over random marginals, target logits at every node with the argmax
    planted on most first children (walks of a few nodes), and children's draft distributions."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    lp, tok = torch.randn(n, 15, v, device="cuda", generator=g).log_softmax(-1).topk(8, -1)
    tokens, parents, num_nodes, _ = xkernels.build_draft_tree(lp.contiguous(), tok.contiguous(), budget)
    m = budget + 1
    logits = torch.randn(n, m, v, device="cuda", generator=g) * 4
    rows = torch.arange(n, device="cuda")
    for i in range(1, m):
        p = parents[:, i]
        first = (parents[:, 1:i] == p[:, None]).sum(-1) == 0
        plant = first & (torch.rand(n, device="cuda", generator=g) < 0.8)
        logits[rows[plant], p[plant], tokens[plant, i]] = 100.0
    q = torch.softmax(logits + torch.randn(n, m, v, device="cuda", generator=g), -1)
    return lp.contiguous(), tok.contiguous(), tokens, parents, logits.to(dtype), q


def bench_tree(results, bench):
    n, budget, v = 64, 63, 151936
    m = budget + 1
    lp, tok, tokens, parents, logits, q = tree_inputs(n, budget, v, torch.bfloat16)
    cases = [("build_draft_tree", lambda: xkernels.build_draft_tree(lp, tok, budget), ("build_draft_tree",)),
             ("tree_attention_mask packed", lambda: xkernels.tree_attention_mask(parents, layout="packed"),
              ("tree_attention_mask",))]
    for name, fn, est in cases:
        row = dict(op=name, shape=f"N={n} budget={budget}", us=round(time_events(fn), 1),
                   h200_estimate_us=ESTIMATE_US[est])
        bench.emit(results, row, fn)
    for temperature, with_q in [(0.0, False), (1.0, False), (1.0, True)]:
        qq = q if with_q else None
        op = lambda: xkernels.tree_verify(tokens, parents, logits, draft_probs=qq, temperature=temperature, seed=1)  # noqa: E731
        us = time_events(op, iters=50)
        accept_len, _, _ = op()
        visited = (accept_len + 1).sum().item()
        # Every visited row once, plus (draft_probs) its q row and residual passes (at least one).
        read = visited * v * (2 + (4 * 3 if with_q else 0))
        row = dict(op="tree_verify", shape=f"N={n} M={m} V={v} bf16", temperature=temperature, draft_probs=with_q,
                   mean_accept_len=round(accept_len.float().mean().item(), 2), us=round(us, 1),
                   h200_estimate_us=ESTIMATE_US[("tree_verify", temperature, with_q)])
        bench.bandwidth(row, read, us)
        bench.emit(results, row, op)


def spiffy_inputs(n, length, v, dtype, masked=24, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(n, length, v, device="cuda", generator=g) * 3).to(dtype)
    block = torch.randint(2, v, (n, length), device="cuda", generator=g)
    block[:, torch.randperm(length, device="cuda", generator=g)[:masked]] = 1
    return logits, block


def bench_spiffy(results, bench):
    """The diffusion ops at LLaDA's vocabulary (126464) and block (32), bfloat16 logits, the shipped
    graph. accept: keep=16 drafts whose logits equal the root's (deep walks), at V=32768."""
    from xkernels.spiffy import shipped_graph

    n, length, v, keep = 16, 32, 126464, 16
    graph = shipped_graph(device="cuda")
    logits, block = spiffy_inputs(n, length, v, torch.bfloat16)
    rows_bytes = int((block == 1).sum()) * v * 2  # every masked row once
    cases = [("dllm_step T=0", lambda: xkernels.dllm_step(logits, block, 1), rows_bytes),
             ("dllm_step T=1", lambda: xkernels.dllm_step(logits, block, 1, temperature=1.0, seed=1), rows_bytes),
             ("spiffy_materialize", lambda: xkernels.spiffy_materialize(logits, block, 1, graph, keep=keep),
              rows_bytes)]
    small_v = 32768
    root, block2 = spiffy_inputs(n, length, small_v, torch.bfloat16, seed=1)
    drafts, node_ids, _ = xkernels.spiffy_materialize(root, block2, 1, graph, keep=keep)
    draft_logits = root[:, None].expand(n, keep, length, small_v).contiguous()
    steps = xkernels.spiffy_accept(root, draft_logits, drafts, node_ids, block2, 1, seed=1)[0]
    # each step reads the masked rows of the node it stands on (24, 23, ... masked)
    accept_bytes = sum(sum(24 - t for t in range(int(s))) for s in steps.tolist()) * small_v * 2
    cases.append(("spiffy_accept", lambda: xkernels.spiffy_accept(root, draft_logits, drafts, node_ids, block2, 1,
                                                                  temperature=1.0, seed=1), accept_bytes))
    lens = torch.full((n,), 1024, device="cuda")
    cases.append(("spiffy_attention_mask", lambda: xkernels.spiffy_attention_mask(keep, length, lens,
                                                                                   max_prefix_len=1024, layout="packed"),
                  n * (1 + keep) * length * (1024 + (1 + keep) * length) // 8))
    for name, fn, moved in cases:
        us = time_events(fn, iters=100)
        row = dict(op=name, shape=f"N={n} L={length} V={small_v if name == 'spiffy_accept' else v} bf16 keep={keep}",
                   us=round(us, 1), h200_estimate_us=ESTIMATE_US[(name,)])
        if name == "spiffy_accept":
            row["mean_steps"] = round(steps.float().mean().item(), 2)
        bench.bandwidth(row, moved, us)
        bench.emit(results, row, fn)


# Edge cases that must stay memory-safe, per section: odd and tiny V, K=0, N=0, bad ids, degenerate rows.
# Each section runs in its own process under compute-sanitizer, so one that dies leaves the others.

def sanitize_chain():
    for n, k, v in [(3, 4, 7), (2, 0, 5), (0, 3, 9), (0, 0, 9), (5, 16, 4099), (2, 2, 1)]:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for temperature, with_q in [(0.0, False), (1.0, False), (0.7, True)]:
                drafts, logits, q = chain_verify_inputs(n, k, v, dtype, temperature, True)
                if n and k:
                    drafts[0, 0] = -5
                    drafts[-1, -1] = v + 100
                    logits[0, 0] = float("nan")
                    logits[-1, 0] = float("-inf")
                xkernels.chain_verify(drafts, logits, draft_probs=q if with_q else None, temperature=temperature)


def sanitize_refine():
    for n, b, v, r, h in [(3, 5, 97, 16, 32), (2, 16, 1000, 256, 512), (0, 4, 10, 8, 16), (1, 4, 300, 16, 12400),
                          (2, 2, 1, 16, 16), (1, 1, 7, 16, 16)]:
        for dtype in (torch.float32, torch.bfloat16):
            ctx, prev, base, weights = refine_inputs(n, b, v, r, h, dtype)
            if n:
                prev[0, 0] = -3  # read as a zero embedding row
            prefix = prev[:, :2].contiguous()
            for temperature in (0.0, 1.0):
                refine_reads(lambda: (xkernels.refine_step(ctx, prev, base, weights, temperature=temperature),
                                      xkernels.jacobi_refine(ctx, prefix, base, weights, max_iters=3,
                                                             temperature=temperature),
                                      xkernels.sequential_refine(ctx, prefix, base, weights,
                                                                 temperature=temperature)), warmup=0, iters=1)


def sanitize_tree():
    for n, budget, v in [(3, 12, 97), (2, 63, 1000), (0, 4, 10), (2, 0, 10)]:
        for dtype in (torch.float32, torch.bfloat16):
            lp, tok, tokens, parents, logits, q = tree_inputs(n, budget, v, dtype)
            xkernels.build_draft_tree(lp, tok, budget)
            xkernels.tree_attention_mask(parents, layout="packed")
            xkernels.tree_positions(parents)
            if n:
                tokens[0, 1] = v + 5  # never accepted, never read
                parents[-1, 2] = 7  # invalid: walks stop there
            for temperature, with_q, wr in [(0.0, False, False), (1.0, False, False), (1.0, True, False), (0.7, True, True)]:
                accept_len, path, _ = xkernels.tree_verify(tokens, parents, logits, draft_probs=q if with_q else None,
                                                           without_replacement=wr, temperature=temperature)
            cache = torch.randn(n, 2, budget + 8, 16, device="cuda", dtype=dtype)
            xkernels.compact_kv_(cache, path, accept_len, 3)


def sanitize_spiffy():
    for n, length, v in [(2, 32, 1000), (1, 7, 33), (0, 4, 10)]:
        for dtype in (torch.float32, torch.bfloat16):
            logits = torch.randn(n, length, v, device="cuda").to(dtype)
            block = torch.full((n, length), 5, device="cuda")
            if n:
                block[0, ::2] = 1
                logits[0, 0, 3] = float("nan")
            for temperature, threshold in [(0.0, None), (1.0, None), (0.7, 0.5)]:
                xkernels.dllm_step(logits, block, 5, num_unmask=3, threshold=threshold, temperature=temperature)
    from xkernels.spiffy import shipped_graph

    graph = shipped_graph(device="cuda")
    for n, length, v, keep in [(2, 32, 1000, 8), (1, 7, 33, 3), (0, 4, 10, 2), (3, 40, 5, 31)]:
        for dtype in (torch.float32, torch.bfloat16):
            logits, block = spiffy_inputs(n, length, v, dtype, masked=min(length, 24))
            if n:
                logits[0, 0, 3] = float("nan")
                block[-1] = 7  # nothing masked
            for temperature in (0.0, 0.7):
                drafts, node_ids, _ = xkernels.spiffy_materialize(logits, block, 1, graph, keep=keep,
                                                                  temperature=temperature)
                draft_logits = logits[:, None].expand(n, keep, length, v).contiguous()
                for threshold in (None, 0.3):
                    xkernels.spiffy_accept(logits, draft_logits, drafts, node_ids, block, 1, threshold=threshold,
                                           temperature=temperature, seed=2)
            lens = torch.tensor([3, 0, 9, 5][: max(n, 1)], device="cuda")
            xkernels.spiffy_attention_mask(keep, length, lens, max_prefix_len=9,
                                           layout="packed" if dtype == torch.bfloat16 else "bool")


SECTIONS = {"chain": (bench_chain_verify, sanitize_chain), "refine": (bench_refine, sanitize_refine),
            "tree": (bench_tree, sanitize_tree), "spiffy": (bench_spiffy, sanitize_spiffy)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sanitize", choices=sorted(SECTIONS), help="run one section's small edge cases only")
    parser.add_argument("--only", nargs="+", choices=sorted(SECTIONS), default=list(SECTIONS),
                        help="the sections to time (default: all)")
    parser.add_argument("--json", help="append the rows here, one JSON object a line")
    parser.add_argument("--profile", action="store_true", help="add each case's CUDA kernels and their times")
    args = parser.parse_args()
    if args.sanitize:
        SECTIONS[args.sanitize][1]()
        torch.cuda.synchronize()
        print(f"sanitize cases of {args.sanitize} ran", flush=True)
        return
    bench = Bench(profile=args.profile)
    for section in args.only:
        results = []
        SECTIONS[section][0](results, bench)
        if args.json:
            with open(args.json, "a") as f:
                for row in results:
                    f.write(json.dumps(dict(row, device=bench.name, torch=torch.__version__,
                                            achievable_tb_s=round(bench.achievable / 1e12, 2))) + "\n")


if __name__ == "__main__":
    main()
