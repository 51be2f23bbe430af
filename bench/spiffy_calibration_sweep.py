"""Sweeps Spiffy's calibration on the shipped block diffusion LM: the calibration prompts per domain
N, the walk depth and the graph budget D (nodes, the root included), with the drafts kept per call
D*, and selects on a dev split, never on the held-out prompts.

The graphs are calibrated as python/train/calibrate_spiffy.py does (calibration_prompts: training
prompts of seed CALIBRATION_SEED, greedy, the frequency objective), one per threshold setting;
the walks are recorded once per prompt at the largest depth (a walk of a smaller depth is its
prefix) and each (N, depth, D) is selected from them. Dev prompts: other training documents
(training_prompts with DEV_SEED), none of them a calibration prompt or sharing one's opening.
Cells: D*: NFE per prompt (the cut against vanilla one token per step), 64 new tokens, T = 0.

Selection (per threshold setting, as the graphs are): the configuration of the fewest code dev
calls summed over D* = 16 and 32 (--select-keeps), among those whose math dev calls at those D* sum
to no more than the baseline's (--baseline: the recipe before this sweep, N 24, depth 8, D 33); ties
to the smaller D, N, depth. Only the selected configuration is decoded on the held-out prompts.

    python bench/spiffy_calibration_sweep.py [--prompts 24,96] [--depths 8,16] [--budgets 33,65,129]
        [--keeps 1,8,16,32] [--dev 8] [--held-out 4] [--weights DIR] [--out FILE]
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from xkernels import data
from xkernels.decoding import dllm_generate
from xkernels.decoding.spiffy_calibration import CALIBRATION_SEED, calibration_walks, select_graph
from xkernels.demo_diffusion import THRESHOLD
from xkernels.models.shipped import WEIGHTS, load_block_diffusion, load_tokenizer
from xkernels.spiffy import SpiffyConfig, shipped_graph

DEV_SEED = 11


def dev_texts(domain, count, calibration):
    """count training prompts of the domain that are not calibration prompts (nor share an opening)."""
    pool = data.training_prompts(domain, 4 * count, rng_seed=DEV_SEED)
    texts = [t for t in pool if not any(t.startswith(c) or c.startswith(t) for c in calibration)][:count]
    if len(texts) < count:
        raise ValueError(f"only {len(texts)} dev prompts of {domain} outside the calibration set")
    return texts


def nfe(model, prompts, threshold, spiffy):
    """Model calls per prompt."""
    return sum(dllm_generate(model, ids, 64, seed=i, threshold=threshold, spiffy=spiffy)[1].model_calls
               for i, ids in enumerate(prompts)) / len(prompts)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", default="24,96", help="calibration prompts per domain")
    parser.add_argument("--depths", default="8,16")
    parser.add_argument("--budgets", default="33,65,129")
    parser.add_argument("--keeps", default="1,8,16,32")
    parser.add_argument("--select-keeps", default="16,32", help="the D* whose calls the selection sums")
    parser.add_argument("--dev", type=int, default=8, help="dev prompts per domain")
    parser.add_argument("--held-out", type=int, default=4, help="held-out prompts per domain")
    parser.add_argument("--baseline", default="24,8,33", help="N,depth,D of the recipe the selection must not "
                        "make worse on math (the shipped graphs' before this sweep)")
    parser.add_argument("--weights", type=Path, default=WEIGHTS,
                        help="the block diffusion LM's folder (default: the shipped one), e.g. a stage not shipped yet")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    counts, depths, budgets, keeps = ints(args.prompts), ints(args.depths), ints(args.budgets), ints(args.keeps)
    baseline, select_keeps = tuple(ints(args.baseline)), ints(args.select_keeps)
    torch.set_num_threads(1)
    began = time.time()
    model, tok = load_block_diffusion(args.weights), load_tokenizer()
    encode = lambda texts: [torch.tensor(tok.encode(t).ids) for t in texts]  # noqa: E731
    # calibration_prompts' texts: code then math, a smaller N a prefix of a larger one's
    calibration = {d: data.training_prompts(d, max(counts), rng_seed=CALIBRATION_SEED) for d in data.DOMAINS}
    dev = {d: encode(dev_texts(d, args.dev, calibration[d])) for d in data.DOMAINS}
    held = {d: encode(data.held_out_prompts(d, args.held_out)) for d in data.DOMAINS}
    lines = [f"Command: `python {' '.join(sys.argv)}`; load average {os.getloadavg()[0]:.1f} at the start, 1 "
             f"thread. Cells: D*: NFE per prompt (cut against vanilla one token per step); {args.dev} dev prompts "
             f"per domain (training documents, seed {DEV_SEED}, none a calibration prompt), {args.held_out} held-out "
             "prompts per domain, 64 new tokens, T = 0.", ""]
    emit = lambda text: (lines.append(text), print(text, flush=True))  # noqa: E731
    selected = {}
    for threshold in (None, THRESHOLD):
        emit(f"## threshold {threshold}")
        emit("```")
        # walks per prompt at the largest depth, in calibration_prompts' order
        per_prompt = {d: [calibration_walks(model, encode([t]), depth=max(depths), threshold=threshold)
                          for t in calibration[d]] for d in data.DOMAINS}
        vanilla = {d: nfe(model, dev[d], None, None) for d in data.DOMAINS}
        emit("vanilla: " + "  ".join(f"{d} {vanilla[d]:.1f}" for d in data.DOMAINS)
             + (f"; threshold alone: " + "  ".join(f"{d} {nfe(model, dev[d], threshold, None):.1f}"
                                                     for d in data.DOMAINS) if threshold else ""))
        cache, sums, graphs = {}, {}, {}
        for n in counts:
            for depth in depths:
                walks = [w[:depth] for d in data.DOMAINS for prompt in per_prompt[d][:n] for w in prompt]
                for budget in budgets:
                    graph = select_graph(walks, budget)
                    key = (tuple(graph.nodes), tuple(graph.edges))
                    if key not in cache:  # a larger depth may choose the same graph
                        cache[key] = {(d, k): nfe(model, dev[d], threshold, SpiffyConfig(graph, k))
                                      for d in data.DOMAINS for k in keeps if k < len(graph)}
                    cells = cache[key]
                    config = (n, depth, budget)
                    graphs[config] = graph
                    sums[config] = tuple(sum(cells[(d, k)] for k in select_keeps) for d in data.DOMAINS)
                    same = "  (the shipped graph)" if config == baseline and graph.nodes == shipped_graph(
                        threshold is not None).nodes else ""
                    emit(f"N={n:<3} depth={depth:<2} D={budget:<3} ({len(graph)} nodes, at most "
                         f"{max(map(len, graph.nodes))} unmaskings a node){same}")
                    for d in data.DOMAINS:
                        emit(f"  {d:<5} " + "  ".join(f"{k}: {cells[(d, k)]:.1f} ({vanilla[d] / cells[(d, k)]:.2f}x)"
                                                      for k in keeps if (d, k) in cells))
        code, math = data.DOMAINS.index("code"), data.DOMAINS.index("math")
        admissible = [c for c in sums if sums[c][math] <= sums[baseline][math]]
        best = min(admissible, key=lambda c: (sums[c][code], c[2], c[0], c[1]))
        selected[threshold] = best
        emit(f"selected: N={best[0]} depth={best[1]} D={best[2]} (code dev calls summed over D* {args.select_keeps}: "
             f"{sums[best][code]:.1f} against the baseline's {sums[baseline][code]:.1f}; math "
             f"{sums[best][math]:.1f} against {sums[baseline][math]:.1f})")
        held_vanilla = {d: nfe(model, held[d], None, None) for d in data.DOMAINS}
        for d in data.DOMAINS:
            cells = {k: nfe(model, held[d], threshold, SpiffyConfig(graphs[best], k))
                     for k in keeps if k < len(graphs[best])}
            emit(f"  held-out {d:<5} vanilla {held_vanilla[d]:.1f}  "
                 + "  ".join(f"{k}: {c:.1f} ({held_vanilla[d] / c:.2f}x)" for k, c in cells.items()))
        emit("```")
        emit("")
    emit(f"Load average {os.getloadavg()[0]:.1f} at the end; {(time.time() - began) / 60:.1f} minutes.")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
