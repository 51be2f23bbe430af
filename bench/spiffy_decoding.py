"""Spiffy against vanilla block diffusion decoding on held-out prompts, the shipped model and
graphs (or those in --weights): model calls (NFE, every forward counted), tokens per second, whether
the tokens equal vanilla's, and where the time goes (the model; outside it: spiffy_materialize,
the batched loop's attention mask, dllm_step / spiffy_accept with the call's host read, the loop's
own), one token per step and with threshold unmasking, one prompt at a time (dllm_generate) and
all of a domain's prompts in one batch (dllm_generate_batch). Best of --rounds rounds per mode, the modes taking
turns within a round (a busy machine's load then weighs on all alike); tokens and NFE are
deterministic. Writes a markdown results file with --out.

    python bench/spiffy_decoding.py [--prompts 4] [--tokens 64] [--keeps 1,2,4,8,16] [--rounds 3]
        [--threads 1] [--weights DIR] [--out bench/results/<date>-spiffy-decoding-cpu.md]
"""

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

from xkernels import data
from xkernels.decoding import dllm_generate, dllm_generate_batch
from xkernels.demo_diffusion import THRESHOLD, format_shares, phase_shares
from xkernels.models.shipped import WEIGHTS, load_block_diffusion, load_tokenizer
from xkernels.spiffy import DraftGraph, SpiffyConfig

PAPER = "the paper: drafting ~6% and acceptance ~5% of a model call (~11% outside the model)"


def run_mode(model, prompts, tokens, seed, threshold, spiffy, batched):
    """(tokens per prompt, the stats of each run): one run per prompt, or one batched run."""
    kwargs = dict(threshold=threshold, spiffy=spiffy, profile=True)
    if batched:
        out, stats = dllm_generate_batch(model, prompts, tokens, seed=[seed + i for i in range(len(prompts))],
                                         **kwargs)
        return out, [stats]
    runs = [dllm_generate(model, ids, tokens, seed=seed + i, **kwargs) for i, ids in enumerate(prompts)]
    return [r[0] for r in runs], [r[1] for r in runs]


def measure(model, prompts, tokens, seed, modes, rounds, batched):
    """Per mode: (tokens, the stats of its fastest round)."""
    best = {}
    for _ in range(rounds):
        for name, threshold, spiffy in modes:
            out, stats = run_mode(model, prompts, tokens, seed, threshold, spiffy, batched)
            seconds = sum(s.seconds for s in stats)
            if name not in best or seconds < sum(s.seconds for s in best[name][1]):
                best[name] = (out, stats)
    return best


@torch.inference_mode()
def copy_cost(model, prompt, copies, repeats=20):
    """(ms of a forward over the block alone, ms each draft copy adds) after prompt's cache, the
    fastest of `repeats` forwards over 1 and `copies` copies. On the CPU each copy is a block's
    worth of matrix work, so a call with K drafts saves time only where it takes more than
    1 + K * added / alone steps."""
    cache = model.new_cache()
    block = torch.full((1, 32), model.cfg.mask_id, dtype=torch.int64, device=prompt.device)
    model.forward_copies(block, cache, commit=prompt.view(1, -1))
    sync = torch.cuda.synchronize if prompt.is_cuda else (lambda: None)
    times = {}
    for c in (1, copies):
        x = block.expand(c, -1)
        for _ in range(repeats):
            sync()
            began = time.perf_counter()
            model(x, cache)
            sync()
            times[c] = min(times.get(c, float("inf")), time.perf_counter() - began)
    return 1e3 * times[1], 1e3 * (times[copies] - times[1]) / (copies - 1)


def table(best, modes, prompts, batched, singles=None):
    """Rows against vanilla (the same threshold's for "same"); batched rows also against the single runs."""
    head = (f"{'mode':<22} {'NFE':>7} {'NFE cut':>8} {'tokens/s':>9} {'speed-up':>9} {'same':>5}"
            + ("  same as single" if batched else "")
            + "  time share: model / materialize / mask / step / other;  materialize, step per model second")
    lines = [head]
    base = best["vanilla"][1]
    base_rate = sum(s.new_tokens for s in base) / sum(s.seconds for s in base)
    for name, threshold, spiffy in modes:
        out, stats = best[name]
        # NFE: per prompt, every forward counted (a batch's calls count once for all its rows)
        nfe = (stats[0].model_calls if batched else sum(s.model_calls for s in stats) / len(prompts))
        base_nfe = (base[0].model_calls if batched else sum(s.model_calls for s in base) / len(prompts))
        rate = sum(s.new_tokens for s in stats) / sum(s.seconds for s in stats)
        vanilla = best["vanilla" if threshold is None else "threshold"][0]
        same = all(torch.equal(a, b) for a, b in zip(out, vanilla))
        shares = phase_shares(stats)
        line = (f"{name:<22} {nfe:>7.1f} {base_nfe / nfe:>7.2f}x {rate:>9.1f} {rate / base_rate:>8.2f}x "
                f"{'yes' if same else 'NO':>5}")
        if batched:
            line += f"  {'yes' if all(torch.equal(a, b) for a, b in zip(out, singles[name][0])) else 'NO':>15}"
        line += f"  {format_shares(shares)};  {shares['draft'] / shares['model']:.3f}, {shares['step'] / shares['model']:.3f}"
        lines.append(line)
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts per domain")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--keeps", default="1,2,4,8,16", help="drafts kept per call (D*), comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-batch", action="store_true", help="skip the batched runs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, help="write the results as markdown here")
    parser.add_argument("--weights", type=Path, default=WEIGHTS,
                        help="the folder of the block diffusion LM and its graphs (default: the shipped ones)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_block_diffusion(args.weights).to(args.device), load_tokenizer()
    graphs = {thr: DraftGraph.load(args.weights / name, device=args.device)
              for thr, name in [(None, "spiffy_graph.json"), (THRESHOLD, "spiffy_graph_threshold.json")]}
    keeps = [int(k) for k in args.keeps.split(",") if k]
    modes = [("vanilla", None, None), ("threshold", THRESHOLD, None)]
    modes += [(f"spiffy-{k}{suffix}", thr, SpiffyConfig(graphs[thr], k))
              for k in keeps for suffix, thr in [("", None), ("+threshold", THRESHOLD)]]
    began = time.time()
    report = [f"Command: `python {' '.join(sys.argv)}`", "",
              f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f} at the start; torch {torch.__version__}, {torch.get_num_threads()} intra-op "
              f"thread(s), {args.device}. Graphs: {len(graphs[None])} nodes (one token per step), "
              f"{len(graphs[THRESHOLD])} (threshold {THRESHOLD}). {args.prompts} held-out prompts per domain, "
              f"{args.tokens} new tokens, block 32, T = 0, best of {args.rounds} rounds. NFE: model calls per prompt "
              f"(the prompt and finished blocks join the cache in the next call; with Spiffy a call whose walk ends "
              f"on a complete draft also takes the next block's first step; batched: the batch's "
              f"calls). "
              f"Spiffy's overhead against {PAPER}."]
    for domain in data.DOMAINS:
        prompts = [torch.tensor(tok.encode(t).ids, device=args.device)
                   for t in data.held_out_prompts(domain, args.prompts, rng_seed=args.seed)]
        dllm_generate(model, prompts[0], 8)  # warm-up
        if domain == data.DOMAINS[0]:
            call, copy = copy_cost(model, prompts[0], 1 + max(keeps))
            report[-1] += (f" One forward after the first {domain} prompt: {call:.2f} ms for the block alone, each "
                           f"draft copy adds {copy:.2f} ms ({copy / call:.2f} of it; fastest of 20 at {1 + max(keeps)} "
                           f"copies): a call with K drafts beats vanilla's time only where it takes more than "
                           f"1 + {copy / call:.2f} K steps.")
        singles = measure(model, prompts, args.tokens, args.seed, modes, args.rounds, batched=False)
        report += ["", f"## {domain}: one prompt at a time", "", "```", table(singles, modes, prompts, False), "```"]
        print("\n".join(report[-6:]), flush=True)
        if not args.no_batch:
            batch = measure(model, prompts, args.tokens, args.seed, modes, args.rounds, batched=True)
            report += ["", f"## {domain}: the {len(prompts)} prompts in one batch", "", "```",
                       table(batch, modes, prompts, True, singles), "```"]
            print("\n".join(report[-6:]), flush=True)
    report += ["", f"Load average {os.getloadavg()[0]:.1f} at the end; {(time.time() - began) / 60:.1f} minutes."]
    if args.out:
        args.out.write_text("\n".join(report) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
