"""Block diffusion decoding (SDAR / LLaDA style) and Spiffy, one sequence at a time.

Blocks of `block_size` masked tokens are decoded left to right. Within a block, each step calls
the model on the block (after the exact prefix cache) and unmasks tokens by dllm_step's rule:
the most confident one, or with `threshold` every one above it (at least one). A finished block's
keys and values join the cache in the next call, as the prompt's do in the first block's
(BlockDiffusionLM.forward_copies: the model is block-causal, so they never change).

With Spiffy, from a block's second step on, each call also verifies drafts: spiffy_materialize
fills the draft graph from the last step distribution the loop has; one forward computes the
logits of the real block and of every draft (each copy attends to the prefix and to itself);
spiffy_accept then takes the real step and, for as long as the block reached is a draft, that
draft's step from its own logits. Every step is the vanilla step on the exact logits of the block
it starts from, and step t of block b draws the noise of offset (b * block_size + t) * block_size
in both loops (the ops' per-request form: position p at that offset + p; spiffy_accept's later
steps at block_size more each), so the tokens are identical to vanilla decoding at any
temperature, with and without a threshold, and dllm_generate_batch gives a sequence of the same
seed the same tokens.

A block's first call has no step distribution to draft from, so it would take one step. Instead,
the call also computes, after each complete draft (one that unmasks the whole block), the next
block of masks seeing that draft: when the walk ends on it, those are the exact logits of the next
block's first step, which the same call takes (the step vanilla takes, with its noise), and the
next call commits the finished block while it drafts from them: a call saved per block whose last
step a draft reaches. (Choosing those drafts is one more host read per such call on a GPU.)
"""

import contextlib
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from ..models.block_diffusion import BlockDiffusionLM
from ..ops import dllm_step, spiffy_accept, spiffy_materialize
from ..spiffy import SpiffyConfig
from .modes import request_seeds


@dataclass
class DllmStats:
    model_calls: int = 0  # NFE: every forward (the prompt and finished blocks join the cache in a block's first)
    steps: int = 0  # unmasking steps (the calls vanilla one-step-per-call decoding makes per block)
    new_tokens: int = 0
    seconds: float = 0.0
    drafts: int = 0  # drafts verified, over all calls
    steps_per_call: List[int] = field(default_factory=list)  # steps committed by each block call
    sequences: List["DllmStats"] = field(default_factory=list)  # dllm_generate_batch: each sequence's own
    # profile=True: wall seconds per phase ("model": every forward; "draft": spiffy_materialize;
    # "mask": the batched forward's attention mask; "step": dllm_step or spiffy_accept with the
    # call's host read); the rest of `seconds` is the loop's own bookkeeping
    phase_seconds: Dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / max(self.seconds, 1e-9)


class PhaseClock:
    """Times a decoding loop's phases into stats.phase_seconds when profiling (on a GPU it waits
    for the device around each phase, so that work is counted where it runs); otherwise free."""

    def __init__(self, stats: DllmStats, profile: bool, device: torch.device):
        self.stats, self.profile = stats, profile
        self.sync = torch.cuda.synchronize if profile and device.type == "cuda" else (lambda: None)

    @contextlib.contextmanager
    def _timed(self, name: str):
        self.sync()
        began = time.perf_counter()
        yield
        self.sync()
        self.stats.phase_seconds[name] = self.stats.phase_seconds.get(name, 0.0) + time.perf_counter() - began

    def __call__(self, name: str):
        return self._timed(name) if self.profile else contextlib.nullcontext()


@torch.no_grad()
def dllm_generate(model: BlockDiffusionLM, prompt_ids, max_new_tokens: int, *, block_size: int = 32,
                  temperature: float = 0.0, seed: int = 0, threshold: Optional[float] = None,
                  spiffy: Optional[SpiffyConfig] = None, trace: Optional[list] = None, profile: bool = False):
    """Returns (the new tokens, int64 [max_new_tokens], and DllmStats). prompt_ids: int64 [P] or
    [1, P]. trace, a list, receives per block the vanilla steps (logits, block before, block
    after), which xkernels.decoding.spiffy_calibration.calibrate reads (vanilla decoding only).
    profile: time each phase into DllmStats.phase_seconds (PhaseClock)."""
    if spiffy is not None and trace is not None:
        raise ValueError("dllm_generate: trace records vanilla decoding; give it without spiffy")
    began = time.perf_counter()
    mask_id = model.cfg.mask_id
    prompt = torch.as_tensor(prompt_ids).reshape(1, -1)
    stats = DllmStats()
    clock = PhaseClock(stats, profile, prompt.device)
    cache = model.new_cache()
    seeds = request_seeds(seed, 1, prompt.device)
    out: List[torch.Tensor] = []
    blocks = -(-max_new_tokens // block_size)
    masks = torch.full((1, block_size), mask_id, dtype=torch.int64, device=prompt.device)
    unseen = prompt  # tokens not yet in the cache: the next call commits them
    ahead = None  # (block, logits) of a block whose first step the call finishing the last one took
    for b in range(blocks):
        block, stale, t = masks, None, 0  # stale: the logits of the last step taken; they fill the drafts
        if ahead is not None:
            (block, stale), t, ahead = ahead, 1, None
        masked = int((block == mask_id).sum())
        steps: list = []
        while masked:
            offset = (b * block_size + t) * block_size
            drafts, node_ids, follows = None, None, None
            copies = block
            if spiffy is not None and stale is not None:
                with clock("draft"):
                    drafts, node_ids, _ = spiffy_materialize(stale, block, mask_id, spiffy.graph, keep=spiffy.keep,
                                                             temperature=temperature)
                    if node_ids.device.type == "cpu":  # drop unused slots (at the end): free to read here,
                        used = int((node_ids[0] >= 0).sum())  # and on a CPU each copy costs a forward
                        drafts, node_ids = drafts[:, :used], node_ids[:, :used]
                    copies = torch.cat([block, drafts[0]])
                    if b + 1 < blocks:  # the next block after each complete draft (a host read)
                        complete = (drafts[0] != mask_id).all(1) & (node_ids[0] >= 0)
                        follows = [-1] * copies.shape[0] + (1 + complete.nonzero()[:, 0]).tolist()
                        copies = torch.cat([copies, masks.expand(len(follows) - copies.shape[0], -1)])
            with clock("model"):
                logits = model.forward_copies(copies, cache, commit=unseen, follows=follows,
                                              commit_block_size=None if b == 0 else block_size)
            unseen = None
            stats.model_calls += 1
            if drafts is None:
                with clock("step"):
                    new_block, _, _, _ = dllm_step(logits[:1], block, mask_id, threshold=threshold,
                                                   temperature=temperature, seed=seeds, offset=offset)
                    taken, last = 1, -1
                    masked = int((new_block == mask_id).sum())  # the step's one host read
                if trace is not None:
                    steps.append((logits[0], block[0], new_block[0]))
            else:
                k = drafts.shape[1]
                stats.drafts += k
                with clock("step"):
                    taken, _, _, new_block, last = spiffy_accept(
                        logits[:1], logits[1 : 1 + k][None], drafts, node_ids, block, mask_id, threshold=threshold,
                        temperature=temperature, seed=seeds, offset=offset)
                    # the call's one host read: steps taken, the draft they ended on, positions left
                    taken, last, masked = torch.stack([taken[0], last[0], (new_block == mask_id).sum()]).tolist()
            stale = logits[last + 1 : last + 2]
            block = new_block
            t += taken
            if follows is not None and not masked and last + 1 in follows:
                # the block ended on a complete draft whose next block this call computed: that
                # block's first step is vanilla's (its logits see exactly this block)
                nxt = logits[follows.index(last + 1) : follows.index(last + 1) + 1]
                with clock("step"):
                    stepped, _, _, _ = dllm_step(nxt, masks, mask_id, threshold=threshold, temperature=temperature,
                                                 seed=seeds, offset=(b + 1) * block_size * block_size)
                ahead = (stepped, nxt)
                taken += 1
            stats.steps_per_call.append(taken)
        stats.steps += t
        if trace is not None:
            trace.append(steps)
        out.append(block[0])
        unseen = block if unseen is None else torch.cat([unseen, block], 1)
    tokens = torch.cat(out)[:max_new_tokens]
    stats.new_tokens = tokens.numel()
    stats.seconds = time.perf_counter() - began
    return tokens, stats
