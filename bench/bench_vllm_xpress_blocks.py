"""The xPress proposer's drafting per engine step, outside vLLM's engine: XPressProposer.blocks
over the blocks of four requests in one call (one drafter pass, one refinement per temperature:
what propose_in_runner does) against one call per request (how it drafted before), greedy and at
T = 0.8, 7 drafts; then the one call refining only the 7 proposed slots (what it does) against
refining all 15 of the block (how it refined before; the same drafts, checked). The contexts are
the held-out prompts of tests/integrations/vllm/engines.py run through the shipped target. The
ways compared alternate, round by round, and each gives its median over the rounds, so a load
that comes and goes on a shared machine weighs on both alike. Runs
inside the vLLM environment of tests/integrations/vllm/run.sh (engines.py imports vLLM):

    build/vllm-venv/bin/python -P bench/bench_vllm_xpress_blocks.py [--rounds 20] [--threads 1]

The file has no bench_* function: bench/run.sh collects this folder in an environment without vLLM.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integrations" / "vllm"))


def medians(fns, rounds):
    """Median milliseconds of each of fns over `rounds` rounds that alternate them (after a warm-up
    call each)."""
    times = {fn: [] for fn in fns}
    for fn in fns:
        fn()
    for _ in range(rounds):
        for fn, seen in times.items():
            began = time.perf_counter()
            fn()
            seen.append(time.perf_counter() - began)
    return [statistics.median(times[fn]) * 1e3 for fn in fns]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (vLLM serves on 1 on this machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from engines import PROMPTS

    from xkernels.decoding.modes import JacobiProposer, request_seeds
    from xkernels.integrations.vllm_xpress import XPressProposer
    from xkernels.models import shipped

    config = SimpleNamespace(cache_config=SimpleNamespace(enable_prefix_caching=False),
                             speculative_config=SimpleNamespace(num_speculative_tokens=7))
    proposer = XPressProposer(config)
    tok = shipped.load_tokenizer()
    contexts, anchors, prevs = [], [], []
    for name, prompt in enumerate(PROMPTS):
        ids = tok.encode(prompt).ids
        with torch.inference_mode():
            _, hidden = proposer.target(torch.tensor([ids[:-1]]), hidden_layers=proposer.drafter.cfg.target_layers)
        state = proposer._state(name, 7 + name)
        proposer._commit([(state, torch.cat(hidden, -1)[0], torch.arange(len(ids) - 1))])
        contexts.append(state.context)
        anchors.append(ids[-1])
        prevs.append(ids[-2])
    seeds = request_seeds(7, len(PROMPTS))
    print(f"{len(PROMPTS)} requests, contexts of {[c.length for c in contexts]} positions, 7 drafts, "
          f"{args.rounds} rounds, torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'temperature':>11s} {'one call (ms)':>14s} {'a call per request (ms)':>24s} {'ratio':>6s}")
    for temperature in (0.0, 0.8):
        temps = [temperature] * len(PROMPTS)

        def together():
            proposer.blocks(contexts, anchors, prevs, temps, seeds)

        def one_by_one():
            for i in range(len(PROMPTS)):
                proposer.blocks(contexts[i : i + 1], anchors[i : i + 1], prevs[i : i + 1], temps[i : i + 1],
                                seeds[i : i + 1])

        batched, looped = medians([together, one_by_one], args.rounds)
        print(f"{temperature:11.1f} {batched:14.1f} {looped:24.1f} {looped / batched:5.2f}x")
    first = proposer.proposer
    whole = JacobiProposer(first.refiner, first.iters)  # every slot of the block
    print(f"{'temperature':>11s} {'7 slots refined (ms)':>21s} {'all 15 (ms)':>12s} {'ratio':>6s}")
    for temperature in (0.0, 0.8):
        temps = [temperature] * len(PROMPTS)

        def refining(p):
            def fn():
                proposer.proposer = p
                return proposer.blocks(contexts, anchors, prevs, temps, seeds)
            return fn

        assert [d for d, _ in refining(first)()] == [d for d, _ in refining(whole)()]  # the same drafts
        part, full = medians([refining(first), refining(whole)], args.rounds)
        print(f"{temperature:11.1f} {part:21.1f} {full:12.1f} {full / part:5.2f}x")
    proposer.proposer = first
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
