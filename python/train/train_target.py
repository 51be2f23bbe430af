"""Trains the target LM on both domains and writes xkernels/models/weights/target.* with a model
card and a loss curve. About 16 minutes on 2 CPU cores.

    python python/train/train_target.py [--steps 1000]
"""

import argparse
import json
import random
import time

import torch
import torch.nn.functional as F

from common import OUT, fit, plot_losses, token_streams, windows
from xkernels.models import TargetConfig, TargetLM
from xkernels.models.shipped import save

CONFIG = TargetConfig(vocab_size=4096, dim=256, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=704)
BATCH, LENGTH = 32, 128


@torch.no_grad()
def held_out_loss(model, streams, batches=20):
    rng = random.Random(1234)
    losses = []
    for _ in range(batches):
        x = windows(streams, BATCH, LENGTH + 1, rng)
        logits, _ = model(x[:, :-1])
        losses.append(F.cross_entropy(logits.reshape(-1, CONFIG.vocab_size), x[:, 1:].reshape(-1)).item())
    return sum(losses) / len(losses)


def bigram_held_out_loss(train, held, batches=20, smoothing=0.1):
    """The held-out loss of an add-k bigram model counted on the training streams."""
    v = CONFIG.vocab_size
    counts = torch.full((v, v), smoothing)
    for stream in train.values():
        counts.index_put_((stream[:-1], stream[1:]), torch.ones(len(stream) - 1), accumulate=True)
    logp = (counts / counts.sum(-1, keepdim=True)).log()
    rng = random.Random(1234)
    losses = []
    for _ in range(batches):
        x = windows(held, BATCH, LENGTH + 1, rng)
        losses.append(-logp[x[:, :-1], x[:, 1:]].mean().item())
    return sum(losses) / len(losses)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    torch.manual_seed(0)
    began = time.time()
    train, held = token_streams("train"), token_streams("held_out")
    model = TargetLM(CONFIG)
    rng = random.Random(0)

    def batch_loss():
        x = windows(train, BATCH, LENGTH + 1, rng)
        logits, _ = model(x[:, :-1])
        return F.cross_entropy(logits.reshape(-1, CONFIG.vocab_size), x[:, 1:].reshape(-1))

    losses = fit(model, args.steps, args.lr, batch_loss, "target")
    model.eval()
    held_loss, bigram = held_out_loss(model, held), bigram_held_out_loss(train, held)
    minutes = (time.time() - began) / 60
    save(model, CONFIG.to_dict(), "target")
    plot_losses({"train": losses}, OUT / "target_loss.png", "target LM")
    card = {"steps": args.steps, "batch": BATCH, "length": LENGTH, "tokens_seen": args.steps * BATCH * LENGTH,
            "train_tokens": {k: len(v) for k, v in train.items()}, "minutes": round(minutes, 1),
            "held_out_loss": round(held_loss, 3), "bigram_held_out_loss": round(bigram, 3),
            "parameters": sum(p.numel() for p in model.parameters())}
    (OUT / "target_card.json").write_text(json.dumps(card, indent=1))
    print(json.dumps(card, indent=1))


if __name__ == "__main__":
    main()
