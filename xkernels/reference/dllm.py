"""Reference of dllm_step, the LLaDA low-confidence unmasking step of diffusion LLM decoding."""

import math
from dataclasses import replace

import torch

from .param_errors import flagged
from .sampling import filtered_logits, row_params, row_streams


def _without_mask_token(logits, mask_id):
    """The mask token is never a candidate: its logit counts as -inf."""
    if 0 <= mask_id < logits.shape[-1]:
        logits = logits.clone()
        logits[..., mask_id] = -math.inf
    return logits


def _dllm_step_one(logits, block, params, stream, mask_id, num_unmask, threshold):
    """dllm_step for one sequence: logits [L, V] float32 and block [L] on the CPU, its RowParams and
    the RowStream of the step (slot p: position p). Returns (new_block, chosen positions ascending,
    x0 [L], confidence [L])."""
    length, v = logits.shape
    logits = _without_mask_token(logits, mask_id)
    masked = block == mask_id
    score = logits
    if params.inv_t and length:
        scaled = torch.stack([filtered_logits(row * params.inv_t, params.top_k, params.top_p, params.min_p,
                                              params.filter_order) for row in logits])
        score = scaled + torch.stack([stream.gumbel(p, v) for p in range(length)])
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


def step_stream(stream, step: int, length: int):
    """The stream of step `step` of a call over a block of `length` positions: the scalar form
    advances the offset by 1 a step, the per-request form by `length` (step d's position p takes
    slot offset + d * length + p), so that spiffy_accept's steps draw what dllm_step calls draw
    when the offset advances so between calls."""
    return replace(stream, offset=stream.offset + (step * length if stream.per_request else step))


def dllm_step(logits, block_tokens, mask_id, num_unmask=1, threshold=None, temperature=0.0, seed=0, offset=0,
              top_k=None, top_p=None, min_p=None, errors=None, filter_order="top_k_first"):
    """One step of the LLaDA low-confidence rule over a block. For every masked position l of
    sequence n: x0 is drawn from the step distribution p' of sequence n's parameters
    (sampling.filtered_probs of logits with the mask token at -inf) by Gumbel-max:
    x0 = argmax(filtered(logits / T) + G), G the noise of slot l of sequence n's stream
    (sampling.row_streams; none at T = 0, where x0 is the argmax) and confidence = softmax(logits)[x0]
    (the untempered softmax, as LLaDA and Fast-dLLM score it). Unmasked positions have confidence
    -inf. Then unmask the num_unmask most confident masked positions (ties to the lowest position),
    or, with threshold, every masked position whose confidence exceeds it and at least the most
    confident one. temperature, top_k, top_p, min_p: scalars or [N] tensors; seed, offset: the
    scalar form or [N] tensors (per request: slot l keyed by (seed[n], offset[n] + l)). Returns
    new_block [N, L], positions [N, L] (the unmasked positions ascending, -1 padded), tokens [N, L]
    (theirs, -1 padded) and confidence [N, L] float32. errors (int32 [N]): each sequence's invalid
    per-row values OR-ed into it as bits (param_errors) and read as off, as the kernels do.
    filter_order: the filters' order (sampling.filter_mask)."""
    n, length, _ = logits.shape
    params = row_params(n, *flagged(errors, n, temperature, top_k, top_p, min_p), filter_order=filter_order)
    streams = row_streams(n, seed, offset)
    l = logits.detach().cpu().float()
    block = block_tokens.detach().cpu()
    new_block = block.clone()
    positions = torch.full((n, length), -1, dtype=torch.int64)
    tokens = torch.full((n, length), -1, dtype=torch.int64)
    conf = torch.empty(n, length)
    for s in range(n):
        new_block[s], chosen, x0, conf[s] = _dllm_step_one(l[s], block[s], params[s], streams[s], mask_id, num_unmask,
                                                           threshold)
        positions[s, : len(chosen)] = torch.tensor(chosen, dtype=torch.int64)
        tokens[s, : len(chosen)] = x0[chosen]
    dev = logits.device
    return new_block.to(dev), positions.to(dev), tokens.to(dev), conf.to(dev)
