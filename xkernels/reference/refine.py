"""References of the xPress refinement ops: refine_step, jacobi_refine, sequential_refine."""

import torch

from .param_errors import flagged
from .rng import gumbel_noise, inverse_temperature
from .sampling import filtered_logits, row_params, row_streams


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


def sample_rows(logits: torch.Tensor, temperature=0.0, seed=0, offset=0, top_k=None, top_p=None, min_p=None,
                filter_order="top_k_first"):
    """tokens = argmax(a' + G), logprobs = log_softmax(a')[tokens] for logits [N, D, V], with
    a = l / T and a' = a filtered (reference.sampling.filtered_logits: -inf at the ids top_k, top_p
    and min_p drop; a' = a without a filter); at T = 0: argmax(l) and log_softmax(l), unfiltered.
    Parameters are scalars or [N] (one a sequence); so are seed and offset (sampling.row_streams:
    the per-request form keys sequence n's slot d by (seed[n], offset[n] + d) alone). filter_order:
    the filters' order (sampling.filter_mask)."""
    n, d, v = logits.shape
    params = row_params(n, temperature, top_k, top_p, min_p, filter_order)
    streams = row_streams(n, seed, offset)
    a = logits.float()
    tokens = torch.zeros(n, d, dtype=torch.int64, device=logits.device)
    logprobs = torch.zeros(n, d, dtype=torch.float32, device=logits.device)
    for i, (rp, st) in enumerate(zip(params, streams)):
        if rp.inv_t == 0:
            tokens[i] = a[i].argmax(-1)
            logprobs[i] = a[i].log_softmax(-1).gather(-1, tokens[i, :, None])[:, 0]
            continue
        for j in range(d):
            row = filtered_logits(a[i, j] * rp.inv_t, rp.top_k, rp.top_p, rp.min_p, rp.filter_order)
            tokens[i, j] = (row + st.gumbel(j, v).to(row.device)).argmax()
            logprobs[i, j] = row.log_softmax(-1)[tokens[i, j]]
    return tokens, logprobs


def refine_logits(ctx, prev_tokens, base_logits, weights) -> torch.Tensor:
    """Refined logits s + w_read z of the drafted slots, [N, D, V] in float32 (materialised here;
    the kernels never write them)."""
    from ..refiner import refiner_hidden

    d = _drafted_slots(ctx, base_logits)
    z = refiner_hidden(weights, ctx, prev_tokens)[:, ctx.shape[1] - d:]
    return base_logits.float() + z @ weights.w_read.float().T


def refine_step(ctx, prev_tokens, base_logits, weights, temperature=0.0, seed=0, offset=0, top_k=None, top_p=None,
                min_p=None, errors=None, filter_order="top_k_first"):
    """One refinement pass: tokens and log-probabilities of every drafted slot (sample_rows).
    errors (int32 [N]): each sequence's invalid per-row values OR-ed into it as bits (param_errors)
    and read as off, as the kernels do; jacobi_refine and sequential_refine take it, and filter_order
    (sample_rows'), alike."""
    temperature, top_k, top_p, min_p = flagged(errors, ctx.shape[0], temperature, top_k, top_p, min_p)
    return sample_rows(refine_logits(ctx, prev_tokens, base_logits, weights), temperature, seed, offset, top_k, top_p,
                       min_p, filter_order)


def _prev_tokens(prefix_tokens, tokens):
    """Slot k reads slot k-1: [token before the block, fixed slots, drafted slots but the last]."""
    return torch.cat([prefix_tokens, tokens[:, :-1]], dim=1)


def jacobi_refine(ctx, prefix_tokens, base_logits, weights, max_iters, temperature=0.0, seed=0, offset=0, top_k=None,
                  top_p=None, min_p=None, errors=None, filter_order="top_k_first"):
    """Jacobi iteration from the drafter's own sample (its base logits, filtered alike); a sequence
    stops after a pass that changes none of its tokens. Every pass reads the same noise. Returns
    tokens, logprobs (of the last pass run) and iters (passes run, int32)."""
    if max_iters < 0:
        raise ValueError("max_iters must be >= 0")
    temperature, top_k, top_p, min_p = flagged(errors, ctx.shape[0], temperature, top_k, top_p, min_p)
    sampling = (temperature, seed, offset, top_k, top_p, min_p)
    tokens, logprobs = sample_rows(base_logits, *sampling, filter_order)
    return jacobi_iterate(tokens, logprobs, prefix_tokens, max_iters,
                          lambda prev: refine_step(ctx, prev, base_logits, weights, *sampling,
                                                   filter_order=filter_order))


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


def sequential_refine(ctx, prefix_tokens, base_logits, weights, temperature=0.0, seed=0, offset=0, top_k=None,
                      top_p=None, min_p=None, errors=None, filter_order="top_k_first"):
    """Left-to-right decoding: drafted slot d is decided from the decided slots before it."""
    temperature, top_k, top_p, min_p = flagged(errors, ctx.shape[0], temperature, top_k, top_p, min_p)
    n, d = base_logits.shape[:2]
    tokens = torch.zeros(n, d, dtype=torch.int64, device=base_logits.device)
    logprobs = torch.zeros(n, d, dtype=torch.float32, device=base_logits.device)
    for slot in range(d):
        step_tokens, step_logprobs = refine_step(ctx, _prev_tokens(prefix_tokens, tokens), base_logits, weights,
                                                 temperature, seed, offset, top_k, top_p, min_p,
                                                 filter_order=filter_order)
        tokens[:, slot] = step_tokens[:, slot]
        logprobs[:, slot] = step_logprobs[:, slot]
    return tokens, logprobs
