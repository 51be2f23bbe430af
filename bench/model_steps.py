"""What one step of each part of the decoding loop costs with the shipped models on this machine
(one intra-op thread, as the loop runs them): the target's one-token step and 16-token block, and
the drafter's pass over a block with its head, in float32 and in bfloat16. Best of 5 rounds of
--repeats calls after a 100-token context.

    python bench/model_steps.py [--repeats 150]

It uses only the models' public calls, so it also runs on earlier commits of the package: the
before/after figures of bench/results/2026-11-30-speed-cpu.md come from this script run on both.
"""

import argparse
import time

import torch

from xkernels.models.shipped import load_all
from xkernels.models.target import KVCache

CONTEXT = 100


def best_ms(fn, repeats):
    for _ in range(10):
        fn()
    rounds = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(repeats):
            fn()
        rounds.append((time.perf_counter() - began) / repeats * 1e3)
    return min(rounds)


@torch.inference_mode()
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=150)
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = load_all()
    target, drafter = models.target, models.drafter
    g = torch.Generator().manual_seed(0)
    cache = target.new_cache()
    target(torch.randint(0, 4096, (1, CONTEXT), generator=g), cache)
    one, block = torch.tensor([[5]]), torch.randint(0, 4096, (1, 16), generator=g)

    def step(tokens, **kwargs):
        target(tokens, cache, **kwargs)
        cache.crop(CONTEXT)

    rows = [("target, one-token step", best_ms(lambda: step(one), args.repeats)),
            ("target, 16-token block (hidden layers kept)",
             best_ms(lambda: step(block, hidden_layers=drafter.cfg.target_layers), args.repeats))]
    features = torch.randn(1, CONTEXT, len(drafter.cfg.target_layers) * target.cfg.dim, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        try:
            context = KVCache(len(drafter.layers))
            for i, (k, v) in enumerate(drafter.context(features.to(dtype), torch.arange(CONTEXT))):
                context.append(i, k, v)
            embeds = target.embed(block).to(dtype)
            h = drafter(embeds, list(zip(context.k, context.v)), start=CONTEXT)
            rows.append((f"drafter layers, {dtype}", best_ms(
                lambda: drafter(embeds, list(zip(context.k, context.v)), start=CONTEXT), args.repeats)))
            rows.append((f"drafter head over 15 slots, {dtype}", best_ms(lambda: target.lm_head(h[:, 1:]).float(),
                                                                         args.repeats)))
        except RuntimeError as error:  # a version of the models that computes only in its weights' dtype
            rows.append((f"drafter, {dtype}", f"n/a ({str(error).splitlines()[0][:60]})"))
    for name, ms in rows:
        print(f"{name:<46} {ms:.3f} ms" if isinstance(ms, float) else f"{name:<46} {ms}")


if __name__ == "__main__":
    main()
