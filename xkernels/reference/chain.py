"""Reference of chain_verify and chain_verify_ragged: speculative verification of a chain of drafts.

Each request is verified on its own (`verify_request`), with its own sampling parameters and
random stream, so a request's result never depends on the rest of the batch.
"""

from typing import List, Optional, Tuple

import torch

from .param_errors import flagged
from .sampling import (RowParams, RowStream, filtered_logits, gumbel_argmax, log_weights_of_linear, row_params,
                       row_streams)

METHODS = ("token", "block")


def _probs(a: torch.Tensor, point_mass: bool, top: int) -> torch.Tensor:
    """p' of one row of filtered scaled logits, as float32 exp(a - max) / sum like the kernels."""
    if point_mass:
        return torch.nn.functional.one_hot(torch.tensor(top), a.shape[0]).float()
    e = torch.exp(a - a.max())
    return e / e.sum()


def verify_request(drafts: torch.Tensor, logits: torch.Tensor, q: Optional[torch.Tensor], params: RowParams,
                   stream: RowStream, method: str = "token") -> Tuple[List[int], List[float]]:
    """One request: drafts int64 [K], logits [K+1, V], q float32 [K, V] or None. Returns the
    emitted tokens (the accepted drafts, then the correction or bonus token) and their
    log-probabilities under the filtered target distribution p' of their rows (0 where p' is a
    point mass: greedy rows and rows without a softmax)."""
    k, vocab = drafts.shape[0], logits.shape[-1]
    greedy = params.inv_t == 0
    rows = logits.float() if greedy else logits.float() * params.inv_t
    # p' of every row: the filters applied to the scaled logits; a row without a softmax
    # (a NaN, a +inf, or all -inf), and every row at T = 0, is a point mass at its argmax.
    a = [rows[i] if greedy else filtered_logits(rows[i], params.top_k, params.top_p, params.min_p, params.filter_order)
         for i in range(k + 1)]
    top = [int(r.argmax()) for r in a]
    point_mass = [greedy or not bool(torch.isfinite(r.max())) for r in a]
    p = [_probs(a[i], point_mass[i], top[i]) for i in range(k + 1)]
    draft = [int(x) for x in drafts]
    q_rows = [torch.nn.functional.one_hot(torch.tensor(x), vocab).float() for x in draft] if q is None else q.float()

    if method == "block" and not greedy:
        accepted, residual_scale = _block_accept(draft, p, q_rows, stream)
    else:
        accepted, residual_scale = _token_accept(draft, p, point_mass, top, q, stream), 1.0

    i = accepted
    if point_mass[i]:
        token = top[i]
    elif i == k:  # every draft accepted: the bonus token from p'
        token = gumbel_argmax(a[i], stream.gumbel(i, vocab), top[i])
    elif q is None:  # p' without the rejected draft (max(w p' - one-hot(x), 0) up to scale)
        log_w = a[i].clone()
        log_w[draft[i]] = float("-inf")
        token = gumbel_argmax(log_w, stream.gumbel(i, vocab), top[i])
    else:  # the correction from normalize(max(w p' - q, 0)), w = 1 token-wise
        weights = residual_scale * p[i] - q_rows[i]
        token = gumbel_argmax(log_weights_of_linear(weights), stream.gumbel(i, vocab), top[i])
    tokens = draft[:i] + [token]
    logprobs = [0.0 if point_mass[j] else float(torch.log(p[j][t])) for j, t in enumerate(tokens)]
    return tokens, logprobs


def _token_accept(draft, p, point_mass, top, q, stream) -> int:
    """Token-wise verification: draft x at row i is accepted with probability min(1, p'(x) / q(x))
    (p'(x) for a deterministic proposal; x == argmax at a point mass); the chain stops at the
    first rejection."""
    for i, x in enumerate(draft):
        if point_mass[i]:
            ok = x == top[i]
        else:
            u = stream.coin(i)
            ok = bool(u * q[i, x] < p[i][x]) if q is not None else bool(u < p[i][x])
        if not ok:
            return i
    return len(draft)


def _block_accept(draft, p, q_rows, stream) -> Tuple[int, float]:
    """Block verification (Sun et al., ICLR 2025): with w_0 = 1 and w_i = min(w_{i-1} p'(x_i) /
    q(x_i), 1), accept the longest prefix i whose coin u_i (the coin of row i - 1) is below
    h_i = Z_i / (Z_i + 1 - w_i) (h_K = w_K), where Z_i = sum_x max(w_i p'_i(x) - q_i(x), 0); the
    correction at row i is drawn from normalize(max(w_i p'_i - q_i, 0)). A deterministic proposal
    is q = one-hot(x). Returns the accepted count and w at it."""
    k = len(draft)
    w = [1.0]
    for i, x in enumerate(draft):
        px, qx = float(p[i][x]), float(q_rows[i][x])
        w.append(min(w[i] * px / qx, 1.0) if qx > 0 else (1.0 if w[i] * px > 0 else 0.0))
    accepted = 0
    for i in range(1, k + 1):
        if i == k:
            h = w[k]
        else:
            z = float(torch.clamp(w[i] * p[i].double() - q_rows[i].double(), min=0).sum())
            denom = z + 1.0 - w[i]
            h = z / denom if denom > 0 else 1.0
        if stream.coin(i - 1) < h:
            accepted = i
    return accepted, w[accepted]


def _check_method(method: str):
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def chain_verify(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_probs: Optional[torch.Tensor] = None,
    temperature=0.0,
    seed=0,
    offset=0,
    top_k=None,
    top_p=None,
    min_p=None,
    method: str = "token",
    return_logprobs: bool = False,
    errors: Optional[torch.Tensor] = None,
    filter_order: str = "top_k_first",
):
    """Speculative verification of a chain of drafts; see xkernels.chain_verify. Returns
    (accept_len int64 [N], out_tokens int64 [N, K+1]), and logprobs float32 [N, K+1] (NaN
    padded) with return_logprobs. errors (int32 [N]) and filter_order: as chain_verify_ragged's
    (errors a word a sequence)."""
    n, k = draft_tokens.shape
    vocab = target_logits.shape[-1]
    if draft_tokens.numel() and not ((draft_tokens >= 0) & (draft_tokens < vocab)).all():
        raise ValueError(f"draft_tokens holds ids outside [0, {vocab})")
    # The dense layout is the ragged one with K drafts a request.
    cu = torch.arange(1, n + 1) * k
    out, emitted, logprobs = chain_verify_ragged(
        draft_tokens.reshape(-1), cu, target_logits.reshape(n * (k + 1), vocab), k,
        None if draft_probs is None else draft_probs.reshape(n * k, vocab), temperature, top_k, top_p, min_p, seed,
        offset, method, errors=errors, filter_order=filter_order)
    result = (emitted.long() - 1, out.long())
    return result + (logprobs,) if return_logprobs else result


def chain_verify_ragged(
    draft_tokens: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    max_spec_len: int,
    draft_probs: Optional[torch.Tensor] = None,
    temperature=0.0,
    top_k=None,
    top_p=None,
    min_p=None,
    seed=0,
    offset=0,
    method: str = "token",
    return_logprobs: bool = True,
    errors: Optional[torch.Tensor] = None,
    filter_order: str = "top_k_first",
):
    """Chains held flat, as vLLM holds them; see xkernels.chain_verify_ragged. Request n has
    K_n = cu[n] - cu[n-1] drafts at draft_tokens[cu[n-1]:cu[n]] and its K_n + 1 target rows at
    target_logits[cu[n-1] + n : cu[n] + n + 1]; draft_probs of any float dtype (the values read as
    float32). Returns (output_token_ids int32 [N, max_spec_len + 1], -1 padded; num_emitted int32
    [N]; logprobs float32 [N, max_spec_len + 1], NaN padded, or None without return_logprobs, as
    chain_verify_ragged_ without a logprobs buffer). errors (int32 [N]): each request's invalid
    per-row values are OR-ed into it as bits (param_errors) and read as off, as the kernels do.
    filter_order: the filters' order (sampling.filter_mask)."""
    _check_method(method)
    n = cu_num_draft_tokens.shape[0]
    temperature, top_k, top_p, min_p = flagged(errors, n, temperature, top_k, top_p, min_p)
    device = target_logits.device
    cu = [0] + [int(c) for c in cu_num_draft_tokens.cpu()]
    params, streams = row_params(n, temperature, top_k, top_p, min_p, filter_order), row_streams(n, seed, offset)
    logits, draft = target_logits.detach().cpu(), draft_tokens.detach().cpu()
    q = None if draft_probs is None else draft_probs.detach().cpu().float()
    out = torch.full((n, max_spec_len + 1), -1, dtype=torch.int32)
    num_emitted = torch.zeros(n, dtype=torch.int32)
    logprobs = torch.full((n, max_spec_len + 1), float("nan"))
    for s in range(n):
        lo, hi = cu[s], cu[s + 1]
        tokens, lp = verify_request(draft[lo:hi], logits[lo + s:hi + s + 1], None if q is None else q[lo:hi],
                                    params[s], streams[s], method)
        num_emitted[s] = len(tokens)
        out[s, :len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        logprobs[s, :len(tokens)] = torch.tensor(lp)
    return out.to(device), num_emitted.to(device), logprobs.to(device) if return_logprobs else None
