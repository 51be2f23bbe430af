"""The demo's diffusion section: the shipped block diffusion LM on held-out prompts of each domain,
decoded one token per step (vanilla), with threshold unmasking, with Spiffy (the shipped graphs),
and with both. It reports model calls (NFE; the prompt and finished blocks join the cache
in the next call), unmasking steps, tokens per second, the NFE reduction and speed-up over vanilla,
whether the tokens equal vanilla's (Spiffy rows against the vanilla run with the same threshold),
and the share of the decoding time spent in the model and in each phase outside it
(spiffy_materialize, dllm_step / spiffy_accept with the call's host read, the loop's own).
The plot shows NFE and tokens per second against the drafts kept per call.
"""

import json
from pathlib import Path
from statistics import mean
from typing import Sequence

import torch
from tqdm import tqdm

from . import data
from .decoding import dllm_generate
from .models.shipped import load_block_diffusion, load_tokenizer
from .spiffy import SpiffyConfig, shipped_graph

THRESHOLD = 0.9  # Fast-dLLM's default
KEEPS = (1, 2, 4, 8, 16, 32)
PHASES = ("model", "draft", "mask", "step")  # DllmStats.phase_seconds; the rest is the loop's own ("other")


def phase_shares(stats_list) -> dict:
    """Each phase's share of the decoding time of some runs (profiled), and "other" for the rest."""
    total = sum(s.seconds for s in stats_list)
    shares = {p: sum(s.phase_seconds.get(p, 0.0) for s in stats_list) / total for p in PHASES}
    shares["other"] = 1.0 - sum(shares.values())
    return shares


def run_diffusion_demo(prompts: int = 4, tokens: int = 64, temperature: float = 0.0, keep: int = 16,
                       block_size: int = 32, seed: int = 0, out: Path = Path("demo_out"), device: str = "cpu",
                       keeps: Sequence[int] = KEEPS) -> dict:
    model, tok = load_block_diffusion().to(device), load_tokenizer()
    graphs = {None: shipped_graph(device=device), THRESHOLD: shipped_graph(threshold=True, device=device)}
    runs = [("vanilla", None, None), ("threshold", THRESHOLD, None), (f"spiffy-{keep}", None, keep),
            (f"spiffy-{keep}+threshold", THRESHOLD, keep)]
    runs += [(f"spiffy-{k}", None, k) for k in keeps if k != keep]
    runs += [(f"spiffy-{k}+threshold", THRESHOLD, k) for k in keeps if k != keep]
    results = {}
    with tqdm(total=len(data.DOMAINS) * prompts * len(runs), desc="diffusion demo") as bar:
        for domain in data.DOMAINS:
            texts = [torch.tensor(tok.encode(t).ids, device=device)
                     for t in data.held_out_prompts(domain, prompts, rng_seed=seed)]
            dllm_generate(model, texts[0], 8, block_size=block_size)  # warm-up
            rows, vanilla = {}, {}
            for name, threshold, k in runs:
                stats_list, same = [], []
                for i, ids in enumerate(texts):
                    spiffy = None if k is None else SpiffyConfig(graphs[threshold], k)
                    out_ids, stats = dllm_generate(model, ids, tokens, block_size=block_size, temperature=temperature,
                                                   seed=seed + i, threshold=threshold, spiffy=spiffy, profile=True)
                    if k is None:
                        vanilla[(threshold, i)] = out_ids
                    same.append(torch.equal(out_ids, vanilla[(threshold, i)]))
                    stats_list.append(stats)
                    bar.update()
                rows[name] = dict(threshold=threshold, keep=k, model_calls=mean(s.model_calls for s in stats_list),
                                  steps=mean(s.steps for s in stats_list),
                                  tokens_per_second=sum(s.new_tokens for s in stats_list)
                                  / sum(s.seconds for s in stats_list),
                                  same_as_vanilla=all(same), phase_share=phase_shares(stats_list))
            base = rows["vanilla"]
            for row in rows.values():
                row["nfe_reduction"] = base["model_calls"] / row["model_calls"]
                row["speedup"] = row["tokens_per_second"] / base["tokens_per_second"]
            results[domain] = rows
    report = dict(prompts=prompts, tokens=tokens, temperature=temperature, block_size=block_size, keep=keep, keeps=keeps,
                  threshold=THRESHOLD, graph_nodes={"one token per step": len(graphs[None]),
                                                    "threshold": len(graphs[THRESHOLD])}, domains=results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_diffusion.json").write_text(json.dumps(report, indent=1))
    _plot(results, out / "demo_diffusion.png", temperature)
    return report


def format_diffusion_tables(report: dict) -> str:
    lines = []
    for domain, rows in report["domains"].items():
        lines.append(f"\n{domain}, block diffusion LM (held-out prompts: {report['prompts']}, {report['tokens']} new "
                     f"tokens, block {report['block_size']}, T={report['temperature']}, threshold "
                     f"{report['threshold']}; NFE counts every model call)")
        lines.append(f"{'mode':<22} {'NFE':>6} {'steps':>6} {'tokens/s':>9} {'NFE cut':>8} {'speed-up':>9}  "
                     "same   time share: model / materialize / mask / step / other")
        for name, r in rows.items():
            if r["keep"] not in (None, report["keep"]):
                continue
            lines.append(f"{name:<22} {r['model_calls']:>6.1f} {r['steps']:>6.1f} {r['tokens_per_second']:>9.1f} "
                         f"{r['nfe_reduction']:>7.2f}x {r['speedup']:>8.2f}x  {'yes' if r['same_as_vanilla'] else 'NO':<4}   "
                         + format_shares(r["phase_share"]))
        for suffix, label in [("", "Spiffy"), ("+threshold", "Spiffy + threshold")]:
            sweep = [(k, rows[f"spiffy-{k}{suffix}"]) for k in report["keeps"] if f"spiffy-{k}{suffix}" in rows]
            lines.append(f"{label} by drafts kept (NFE, tokens/s, same): " + "; ".join(
                f"{k}: {r['model_calls']:.1f}, {r['tokens_per_second']:.0f}, {'yes' if r['same_as_vanilla'] else 'NO'}"
                for k, r in sweep))
    return "\n".join(lines)


def format_shares(shares: dict) -> str:
    return " / ".join(f"{100 * shares[p]:.1f}%" for p in PHASES + ("other",))


def _plot(results, path, temperature):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for domain, rows in results.items():
        for suffix, style, base in [("", "-", "vanilla"), ("+threshold", "--", "threshold")]:
            keeps = [k for k in KEEPS if f"spiffy-{k}{suffix}" in rows]
            for ax, key in [(axes[0], "model_calls"), (axes[1], "tokens_per_second")]:
                line, = ax.plot(keeps, [rows[f"spiffy-{k}{suffix}"][key] for k in keeps], marker="o",
                                linestyle=style, label=f"{domain}: spiffy{suffix}")
                ax.axhline(rows[base][key], linestyle=":", color=line.get_color(), label=f"{domain}: {base}")
    for ax, label in [(axes[0], "model calls (NFE)"), (axes[1], "tokens per second")]:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("drafts kept per call")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Spiffy on the shipped block diffusion LM (T={temperature})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
