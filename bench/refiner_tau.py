"""tau of the refined modes for one or more refiner weight folders, every draft verified, on the demo's
held-out prompts (T = 0, 64 new tokens; tau = tokens over target calls summed over the prompts):
what the refiner's targets in issue 11 are stated in. tau is deterministic, so a run is a measurement.

    python bench/refiner_tau.py                       # the shipped refiner
    python bench/refiner_tau.py FOLDER [FOLDER ...]   # refiner.safetensors/.json in each folder
"""

import argparse
from pathlib import Path

from xkernels import data
from xkernels.decoding import generate
from xkernels.models.shipped import WEIGHTS, load_all, load_refiner

PASSES = range(1, 7)


def taus(models, refiner, domain, prompts=4, tokens=64):
    texts = data.held_out_prompts(domain, prompts, rng_seed=0)
    runs = [("drafter", "drafter", 4), ("sequential", "sequential", 4)] + [
        (f"jacobi-{p}", "jacobi", p) for p in PASSES] + [("tree-jacobi", "tree-jacobi", 4)]
    row = {}
    for name, mode, iters in runs:
        new = calls = 0
        for i, text in enumerate(texts):
            _, stats = generate(models.target, models.tokenizer.encode(text).ids, tokens, mode=mode,
                                drafter=models.drafter, refiner=refiner, iters=iters, seed=i, draft_len=None)
            new, calls = new + stats.new_tokens, calls + stats.target_calls
        row[name] = new / calls
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="*", type=Path, default=[WEIGHTS])
    args = parser.parse_args()
    models = load_all()
    for folder in args.folders:
        refiner = load_refiner(folder)
        for domain in data.DOMAINS:
            row = taus(models, refiner, domain)
            print(f"{folder.name:>10} {domain:<5} " + " ".join(f"{k} {v:.2f}" for k, v in row.items()) +
                  f" | jacobi-4 / sequential {row['jacobi-4'] / row['sequential']:.2f},"
                  f" jacobi-4 / drafter {row['jacobi-4'] / row['drafter']:.2f}", flush=True)


if __name__ == "__main__":
    main()
