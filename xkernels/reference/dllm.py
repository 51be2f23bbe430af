"""Reference of dllm_step, the LLaDA low-confidence unmasking step of diffusion LLM decoding."""

import math

import torch

from .rng import _as_int, gumbel_noise, inverse_temperature


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
