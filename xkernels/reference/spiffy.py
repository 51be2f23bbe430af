"""References of the Spiffy ops (the draft-graph format is in xkernels/spiffy.py): spiffy_materialize,
spiffy_accept, spiffy_attention_mask."""

import math

import torch

from .dllm import _dllm_step_one, _without_mask_token, step_stream
from .param_errors import flagged
from .sampling import filtered_logits, row_params, row_streams


SPIFFY_MAX_RANK = 8  # vocabulary ranks a graph may use (kSpiffyMaxRank)


def spiffy_materialize(logits, block_tokens, mask_id, graph_ranks, graph_child_ptr, graph_children, keep,
                       temperature=0.0, top_k=None, top_p=None, min_p=None, errors=None, filter_order="top_k_first"):
    """Fills the draft graph from the step distribution at the root and keeps the best `keep` nodes.

    Per sequence: the masked positions in confidence order (the untempered top-1 probability,
    higher first, NaN last, ties to the lower position) give position ranks i; a position's tokens
    by logit (ties to the lower id; the mask token's logit counts as -inf) give vocabulary ranks j. Node g's draft is the block with each
    of its operations (i, j) applied. Its local score is the mean log probability of those tokens
    under sequence n's step distribution p' (dllm_step's: softmax(logits / T) filtered by top_k,
    top_p and min_p, scalars or [N] tensors; softmax(logits) unfiltered at T = 0); a node is
    unusable when a rank falls outside the masked positions or the row has no softmax or a token
    has probability 0 (the filters' dropped tokens among them). Children
    first, a usable node's score is the mean of its local score and its best usable child's score
    (the geometric mean of the two probabilities). Then, starting from the root's usable children, the best
    node of the frontier (ties to the lower id) is kept and its usable children join the frontier,
    `keep` times. Returns draft_blocks [N, keep, L], node_ids [N, keep] (in the order kept, -1
    when the frontier ran out; such a slot holds the block itself and score 0) and scores
    [N, keep] float32, exp(score). errors, filter_order: as dllm.dllm_step takes them."""
    n, length, v = logits.shape
    params = row_params(n, *flagged(errors, n, temperature, top_k, top_p, min_p), filter_order=filter_order)
    raw = _without_mask_token(logits.detach().cpu().float(), mask_id)
    block = block_tokens.detach().cpu()
    logp = torch.stack([torch.log_softmax(_step_logits(raw[s], params[s]), -1) for s in range(n)]) if n else raw
    conf = torch.softmax(raw, -1).max(-1).values
    top = torch.sort(raw, dim=-1, descending=True, stable=True).indices[..., :SPIFFY_MAX_RANK]
    ranks = graph_ranks.cpu().tolist()
    ptr, edges = graph_child_ptr.cpu().tolist(), graph_children.cpu().tolist()
    children = [edges[ptr[g]:ptr[g + 1]] for g in range(len(ranks))]
    drafts = block[:, None, :].repeat(1, keep, 1)
    node_ids = torch.full((n, keep), -1, dtype=torch.int64)
    scores = torch.zeros(n, keep)
    for s in range(n):
        def rank(p):
            c = float(conf[s, p])
            return (1, 0.0, p) if c != c else (0, -c, p)

        order = sorted((p for p in range(length) if block[s, p] == mask_id), key=rank)
        ops = [[(i, j) for i, j in node if i >= 0] for node in ranks]
        score = [-math.inf] * len(ranks)
        for g in range(1, len(ranks)):
            usable = bool(ops[g]) and all(i < len(order) and j < min(v, SPIFFY_MAX_RANK)
                                          and math.isfinite(float(raw[s, order[i]].max())) for i, j in ops[g])
            if usable:
                lp = [float(logp[s, order[i], top[s, order[i], j]]) for i, j in ops[g]]
                score[g] = sum(lp) / len(lp) if all(x > -math.inf for x in lp) else -math.inf
        for g in range(len(ranks) - 1, 0, -1):
            kids = [score[c] for c in children[g] if score[c] > -math.inf]
            if score[g] > -math.inf and kids:
                score[g] = 0.5 * (score[g] + max(kids))
        frontier = {c for c in children[0] if score[c] > -math.inf}
        kept = set()
        for r in range(keep):
            if not frontier:
                break
            best = min(frontier, key=lambda g: (-score[g], g))
            frontier.discard(best)
            kept.add(best)
            frontier |= {c for c in children[best] if score[c] > -math.inf and c not in kept}
            for i, j in ops[best]:
                drafts[s, r, order[i]] = top[s, order[i], j]
            node_ids[s, r] = best
            scores[s, r] = math.exp(score[best])
    dev = logits.device
    return drafts.to(dev), node_ids.to(dev), scores.to(dev)


def _step_logits(raw, params):
    """The logits [L, V] whose softmax spiffy_materialize scores by: raw / T filtered, raw at T = 0."""
    if not params.inv_t or not len(raw):
        return raw
    return torch.stack([filtered_logits(row * params.inv_t, params.top_k, params.top_p, params.min_p, params.filter_order)
                        for row in raw])


def spiffy_accept(root_logits, draft_logits, draft_blocks, node_ids, block_tokens, mask_id, num_unmask=1,
                  threshold=None, temperature=0.0, seed=0, offset=0, top_k=None, top_p=None, min_p=None, errors=None,
                  filter_order="top_k_first"):
    """Spiffy's acceptance: take dllm_step's step from the root's logits (step 0 of the stream);
    while the new block equals a kept draft (node_ids >= 0), take the next step (step 1, ...; the
    stream of step d as dllm.step_stream gives it) from that draft's logits, which the same forward
    computed for exactly that block. Every step is dllm_step's, with the same parameters, on the
    true logits of the block reached, so the result is what one-step-per-call decoding gives.
    Returns num_steps [N], positions and tokens [N, L] (in the order committed,
    -1 padded), new_block [N, L], continue_from [N] (the draft whose logits gave the last step, -1:
    the root). errors, filter_order: as dllm.dllm_step takes them."""
    n, length, _ = root_logits.shape
    params = row_params(n, *flagged(errors, n, temperature, top_k, top_p, min_p), filter_order=filter_order)
    streams = row_streams(n, seed, offset)
    root, drafts_l = root_logits.detach().cpu().float(), draft_logits.detach().cpu().float()
    blocks, ids = draft_blocks.cpu(), node_ids.cpu()
    new_block = block_tokens.detach().cpu().clone()
    num_steps = torch.zeros(n, dtype=torch.int64)
    positions = torch.full((n, length), -1, dtype=torch.int64)
    tokens = torch.full((n, length), -1, dtype=torch.int64)
    continue_from = torch.full((n,), -1, dtype=torch.int64)
    for s in range(n):
        cur, committed = -1, 0
        while (new_block[s] == mask_id).any():
            logits = root[s] if cur < 0 else drafts_l[s, cur]
            stream = step_stream(streams[s], int(num_steps[s]), length)
            new_block[s], chosen, x0, _ = _dllm_step_one(logits, new_block[s], params[s], stream, mask_id, num_unmask,
                                                         threshold)
            positions[s, committed:committed + len(chosen)] = torch.tensor(chosen, dtype=torch.int64)
            tokens[s, committed:committed + len(chosen)] = x0[chosen]
            committed += len(chosen)
            num_steps[s] += 1
            match = [k for k in range(ids.shape[1]) if ids[s, k] >= 0 and torch.equal(blocks[s, k], new_block[s])]
            if not match:
                break
            cur = match[0]
        continue_from[s] = cur
    dev = root_logits.device
    return num_steps.to(dev), positions.to(dev), tokens.to(dev), new_block.to(dev), continue_from.to(dev)


def spiffy_attention_mask(prefix_lens, num_drafts, block_size, max_prefix_len, packed=False):
    """The mask of one forward over [prefix (max_prefix_len keys), real block, num_drafts copies]:
    query q (copy q // block_size) sees prefix keys below prefix_lens[n] and the keys of its own
    copy. bool [N, Q, K], or packed uint8 [N, Q, ceil(K / 8)] (bit k % 8 of byte k / 8)."""
    q = (1 + num_drafts) * block_size
    keys = torch.arange(max_prefix_len + q)
    query_copy = torch.arange(q) // block_size
    own = (keys[None, :] >= max_prefix_len) & ((keys[None, :] - max_prefix_len) // block_size == query_copy[:, None])
    prefix = keys[None, None, :] < prefix_lens.cpu()[:, None, None]
    mask = own[None] | prefix
    if packed:
        padded = torch.nn.functional.pad(mask, (0, (-mask.shape[-1]) % 8))
        padded = padded.view(*mask.shape[:2], padded.shape[-1] // 8, 8)  # not -1: N may be 0
        mask = (padded.to(torch.uint8) << torch.arange(8, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)
    return mask.to(prefix_lens.device)
