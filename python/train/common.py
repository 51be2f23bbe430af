"""Helpers the training recipes share: token streams, random windows, the loss curve."""

import math
import random
from pathlib import Path
from typing import Callable, Dict, List

import torch
from tqdm import tqdm

from xkernels import data
from xkernels.models.shipped import load_tokenizer

OUT = Path(__file__).resolve().parents[2] / "xkernels" / "models" / "weights"


def token_streams(split: str, math_count: int = 20_000) -> Dict[str, torch.Tensor]:
    """One int64 token stream per domain, documents separated by <|endoftext|>."""
    tok = load_tokenizer()
    eot = tok.token_to_id(data.EOT)
    docs = {"code": list(data.code_documents(split)), "math": list(data.math_documents(split, math_count))}
    streams = {}
    for domain, texts in docs.items():
        ids: List[int] = []
        for enc in tok.encode_batch(texts):
            ids += enc.ids + [eot]
        streams[domain] = torch.tensor(ids, dtype=torch.int64)
    return streams


def windows(streams: Dict[str, torch.Tensor], batch: int, length: int, rng: random.Random) -> torch.Tensor:
    """[batch, length] windows, half from each domain."""
    rows = []
    for i in range(batch):
        stream = streams[data.DOMAINS[i % len(data.DOMAINS)]]
        start = rng.randrange(0, len(stream) - length)
        rows.append(stream[start : start + length])
    return torch.stack(rows)


def cosine_lr(step: int, total: int, peak: float, warmup: int = 50) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def fit(model: torch.nn.Module, steps: int, lr: float, batch_loss: Callable[[], torch.Tensor], desc: str) -> List[float]:
    """AdamW (weight decay 0.05, betas 0.9/0.95) with the cosine schedule and grad clip 1.0 over
    `steps` batches of batch_loss(); returns the training losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05, betas=(0.9, 0.95))
    losses: List[float] = []
    for step in (bar := tqdm(range(steps), desc=desc)):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, steps, lr)
        loss = batch_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    return losses


def plot_losses(curves: Dict[str, List[float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    window = 50  # per-step losses are noisy: each curve is drawn faintly, its moving mean solid
    for name, values in curves.items():
        steps = range(1, len(values) + 1)
        line, = ax.plot(steps, values, alpha=0.25, linewidth=0.6)
        if len(values) >= window:
            mean = [sum(values[i - window:i]) / window for i in range(window, len(values) + 1)]
            ax.plot(range(window, len(values) + 1), mean, color=line.get_color(), label=f"{name} ({window}-step mean)")
        else:
            line.set_label(name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
