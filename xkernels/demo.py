"""The demo: speculative decoding on the shipped models, on held-out prompts of each domain.

For every domain it prints mode, tau (tokens per target call), target calls, tokens per second
and the speed-up over plain autoregressive decoding, then writes a plot (tau and speed-up by mode
and by Jacobi passes, and tau against the tokens verified per target call for chains and trees)
and the numbers as JSON.
"""

import json
from pathlib import Path
from statistics import mean

import torch
from tqdm import tqdm

from . import data
from .decoding import generate
from .models.shipped import load_all


PARTS = ("drafter", "refinement", "verification", "bookkeeping")
CHAIN_LENGTHS = (4, 8, 15)  # drafts a chain verifies per block (at most the block's 15)
TREE_BUDGETS = (4, 8, 16, 32)  # draft nodes a tree verifies per block


def run_demo(prompts: int = 4, tokens: int = 64, temperature: float = 0.0, passes=(1, 2, 3, 4, 5, 6),
             iters: int = 4, out: Path = Path("demo_out"), seed: int = 0, draft_len="auto",
             sweep: bool = True, device: str = "cpu") -> dict:
    """Each speculative mode twice: with draft_len (the rule of xkernels.decoding.draft_length by
    default) and verifying every draft ("<mode> (all)"); the Jacobi pass sweep verifies every draft
    too, so its tau measures the refinement alone. tau is tokens over target calls summed over the
    prompts (a mean of per-prompt ratios would let one repetitive prompt dominate)."""
    torch.manual_seed(seed)
    models = load_all().to(device)
    verified = models.drafter.cfg.block_size - 1  # the trees verify as many drafts as the chains
    speculative = [("drafter", None), ("sequential", None), ("jacobi", iters), ("tree", None), ("tree-jacobi", iters)]
    runs = [("ar", "ar", None, None)] + [(mode, mode, p, draft_len) for mode, p in speculative] + [
        (mode, f"{mode} (all)", p, None) for mode, p in speculative] + [
        ("jacobi", f"jacobi-{p} (all)", p, None) for p in passes if p != iters]
    results, sweeps = {}, {}
    sweep_runs = [("drafter", dict(draft_len=k), k) for k in CHAIN_LENGTHS] + [
        ("tree", dict(tree_budget=b, draft_len=None), b) for b in TREE_BUDGETS] if sweep else []
    total = len(data.DOMAINS) * prompts * (len(runs) + len(sweep_runs))
    with tqdm(total=total, desc="demo") as bar:
        for domain in data.DOMAINS:
            texts = data.held_out_prompts(domain, prompts, rng_seed=seed)
            for mode, _, p, _ in runs[:4]:  # warm-up: first calls pay for lazy initialisation
                generate(models.target, models.tokenizer.encode(texts[0]).ids, 16, mode=mode, drafter=models.drafter,
                         refiner=models.refiner, temperature=temperature, draft_len=draft_len)
            rows, ar_tokens = {}, []
            for mode, name, p, length in runs:
                stats_list, same = [], []
                for i, text in enumerate(texts):
                    ids = models.tokenizer.encode(text).ids
                    out_ids, stats = generate(models.target, ids, tokens, mode=mode, drafter=models.drafter,
                                              refiner=models.refiner, iters=p or iters, temperature=temperature,
                                              seed=seed + i, draft_len=length, tree_budget=verified)
                    if mode == "ar":
                        ar_tokens.append(out_ids)
                    same.append(out_ids == ar_tokens[i])
                    stats_list.append(stats)
                    bar.update()
                calls = sum(s.target_calls for s in stats_list)
                drafted = sum(s.draft_calls for s in stats_list)
                parts = {k: 1e3 * sum(s.parts.get(k, 0.0) for s in stats_list) / calls for k in PARTS} if drafted else {}
                rows[name] = dict(
                    mode=mode, passes=p, draft_len=length, tau=sum(s.new_tokens for s in stats_list) / calls,
                    ms_per_call=parts, target_calls=calls / len(stats_list), drafted=drafted / calls,
                    refine_passes=mean(s.refine_passes for s in stats_list),
                    tokens_per_second=sum(s.new_tokens for s in stats_list) / sum(s.seconds for s in stats_list),
                    same_tokens_as_ar=all(same))
            base = rows["ar"]["tokens_per_second"]
            for row in rows.values():
                row["speedup"] = row["tokens_per_second"] / base
            results[domain] = rows
            sweeps[domain] = {"chain": {}, "tree": {}}
            for mode, kwargs, size in sweep_runs:
                toks = calls = 0
                for i, text in enumerate(texts):
                    stats = generate(models.target, models.tokenizer.encode(text).ids, tokens, mode=mode,
                                     drafter=models.drafter, temperature=temperature, seed=seed + i, **kwargs)[1]
                    toks, calls = toks + stats.new_tokens, calls + stats.target_calls
                    bar.update()
                sweeps[domain]["chain" if mode == "drafter" else "tree"][size] = toks / calls
    report = dict(prompts=prompts, tokens=tokens, temperature=temperature, jacobi_iters=iters,
                  draft_len=draft_len, device=str(device), domains=results, tau_by_verified_tokens=sweeps)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps(report, indent=1))
    _plot(results, sweeps, passes, iters, out / "demo.png", temperature)
    return report


def format_tables(report: dict) -> str:
    lines = []
    rule = "the draft length rule" if report["draft_len"] == "auto" else f"{report['draft_len']} drafts"
    for domain, rows in report["domains"].items():
        lines.append(f"\n{domain} (held-out prompts: {report['prompts']}, {report['tokens']} new tokens each, "
                     f"T={report['temperature']}; modes verify by {rule}, '(all)' rows every draft)")
        lines.append(f"{'mode':<20} {'tau':>5} {'target calls':>13} {'drafted':>8} {'tokens/s':>9} {'speed-up':>9} "
                     f"{'refine passes':>14}" + ("  same as ar" if report["temperature"] == 0 else ""))
        for name, r in rows.items():
            line = (f"{name:<20} {r['tau']:>5.2f} {r['target_calls']:>13.1f} {100 * r['drafted']:>7.0f}% "
                    f"{r['tokens_per_second']:>9.1f} {r['speedup']:>8.2f}x {r['refine_passes']:>14.1f}")
            if report["temperature"] == 0:
                line += f"  {'yes' if r['same_tokens_as_ar'] else 'NO'}"
            lines.append(line)
        lines.append("ms per target call (" + ", ".join(PARTS) + "):")
        lines += [f"  {name:<18} " + " / ".join(f"{r['ms_per_call'][k]:.2f}" for k in PARTS)
                  for name, r in rows.items() if r.get("ms_per_call") and "-" not in name.replace("tree-jacobi", "")]
        sweep = report.get("tau_by_verified_tokens", {}).get(domain)
        if sweep and sweep["chain"]:
            lines.append("tau by drafts verified per target call (drafter marginals): " + ", ".join(
                [f"chain {k}: {t:.2f}" for k, t in sweep["chain"].items()] +
                [f"tree {k}: {t:.2f}" for k, t in sweep["tree"].items()]))
    return "\n".join(lines)


def _plot(results, sweeps, passes, iters, path, temperature):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for ax, key, label in [(axes[0], "tau", "tau (tokens per target call)"), (axes[1], "speedup", "speed-up over ar")]:
        for domain, rows in results.items():
            jacobi = [rows[f"jacobi-{p} (all)" if p != iters else "jacobi (all)"][key] for p in passes]
            line, = ax.plot(passes, jacobi, marker="o", label=f"{domain}: jacobi (all drafts)")
            for mode, style in [("drafter (all)", ":"), ("sequential (all)", "--"), ("jacobi", "-.")]:
                ax.axhline(rows[mode][key], linestyle=style, color=line.get_color(), label=f"{domain}: {mode}")
        ax.set_xlabel("Jacobi passes")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].axhline(1.0, color="black", linewidth=0.8)
    axes[0].legend(fontsize=6)
    for domain, sweep in sweeps.items():
        if not sweep["chain"]:
            continue
        chain, tree = sorted((int(k), v) for k, v in sweep["chain"].items()), sorted((int(k), v) for k, v in sweep["tree"].items())
        line, = axes[2].plot(*zip(*tree), marker="o", label=f"{domain}: tree")
        axes[2].plot(*zip(*chain), marker="s", linestyle="--", color=line.get_color(), label=f"{domain}: chain")
    axes[2].set_xlabel("drafts verified per target call")
    axes[2].set_ylabel("tau (drafter marginals)")
    axes[2].grid(alpha=0.3)
    axes[2].legend(fontsize=7)
    fig.suptitle(f"xPress refinement on the shipped models (T={temperature}; 'jacobi' line: the draft length rule)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
