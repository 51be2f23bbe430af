"""Plain PyTorch references: what each op means, in code one can read.

The kernels must agree with these. They use the package's Philox stream (keyed as
in csrc/include/xkernels/philox.h), so at temperature > 0 they draw the same
tokens as the kernels for the same (seed, offset).
"""

import math
import struct
from typing import Optional, Tuple

import torch

_MASK32 = 0xFFFFFFFF
COIN_DRAW = 0xFFFFFFFF  # the Philox draw index of the acceptance coin


def _mulhilo(a: int, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of a * b for a 32-bit constant a and int64 tensor b in [0, 2^32)."""
    lo_part = a * (b & 0xFFFF)
    hi_part = a * (b >> 16)
    mid = lo_part + ((hi_part & 0xFFFF) << 16)
    return (hi_part >> 16) + (mid >> 32), mid & _MASK32


def philox4x32_10(counter, key):
    """Philox4x32-10 on int64 tensors holding 32-bit words. counter: 4 tensors, key: 2 ints or 0-dim tensors."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        hi0, lo0 = _mulhilo(0xD2511F53, c0)
        hi1, lo1 = _mulhilo(0xCD9E8D57, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + 0x9E3779B9) & _MASK32
        k1 = (k1 + 0xBB67AE85) & _MASK32
    return c0, c1, c2, c3


def philox_draw(seed, offset, sequence, position, draw) -> torch.Tensor:
    """The 4 words of Philox draw `draw` of (sequence, position): counter = (draw, position,
    sequence, offset_lo), key = (seed_lo, seed_hi ^ offset_hi). seed and offset: ints, or
    one-element int64 tensors (their 64 bits, computed on their device: no host read). Returns
    int64 [..., 4], on the device of the first tensor of (sequence, position, draw) (the CPU if
    none is one)."""
    seed, offset = (x.reshape(()) if isinstance(x, torch.Tensor) else x for x in (seed, offset))
    device = next((x.device for x in (sequence, position, draw) if isinstance(x, torch.Tensor)), None)
    sequence, position, draw = torch.broadcast_tensors(
        *(torch.as_tensor(x, dtype=torch.int64, device=device) for x in (sequence, position, draw)))
    # Masks, not % 2**64: the same words from a Python int and from an int64 tensor's two's complement.
    counter = (draw, position, sequence, torch.zeros_like(draw) + (offset & _MASK32))
    key = (seed & _MASK32, ((seed >> 32) ^ (offset >> 32)) & _MASK32)
    return torch.stack(philox4x32_10(counter, key), dim=-1)


def uniform_open(words: torch.Tensor) -> torch.Tensor:
    """Uniforms strictly inside (0, 1) from 32-bit words: (top 23 bits + 0.5) / 2^23, in float32."""
    return ((words >> 9).to(torch.float32) + 0.5) * 2.0**-23


def gumbel_noise(seed: int, offset: int, sequence: int, position: int, vocab: int) -> torch.Tensor:
    """Gumbel noise of vocabulary ids 0..vocab-1 at (sequence, position): word v % 4 of draw v // 4."""
    draws = torch.arange((vocab + 3) // 4)
    words = philox_draw(seed, offset, sequence, position, draws).reshape(-1)[:vocab]
    return -torch.log(-torch.log(uniform_open(words)))


def acceptance_coins(seed: int, offset: int, n: int, k: int) -> torch.Tensor:
    """The acceptance uniform of every (sequence, row): [n, k] float32."""
    seq = torch.arange(n)[:, None]
    row = torch.arange(k)[None, :]
    return uniform_open(philox_draw(seed, offset, seq, row, COIN_DRAW)[..., 0])


def _as_int(value) -> int:
    return int(value.item()) if isinstance(value, torch.Tensor) else int(value)


def inverse_temperature(temperature: float) -> float:
    """The float32 reciprocal 1 / T the kernels scale logits by, or 0.0 for greedy decoding:
    T must be finite and >= 0; T = 0, and a T > 0 whose reciprocal overflows float32 (below
    about 2.9e-39, the T -> 0 limit), are greedy."""
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
    if temperature == 0:
        return 0.0
    try:  # rounded to float32 in Python: no tensor, so nothing a host-read guard would flag
        inv = struct.unpack("f", struct.pack("f", 1.0 / temperature))[0]
    except OverflowError:  # Pythons that refuse to round a large double to inf
        return 0.0
    return inv if math.isfinite(inv) else 0.0


def chain_verify(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_probs: Optional[torch.Tensor] = None,
    temperature: float = 0.0,
    seed=0,
    offset=0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Speculative verification of a chain of drafts; see xkernels.chain_verify."""
    n, k = draft_tokens.shape
    vocab = target_logits.shape[-1]
    device = target_logits.device
    if draft_tokens.numel() and not ((draft_tokens >= 0) & (draft_tokens < vocab)).all():
        raise ValueError(f"draft_tokens holds ids outside [0, {vocab})")
    inv_t = inverse_temperature(temperature)
    greedy = inv_t == 0
    seed, offset = _as_int(seed), _as_int(offset)
    logits = target_logits.detach().cpu().float()
    draft = draft_tokens.detach().cpu()
    q = None if draft_probs is None else draft_probs.detach().cpu().float()

    # Scaled logits a = logits / T (as a product by the float32 reciprocal, like the kernels).
    a = logits if greedy else logits * inv_t
    top = a.argmax(-1)  # [n, k+1]; NaN first, ties to the lowest index
    row_max = a.amax(-1) if vocab else torch.zeros(n, k + 1)
    # A row without a softmax (NaN, +inf, or all -inf) is a point mass at its argmax.
    point_mass = torch.full_like(top, greedy, dtype=torch.bool) | ~torch.isfinite(row_max)
    # Acceptance of every draft, then the chain stops at the first rejection.
    # Under a point mass (greedy) a draft is accepted iff it is the argmax; otherwise with
    # probability min(1, p(x) / q(x)), or p(x) for a deterministic proposal.
    accepted = draft == top[:, :k]
    if not greedy:
        row_sum = torch.exp(a - row_max[..., None]).sum(-1)
        p_x = torch.exp(a[:, :k].gather(-1, draft[..., None])[..., 0] - row_max[:, :k]) / row_sum[:, :k]
        coins = acceptance_coins(seed, offset, n, k)
        q_x = q.gather(-1, draft[..., None])[..., 0] if q is not None else None
        sampled_accept = coins * q_x < p_x if q is not None else coins < p_x
        accepted = torch.where(point_mass[:, :k], accepted, sampled_accept)
    accept_len = accepted.long().cumprod(-1).sum(-1)
    out = torch.where(torch.arange(k) < accept_len[:, None], draft, -1)
    out = torch.cat([out, torch.full((n, 1), -1, dtype=torch.int64)], 1)

    for s, i in enumerate(accept_len.tolist()):
        if point_mass[s, i]:
            out[s, i] = top[s, i]
            continue
        # Sample the correction (or the bonus at row k) by Gumbel-max over log-weights.
        if i == k:
            log_w = a[s, i].clone()
        elif q is not None:
            residual = torch.exp(a[s, i] - row_max[s, i]) / row_sum[s, i] - q[s, i]
            log_w = torch.where(residual > 0, torch.log(residual), float("-inf"))
        else:
            log_w = a[s, i].clone()
            log_w[int(draft[s, i])] = float("-inf")
        if torch.isneginf(log_w).all():  # nothing can be drawn (only by rounding): the argmax
            out[s, i] = top[s, i]
        else:
            noisy = torch.where(torch.isneginf(log_w), float("-inf"), log_w + gumbel_noise(seed, offset, s, i, vocab))
            out[s, i] = noisy.argmax()
    return accept_len.to(device), out.to(device)


# ---- xPress refinement ----


def _drafted_slots(ctx, base_logits) -> int:
    b, d = ctx.shape[1], base_logits.shape[1]
    if d > b:
        raise ValueError(f"base_logits has {d} drafted slots but the block has only {b}")
    return d


def perturbed_scores(logits: torch.Tensor, temperature: float, seed: int, offset: int):
    """(a, score) for logits [N, D, V]: a = l / T (l at T = 0) and score = a + G, the Gumbel noise
    keyed by (sequence n, drafted slot d, id v) (score = a at T = 0)."""
    n, d, v = logits.shape
    a = logits.float()
    inv_t = inverse_temperature(temperature)
    if inv_t == 0:
        return a, a
    a = a * inv_t
    if n * d == 0:
        return a, a
    noise = torch.stack([torch.stack([gumbel_noise(seed, offset, i, j, v) for j in range(d)]) for i in range(n)])
    return a, a + noise.to(a.device)


def sample_rows(logits: torch.Tensor, temperature: float, seed: int, offset: int):
    """tokens = argmax(l / T + G), logprobs = log_softmax(l / T)[tokens] for logits [N, D, V];
    at T = 0: argmax(l) and log_softmax(l)."""
    a, score = perturbed_scores(logits, temperature, seed, offset)
    tokens = score.argmax(-1)
    logprobs = a.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
    return tokens, logprobs


def refine_logits(ctx, prev_tokens, base_logits, weights) -> torch.Tensor:
    """Refined logits s + w_read z of the drafted slots, [N, D, V] in float32 (materialised here;
    the kernels never write them)."""
    from .refiner import refiner_hidden

    d = _drafted_slots(ctx, base_logits)
    z = refiner_hidden(weights, ctx, prev_tokens)[:, ctx.shape[1] - d:]
    return base_logits.float() + z @ weights.w_read.float().T


def refine_step(ctx, prev_tokens, base_logits, weights, temperature=0.0, seed=0, offset=0):
    """One refinement pass: tokens and log-probabilities of every drafted slot."""
    return sample_rows(refine_logits(ctx, prev_tokens, base_logits, weights), temperature, _as_int(seed),
                       _as_int(offset))


def _prev_tokens(prefix_tokens, tokens):
    """Slot k reads slot k-1: [token before the block, fixed slots, drafted slots but the last]."""
    return torch.cat([prefix_tokens, tokens[:, :-1]], dim=1)


def jacobi_refine(ctx, prefix_tokens, base_logits, weights, max_iters, temperature=0.0, seed=0, offset=0):
    """Jacobi iteration from the drafter's own sample; a sequence stops after a pass that changes none
    of its tokens. Returns tokens, logprobs (of the last pass run) and iters (passes run, int32)."""
    if max_iters < 0:
        raise ValueError("max_iters must be >= 0")
    seed, offset = _as_int(seed), _as_int(offset)
    tokens, logprobs = sample_rows(base_logits, temperature, seed, offset)
    return jacobi_iterate(tokens, logprobs, prefix_tokens, max_iters,
                          lambda prev: refine_step(ctx, prev, base_logits, weights, temperature, seed, offset))


def jacobi_iterate(tokens, logprobs, prefix_tokens, max_iters, step, early_exit=True):
    """The Jacobi loop from the iterate (tokens, logprobs): step(prev_tokens) -> (tokens, logprobs) is
    one refinement pass; a sequence stops after a pass that changes none of its tokens. Returns
    tokens, logprobs and iters (int32). early_exit=False runs all max_iters passes without reading
    whether any sequence is still active (no host sync); stopped sequences keep their results."""
    iters = torch.zeros(tokens.shape[0], dtype=torch.int32, device=tokens.device)
    active = torch.ones(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    for _ in range(max_iters):
        if early_exit and not active.any():
            break
        new_tokens, new_logprobs = step(_prev_tokens(prefix_tokens, tokens))
        changed = (new_tokens != tokens).any(-1)
        tokens = torch.where(active[:, None], new_tokens, tokens)
        logprobs = torch.where(active[:, None], new_logprobs, logprobs)
        iters += active.int()
        active &= changed
    return tokens, logprobs, iters


def sequential_refine(ctx, prefix_tokens, base_logits, weights, temperature=0.0, seed=0, offset=0):
    """Left-to-right decoding: drafted slot d is decided from the decided slots before it."""
    seed, offset = _as_int(seed), _as_int(offset)
    n, d = base_logits.shape[:2]
    tokens = torch.zeros(n, d, dtype=torch.int64, device=base_logits.device)
    logprobs = torch.zeros(n, d, dtype=torch.float32, device=base_logits.device)
    for slot in range(d):
        step_tokens, step_logprobs = refine_step(ctx, _prev_tokens(prefix_tokens, tokens), base_logits, weights,
                                                 temperature, seed, offset)
        tokens[:, slot] = step_tokens[:, slot]
        logprobs[:, slot] = step_logprobs[:, slot]
    return tokens, logprobs


# ---- draft trees ----


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
        bits = torch.nn.functional.pad(mask, (0, pad)).view(n, m, -1, 8).to(torch.uint8)
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
                seed=0, offset=0, num_nodes=None):
    """Walks each tree from the root, accepting children by the rules of csrc/include/xkernels/tree.h.
    Returns accept_len [N], path [N, M] (accepted nodes from the root, -1 padded) and out_tokens
    [N, M] (accepted draft tokens, then the correction or bonus token, -1 padded)."""
    n, m, v = target_logits.shape
    inv_t = inverse_temperature(temperature)
    seed, offset = _as_int(seed), _as_int(offset)
    logits = target_logits.detach().cpu().float()
    toks, par = tokens.detach().cpu(), parents.detach().cpu()
    q_all = None if draft_probs is None else draft_probs.detach().cpu().float()
    accept_len = torch.zeros(n, dtype=torch.int64)
    path = torch.full((n, m), -1, dtype=torch.int64)
    out = torch.full((n, m), -1, dtype=torch.int64)
    for s, count in enumerate(_num_nodes(parents, num_nodes)):
        children = [[] for _ in range(m)]
        for i in range(1, count):
            children[int(par[s, i])].append(i)
        node, acc = 0, 0
        path[s, 0] = 0
        while True:
            a = logits[s, node] * (inv_t if inv_t else 1.0)
            top = int(a.argmax())
            emit = None
            if inv_t == 0 or not torch.isfinite(a.max()):
                nxt = next((c for c in children[node] if int(toks[s, c]) == top), None)
                emit = top if nxt is None else None
            else:
                p = torch.softmax(a, -1)
                nxt = None
                if q_all is None:
                    r = p.clone()
                    for c in children[node]:
                        x = int(toks[s, c])
                        u = float(acceptance_coins_at(seed, offset, s, c))
                        if u * float(r.sum()) < float(r[x]):
                            nxt = c
                            break
                        r[x] = 0.0
                else:
                    r, q = p.clone(), q_all[s, node].clone()
                    for c in children[node]:
                        x = int(toks[s, c])
                        u = float(acceptance_coins_at(seed, offset, s, c))
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
                        score = r.log() + gumbel_noise(seed, offset, s, node, v)
                        emit = int(score.argmax())
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


def acceptance_coins_at(seed: int, offset: int, sequence: int, position: int) -> torch.Tensor:
    """The acceptance uniform of one (sequence, position)."""
    return uniform_open(philox_draw(seed, offset, sequence, position, COIN_DRAW)[..., 0])


def compact_kv(cache: torch.Tensor, path: torch.Tensor, accept_len: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """A copy of cache [N, H, L, d] whose entries prefix_len + j, j = 0..accept_len, hold those of
    prefix_len + path[j] (the root and the accepted nodes, moved behind the prefix)."""
    out = cache.clone()
    for s in range(cache.shape[0]):
        for j in range(int(accept_len[s]) + 1):
            out[s, :, prefix_len + j] = cache[s, :, prefix_len + int(path[s, j])]
    return out


# ---- diffusion LLM decoding (Spiffy, issue 8) ----


def _without_mask_token(logits, mask_id):
    """The mask token is never a candidate: its logit counts as -inf."""
    if 0 <= mask_id < logits.shape[-1]:
        logits = logits.clone()
        logits[..., mask_id] = -math.inf
    return logits


def _dllm_step_one(logits, block, sequence, mask_id, num_unmask, threshold, temperature, seed, offset):
    """dllm_step for one sequence: logits [L, V] float32 and block [L] on the CPU; `sequence` keys
    the noise. Returns (new_block, chosen positions ascending, x0 [L], confidence [L])."""
    length, v = logits.shape
    inv_t = inverse_temperature(temperature)
    logits = _without_mask_token(logits, mask_id)
    masked = block == mask_id
    score = logits
    if inv_t and length:
        score = logits * inv_t + torch.stack([gumbel_noise(seed, offset, sequence, p, v) for p in range(length)])
    x0 = score.argmax(-1)
    conf = torch.softmax(logits, -1).gather(-1, x0[:, None])[:, 0]
    conf = torch.where(masked, conf, torch.tensor(-math.inf))
    new_block = block.clone()
    if not masked.any():
        return new_block, [], x0, conf

    def rank(p):  # higher confidence first, a NaN last, ties to the lower position
        c = float(conf[p])
        return (1, 0.0, p) if c != c else (0, -c, p)

    order = sorted((p for p in range(length) if masked[p]), key=rank)
    if threshold is None:
        chosen = order[:num_unmask]
    else:
        chosen = [p for p in order if float(conf[p]) > threshold] or order[:1]
    chosen.sort()
    new_block[chosen] = x0[chosen]
    return new_block, chosen, x0, conf


def dllm_step(logits, block_tokens, mask_id, num_unmask=1, threshold=None, temperature=0.0, seed=0, offset=0):
    """One step of the LLaDA low-confidence rule over a block. For every masked position l of
    sequence n: x0 = argmax(logits / T + G) (G: the Gumbel noise of (sequence n, position l); none at
    T = 0) and confidence = softmax(logits)[x0] (the untempered softmax, as LLaDA and Fast-dLLM
    score it). Unmasked positions have confidence -inf. Then unmask the num_unmask most confident
    masked positions (ties to the lowest position), or, with threshold, every masked position whose
    confidence exceeds it and at least the most confident one. Returns new_block [N, L],
    positions [N, L] (the unmasked positions ascending, -1 padded), tokens [N, L] (theirs, -1
    padded) and confidence [N, L] float32."""
    n, length, _ = logits.shape
    seed, offset = _as_int(seed), _as_int(offset)
    l = logits.detach().cpu().float()
    block = block_tokens.detach().cpu()
    new_block = block.clone()
    positions = torch.full((n, length), -1, dtype=torch.int64)
    tokens = torch.full((n, length), -1, dtype=torch.int64)
    conf = torch.empty(n, length)
    for s in range(n):
        new_block[s], chosen, x0, conf[s] = _dllm_step_one(l[s], block[s], s, mask_id, num_unmask, threshold,
                                                           temperature, seed, offset)
        positions[s, : len(chosen)] = torch.tensor(chosen, dtype=torch.int64)
        tokens[s, : len(chosen)] = x0[chosen]
    dev = logits.device
    return new_block.to(dev), positions.to(dev), tokens.to(dev), conf.to(dev)


# ---- Spiffy (the graph format: xkernels/spiffy.py) ----

SPIFFY_MAX_RANK = 8  # vocabulary ranks a graph may use (kSpiffyMaxRank)


def spiffy_materialize(logits, block_tokens, mask_id, graph_ranks, graph_child_ptr, graph_children, keep,
                       temperature=0.0):
    """Fills the draft graph from the step distribution at the root and keeps the best `keep` nodes.

    Per sequence: the masked positions in confidence order (the untempered top-1 probability,
    higher first, NaN last, ties to the lower position) give position ranks i; a position's tokens
    by logit (ties to the lower id; the mask token's logit counts as -inf) give vocabulary ranks j. Node g's draft is the block with each
    of its operations (i, j) applied. Its local score is the mean log probability of those tokens
    under softmax(logits / T) (softmax(logits) at T = 0); a node is unusable when a rank falls
    outside the masked positions or the row has no softmax or a token has probability 0. Children
    first, a usable node's score is the mean of its local score and its best usable child's score
    (the geometric mean of the two probabilities). Then, starting from the root's usable children, the best
    node of the frontier (ties to the lower id) is kept and its usable children join the frontier,
    `keep` times. Returns draft_blocks [N, keep, L], node_ids [N, keep] (in the order kept, -1
    when the frontier ran out; such a slot holds the block itself and score 0) and scores
    [N, keep] float32, exp(score)."""
    n, length, v = logits.shape
    scale = inverse_temperature(temperature) or 1.0
    raw = _without_mask_token(logits.detach().cpu().float(), mask_id)
    block = block_tokens.detach().cpu()
    logp = torch.log_softmax(raw * scale, -1)
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


def spiffy_accept(root_logits, draft_logits, draft_blocks, node_ids, block_tokens, mask_id, num_unmask=1,
                  threshold=None, temperature=0.0, seed=0, offset=0):
    """Spiffy's acceptance: take dllm_step's step from the root's logits (the noise of offset + 0);
    while the new block equals a kept draft (node_ids >= 0), take the next step (offset + 1, ...)
    from that draft's logits, which the same forward computed for exactly that block. Every step
    is dllm_step's on the true logits of the block reached, so the result is what one-step-per-call
    decoding gives. Returns num_steps [N], positions and tokens [N, L] (in the order committed,
    -1 padded), new_block [N, L], continue_from [N] (the draft whose logits gave the last step, -1:
    the root)."""
    n, length, _ = root_logits.shape
    seed, offset = _as_int(seed), _as_int(offset)
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
            new_block[s], chosen, x0, _ = _dllm_step_one(logits, new_block[s], s, mask_id, num_unmask, threshold,
                                                         temperature, seed, offset + int(num_steps[s]))
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
        padded = torch.nn.functional.pad(mask, (0, (-mask.shape[-1]) % 8)).view(*mask.shape[:2], -1, 8)
        mask = (padded.to(torch.uint8) << torch.arange(8, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)
    return mask.to(prefix_lens.device)


# ---- vocabulary-parallel sampling (xkernels/distributed.py) ----


def gumbel_noise_of_ids(seed: int, offset: int, sequence: int, position: int, ids: torch.Tensor) -> torch.Tensor:
    """The Gumbel noise of the global vocabulary ids `ids` at (sequence, position): word id % 4 of
    draw id // 4, as gumbel_noise gives it for the whole vocabulary."""
    words = philox_draw(seed, offset, sequence, position, ids // 4).gather(-1, (ids % 4)[..., None])[..., 0]
    return -torch.log(-torch.log(uniform_open(words)))


def shard_row_stats(logits, vocab_start, rows=None, exclude=None, draft_probs=None, residual_stats=None, ignore_id=-1,
                    sample=False, raw_stats=False, temperature=0.0, seed=0, offset=0):
    """The per-shard pass of vocabulary-parallel sampling; see xkernels.ops.shard_row_stats."""
    n, r, v = logits.shape
    inv_t = inverse_temperature(temperature)
    if sample and inv_t == 0:
        raise ValueError("sample=True needs temperature > 0")
    seed, offset = _as_int(seed), _as_int(offset)
    l = logits.detach().cpu().float()
    rows = torch.arange(r).expand(n, r) if rows is None else rows.cpu()
    ids = torch.arange(vocab_start, vocab_start + v)
    shape = rows.shape
    row_max, row_sum = torch.full(shape, -math.inf), torch.zeros(shape)
    top_id, pick_id = torch.full(shape, -1, dtype=torch.int64), torch.full(shape, -1, dtype=torch.int64)
    pick_score, pick_logit = torch.full(shape, -math.inf), torch.full(shape, -math.inf)
    for s in range(n):
        for j in range(shape[1]):
            row = int(rows[s, j])
            raw = torch.where(ids == ignore_id, -math.inf, l[s, row])
            a = raw * inv_t if inv_t else raw
            stat = raw if raw_stats else a
            if v == 0:
                continue
            top = int(stat.argmax())  # NaN first, ties to the lowest id
            row_max[s, j], top_id[s, j] = stat[top], vocab_start + top
            if math.isfinite(float(stat[top])):
                row_sum[s, j] = torch.exp(stat - stat[top]).sum()
            if not sample:
                continue
            if draft_probs is not None and row < draft_probs.shape[1]:
                big_m, big_s = (float(x) for x in residual_stats[s, j])
                w = torch.exp(a - big_m) / big_s - draft_probs[s, row].cpu().float()
                log_w = torch.where(w > 0, torch.log(w.clamp_min(1e-45)), -math.inf)
            else:
                log_w = a.clone()
            if exclude is not None:
                log_w[torch.isin(ids, exclude[s, j].cpu())] = -math.inf
            drawable = ~torch.isneginf(log_w)
            if not drawable.any():
                continue
            score = torch.where(drawable, log_w + gumbel_noise_of_ids(seed, offset, s, row, ids), -math.inf)
            best = int(score.argmax())
            pick_score[s, j], pick_id[s, j], pick_logit[s, j] = score[best], vocab_start + best, stat[best]
    dev = logits.device
    return tuple(t.to(dev) for t in (row_max, row_sum, top_id, pick_score, pick_id, pick_logit))
