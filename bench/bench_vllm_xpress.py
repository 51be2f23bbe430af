"""xPress inside vLLM on the CPU: tau and tokens per second of the shipped target served by vLLM
without speculation, with ngram speculation and with the xPress proposer
(xkernels.integrations.vllm_xpress.XPressProposer), all verified by XKernelsRejectionSampler.
Runs inside the vLLM environment of tests/integrations/vllm/run.sh, which exports the target:

    VLLM_ENABLE_V1_MULTIPROCESSING=0 XKERNELS_VLLM=1 VLLM_CPU_KVCACHE_SPACE=1 \\
      build/vllm-venv/bin/python -P bench/bench_vllm_xpress.py build/vllm-target [--tokens 64]

tau: tokens per target forward of a request after its prefill (1 without speculation).
Tokens per second: the new tokens of a whole generate call over its wall time, after one
warm-up call. The prompts are the held-out ones of tests/integrations/vllm/engines.py.

The file has no bench_* function: bench/run.sh collects this folder in an environment without vLLM.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integrations" / "vllm"))

METHODS = {
    "none": None,
    "ngram (4 tokens)": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                         "prompt_lookup_min": 2},
    "xPress (7 tokens)": {"method": "custom_class", "num_speculative_tokens": 7,
                          "model": "xkernels.integrations.vllm_xpress.XPressProposer"},
    "xPress (15 tokens)": {"method": "custom_class", "num_speculative_tokens": 15,
                           "model": "xkernels.integrations.vllm_xpress.XPressProposer"},
}
# vLLM's CPU kernel registration fails in a process where the ngram proposer imported numba: ngram last.
ORDER = ("none", "xPress (7 tokens)", "xPress (15 tokens)", "ngram (4 tokens)")


def measure(llm, prompts, params):
    """(tau, tokens per second, tokens) of one generate call."""
    from engines import model_runner

    runner = model_runner(llm)
    steps = []
    sample = runner._sample

    def counted(logits, spec_decode_metadata):
        steps.append(len(runner.input_batch.req_ids))
        return sample(logits, spec_decode_metadata)

    runner._sample = counted
    try:
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
    finally:
        del runner._sample
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    new = sum(map(len, tokens))
    # Each request's prefill forward emits its first token (prompts fit one prefill chunk).
    return (new - len(prompts)) / max(sum(steps) - len(prompts), 1), new / seconds, tokens


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    assert os.environ.get("XKERNELS_VLLM") == "1" and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
    from engines import PROMPTS, close, engine
    from vllm import SamplingParams

    load_at_start = os.getloadavg()[0]
    cases = [("greedy, batch 1", 0.0, 1), ("greedy, batch 4", 0.0, 4), ("T=0.8 top_p=0.95, batch 4", 0.8, 4)]
    rows, reference = [], {}
    for name in ORDER:
        llm = engine(args.target, enable_prefix_caching=False, speculative_config=METHODS[name])
        for case, temperature, batch in cases:
            params = SamplingParams(max_tokens=args.tokens, temperature=temperature, top_p=0.95 if temperature else 1.0,
                                    seed=7 if temperature else None)
            taus, speeds, tokens = [], [], []
            measure(llm, PROMPTS[:batch], params)  # warm-up
            for start in range(0, len(PROMPTS), batch):
                tau, speed, out = measure(llm, PROMPTS[start : start + batch], params)
                taus.append(tau)
                speeds.append(speed)
                tokens += out
            if temperature == 0:
                same = reference.setdefault(case, tokens) == tokens
            else:
                same = None
            rows.append((name, case, sum(taus) / len(taus), sum(speeds) / len(speeds), same))
            print(f"{name:20s} {case:28s} tau {rows[-1][2]:5.2f}  {rows[-1][3]:7.1f} tok/s"
                  + ("" if same is None else f"  tokens equal no-speculation's: {same}"), flush=True)
        close(llm)
    print(f"\ntorch threads {torch.get_num_threads()}, load average {load_at_start:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end")
    base = {case: speed for name, case, _, speed, _ in rows if name == "none"}
    print(f"{'method':20s} {'case':28s} {'tau':>5s} {'tok/s':>8s} {'vs none':>8s}")
    for name, case, tau, speed, _ in rows:
        print(f"{name:20s} {case:28s} {tau:5.2f} {speed:8.1f} {speed / base[case]:7.2f}x")


if __name__ == "__main__":
    main()
