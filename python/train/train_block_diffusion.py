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

The shipped weights come from the first command (defaults) followed by the second; the model card
lists the stages.
"""

import argparse
import json
import random
import sys
import time

import torch
import torch.nn.functional as F

from common import OUT, fit, plot_losses, token_streams, windows
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
    args = parser.parse_args()
    torch.manual_seed(0)
    began = time.time()
    train, held = token_streams("train"), token_streams("held_out")
    if args.init == "target":
        cfg = BlockDiffusionConfig(**load_config("target"))
        model = BlockDiffusionLM(cfg)
        model.load_state_dict(load_target().state_dict())
        stages = []
    else:
        model = load_block_diffusion()
        cfg = model.cfg
        stages = json.loads((OUT / "block_diffusion_card.json").read_text())["stages"]
    start_loss = held_out_loss(model.eval(), held)
    model.train()
    rng, gen = random.Random(len(stages)), torch.Generator().manual_seed(len(stages))  # new batches per stage
    losses = fit(model, args.steps, args.lr,
                 lambda: loss_of(model, windows(train, BATCH, LENGTH, rng), rng.randrange(cfg.block_size), gen),
                 "block diffusion")
    model.eval()
    held_loss = held_out_loss(model, held)
    save(model, cfg.to_dict(), "block_diffusion")
    plot = "block_diffusion_loss.png" if not stages else f"block_diffusion_loss_stage{len(stages) + 1}.png"
    plot_losses({"train": losses}, OUT / plot, "block diffusion LM (masked-token cross-entropy)")
    stages.append({"loss_curve": plot, "command": " ".join(["python python/train/train_block_diffusion.py"] + sys.argv[1:]),
                   "init": args.init, "steps": args.steps, "lr": args.lr, "minutes": round((time.time() - began) / 60, 1),
                   "held_out_loss_at_start": round(start_loss, 3), "held_out_loss": round(held_loss, 3)})
    card = {"batch": BATCH, "length": LENGTH, "block_size": cfg.block_size, "mask_id": cfg.mask_id,
            "held_out_loss": round(held_loss, 3), "parameters": sum(p.numel() for p in model.parameters()),
            "stages": stages}
    (OUT / "block_diffusion_card.json").write_text(json.dumps(card, indent=1))
    print(json.dumps(card, indent=1))


if __name__ == "__main__":
    main()
