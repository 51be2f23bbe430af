"""Vocabulary-parallel verification under torchrun: each rank holds a slice of the vocabulary of the
target's logits, and xkernels.distributed verifies drafts without gathering them. Every rank gets
the tokens the unsharded op gives on the whole logits. Then the decoding loop, tensor-parallel.

Run (CPUs, gloo, two processes):
    python -m torch.distributed.run --standalone --nproc-per-node 2 python/examples/tensor_parallel.py
"""

import torch
import torch.distributed as dist

import xkernels
from xkernels import distributed
from xkernels.decoding import generate
from xkernels.decoding.tensor_parallel import shard_bounds
from xkernels.models.shipped import load_drafter, load_refiner, load_target, load_tokenizer

dist.init_process_group("gloo")  # NCCL on GPUs: the code uses only tensor ops and collectives
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)

# Every rank computes the same full logits here only to compare; a real TP target has its shard.
g = torch.Generator().manual_seed(0)
logits = torch.randn(4, 5, 1000, generator=g)  # [N, K+1, V]
drafts = logits[:, :4].argmax(-1)
drafts[:, 2] = 7  # a rejection in the middle
start, stop = shard_bounds(logits.shape[-1], world, rank)  # this rank's ids [start, stop)
local = logits[..., start:stop].contiguous()

for temperature in (0.0, 1.0):
    seed = torch.tensor([5, 6, 7, 8])  # a stream per sequence
    got = distributed.chain_verify(drafts, local, vocab_start=start, temperature=temperature, seed=seed)
    want = xkernels.chain_verify(drafts, logits, temperature=temperature, seed=seed)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
if rank == 0:
    print(f"{world} ranks: sharded chain_verify equals the unsharded op")

# The decoding loop shards the target's LM head (and the refiner's vocabulary rows) across the group.
target, tok = load_target().eval(), load_tokenizer()
prompt = tok.encode("def add(a, b):").ids
tokens, _ = generate(target, prompt, 16, mode="jacobi", drafter=load_drafter(), refiner=load_refiner(),
                     draft_len=8, tp_group=dist.group.WORLD)
if rank == 0:
    print("tensor-parallel jacobi:", repr(tok.decode(tokens)))
dist.destroy_process_group()
