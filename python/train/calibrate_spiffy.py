"""Calibrates Spiffy's draft graphs on the shipped block diffusion LM and writes
xkernels/models/weights/spiffy_graph.json (one token per step) and spiffy_graph_threshold.json
(threshold unmasking). Vanilla decoding of training prompts (never the held-out ones the demo
evaluates), greedy, 64 new tokens in blocks of 32. The defaults are what
bench/spiffy_calibration_sweep.py selected on dev prompts (other training prompts):
bench/results/2026-12-06-spiffy-sweep-cpu.md.

    python python/train/calibrate_spiffy.py [--prompts 24] [--budget 65] [--threshold-budget 33] [--depth 8]
        [--objective frequency] [--weights DIR]
"""

import argparse
import time
from pathlib import Path

import torch

from common import OUT
from xkernels.models.shipped import load_block_diffusion, load_tokenizer
from xkernels.decoding.spiffy_calibration import OBJECTIVES, calibrate, calibration_prompts

THRESHOLD = 0.9  # Fast-dLLM's default, also the demo's


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=24, help="per domain")
    parser.add_argument("--budget", type=int, default=65, help="nodes of the one-token-per-step graph")
    parser.add_argument("--threshold-budget", type=int, default=33, help="nodes of the threshold unmasking graph")
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--objective", choices=OBJECTIVES, default="frequency")
    parser.add_argument("--weights", type=Path, default=OUT,
                        help="the block diffusion LM's folder, where the graphs go (default: the shipped one)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok = load_block_diffusion(args.weights), load_tokenizer()
    prompts = calibration_prompts(tok, args.prompts)
    for name, threshold, budget in [("spiffy_graph", None, args.budget),
                                    ("spiffy_graph_threshold", THRESHOLD, args.threshold_budget)]:
        began = time.time()
        graph = calibrate(model, prompts, budget=budget, depth=args.depth, block_size=32, max_new_tokens=64,
                          threshold=threshold, objective=args.objective)
        graph.meta["minutes"] = round((time.time() - began) / 60, 1)
        graph.save(args.weights / f"{name}.json")
        print(name, len(graph), "nodes,", len(graph.edges), "edges,", graph.meta["minutes"], "min")


if __name__ == "__main__":
    main()
