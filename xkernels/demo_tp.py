"""python -m xkernels demo --tp N: the shipped models decoded with a vocabulary-parallel target on N
gloo processes (CPU), against one process.

It spawns the ranks with torchrun's conventions (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK in the environment; under torchrun itself it joins the launched group instead). Every
rank decodes each held-out prompt twice, alone and with tp_group, and rank 0 prints per mode
whether the tokens are the same and the bytes each rank sent per block, against the bytes an
all-gather of the logits the loop read would have sent.
"""

import os
import socket

import torch
import torch.distributed as dist

MODES = ("ar", "drafter", "sequential", "jacobi", "tree", "tree-jacobi")


def _rank_main(prompts: int, tokens: int, temperature: float, draft_len, seed: int):
    from . import data, distributed
    from .decoding import generate
    from .models.shipped import load_all

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # from the environment, as torchrun sets it
    models = load_all()
    modes = [m for m in MODES if not (m == "drafter" and temperature != 0)]
    lines = [f"vocabulary-parallel decoding over {dist.get_world_size()} gloo ranks (vocabulary "
             f"{models.target.lm_head.weight.shape[0]}), {prompts} prompt(s) per domain, {tokens} new tokens, "
             f"T={temperature}, drafts verified per block: {draft_len or 'all'}",
             f"{'domain':8} {'mode':12} {'same as 1 process':>18} {'blocks':>7} {'bytes sent/block':>17} "
             f"{'all-gather bytes/block':>23} {'ratio':>7}"]
    for domain in data.DOMAINS:
        for mode in modes:
            same, blocks, sent, gathered = True, 0, 0, 0
            for i, text in enumerate(data.held_out_prompts(domain, prompts, rng_seed=seed)):
                ids = models.tokenizer.encode(text).ids
                kw = dict(mode=mode, drafter=models.drafter, refiner=models.refiner, temperature=temperature,
                          seed=seed + i, draft_len=draft_len)
                alone, _ = generate(models.target, ids, tokens, **kw)
                distributed.traffic.reset()
                sharded, stats = generate(models.target, ids, tokens, tp_group=dist.group.WORLD, **kw)
                same &= sharded == alone
                blocks += stats.target_calls
                sent += distributed.traffic.bytes
                gathered += distributed.traffic.logits_bytes
            lines.append(f"{domain:8} {mode:12} {'yes' if same else 'NO':>18} {blocks:>7} {sent / blocks:>17,.0f} "
                         f"{gathered / blocks:>23,.0f} {gathered / max(sent, 1):>6.0f}x")
    if dist.get_rank() == 0:
        print("\n".join(lines))
    dist.destroy_process_group()


def _spawned(local_rank: int, world: int, port: int, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank))
    _rank_main(*args)


def run_tp_demo(world: int, prompts: int = 1, tokens: int = 32, temperature: float = 0.0, draft_len=None,
                seed: int = 0):
    args = (prompts, tokens, temperature, draft_len, seed)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun
        return _rank_main(*args)
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_spawned, args=(world, port, args), nprocs=world, join=True)
