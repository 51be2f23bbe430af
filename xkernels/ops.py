"""Typed Python entry points of the xkernels ops."""

from typing import Optional, Tuple, Union

import torch

Seed = Union[int, torch.Tensor]


def _tensor(value, name: str):
    """Tensors pass through; other arrays (CuPy, NumPy, JAX) come in zero-copy through DLPack."""
    if value is None or isinstance(value, torch.Tensor):
        return value
    if hasattr(value, "__dlpack__"):
        return torch.from_dlpack(value)
    raise TypeError(f"{name} must be a torch.Tensor or support DLPack, got {type(value).__name__}")


def _rng(value: Seed, name: str):
    """An int goes in the int argument; a tensor overrides it at run time (CUDA-graph friendly)."""
    if isinstance(value, torch.Tensor) or hasattr(value, "__dlpack__"):
        return 0, _tensor(value, name)
    value = int(value)
    if not -(2**63) <= value < 2**64:
        raise ValueError(f"{name} must fit in 64 bits, got {value}")
    return (value - 2**64 if value >= 2**63 else value), None


def chain_verify(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    draft_probs: Optional[torch.Tensor] = None,
    temperature: float = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Verify a chain of K draft tokens per sequence against the target's logits.

    Args:
        draft_tokens: int64 ``[N, K]``.
        target_logits: float32, bfloat16 or float16 ``[N, K+1, V]``; row ``i`` holds the
            target's next-token logits after the prefix plus the first ``i`` drafts.
        draft_probs: optional float32 ``[N, K, V]``, the distributions the drafts were
            sampled from. Without it the drafts are treated as deterministic proposals.
        temperature: 0 for greedy verification (ties go to the lowest index).
        Arrays of other libraries (CuPy, NumPy) are taken zero-copy through DLPack.
        seed, offset: the Philox stream (ints, or one-element int64 tensors on the logits'
            device that a captured CUDA graph can advance in place).

    Returns:
        ``accept_len`` int64 ``[N]`` in ``[0, K]`` and ``out_tokens`` int64 ``[N, K+1]``:
        the accepted drafts, then the correction (or bonus) token, then -1. Each sequence
        emits ``accept_len + 1`` tokens.

    At ``temperature > 0`` the emitted tokens are distributed exactly as sampling the
    target one token at a time: draft ``x_i`` is accepted when ``u * q_i(x_i) < p_i(x_i)``
    (``u < p_i(x_i)`` without draft_probs), and the first rejection draws from
    ``normalize(max(p_i - q_i, 0))`` (``p_i`` without ``x_i`` without draft_probs).
    A row whose softmax is undefined (a NaN, a +inf, or all -inf) is treated as a point
    mass at its ``torch.argmax``. Draft ids outside ``[0, V)`` raise on the CPU; on CUDA
    they are checked only with ``XKERNELS_CHECK=1`` (a host sync) and are otherwise
    rejected without being read.
    """
    seed_int, seed_tensor = _rng(seed, "seed")
    offset_int, offset_tensor = _rng(offset, "offset")
    return torch.ops.xkernels.chain_verify.default(
        _tensor(draft_tokens, "draft_tokens"), _tensor(target_logits, "target_logits"),
        _tensor(draft_probs, "draft_probs"), float(temperature), seed_int, offset_int, seed_tensor,
        offset_tensor,
    )


def build_info() -> dict:
    """How libxkernels was built: version, whether CUDA kernels are in, and their architectures."""
    fields = dict(item.split("=", 1) for item in torch.ops.xkernels.build_info.default().split(";"))
    fields["cuda"] = fields["cuda"] == "yes"
    return fields
