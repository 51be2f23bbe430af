"""Spiffy's draft graphs: the format, JSON files, offline calibration and the attention helpers.

A graph lives in rank coordinates. An operation (i, j) means "unmask the masked position of
confidence rank i with its token of probability rank j", both ranks taken from a step
distribution (the one the decoding loop last used). A node is a set of operations; node 0, the
root, is the empty set (the block as it is). B is a child of A when B adds one step's operations
to A's, so a node reached in different orders has several parents: a DAG. Nodes are stored in
topological order (fewer operations first), which rules out cycles.

On the device a graph is three int32 tensors, the format of xkernels.spiffy_materialize:
``ranks [G, K, 2]`` (each node's operations, -1 padded), ``child_ptr [G + 1]`` and ``children
[E]`` (CSR edges).
"""

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

import torch

from .reference import SPIFFY_MAX_RANK

Op = Tuple[int, int]
Node = FrozenSet[Op]
GRAPHS = Path(__file__).parent / "models" / "weights"


class DraftGraph:
    """nodes: each node's operations (node 0 must be empty); edges: (parent, child) index pairs.
    Nodes are reordered topologically (by number of operations, stable); every non-root node needs
    a parent, and every edge must add operations (so no cycles)."""

    def __init__(self, nodes: Sequence[Iterable[Op]], edges: Iterable[Tuple[int, int]], device=None):
        sets = [frozenset((int(i), int(j)) for i, j in ops) for ops in nodes]
        if not sets or sets[0]:
            raise ValueError("DraftGraph: node 0 (the root) must exist and have no operations")
        for g, ops in enumerate(sets):
            ranks = [i for i, _ in ops]
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"DraftGraph: node {g} unmasks a position rank twice: {sorted(ops)}")
            for i, j in ops:
                if not (0 <= i and 0 <= j < SPIFFY_MAX_RANK):
                    raise ValueError(f"DraftGraph: node {g} has operation ({i}, {j}); ranks must be >= 0 and "
                                     f"vocabulary ranks below {SPIFFY_MAX_RANK}")
        if len(set(sets)) != len(sets):
            raise ValueError("DraftGraph: two nodes have the same operations")
        order = sorted(range(len(sets)), key=lambda g: len(sets[g]))
        where = {g: k for k, g in enumerate(order)}
        self.nodes: List[Node] = [sets[g] for g in order]
        kids: Dict[int, set] = defaultdict(set)
        for a, b in edges:
            a, b = int(a), int(b)
            if not (0 <= a < len(sets) and 0 <= b < len(sets)):
                raise ValueError(f"DraftGraph: edge ({a}, {b}) names a node outside 0..{len(sets) - 1}")
            if not sets[a] < sets[b]:
                raise ValueError(f"DraftGraph: edge ({a}, {b}) does not add operations to its parent "
                                 "(a child must strictly contain its parent, which also rules out cycles)")
            kids[where[a]].add(where[b])
        has_parent = {c for cs in kids.values() for c in cs}
        orphans = [order[g] for g in range(1, len(sets)) if g not in has_parent]
        if orphans:
            raise ValueError(f"DraftGraph: nodes {orphans} have no parent (every node but the root needs one)")
        self.child_lists: List[List[int]] = [sorted(kids[g]) for g in range(len(sets))]
        width = max(1, max(len(ops) for ops in self.nodes))
        ranks = torch.full((len(self.nodes), width, 2), -1, dtype=torch.int32)
        for g, ops in enumerate(self.nodes):
            if ops:
                ranks[g, : len(ops)] = torch.tensor(sorted(ops), dtype=torch.int32)
        counts = torch.tensor([0] + [len(c) for c in self.child_lists], dtype=torch.int64)
        self.ranks = ranks.to(device)
        self.child_ptr = counts.cumsum(0).to(torch.int32).to(device)
        self.children = torch.tensor([c for cs in self.child_lists for c in cs], dtype=torch.int32, device=device)
        self.meta: dict = {}

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def edges(self) -> List[Tuple[int, int]]:
        return [(a, b) for a, cs in enumerate(self.child_lists) for b in cs]

    @property
    def max_position_rank(self) -> int:
        return max((i for ops in self.nodes for i, _ in ops), default=-1)

    def to(self, device) -> "DraftGraph":
        graph = DraftGraph(self.nodes, self.edges, device=device)
        graph.meta = dict(self.meta)
        return graph

    def to_json(self) -> str:
        return json.dumps({"nodes": [sorted(ops) for ops in self.nodes], "edges": self.edges, "meta": self.meta})

    @classmethod
    def from_json(cls, text: str, device=None) -> "DraftGraph":
        data = json.loads(text)
        graph = cls(data["nodes"], data["edges"], device=device)
        graph.meta = data.get("meta", {})
        return graph

    def save(self, path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path, device=None) -> "DraftGraph":
        return cls.from_json(Path(path).read_text(), device=device)


@dataclass
class SpiffyConfig:
    """Spiffy for xkernels.decoding.dllm_generate: the draft graph and how many drafts each model
    call verifies (keep, at most len(graph) - 1)."""

    graph: DraftGraph
    keep: int = 8


def shipped_graph(threshold: bool = False, device=None) -> DraftGraph:
    """The graph calibrated on the shipped block diffusion LM (training prompts of both domains;
    budget and depth in its meta): one token per step, or threshold unmasking."""
    name = "spiffy_graph_threshold.json" if threshold else "spiffy_graph.json"
    return DraftGraph.load(GRAPHS / name, device=device)


def rank_coordinates(logits: torch.Tensor, block: torch.Tensor, mask_id: int):
    """The ranks spiffy_materialize reads from a step distribution logits [L, V] over block [L]:
    (position of each position rank, {position: its tokens best first})."""
    raw = logits.detach().float().cpu().clone()
    raw[:, mask_id] = float("-inf")  # never a candidate, as in dllm_step
    conf = torch.softmax(raw, -1).max(-1).values
    masked = [p for p in range(block.shape[0]) if int(block[p]) == mask_id]
    order = sorted(masked, key=lambda p: (1, 0.0, p) if math.isnan(float(conf[p])) else (0, -float(conf[p]), p))
    top = torch.sort(raw, dim=-1, descending=True, stable=True).indices[:, :SPIFFY_MAX_RANK]
    return order, {p: top[p].tolist() for p in masked}


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


def calibrate(model, prompts: Sequence[torch.Tensor], *, budget: int, depth: int, block_size: int = 32,
              max_new_tokens: int = 64, threshold: Optional[float] = None, temperature: float = 0.0,
              seed: int = 0, objective: str = "frequency") -> DraftGraph:
    """Runs vanilla decoding (xkernels.decoding.dllm_generate) on the prompts (token id tensors),
    expresses each step's next `depth` unmaskings in the rank coordinates the loop will have there
    (trace_lookahead), and keeps the best connected `budget` nodes (select_graph)."""
    from .decoding.dllm import dllm_generate

    walks: List[List[Node]] = []
    for k, prompt in enumerate(prompts):
        blocks: List[list] = []
        dllm_generate(model, prompt, max_new_tokens, block_size=block_size, temperature=temperature, seed=seed + k,
                      threshold=threshold, trace=blocks)
        for steps in blocks:
            walks += trace_lookahead(steps, model.cfg.mask_id, depth)
    graph = select_graph(walks, budget, objective)
    graph.meta.update({"budget": budget, "depth": depth, "block_size": block_size, "prompts": len(prompts),
                       "max_new_tokens": max_new_tokens, "threshold": threshold, "temperature": temperature,
                       "objective": objective})
    return graph


def spiffy_positions(num_drafts: int, block_size: int, start: int, device=None) -> torch.Tensor:
    """Positions of a flat forward over [real block, num_drafts copies]: every copy reuses the
    block's positions start .. start + block_size - 1."""
    return torch.arange(start, start + block_size, device=device).repeat(1 + num_drafts)


def spiffy_mask_mod(block_size: int, prefix_len: int):
    """A FlexAttention mask_mod of xkernels.spiffy_attention_mask for one sequence: queries [real
    block + copies], keys [prefix + real block + copies]."""

    def mask_mod(b, h, q_idx, kv_idx):
        own = (kv_idx - prefix_len) // block_size == q_idx // block_size
        return (kv_idx < prefix_len) | ((kv_idx >= prefix_len) & own)

    return mask_mod


def spiffy_block_mask(num_drafts: int, block_size: int, prefix_len: int, device=None, flex_block_size: int = 128):
    """The FlexAttention BlockMask of spiffy_mask_mod."""
    from torch.nn.attention.flex_attention import create_block_mask

    q = (1 + num_drafts) * block_size
    return create_block_mask(spiffy_mask_mod(block_size, prefix_len), B=None, H=None, Q_LEN=q,
                             KV_LEN=prefix_len + q, device=device, BLOCK_SIZE=flex_block_size)
