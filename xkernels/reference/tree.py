"""References of the draft-tree ops: build_draft_tree (and build_draft_tree_with_mask),
tree_attention_mask, tree_positions, tree_verify and compact_kv_."""

import math
from typing import Optional

import torch

from .param_errors import flagged
from .sampling import filtered_logits, row_params, row_streams


def build_draft_tree(topk_logprobs: torch.Tensor, topk_tokens: torch.Tensor, budget: int):
    """DDTree's best-first tree over per-slot top-k candidates [N, D, k] (log-probs sorted
    descending): the `budget` best prefixes by summed log-prob (float32 sums, a NaN log-prob or
    sum as -inf), popped best first, ties to the entry pushed first (the next sibling, then the
    first child of each popped entry).
    Returns tokens, parents, depth [N, budget+1] (root: -1, -1, 0; unused nodes -1, -1, 0) and
    num_nodes [N] (root included)."""
    import heapq

    n, d, k = topk_logprobs.shape
    m = budget + 1
    tokens = torch.full((n, m), -1, dtype=torch.int64)
    parents = torch.full((n, m), -1, dtype=torch.int64)
    depth = torch.zeros(n, m, dtype=torch.int64)
    num_nodes = torch.ones(n, dtype=torch.int64)
    lp_all = topk_logprobs.detach().cpu().float()
    lp_all = torch.where(lp_all.isnan(), torch.tensor(-math.inf), lp_all)
    tok_all = topk_tokens.detach().cpu()

    def f32(x):  # the kernels add in float32; inf - inf is -inf, not NaN
        x = float(torch.tensor(x, dtype=torch.float32))
        return -math.inf if math.isnan(x) else x

    for s in range(n):
        lp = lp_all[s].tolist()
        heap, order, nodes = [], 0, 1
        if d and k and budget:
            heapq.heappush(heap, (-lp[0][0], order, lp[0][0], 0.0, 0, 0, 0))  # (-score, order, score, base, parent, slot, rank)
            order += 1
        while nodes <= budget and heap:
            _, _, score, base, parent, slot, rank = heapq.heappop(heap)
            i = nodes
            nodes += 1
            tokens[s, i], parents[s, i], depth[s, i] = int(tok_all[s, slot, rank]), parent, slot + 1
            if rank + 1 < k:
                sib = f32(base + lp[slot][rank + 1])
                heapq.heappush(heap, (-sib, order, sib, base, parent, slot, rank + 1))
                order += 1
            if slot + 1 < d:
                child = f32(score + lp[slot + 1][0])
                heapq.heappush(heap, (-child, order, child, score, i, slot + 1, 0))
                order += 1
        num_nodes[s] = nodes
    dev = topk_logprobs.device
    return tokens.to(dev), parents.to(dev), num_nodes.to(dev), depth.to(dev)


def build_draft_tree_with_mask(topk_logprobs: torch.Tensor, topk_tokens: torch.Tensor, budget: int,
                               packed: bool = False):
    """build_draft_tree's (tokens, parents, num_nodes, depth) and the mask of that tree,
    tree_attention_mask(parents, num_nodes, packed): what the one op writes is exactly what the two
    calls give."""
    tokens, parents, num_nodes, depth = build_draft_tree(topk_logprobs, topk_tokens, budget)
    return tokens, parents, num_nodes, depth, tree_attention_mask(parents, num_nodes, packed)


def _num_nodes(parents, num_nodes):
    n, m = parents.shape
    return [m] * n if num_nodes is None else [int(x) for x in num_nodes]


def tree_attention_mask(parents: torch.Tensor, num_nodes: Optional[torch.Tensor] = None, packed: bool = False):
    """mask[n, i, j]: node j is node i or one of its ancestors (real nodes); a padding node
    (i >= num_nodes) sees itself only. packed: uint8 [N, M, ceil(M/8)], bit j % 8 of byte j // 8."""
    n, m = parents.shape
    mask = torch.zeros(n, m, m, dtype=torch.bool)
    par = parents.detach().cpu()
    for s, count in enumerate(_num_nodes(parents, num_nodes)):
        for i in range(m):
            mask[s, i, i] = True
            if i < count and i > 0:
                mask[s, i] |= mask[s, int(par[s, i])]
    if packed:
        pad = (-m) % 8
        bits = torch.nn.functional.pad(mask, (0, pad)).view(n, m, (m + pad) // 8, 8).to(torch.uint8)
        mask = (bits << torch.arange(8, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)
    return mask.to(parents.device)


def tree_positions(parents: torch.Tensor, num_nodes: Optional[torch.Tensor] = None):
    """Depth of each node (root 0; padding nodes 0): the rotary position offset after the prefix."""
    n, m = parents.shape
    depth = torch.zeros(n, m, dtype=torch.int64)
    par = parents.detach().cpu()
    for s, count in enumerate(_num_nodes(parents, num_nodes)):
        for i in range(1, count):
            depth[s, i] = depth[s, int(par[s, i])] + 1
    return depth.to(parents.device)


def tree_verify(tokens, parents, target_logits, draft_probs=None, without_replacement=False, temperature=0.0,
                seed=0, offset=0, num_nodes=None, top_k=None, top_p=None, min_p=None, errors=None,
                filter_order="top_k_first"):
    """Walks each tree from the root, accepting children by the rules of csrc/include/xkernels/tree.h,
    against each row's filtered distribution p' (reference/sampling.py's filtered_logits of the
    sequence's parameters: temperature, top_k, top_p, min_p, each a scalar or an [N] tensor). Node i
    owns slot i of the sequence's stream (sampling.RowStream): child c's coin is slot c's, the sample
    at node i uses slot i's Gumbel noise. Returns accept_len [N], path [N, M] (accepted nodes from the
    root, -1 padded) and out_tokens [N, M] (accepted draft tokens, then the correction or bonus
    token, -1 padded). errors (int32 [N]): each sequence's invalid per-row values OR-ed into it as
    bits (param_errors) and read as off, as the kernels do. filter_order: the filters' order
    (sampling.filter_mask)."""
    n, m, v = target_logits.shape
    params = row_params(n, *flagged(errors, n, temperature, top_k, top_p, min_p), filter_order=filter_order)
    streams = row_streams(n, seed, offset)
    logits = target_logits.detach().cpu().float()
    toks, par = tokens.detach().cpu(), parents.detach().cpu()
    q_all = None if draft_probs is None else draft_probs.detach().cpu().float()
    accept_len = torch.zeros(n, dtype=torch.int64)
    path = torch.full((n, m), -1, dtype=torch.int64)
    out = torch.full((n, m), -1, dtype=torch.int64)
    for s, count in enumerate(_num_nodes(parents, num_nodes)):
        rp, stream = params[s], streams[s]
        children = [[] for _ in range(m)]
        for i in range(1, count):
            children[int(par[s, i])].append(i)
        node, acc = 0, 0
        path[s, 0] = 0
        while True:
            a = logits[s, node] * (rp.inv_t if rp.inv_t else 1.0)
            top = int(a.argmax())
            emit = None
            if rp.inv_t == 0 or not torch.isfinite(a.max()):
                nxt = next((c for c in children[node] if int(toks[s, c]) == top), None)
                emit = top if nxt is None else None
            else:
                p = torch.softmax(filtered_logits(a, rp.top_k, rp.top_p, rp.min_p, rp.filter_order), -1)
                nxt = None
                if q_all is None:
                    r = p.clone()
                    for c in children[node]:
                        x = int(toks[s, c])
                        if stream.coin(c) * float(r.sum()) < float(r[x]):
                            nxt = c
                            break
                        r[x] = 0.0
                else:
                    r, q = p.clone(), q_all[s, node].clone()
                    for c in children[node]:
                        x = int(toks[s, c])
                        u = stream.coin(c)
                        # A draft row without mass proposes nothing: its children are rejected.
                        q_norm = q / q.sum() if float(q.sum()) > 0 else torch.zeros_like(q)
                        if float(q.sum()) > 0 and u * float(q_norm[x]) < float(r[x] / r.sum()):
                            nxt = c
                            break
                        r = (r / r.sum() - q_norm).clamp_min(0)
                        if without_replacement:
                            q[x] = 0.0
                        if float(r.sum()) <= 0:
                            break
                if nxt is None:
                    if float(r.sum()) <= 0:
                        emit = top
                    else:
                        emit = int((r.log() + stream.gumbel(node, v)).argmax())
            if nxt is None:
                out[s, acc] = emit
                break
            out[s, acc] = int(toks[s, nxt])
            acc += 1
            path[s, acc] = nxt
            node = nxt
        accept_len[s] = acc
    dev = target_logits.device
    return accept_len.to(dev), path.to(dev), out.to(dev)


def compact_kv(cache: torch.Tensor, path: torch.Tensor, accept_len: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """A copy of cache [N, H, L, d] whose entries prefix_len + j, j = 0..accept_len, hold those of
    prefix_len + path[j] (the root and the accepted nodes, moved behind the prefix)."""
    out = cache.clone()
    for s in range(cache.shape[0]):
        for j in range(int(accept_len[s]) + 1):
            out[s, :, prefix_len + j] = cache[s, :, prefix_len + int(path[s, j])]
    return out
