"""generate_batch of held-out prompts against decoding them one at a time with generate, the
shipped models at T = 0 on this machine: tokens/s of each and their ratio per mode, and whether
every sequence's tokens are the same both ways. Best of --rounds rounds, the two ways taking
turns within a round (a busy machine's load then weighs on both alike); the loop's default
threads; both draft length rules measure their cost models before the first clock starts.

    python bench/bench_generate_batch.py [--prompts 8] [--tokens 64] [--modes ar jacobi] [--rounds 3] [--device cpu]
"""

import argparse
import time

import torch

from xkernels import data
from xkernels.decoding import generate, generate_batch
from xkernels.models.shipped import load_all


def best_seconds(fns, rounds):
    """Best wall time of each of fns over rounds (each round runs them in turn), and their results."""
    for fn in fns:
        fn()  # warm-up: lazy tables and the cost models
    best, results = [float("inf")] * len(fns), [None] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            began = time.perf_counter()
            results[i] = fn()
            best[i] = min(best[i], time.perf_counter() - began)
    return best, results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts, half code and half math")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--modes", nargs="+", default=["ar", "jacobi"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--draft-len", default="auto", help="'auto' or an int, for both loops")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda (generate_batch then replays CUDA graphs)")
    args = parser.parse_args()
    draft_len = args.draft_len if args.draft_len == "auto" else int(args.draft_len)
    models = load_all().to(args.device)
    texts = data.held_out_prompts("code", args.prompts // 2) + data.held_out_prompts("math", args.prompts - args.prompts // 2)
    prompts = [models.tokenizer.encode(t).ids for t in texts]
    kw = dict(drafter=models.drafter, refiner=models.refiner, draft_len=draft_len)
    print(f"{len(prompts)} held-out prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), "
          f"{args.tokens} new tokens each, T = 0, {args.device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads available")
    print(f"{'mode':<12} {'one at a time tok/s':>20} {'batched tok/s':>14} {'ratio':>6}  same tokens")
    for mode in args.modes:
        (one_s, batch_s), (singles, (batched, _)) = best_seconds(
            [lambda: [generate(models.target, p, args.tokens, mode=mode, **kw)[0] for p in prompts],
             lambda: generate_batch(models.target, prompts, args.tokens, mode=mode, **kw)], args.rounds)
        total = len(prompts) * args.tokens
        print(f"{mode:<12} {total / one_s:>20.1f} {total / batch_s:>14.1f} {one_s / batch_s:>5.2f}x  "
              f"{batched == singles}")


if __name__ == "__main__":
    main()
