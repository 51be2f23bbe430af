"""The distillation text of the block diffusion LM: the shipped AR target's greedy continuations
of prompts cut from TRAINING documents only (xkernels.data's train split; the held-out split, and
so every evaluation prompt, is never read). Deterministic text sharpens the diffusion LM's step
distributions, which threshold unmasking and Spiffy's drafts need.

Code prompts are 24-96 tokens of a training file, from its start half of the time (as the demo's
prompts are file openings) and from a random token otherwise; math prompts are a training problem's
question and "Answer:". Each is continued by 96 greedy tokens (prompt and continuation stay within
the 192 tokens the diffusion LM trains on). The corpus is cached under build/distill/, keyed by
its arguments and the target's weights, and built by train_block_diffusion.py --data distill or:

    python python/train/distill_corpus.py [--prompts 3000]   # per domain
"""

import argparse
import hashlib
import random
import time
from pathlib import Path
from typing import Dict, List

import torch

from common import OUT
from xkernels import data
from xkernels.decoding import generate_batch
from xkernels.models.shipped import load_target, load_tokenizer

CACHE = Path(__file__).resolve().parents[2] / "build" / "distill"
NEW_TOKENS = 96
BATCH = 64  # prompts a generate_batch call


def _prompts(domain: str, count: int, tok, rng: random.Random) -> List[List[int]]:
    if domain == "math":
        docs = list(data.math_documents("train", 20_000))
        return [tok.encode(d[: d.index("Answer:") + len("Answer:")]).ids for d in rng.sample(docs, count)]
    files = [ids for ids in (e.ids for e in tok.encode_batch(list(data.code_documents("train")))) if len(ids) > 128]
    prompts = []
    for _ in range(count):
        ids, length = rng.choice(files), rng.randint(24, 96)
        start = 0 if rng.random() < 0.5 else rng.randrange(len(ids) - length)
        prompts.append(ids[start : start + length])
    return prompts


def distilled_streams(count: int, seed: int = 0) -> Dict[str, torch.Tensor]:
    """One int64 stream per domain (as common.token_streams): count prompts, each followed by the
    target's greedy continuation, separated by <|endoftext|>."""
    key = hashlib.sha256((OUT / "target.safetensors").read_bytes()).hexdigest()[:12]
    path = CACHE / f"target-{key}_n{count}_new{NEW_TOKENS}_seed{seed}.pt"
    if path.exists():
        return torch.load(path)
    tok, target = load_tokenizer(), load_target()
    eot = tok.token_to_id(data.EOT)
    rng, streams = random.Random(seed), {}
    for domain in data.DOMAINS:
        began, ids = time.time(), []
        prompts = _prompts(domain, count, tok, rng)
        for i in range(0, count, BATCH):
            outs, _ = generate_batch(target, prompts[i : i + BATCH], NEW_TOKENS, mode="ar", num_threads=1)
            for prompt, out in zip(prompts[i : i + BATCH], outs):
                ids += prompt + out + [eot]
            print(f"distill {domain}: {min(i + BATCH, count)}/{count} prompts, {time.time() - began:.0f} s", flush=True)
        streams[domain] = torch.tensor(ids, dtype=torch.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(streams, path)
    return streams


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=3000, help="per domain")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    streams = distilled_streams(args.prompts, args.seed)
    print({d: s.numel() for d, s in streams.items()}, "tokens")


if __name__ == "__main__":
    main()
