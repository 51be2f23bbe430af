"""Spiffy's offline calibration: replay vanilla decoding, express what the next steps unmask in
the rank coordinates the loop has there, and keep the best connected nodes as a draft graph.

It sits beside the decoding it replays (dllm_generate); the graph format is in xkernels/spiffy.py.
"""

from collections import Counter, defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .. import data
from ..spiffy import DraftGraph, Node, rank_coordinates
from .dllm import dllm_generate

CALIBRATION_SEED = 7  # the training prompts python/train/calibrate_spiffy.py calibrates the shipped graphs on


def calibration_prompts(tokenizer, per_domain: int, rng_seed: int = CALIBRATION_SEED) -> List[torch.Tensor]:
    """Token ids of `per_domain` training prompts of each domain (xkernels.data.training_prompts:
    documents of the training split, never a held-out one, so a graph calibrated on them is
    evaluated on prompts it never saw)."""
    return [torch.tensor(tokenizer.encode(text).ids) for domain in data.DOMAINS
            for text in data.training_prompts(domain, per_domain, rng_seed=rng_seed)]


def trace_lookahead(trace: Sequence[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]], mask_id: int,
                    depth: int) -> List[List[Node]]:
    """For one block's vanilla steps [(logits, block before the step, block after)], the states
    the next 1..depth steps reach from each step t >= 1, in the rank coordinates that Spiffy's loop
    has there: the previous step's logits (the last distribution computed) over the block before
    step t. A walk stops at an unmasking outside the top SPIFFY_MAX_RANK tokens."""
    walks = []
    for t in range(1, len(trace)):
        before = trace[t][1]
        order, top = rank_coordinates(trace[t - 1][0], before, mask_id)
        rank_of = {p: i for i, p in enumerate(order)}
        ops: set = set()
        walk = []
        for _, prev, after in trace[t : t + depth]:
            step = []
            for p in (prev != after).nonzero().flatten().tolist():
                tok = int(after[p])
                if tok not in top[p]:
                    break
                step.append((rank_of[p], top[p].index(tok)))
            else:
                ops |= set(step)
                walk.append(frozenset(ops))
                continue
            break
        walks.append(walk)
    return walks


OBJECTIVES = ("frequency", "v3")


def select_graph(walks: Iterable[List[Node]], budget: int, objective: str = "frequency") -> DraftGraph:
    """The graph of at most `budget` nodes (the root included) chosen greedily from observed walks.
    A node's value is its count (objective "frequency", the default: the expected number of
    accepted steps a kept node adds, the paper's v4 objective) or its count plus its parents'
    counts ("v3"; the root, in every walk, is left out of the parents so that it does not flatten
    the choice among its children). On the shipped model "frequency" needs fewer model calls at
    every keep (v3 favours the many rare children of a frequent node and stays shallow;
    bench/results/2026-11-30-spiffy-cpu.md). The node of highest value among the children of the chosen nodes joins next
    (ties to the first seen), so the chosen set stays connected. Edges: every observed
    parent-child pair of chosen nodes."""
    if objective not in OBJECTIVES:
        raise ValueError(f"select_graph: objective must be one of {OBJECTIVES}, got {objective!r}")
    root: Node = frozenset()
    count: Counter = Counter()
    parents: Dict[Node, set] = defaultdict(set)
    first_seen: Dict[Node, int] = {}
    for walk in walks:
        count[root] += 1
        for a, b in zip([root] + walk[:-1], walk):
            count[b] += 1
            parents[b].add(a)
            first_seen.setdefault(b, len(first_seen))
    children: Dict[Node, set] = defaultdict(set)
    for b, ps in parents.items():
        for a in ps:
            children[a].add(b)
    value = {b: count[b] + (objective == "v3") * sum(count[a] for a in ps if a != root) for b, ps in parents.items()}
    chosen = [root]
    frontier = set(children[root])
    while frontier and len(chosen) < budget:
        best = max(frontier, key=lambda b: (value[b], -first_seen[b]))
        chosen.append(best)
        frontier.discard(best)
        frontier |= {c for c in children[best] if c not in chosen}
    index = {node: g for g, node in enumerate(chosen)}
    edges = [(index[a], index[b]) for b in chosen[1:] for a in parents[b] if a in index]
    graph = DraftGraph(chosen, edges)
    graph.meta = {"counts": [count[node] for node in graph.nodes]}
    return graph


def calibration_walks(model, prompts: Sequence[torch.Tensor], *, depth: int, block_size: int = 32,
                      max_new_tokens: int = 64, threshold: Optional[float] = None, temperature: float = 0.0,
                      seed: int = 0) -> List[List[Node]]:
    """Runs vanilla decoding (xkernels.decoding.dllm_generate) on the prompts (token id tensors) and
    expresses each step's next `depth` unmaskings in the rank coordinates the loop will have there
    (trace_lookahead): the observed unmasking sequences select_graph counts."""
    walks: List[List[Node]] = []
    for k, prompt in enumerate(prompts):
        blocks: List[list] = []
        dllm_generate(model, prompt, max_new_tokens, block_size=block_size, temperature=temperature, seed=seed + k,
                      threshold=threshold, trace=blocks)
        for steps in blocks:
            walks += trace_lookahead(steps, model.cfg.mask_id, depth)
    return walks


def calibrate(model, prompts: Sequence[torch.Tensor], *, budget: int, depth: int, block_size: int = 32,
              max_new_tokens: int = 64, threshold: Optional[float] = None, temperature: float = 0.0,
              seed: int = 0, objective: str = "frequency") -> DraftGraph:
    """The graph of the best connected `budget` nodes (select_graph) of the prompts' calibration_walks."""
    walks = calibration_walks(model, prompts, depth=depth, block_size=block_size, max_new_tokens=max_new_tokens,
                              threshold=threshold, temperature=temperature, seed=seed)
    graph = select_graph(walks, budget, objective)
    graph.meta.update({"budget": budget, "depth": depth, "block_size": block_size, "prompts": len(prompts),
                       "max_new_tokens": max_new_tokens, "threshold": threshold, "temperature": temperature,
                       "objective": objective})
    return graph
