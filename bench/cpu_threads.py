"""The CPU kernels on one intra-op thread and on two, in one run: each op's median wall-clock time
and the speed-up from the second thread (1.0x means the op does not use it).

    python bench/cpu_threads.py [--rounds 15]

Shapes: N=16 sequences, V=32000, random logits (randn * 3), T=1 where the op samples; the refine
read is bench_refine.py's N=4 case (V=32768, r=256, 60 rows) at T=0 and T=1.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

import xkernels

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_refine import make_inputs  # noqa: E402


def cases():
    g = torch.Generator().manual_seed(0)
    v = 32000
    logits = torch.randn(16, 9, v, generator=g) * 3
    drafts = torch.randint(0, v, (16, 8), generator=g)
    q = torch.softmax(torch.randn(16, 8, v, generator=g), -1)
    dllm_logits = torch.randn(16, 32, v, generator=g) * 3
    block = torch.randint(0, v, (16, 32), generator=g)
    block[:, 8:] = 5  # 24 masked positions a sequence
    topk_lp = torch.randn(16, 8, 4, generator=g).sort(-1, descending=True).values.log_softmax(-1)
    tokens, parents, num_nodes, _ = xkernels.build_draft_tree(topk_lp, torch.randint(0, v, (16, 8, 4), generator=g), 31)
    tree_logits = torch.randn(16, 32, v, generator=g) * 3
    ctx, prev, base, weights = make_inputs(4, torch.float32)
    return {
        "chain_verify T=1 with q": lambda: xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=1.0, seed=1),
        "tree_verify T=1 (M=32)": lambda: xkernels.tree_verify(tokens, parents, tree_logits, num_nodes=num_nodes,
                                                              temperature=1.0, seed=1),
        "dllm_step T=1 (L=32)": lambda: xkernels.dllm_step(dllm_logits, block, 5, num_unmask=2, temperature=1.0, seed=1),
        "refine_step T=0 (N=4)": lambda: xkernels.refine_step(ctx, prev, base, weights),
        "refine_step T=1 (N=4)": lambda: xkernels.refine_step(ctx, prev, base, weights, temperature=1.0, seed=1),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    before = torch.get_num_threads()
    print(f"torch {torch.__version__}, {args.rounds} rounds a thread count, medians (ms of wall-clock time); "
          f"xkernels build: {xkernels.build_info()}")
    print(f"{'op (N=16, V=32000)':<26} {'1 thread':>9} {'2 threads':>10} {'speed-up':>9}")
    for name, fn in cases().items():
        med = {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            fn()  # warm-up
            times = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            med[threads] = sorted(times)[len(times) // 2] * 1e3
        print(f"{name:<26} {med[1]:>9.2f} {med[2]:>10.2f} {med[1] / med[2]:>8.2f}x")
    torch.set_num_threads(before)


if __name__ == "__main__":
    main()
