"""Where the shipped block diffusion LM stands as a drafter for itself (Spiffy) and against the AR
target it was adapted from, on held-out prompts, greedy, 64 new tokens in blocks of 32:

- AR agreement: the share of the diffusion LM's vanilla tokens that the AR target picks greedily
  after the same prefix (teacher-forced), and the share equal to the AR target's own greedy
  continuation position by position;
- confidence: the mean top-1 probability of the token each vanilla step unmasks (flat step
  distributions make drafts rare);
- next position: how often a step unmasks the position that the previous step's distribution
  ranked most confident among those still masked (Spiffy's first draft, node (0, 0)'s position).

    python bench/block_diffusion_quality.py [--prompts 8] [--weights DIR]
"""

import argparse
from pathlib import Path

import torch

from xkernels import data
from xkernels.decoding import dllm_generate, generate
from xkernels.models.shipped import WEIGHTS, load_block_diffusion, load_target, load_tokenizer
from xkernels.spiffy import rank_coordinates


@torch.inference_mode()
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts per domain")
    parser.add_argument("--weights", type=Path, default=WEIGHTS,
                        help="the block diffusion LM's folder (default: the shipped one; the target: always shipped)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, target, tok = load_block_diffusion(args.weights), load_target(), load_tokenizer()
    mask_id = model.cfg.mask_id
    print(f"{'domain':<6} {'AR agrees':>10} {'= AR greedy':>12} {'confidence':>11} {'next position':>14}")
    for domain in data.DOMAINS:
        agree = same = total = 0
        conf, hits, steps = [], 0, 0
        for text in data.held_out_prompts(domain, args.prompts):
            ids = torch.tensor(tok.encode(text).ids)
            trace: list = []
            out, _ = dllm_generate(model, ids, 64, trace=trace)
            ar, _ = generate(target, ids.tolist(), 64, mode="ar")
            logits, _ = target(torch.cat([ids, out])[None])
            picks = logits[0, ids.numel() - 1 : -1].argmax(-1)
            agree += int((picks == out).sum())
            same += int((torch.as_tensor(ar)[: out.numel()] == out).sum())
            total += out.numel()
            for block in trace:
                for t, (step_logits, before, after) in enumerate(block):
                    pos = int((before != after).nonzero()[0, 0])
                    p = torch.softmax(step_logits.float().masked_fill(
                        torch.arange(step_logits.shape[-1]) == mask_id, float("-inf")), -1)
                    conf.append(float(p[pos, after[pos]]))
                    if t:
                        order, _ = rank_coordinates(block[t - 1][0], before, mask_id)
                        hits += order[0] == pos
                        steps += 1
        print(f"{domain:<6} {agree / total:>10.3f} {same / total:>12.3f} {sum(conf) / len(conf):>11.3f} "
              f"{hits / steps:>14.3f}", flush=True)


if __name__ == "__main__":
    main()
