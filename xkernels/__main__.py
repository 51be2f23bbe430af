"""Command line of xkernels.

    python -m xkernels demo   speculative decoding on the shipped models, then Spiffy on the block
                              diffusion LM (tables, plots, JSON)
    python -m xkernels demo --tp 2   the same target vocabulary-parallel over 2 gloo processes
    python -m xkernels info   how the package was built and the ops it has
    python -m xkernels export-hf OUT   the shipped target and tokenizer as a transformers folder
"""

import argparse
import sys

import torch

import xkernels

from .demo_batch import SIZES


def info(_args):
    build = xkernels.build_info()
    ops = sorted(name.split("::")[1] for name in torch._C._dispatch_get_all_op_names()
                 if name.startswith("xkernels::") and name != "xkernels::build_info")
    print(f"xkernels     {build['version']}  ({xkernels._LIBRARY_PATH})")
    print(f"torch        {torch.__version__}  (CUDA {torch.version.cuda or 'none'})")
    print(f"CUDA kernels {'compiled for ' + build['cuda_archs'] if build['cuda'] else 'not compiled'}")
    print(f"CPU kernels  threads: {build['cpu_threads']}, greedy float32 refine read: {build['cpu_read']}")
    print(f"GPU          {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none visible'}")
    print(f"ops          {', '.join(ops)}")


def demo(args):
    from pathlib import Path

    if args.tp:
        from .demo_tp import run_tp_demo

        draft_len = None if args.draft_len == "auto" else args.draft_len  # the rule reads per-rank timings
        return run_tp_demo(args.tp, prompts=args.prompts, tokens=args.tokens, temperature=args.temperature,
                           draft_len=draft_len, seed=args.seed)
    from .demo import format_tables, run_demo

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU is visible to torch")
    passes = tuple(range(1, args.max_passes + 1))
    report = run_demo(prompts=args.prompts, tokens=args.tokens, temperature=args.temperature, passes=passes,
                      iters=args.iters, out=Path(args.out), seed=args.seed, draft_len=args.draft_len,
                      sweep=not args.no_sweep, device=args.device)
    print(format_tables(report))
    print(f"\nwrote {args.out}/demo.png and {args.out}/demo.json")
    from .demo_block import format_block_tables, run_block_demo

    block = run_block_demo(prompts=args.prompts, tokens=args.tokens, temperature=args.temperature or 1.0,
                           seed=args.seed, out=Path(args.out), device=args.device)
    print(format_block_tables(block))
    sizes = args.batch_sizes if args.batch_sizes is not None else (
        SIZES if args.device.startswith("cuda") else ())
    if sizes:
        from .demo_batch import format_batch_sweep, run_batch_sweep
        from .models.shipped import load_all

        models = load_all().to(args.device)
        print(format_batch_sweep(run_batch_sweep(models, sizes, args.tokens, args.iters, args.temperature, args.seed),
                                 args.temperature))
    if args.no_diffusion:
        return
    from .demo_diffusion import format_diffusion_tables, run_diffusion_demo

    keep = args.keep if args.keep is not None else (16 if args.device.startswith("cuda") else 1)
    report = run_diffusion_demo(prompts=args.prompts, tokens=args.tokens, temperature=args.temperature,
                                keep=keep, seed=args.seed, out=Path(args.out), device=args.device)
    print(format_diffusion_tables(report))
    print(f"\nwrote {args.out}/demo_diffusion.png and {args.out}/demo_diffusion.json")


def export_hf(args):
    from .models.hf import export_all

    out = export_all(args.out)
    print(f"wrote {out}: AutoModelForCausalLM.from_pretrained({str(out)!r}) and AutoTokenizer.from_pretrained(...)")


def _draft_len(text: str):
    return text if text == "auto" else int(text)


def _sizes(text: str):
    return tuple(int(n) for n in text.split(",") if n)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m xkernels", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions, CUDA architectures and the ops available").set_defaults(run=info)
    d = commands.add_parser("demo", help="speculative decoding on the shipped models, on held-out prompts",
                            description="Decodes held-out code and math prompts with every mode (ar, drafter, "
                                        "sequential, jacobi, tree, tree-jacobi) and reports tau, target calls, tokens "
                                        "per second and the speed-up over ar, and tau against the drafts verified per "
                                        "target call for chains and trees; writes demo.png and demo.json. Then the "
                                        "block diffusion LM: vanilla, threshold, Spiffy and Spiffy + threshold "
                                        "(NFE, tokens per second, identical or not); writes demo_diffusion.png/json.")
    d.add_argument("--prompts", type=int, default=4, help="held-out prompts per domain (default 4)")
    d.add_argument("--tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    d.add_argument("--temperature", type=float, default=0.0, help="0 for greedy (default), e.g. 1 to sample")
    d.add_argument("--iters", type=int, default=4, help="Jacobi passes of the 'jacobi' row (default 4)")
    d.add_argument("--max-passes", type=int, default=6, help="plot Jacobi with 1..this many passes (default 6)")
    d.add_argument("--draft-len", type=_draft_len, default="auto",
                   help="drafts each block verifies: 'auto' (default: the draft length rule, which also "
                        "skips the drafter where drafting does not pay) or a number")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--no-sweep", action="store_true", help="skip the chain-vs-tree sweep of verified tokens")
    d.add_argument("--keep", type=int, default=None,
                   help="Spiffy drafts kept per model call (default 16 on CUDA, where a wider forward costs little; "
                        "1 on the CPU, where each draft copy adds about 0.4 of a forward's time)")
    d.add_argument("--no-diffusion", action="store_true", help="skip the block diffusion (Spiffy) section")
    d.add_argument("--out", default="demo_out", help="folder for demo.png and demo.json (default demo_out)")
    d.add_argument("--tp", type=int, default=0,
                   help="instead: decode with the target's LM head sharded over this many gloo processes "
                        "(torchrun conventions) and compare with one process (--prompts 1 is plenty)")
    d.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the models run")
    d.add_argument("--batch-sizes", type=_sizes, default=None,
                   help="batch sizes of the generate_batch sweep, e.g. 1,4,16,64 (default: those on cuda, none on "
                        "cpu; an empty string skips it)")
    d.set_defaults(run=demo)
    e = commands.add_parser("export-hf", help="the shipped target (Qwen3) and tokenizer as a transformers folder")
    e.add_argument("out", help="the folder to write (config.json, model.safetensors, tokenizer files)")
    e.set_defaults(run=export_hf)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    sys.exit(main())
