"""The demo's batch-size sweep: generate_batch's tokens per second for ar and every speculative mode
(the default draft length rule) at each batch size, on held-out code and math prompts taken in turn
to fill the batch; at T = 0 each row also says whether every sequence's tokens were ar's."""

from itertools import cycle, islice

from . import data
from .decoding import generate_batch

SIZES = (1, 4, 16, 64)
SPECULATIVE = ("drafter", "sequential", "jacobi", "tree", "tree-jacobi")


def run_batch_sweep(models, sizes=SIZES, tokens: int = 64, iters: int = 4, temperature: float = 0.0, seed: int = 0,
                    modes=SPECULATIVE) -> dict:
    """{size: {"tokens_per_second": {mode: ...}, "same_tokens_as_ar": {mode: ...}, "best": mode}}."""
    half = (max(sizes) + 1) // 2
    texts = [t for pair in zip(data.held_out_prompts("code", half, rng_seed=seed),
                               data.held_out_prompts("math", half, rng_seed=seed)) for t in pair]
    ids = [models.tokenizer.encode(t).ids for t in texts]
    kw = dict(drafter=models.drafter, refiner=models.refiner, iters=iters, temperature=temperature, seed=seed)
    report = {}
    for size in sizes:
        prompts = list(islice(cycle(ids), size))
        speed, same, ar_tokens = {}, {}, None
        for mode in ("ar",) + tuple(modes):
            generate_batch(models.target, prompts, 4, mode=mode, **kw)  # warm-up: lazy tables, the cost model
            out, stats = generate_batch(models.target, prompts, tokens, mode=mode, **kw)
            ar_tokens = out if mode == "ar" else ar_tokens
            speed[mode], same[mode] = stats.tokens_per_second, out == ar_tokens
        best = max(modes, key=speed.__getitem__)
        report[size] = dict(tokens_per_second=speed, same_tokens_as_ar=same, best=best)
    return report


def format_batch_sweep(report: dict, temperature: float = 0.0) -> str:
    lines = ["\nbatch-size sweep (generate_batch, held-out code and math prompts in turn, default draft length rule)",
             f"{'batch':>5} {'ar tok/s':>10} {'best speculative':>18} {'tok/s':>10} {'vs ar':>6}"
             + ("  same as ar (all modes)" if temperature == 0 else "")]
    for size, r in report.items():
        speed, best = r["tokens_per_second"], r["best"]
        line = (f"{size:>5} {speed['ar']:>10.1f} {best:>18} {speed[best]:>10.1f} {speed[best] / speed['ar']:>5.2f}x")
        if temperature == 0:
            line += f"  {'yes' if all(r['same_tokens_as_ar'].values()) else 'NO'}"
        lines.append(line)
    return "\n".join(lines)
