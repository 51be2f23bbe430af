"""Reference of chain_verify: speculative verification of a chain of drafts."""

from typing import Optional, Tuple

import torch

from .rng import _as_int, acceptance_coins, gumbel_noise, inverse_temperature


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
