"""Sweeps Spiffy's graph budget D (nodes, the root included) and the drafts kept per call D* on the
shipped block diffusion LM: the graphs are calibrated as python/train/calibrate_spiffy.py does (its
training prompts, depth 8, the frequency objective; the walks recorded once per threshold setting,
each budget selected from them), then decode the held-out prompts; cells are `NFE / tokens per
second` per prompt for each D*, with vanilla's beside them.

    python bench/spiffy_calibration_sweep.py [--budgets 3,5,9,17,33] [--keeps 1,2,4,8,16] [--out FILE]
"""

import argparse
import os
import sys
from pathlib import Path

import torch

from xkernels import data
from xkernels.decoding import dllm_generate
from xkernels.decoding.spiffy_calibration import calibration_prompts, calibration_walks, select_graph
from xkernels.demo_diffusion import THRESHOLD
from xkernels.models.shipped import load_block_diffusion, load_tokenizer
from xkernels.spiffy import SpiffyConfig


def decode(model, prompts, threshold, spiffy):
    """NFE per prompt and tokens per second over the prompts."""
    calls = seconds = tokens = 0
    for i, ids in enumerate(prompts):
        _, stats = dllm_generate(model, ids, 64, seed=i, threshold=threshold, spiffy=spiffy)
        calls, seconds, tokens = calls + stats.model_calls, seconds + stats.seconds, tokens + stats.new_tokens
    return f"{calls / len(prompts):.1f}/{tokens / seconds:.0f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", default="3,5,9,17,33")
    parser.add_argument("--keeps", default="1,2,4,8,16")
    parser.add_argument("--prompts", type=int, default=24, help="calibration prompts per domain")
    parser.add_argument("--held-out", type=int, default=4, help="held-out prompts per domain")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok = load_block_diffusion(), load_tokenizer()
    calibration = calibration_prompts(tok, args.prompts)
    held = {d: [torch.tensor(tok.encode(t).ids) for t in data.held_out_prompts(d, args.held_out)]
            for d in data.DOMAINS}
    budgets = [int(b) for b in args.budgets.split(",")]
    keeps = [int(k) for k in args.keeps.split(",")]
    lines = [f"Command: `python {' '.join(sys.argv)}`; load average {os.getloadavg()[0]:.1f} at the start, "
             f"1 thread. Cells: D*: NFE / tokens per second (per prompt, {args.held_out} held-out prompts per "
             f"domain, 64 new tokens, T = 0).", "", "```"]
    for threshold in (None, THRESHOLD):
        walks = calibration_walks(model, calibration, depth=8, threshold=threshold)
        for domain, prompts in held.items():
            lines.append(f"threshold {threshold} {domain}: vanilla {decode(model, prompts, threshold, None)}")
            print(lines[-1], flush=True)
            for budget in budgets:
                graph = select_graph(walks, budget)
                cells = [f"{k}: {decode(model, prompts, threshold, SpiffyConfig(graph, k))}"
                         for k in keeps if k < len(graph)]
                lines.append(f"  D={budget:<3} " + "  ".join(cells))
                print(lines[-1], flush=True)
    lines.append("```")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
