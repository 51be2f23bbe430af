"""Trains the block diffusion LM (SDAR style) on both domains and writes
xkernels/models/weights/block_diffusion.* with a model card and a loss curve. It starts from the
shipped autoregressive target (as SDAR adapts an AR model), so a short run suffices: about 20
minutes on 2 CPU cores.

Each training sequence is a clean copy and a noised copy side by side (BD3-LM's layout): the
clean copy attends block-causally to itself; each noised block attends to the clean blocks before
it and to itself. Every noised block masks its tokens with its own rate t ~ U(0, 1), and the loss
is the cross-entropy of the masked tokens. Block boundaries are shifted by a random offset per
batch, so a prompt of any length can end a block.

    python python/train/train_block_diffusion.py [--steps 900] [--lr 1e-3]
    python python/train/train_block_diffusion.py --init shipped --steps 1200 --lr 5e-4   # a second stage
    python python/train/train_block_diffusion.py --init shipped --data distill ...        # distillation

--data distill trains on the AR target's greedy continuations of training prompts (distill_corpus.py,
cached under build/distill/), mixed with the real text at --text-share of each batch's rows; held-out
loss is always measured on the real held-out text. The model card lists the stages the shipped
weights come from, each with its command; --out writes a stage elsewhere (to compare before shipping),
--from continues such a folder instead of the shipped one.
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from common import OUT, fit, plot_losses, token_streams, windows
from distill_corpus import distilled_streams
from xkernels.models.block_diffusion import BlockDiffusionConfig, BlockDiffusionLM
from xkernels.models.shipped import load_block_diffusion, load_config, load_target, save

BATCH, LENGTH = 12, 192


def training_mask(length: int, block_size: int, offset: int) -> torch.Tensor:
    """[2T, 2T] bool for the sequence [clean, noised]."""
    block = (torch.arange(length) + offset) // block_size
    before_or_same = block[None, :] <= block[:, None]
    same = block[None, :] == block[:, None]
    top = torch.cat([before_or_same, torch.zeros_like(same)], dim=1)
    bottom = torch.cat([before_or_same & ~same, same], dim=1)
    return torch.cat([top, bottom], dim=0)


def noised(x: torch.Tensor, block_size: int, offset: int, mask_id: int, gen: torch.Generator):
    """x with each block's tokens masked at a rate t ~ U(0, 1) drawn per block, and the mask."""
    block = (torch.arange(x.shape[1]) + offset) // block_size
    rate = torch.rand(x.shape[0], int(block[-1]) + 1, generator=gen)[:, block]
    masked = torch.rand(x.shape, generator=gen) < rate
    return torch.where(masked, torch.full_like(x, mask_id), x), masked


def loss_of(model, x, offset, gen):
    cfg = model.cfg
    noisy, masked = noised(x, cfg.block_size, offset, cfg.mask_id, gen)
    positions = torch.arange(x.shape[1]).repeat(2)
    logits = model.hidden(torch.cat([x, noisy], dim=1), positions, training_mask(x.shape[1], cfg.block_size, offset))
    logits = logits[:, x.shape[1]:][masked]
    return F.cross_entropy(logits, x[masked])


@torch.no_grad()
def held_out_loss(model, streams, batches=20):
    rng, gen = random.Random(1234), torch.Generator().manual_seed(1234)
    losses = [loss_of(model, windows(streams, BATCH, LENGTH, rng), rng.randrange(model.cfg.block_size), gen).item()
              for _ in range(batches)]
    return sum(losses) / len(losses)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--init", choices=["target", "shipped"], default="target",
                        help="start from the AR target (default) or continue the shipped block diffusion LM")
    parser.add_argument("--data", choices=["text", "distill"], default="text",
                        help="the training text: the corpus (default) or the AR target's greedy continuations")
    parser.add_argument("--distill-prompts", type=int, default=3000, help="--data distill: prompts per domain")
    parser.add_argument("--distill-seed", type=int, default=0,
                        help="--data distill: which training prompts (another seed draws other ones)")
    parser.add_argument("--text-share", type=float, default=0.0,
                        help="--data distill: the share of each batch's rows drawn from the real text")
    parser.add_argument("--out", type=Path, default=OUT, help="where the weights, card and curve go")
    parser.add_argument("--from", dest="source", type=Path, default=OUT,
                        help="--init shipped: the folder whose weights and card to continue (default: the shipped "
                        "ones; a scratch --out of an earlier stage, to try stages in turn before shipping them)")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: torch's)")
    args = parser.parse_args()
    if not 0.0 <= args.text_share <= 1.0:
        parser.error(f"--text-share must be in [0, 1], got {args.text_share}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    began = time.time()
    train, held = token_streams("train"), token_streams("held_out")
    distilled = distilled_streams(args.distill_prompts, args.distill_seed) if args.data == "distill" else None
    text_rows = BATCH if distilled is None else round(BATCH * args.text_share)
    if args.init == "target":
        cfg = BlockDiffusionConfig(**load_config("target"))
        model = BlockDiffusionLM(cfg)
        model.load_state_dict(load_target().state_dict())
        stages = []
    else:
        model = load_block_diffusion(args.source)
        cfg = model.cfg
        stages = json.loads((args.source / "block_diffusion_card.json").read_text())["stages"]
    start_loss = held_out_loss(model.eval(), held)
    model.train()
    rng, gen = random.Random(len(stages)), torch.Generator().manual_seed(len(stages))  # new batches per stage

    def batch():
        rows = [windows(train, text_rows, LENGTH, rng)] if text_rows else []
        if text_rows < BATCH:
            rows.append(windows(distilled, BATCH - text_rows, LENGTH, rng))
        return torch.cat(rows)

    losses = fit(model, args.steps, args.lr, lambda: loss_of(model, batch(), rng.randrange(cfg.block_size), gen),
                 "block diffusion")
    model.eval()
    held_loss = held_out_loss(model, held)
    save(model, cfg.to_dict(), "block_diffusion", args.out)
    plot = "block_diffusion_loss.png" if not stages else f"block_diffusion_loss_stage{len(stages) + 1}.png"
    plot_losses({"train": losses}, args.out / plot, "block diffusion LM (masked-token cross-entropy)")
    # The command as it makes the shipped weights: --out and --from change where they go and come
    # from (the stages run in turn on the shipped folder), not what they are.
    given, moved = sys.argv[1:], ("--out", "--from")
    argv = [a for i, a in enumerate(given) if not a.startswith(moved) and (i == 0 or given[i - 1] not in moved)]
    stage = {"loss_curve": plot, "command": " ".join(["python python/train/train_block_diffusion.py"] + argv),
             "init": args.init, "data": args.data, "steps": args.steps, "lr": args.lr,
             "minutes": round((time.time() - began) / 60, 1),
             "held_out_loss_at_start": round(start_loss, 3), "held_out_loss": round(held_loss, 3)}
    if distilled is not None:
        stage.update(distill_prompts_per_domain=args.distill_prompts, distill_seed=args.distill_seed,
                     text_share=args.text_share,
                     distill_tokens={d: s.numel() for d, s in distilled.items()})
    stages.append(stage)
    card = {"batch": BATCH, "length": LENGTH, "block_size": cfg.block_size, "mask_id": cfg.mask_id,
            "held_out_loss": round(held_loss, 3), "parameters": sum(p.numel() for p in model.parameters()),
            "stages": stages}
    (args.out / "block_diffusion_card.json").write_text(json.dumps(card, indent=1))
    print(json.dumps(card, indent=1))


if __name__ == "__main__":
    main()
