"""Spiffy's draft graphs: the format, JSON files, the rank coordinates and the attention helpers.

The offline calibration, which replays decoding, is in xkernels/decoding/spiffy_calibration.py.

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
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Sequence, Tuple

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
