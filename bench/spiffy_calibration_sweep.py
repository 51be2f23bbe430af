"""Compares Spiffy draft graphs by calibration objective and budget on the shipped block diffusion
LM: NFE and tokens per second on held-out prompts for each number of drafts kept per call (the
table in bench/results/2026-11-30-spiffy-cpu.md).

    python bench/spiffy_calibration_sweep.py
"""

import torch

from xkernels import data
from xkernels.decoding import dllm_generate
from xkernels.models.shipped import load_block_diffusion, load_tokenizer
from xkernels.decoding.spiffy_calibration import calibrate
from xkernels.spiffy import SpiffyConfig

CASES = [("v3", 33, None), ("v3", 33, 0.9), ("frequency", 33, None), ("frequency", 33, 0.9), ("frequency", 65, None)]
KEEPS = (1, 2, 4, 8, 16, 32)


def main():
    torch.set_num_threads(1)
    model, tok = load_block_diffusion(), load_tokenizer()
    calibration = [torch.tensor(tok.encode(t).ids) for d in data.DOMAINS for t in data.training_prompts(d, 24, rng_seed=7)]
    held = {d: [torch.tensor(tok.encode(t).ids) for t in data.held_out_prompts(d, 4)] for d in data.DOMAINS}
    for objective, budget, threshold in CASES:
        graph = calibrate(model, calibration, budget=budget, depth=8, objective=objective, threshold=threshold)
        for domain, prompts in held.items():
            cells = []
            for keep in KEEPS:
                calls = seconds = 0.0
                for i, ids in enumerate(prompts):
                    _, stats = dllm_generate(model, ids, 64, seed=i, threshold=threshold,
                                             spiffy=SpiffyConfig(graph, keep))
                    calls += stats.model_calls
                    seconds += stats.seconds
                cells.append(f"{keep}:{calls / len(prompts):.1f}/{64 * len(prompts) / seconds:.0f}")
            print(objective, budget, threshold, domain, " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
