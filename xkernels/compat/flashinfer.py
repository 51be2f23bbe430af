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
        generator: where no seed is given, a ``torch.Generator`` the seed is drawn from (one
            host draw, like FlashInfer's).
        seed, offset: ints, one-element int64 tensors, or int64 ``[B]`` tensors (a stream per
            request, which FlashInfer's kernels ignore past element 0: flashinfer #1104).

    Returns:
        ``output_token_ids`` int32 ``[B, K+1]`` (accepted drafts, then the correction or bonus
        token, then -1), ``accepted_num`` and ``emitted_num`` int32 ``[B]``: the drafts that pass
        their own acceptance test counted at every position, even after the first rejection,
        and the drafts emitted (the bonus token excluded), FlashInfer's two counters.

    Where it differs: the probabilities are verified as the distribution ``log(target_probs)``
    gives (rows renormalised; a row summing to 0 is a point mass at its argmax); the random
    numbers are the package's Philox stream, not FlashInfer's, so the same seed gives other
    (equally distributed) tokens.
    """
    draft_ids = draft_token_ids.long()
    b, k = draft_ids.shape
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
    offset = 0 if offset is None else offset
    logits = torch.log(target_probs.float())
    accept_len, out = ops.chain_verify(draft_ids, logits, draft_probs=draft_probs.float(), temperature=1.0, seed=seed,
                                       offset=offset)
    accepted = _accepted_at_every_position(draft_ids, target_probs.float(), draft_probs.float(), seed, offset)
    counters = []
    for counter, add in ((maybe_output_accepted_token_num, accepted), (maybe_output_emitted_draft_token_num, accept_len)):
        if counter is None:
            counter = torch.zeros(b, dtype=torch.int32, device=target_probs.device)
        counter += add.to(counter.dtype)
        counters.append(counter)
    return out.to(torch.int32), counters[0], counters[1]


def _accepted_at_every_position(draft_ids, target_probs, draft_probs, seed, offset) -> torch.Tensor:
    """How many drafts pass u * q(x) < p(x) with the coins the kernel uses, counting every
    position (FlashInfer's accepted_num), computed on the device."""
    b, k = draft_ids.shape
    coins = stream_coins(seed, offset, b, k, target_probs.device)
    p = target_probs[:, :k].gather(-1, draft_ids[..., None])[..., 0] / target_probs[:, :k].sum(-1)
    q = draft_probs.gather(-1, draft_ids[..., None])[..., 0]
    return (coins * q < p).sum(-1)
