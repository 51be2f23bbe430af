"""The demo's decoding on the shipped models with and without a competing CPU-bound process.

    python bench/busy_machine.py [--tokens 32] [--prompts 2] [--json out.json]

Runs every mode of xkernels.decoding.generate on held-out prompts of both domains, first on the
machine as it is, then while another process spins on one core (it stops by itself after
--busy-seconds, and is killed when the measurement ends). Prints tokens/s for both and their
ratio; the loop picks its intra-op threads with xkernels.decoding.generate.decode_threads (one for
the small shipped models). One extra row shows jacobi with torch's 2 threads under the same load,
what the thread choice avoids.
"""

import argparse
import json
import subprocess
import sys
import time

import torch

from xkernels import data
from xkernels.decoding import MODES, generate
from xkernels.models.shipped import load_all

SPIN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def measure(models, prompts, tokens, modes, num_threads=None):
    rates = {}
    for mode in modes:
        new, seconds = 0, 0.0
        for ids in prompts:
            _, stats = generate(models.target, ids, tokens, mode=mode, drafter=models.drafter, refiner=models.refiner,
                                num_threads=num_threads)
            new, seconds = new + stats.new_tokens, seconds + stats.seconds
        rates[mode] = new / seconds
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=2, help="held-out prompts per domain")
    parser.add_argument("--busy-seconds", type=int, default=600)
    parser.add_argument("--json")
    args = parser.parse_args()
    models = load_all()
    prompts = [models.tokenizer.encode(t).ids for d in data.DOMAINS for t in data.held_out_prompts(d, args.prompts)]
    measure(models, prompts[:1], 8, MODES)  # warm-up
    idle = measure(models, prompts, args.tokens, MODES)
    busy_proc = subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=args.busy_seconds)])
    try:
        time.sleep(0.5)
        busy = measure(models, prompts, args.tokens, MODES)
        two = measure(models, prompts[:1], 8, ["jacobi"], num_threads=2)["jacobi"]
    finally:
        busy_proc.kill()
        busy_proc.wait()
    print(f"tokens/s, {len(prompts)} held-out prompts x {args.tokens} tokens, torch {torch.__version__}")
    print(f"{'mode':<12} {'as is':>9} {'busy':>9} {'ratio':>7}")
    for mode in MODES:
        print(f"{mode:<12} {idle[mode]:>9.1f} {busy[mode]:>9.1f} {idle[mode] / busy[mode]:>6.2f}x")
    print(f"{'jacobi, 2 threads, busy (1 prompt, 8 tokens)':<40} {two:>9.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(idle=idle, busy=busy, jacobi_two_threads_busy=two, tokens=args.tokens,
                           prompts=len(prompts)), f, indent=1)


if __name__ == "__main__":
    main()
