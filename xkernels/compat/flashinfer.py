"""FlashInfer's chain speculative sampling signature (`flashinfer.sampling`) over chain_verify."""

from typing import Optional, Tuple, Union

import torch

from .. import ops
from ..reference.sampling import stream_coins

Seed = Union[int, torch.Tensor]


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: Optional[torch.Tensor] = None,
    maybe_output_emitted_draft_token_num: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    seed: Optional[Seed] = None,
    offset: Optional[Seed] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless chain verification with FlashInfer's arguments and outputs.

    Args:
        draft_probs: float32 ``[B, K, V]``, the distributions the drafts were drawn from.
        draft_token_ids: int32 or int64 ``[B, K]``.
        target_probs: float32 ``[B, K+1, V]``, the target's (already processed) probabilities.
        maybe_output_accepted_token_num, maybe_output_emitted_draft_token_num: optional int32
            ``[B]`` counters, added to in place (as FlashInfer does) and returned.
        deterministic: accepted for compatibility; xkernels is always deterministic.
        generator: where no seed is given, a ``torch.Generator`` on the probabilities' device the
            seed is drawn from (on the device).
        seed, offset: ints, one-element int64 tensors, or int64 ``[B]`` tensors (a stream per
            request, which FlashInfer's kernels ignore past element 0: flashinfer #1104).

    Returns:
        ``output_token_ids`` int32 ``[B, K+1]`` (accepted drafts, then the correction or bonus
        token, then -1), ``accepted_num`` and ``emitted_num`` int32 ``[B]``: the drafts that pass
        their own acceptance test counted at every position, even after the first rejection,
        and the drafts emitted (the bonus token excluded), FlashInfer's two counters.

    Where it differs: the probabilities are verified as the distribution ``log(target_probs)``
    gives (rows renormalised; a row summing to 0 is a point mass at its argmax): the log is one
    float32 pass over ``target_probs`` (read and write, ``B (K+1) V`` elements) before the kernel,
    which reads log-probabilities; the random numbers are the package's Philox stream, not
    FlashInfer's, so the same seed gives other (equally distributed) tokens.

    Nothing is read on the host and the call is CUDA-graph capturable: with ``seed`` None, the seed
    is drawn on the probabilities' device by ``torch.randint`` (from ``generator``, which must be
    on that device, or the device's default generator; under capture a replay then draws anew, as
    PyTorch's graph-safe generators do). A one-element ``seed`` or ``offset`` is FlashInfer's one
    stream for the batch.
    """
    draft_ids = draft_token_ids.long()
    b, k = draft_ids.shape
    device = target_probs.device
    if seed is None:
        seed = torch.randint(0, 2**62, (), generator=generator, dtype=torch.int64, device=device)
    seed, offset = _stream(seed), _stream(0 if offset is None else offset)
    draft_probs = draft_probs.float()
    accept_len, out = ops.chain_verify(draft_ids, torch.log(target_probs.float()), draft_probs=draft_probs,
                                       temperature=1.0, seed=seed, offset=offset)
    accepted = _accepted_at_every_position(draft_ids, target_probs, draft_probs, accept_len, seed, offset)
    counters = []
    for counter, add in ((maybe_output_accepted_token_num, accepted), (maybe_output_emitted_draft_token_num, accept_len)):
        if counter is None:
            counter = torch.zeros(b, dtype=torch.int32, device=device)
        counter += add.to(counter.dtype)
        counters.append(counter)
    return out.to(torch.int32), counters[0], counters[1]


def _stream(value: Seed) -> Seed:
    """FlashInfer's seed or offset as the ops take it: a one-element tensor is one stream for the
    batch (the ops' 0-dim form), an int or an int64 [B] tensor passes as it is."""
    return value.reshape(()) if isinstance(value, torch.Tensor) and value.numel() == 1 else value


def _accepted_at_every_position(draft_ids, target_probs, draft_probs, accept_len, seed, offset) -> torch.Tensor:
    """FlashInfer's accepted_num: the kernel's accept_len (the drafts before its first rejection all
    passed, the rejected one did not), plus the drafts after the rejection that pass FlashInfer's own
    test u * q(x) < p(x) with the coins of their slots. Tensor ops on [B, K] (the coins' Philox
    rounds among them): no pass over the vocabulary, no host read."""
    b, k = draft_ids.shape
    coins = stream_coins(seed, offset, b, k, target_probs.device)
    p = target_probs[:, :k].gather(-1, draft_ids[..., None])[..., 0].float()
    q = draft_probs.gather(-1, draft_ids[..., None])[..., 0]
    after = torch.arange(k, device=target_probs.device)[None] > accept_len[:, None]
    return accept_len + ((coins * q < p) & after).sum(-1)
