"""Co-trains the dFlash-style drafter and the xPress refiner against the frozen shipped target and
writes xkernels/models/weights/{drafter,refiner}.* with a model card and loss curves.

    python python/train/train_drafter.py --objective legacy --steps 3500 --out STAGE1   # ~12 min on 2 cores
    python python/train/train_drafter.py --objective xpress --init STAGE1 --steps 3000 --lr 0.001 \
        --freeze-drafter                                    # the shipped refiner's second stage, ~19 min
--init takes "scratch", "shipped" (the package's weights) or a folder holding drafter.* and refiner.*.

Per block (anchor at position a, gold tokens x[a+1 .. a+D], D = B - 1), with per-slot weights
w_k = exp(-k / 8), the loss is, for --objective legacy,
    1.0 * CE(refined, gold)        refiner, teacher forcing: slot k reads the gold token before it
  + 1.0 * TV(refined, target)      total variation to the target's distribution at that slot
  + 0.5 * CE(refined', gold)       consistency: a second pass reading the model's own predictions
  + 0.5 * CE(drafter, gold)        anchor: keeps the drafter's own cross-entropy low
and for --objective xpress (the xPress authors' recipe, trained for few Jacobi passes)
    1.0 * DSpark(refined)          DSpark(l) = 0.9 * TV(l, target) + 0.1 * CE(l, gold), teacher forced
  + 0.3 * mean_j DSpark(l_j)       consistency over 3 Jacobi passes: pass j reads the detached argmax
                                   of pass j-1, pass 1 the drafter's own argmax (the Jacobi seed)
  + 0.5 * CE(drafter, gold)        anchor
--freeze-drafter trains the refiner alone (the anchor term is then reported, not trained), so the
drafter, and every mode that reads only its marginals (drafter, tree), stay as they were; only the
refiner is written, with refiner_card.json and refiner_loss.png.
"""

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from common import OUT, cosine_lr, plot_losses, token_streams, windows
from xkernels import XPressRefiner, data
from xkernels.models import BlockDrafter, DrafterConfig
from xkernels.models.shipped import load_drafter, load_refiner, load_target, load_tokenizer, save

BLOCK, RANK = 16, 64
BATCH, LENGTH, ANCHORS = 8, 160, 4  # 8 windows, 4 blocks each
OBJECTIVES = {"legacy": dict(ce=1.0, tv=1.0, consistency=0.5, anchor=0.5),
              "xpress": dict(dspark=1.0, consistency=0.3, anchor=0.5)}
JACOBI_PASSES = 3


def block_batch(target, x, layers, rng):
    """Anchors, the target's features and distributions for a batch of windows x [N, T]."""
    with torch.no_grad():
        logits, hidden = target(x, hidden_layers=layers)
    n, t = x.shape
    anchors = torch.tensor([[rng.randrange(1, t - BLOCK) for _ in range(ANCHORS)] for _ in range(n)])
    rows = torch.arange(n).repeat_interleave(ANCHORS)
    a = anchors.reshape(-1)
    slots = a[:, None] + torch.arange(BLOCK)  # positions of the block's slots
    features = torch.cat(hidden, -1)[rows]
    gold = x[rows[:, None], slots[:, 1:]]  # [M, D]
    prev = x[rows[:, None], slots - 1]  # slot k reads the token before it
    target_probs = logits[rows[:, None], slots[:, :-1]].softmax(-1)  # predicts the token at slot k+1
    anchor_ids = x[rows, a]
    return features, a, anchor_ids, gold, prev, target_probs


def losses(target, drafter, refiner, batch, mask_id, objective="legacy"):
    features, a, anchor_ids, gold, prev, target_probs = batch
    m, d = gold.shape
    block_ids = torch.cat([anchor_ids[:, None], torch.full((m, d), mask_id)], 1)
    ctx_kv = drafter.context(features, torch.arange(features.shape[1]))
    h = drafter(target.embed(block_ids).detach(), ctx_kv, ctx_len=a)
    base = target.lm_head(h[:, 1:])
    w = torch.exp(-torch.arange(d, dtype=torch.float32) / 8)
    w = w / w.sum()

    def ce(logits):
        return (F.cross_entropy(logits.reshape(-1, logits.shape[-1]), gold.reshape(-1), reduction="none")
                .view(m, d) * w).sum(-1).mean()

    def tv(logits):
        return (0.5 * (logits.softmax(-1) - target_probs).abs().sum(-1) * w).sum(-1).mean()

    def reading(drafts):  # slot k reads slot k-1: the token before the anchor, the anchor, the drafts
        return torch.cat([prev[:, :2], drafts[:, :-1]], 1).detach()

    refined = refiner(base, h, prev)
    if objective == "legacy":
        refined_own = refiner(base, h, reading(refined.argmax(-1)))
        parts = dict(ce=ce(refined), tv=tv(refined), consistency=ce(refined_own), anchor=ce(base))
    else:
        def dspark(logits):
            return 0.9 * tv(logits) + 0.1 * ce(logits)

        drafts, consistency = base.argmax(-1), 0.0
        for _ in range(JACOBI_PASSES):
            passed = refiner(base, h, reading(drafts))
            consistency = consistency + dspark(passed) / JACOBI_PASSES
            drafts = passed.argmax(-1)
        parts = dict(dspark=dspark(refined), consistency=consistency, anchor=ce(base))
    weights = OBJECTIVES[objective]
    return sum(weights[k] * v for k, v in parts.items()), parts, base, refined


@torch.no_grad()
def evaluate(target, drafter, refiner, streams, layers, mask_id, objective, batches=6):
    """Held-out cross-entropies and greedy agreement with the target (teacher forced)."""
    rng = random.Random(99)
    sums = dict(drafter_ce=0.0, refiner_ce=0.0, drafter_match=0.0, refiner_match=0.0)
    for _ in range(batches):
        batch = block_batch(target, windows(streams, BATCH, LENGTH, rng), layers, rng)
        _, parts, base, refined = losses(target, drafter, refiner, batch, mask_id, objective)
        want = batch[5].argmax(-1)
        gold = batch[3]
        sums["drafter_ce"] += parts["anchor"].item() / batches
        sums["refiner_ce"] += F.cross_entropy(refined.reshape(-1, refined.shape[-1]), gold.reshape(-1)).item() / batches
        sums["drafter_match"] += (base.argmax(-1) == want).float().mean().item() / batches
        sums["refiner_match"] += (refined.argmax(-1) == want).float().mean().item() / batches
    return {k: round(v, 3) for k, v in sums.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3500)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--objective", choices=sorted(OBJECTIVES), default="xpress")
    parser.add_argument("--init", default="scratch",
                        help="scratch (default), shipped (the package's drafter and refiner) or a folder of them")
    parser.add_argument("--freeze-drafter", action="store_true", help="train the refiner only")
    parser.add_argument("--out", type=Path, default=OUT, help="weights folder (default: the package's)")
    args = parser.parse_args()
    torch.manual_seed(0)
    began = time.time()
    target = load_target()
    for p in target.parameters():
        p.requires_grad_(False)
    mask_id = load_tokenizer().token_to_id(data.MASK)
    dcfg = DrafterConfig(dim=target.cfg.dim, mask_token_id=mask_id, n_layers=2, ffn_hidden=704, block_size=BLOCK,
                         target_layers=(1, 3))
    if args.init != "scratch":
        folder = OUT if args.init == "shipped" else Path(args.init)
        drafter, refiner = load_drafter(folder).train(), load_refiner(folder).train()
        dcfg = drafter.cfg
    else:
        drafter = BlockDrafter(dcfg)
        refiner = XPressRefiner(target.cfg.vocab_size, target.cfg.dim, BLOCK, rank=RANK, mlp_ratio=2)
    if args.freeze_drafter:
        for p in drafter.parameters():
            p.requires_grad_(False)
    params = [p for p in list(drafter.parameters()) + list(refiner.parameters()) if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    train, held = token_streams("train"), token_streams("held_out")
    rng = random.Random(0)
    curves = {k: [] for k in OBJECTIVES[args.objective]}
    for step in (bar := tqdm(range(args.steps), desc="drafter+refiner")):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, args.steps, args.lr)
        batch = block_batch(target, windows(train, BATCH, LENGTH, rng), dcfg.target_layers, rng)
        loss, parts, _, _ = losses(target, drafter, refiner, batch, mask_id, args.objective)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        for k, v in parts.items():
            curves[k].append(v.item())
        bar.set_postfix({k: f"{sum(c[-20:]) / len(c[-20:]):.3f}" for k, c in curves.items()})
    drafter.eval(), refiner.eval()
    scores = evaluate(target, drafter, refiner, held, dcfg.target_layers, mask_id, args.objective)
    minutes = (time.time() - began) / 60
    if not args.freeze_drafter:
        save(drafter, dcfg.to_dict(), "drafter", args.out)
    save(refiner, dict(vocab_size=target.cfg.vocab_size, hidden_size=target.cfg.dim, block_size=BLOCK, rank=RANK,
                       mlp_ratio=2), "refiner", args.out)
    trained = "refiner" if args.freeze_drafter else "drafter"  # the card and curves are named after it
    plotted = {k: v for k, v in curves.items() if not (args.freeze_drafter and k == "anchor")}  # untrained
    plot_losses(plotted, args.out / f"{trained}_loss.png",
                f"refiner ({args.objective}, drafter frozen)" if args.freeze_drafter else
                f"drafter + refiner ({args.objective})")
    card = {"command": f"python python/train/train_drafter.py --objective {args.objective} --init {args.init} "
                       f"--steps {args.steps} --lr {args.lr}" + (" --freeze-drafter" if args.freeze_drafter else ""),
            "objective": args.objective, "init": args.init, "freeze_drafter": args.freeze_drafter,
            "steps": args.steps, "blocks_per_step": BATCH * ANCHORS, "block_size": BLOCK, "rank": RANK,
            "loss_weights": OBJECTIVES[args.objective], "jacobi_passes": JACOBI_PASSES if args.objective == "xpress" else 1,
            "minutes": round(minutes, 1), "held_out": scores,
            "drafter_parameters": sum(p.numel() for p in drafter.parameters()),
            "refiner_parameters": sum(p.numel() for p in refiner.parameters())}
    (args.out / f"{trained}_card.json").write_text(json.dumps(card, indent=1))
    print(json.dumps(card, indent=1))


if __name__ == "__main__":
    main()
