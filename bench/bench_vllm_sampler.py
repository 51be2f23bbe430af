"""XKernelsRejectionSampler against vLLM's own RejectionSampler, per call on the CPU, on one
hand-built batch: N=8 requests, K=4 drafts each, V=151936 (Qwen's vocabulary), random logits,
mixed per-request temperature (one greedy request), top-k and top-p; with ngram-style drafts
(no draft_probs) and with a draft model's probabilities. Runs inside the vLLM environment of
tests/integrations/vllm/run.sh:

    build/vllm-venv/bin/python -P bench/bench_vllm_sampler.py [--rounds 15] [--threads 1]

vLLM's sampler as shipped reads an uninitialised buffer of per-token parameters on the CPU
(vllm #55005): with top-k in the batch it fails or samples from the wrong law. The row
"vLLM, expand fixed" replaces its expand_batch_to_tokens with a correct one (repeat_interleave)
so that vLLM's path runs on these inputs. Medians of ``--rounds`` calls after two warm-up calls.

The file has no bench_* function: bench/run.sh collects this folder in an environment without vLLM.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

N, K, V = 8, 4, 151936
TEMPERATURE = [0.0, 0.7, 1.0, 1.2, 0.8, 1.0, 0.6, 0.9]
TOP_K = [0, 50, 0, 20, 0, 100, 0, 40]
TOP_P = [1.0, 0.9, 0.95, 1.0, 0.8, 1.0, 0.7, 0.9]


def expand_fixed(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
    """What vLLM's expand_batch_to_tokens means to return: x[n] repeated for request n's tokens."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    out = x.repeat_interleave(counts, output_size=num_tokens)
    return torch.where(out == replace_from, torch.full_like(out, replace_to), out)


def timed(fn, rounds):
    fn()
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integrations" / "vllm"))
    import vllm.v1.sample.rejection_sampler as rs
    from batches import sampling_metadata, spec_metadata, vllm_cpu_kernels
    from vllm.v1.sample.sampler import Sampler

    from xkernels.integrations.vllm import XKernelsRejectionSampler

    vllm_cpu_kernels()
    g = torch.Generator().manual_seed(0)
    drafts = torch.randint(0, V, (N, K), generator=g).tolist()
    md = spec_metadata(drafts)
    logits = torch.randn(N * (K + 1), V, generator=g) * 3
    q = torch.softmax(torch.randn(N * K, V, generator=g) * 3, -1)
    sm = sampling_metadata(N, V, temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P)
    positions = torch.arange(N * (K + 1), dtype=torch.int64) + 100
    ours = XKernelsRejectionSampler(Sampler())
    theirs = rs.RejectionSampler(Sampler())
    req_ids = [f"r{i}" for i in range(N)]

    def xkernels_call(draft_probs):
        ours.set_requests(req_ids, positions)
        return ours(md, draft_probs, logits, sm)

    print(f"N={N} K={K} V={V} float32, threads={torch.get_num_threads()}, median of {args.rounds} calls")
    print(f"temperature {TEMPERATURE}\ntop_k {TOP_K}\ntop_p {TOP_P}")
    print(f"{'case':44s} {'ms/call':>9s}")
    shipped = rs.expand_batch_to_tokens
    for name, draft_probs in (("ngram drafts (no draft_probs)", None), ("draft-model drafts (draft_probs)", q)):
        mine = timed(lambda: xkernels_call(draft_probs), args.rounds)
        print(f"{'xkernels, ' + name:44s} {mine:9.2f}")
        try:
            theirs(md, draft_probs, logits, sm)
            ms = f"{timed(lambda: theirs(md, draft_probs, logits, sm), args.rounds):9.2f}"
        except Exception as e:  # noqa: BLE001 (vllm #55005 is what this row shows)
            ms = f"fails: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
        print(f"{'vLLM as shipped, ' + name:44s} {ms}")
        rs.expand_batch_to_tokens = expand_fixed
        try:
            fixed = timed(lambda: theirs(md, draft_probs, logits, sm), args.rounds)
        finally:
            rs.expand_batch_to_tokens = shipped
        print(f"{'vLLM, expand fixed, ' + name:44s} {fixed:9.2f}   (xkernels {fixed / mine:.1f}x faster)")


if __name__ == "__main__":
    main()
