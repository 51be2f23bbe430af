"""How far a random op's stream offset must advance between two calls (docs/concepts/random_streams.md).

A random op reads Philox slots ``offset[n] + i`` of request ``n`` (the per-request form) for the
slots ``i`` its shapes allow; a later call of the same request whose offset starts inside that range
reuses noise, which silently correlates the two calls' tokens (no error, no visible bias in one
call). :func:`offset_advance` gives, for an op and the arguments of a call, the width of that range:
advancing each request's offset by it (or keying ``offset = step * width`` for any step counter that
grows by at least one per call) never reuses a slot.
"""

import inspect
from typing import Callable, Union

import torch

from .reference.sampling import is_per_row


def _dim(arguments, name: str, dim: int) -> int:
    value = arguments.get(name)
    if not isinstance(value, torch.Tensor) or value.dim() <= dim:
        raise ValueError(f"offset_advance: give {name} (a tensor with a dimension {dim}) as the op takes it")
    return value.shape[dim]


def _spiffy_steps(a) -> int:
    # One step from the root, then one from each kept draft the block reaches; every step unmasks a
    # position, so there are no more steps than positions.
    return min(_dim(a, "draft_logits", 1) + 1, _dim(a, "root_logits", 1))


def _max_spec_len(a) -> int:
    if "max_spec_len" not in a:
        raise ValueError("offset_advance: give max_spec_len as chain_verify_ragged takes it")
    return int(a["max_spec_len"])


# Per op: (slots a call of the per-request form reads, slots of the batch-row form). The per-request
# form keys request n's slot i by (seed[n], offset[n] + i); the batch-row form keys the slot by its
# own counter field, so there a new offset is fresh noise, except where the op itself adds to it.
_RULES = {
    # Token-wise or block: a coin per draft and a sample at any row up to K (the bonus row).
    "chain_verify": (lambda a: _dim(a, "draft_tokens", 1) + 1, lambda a: 1),
    "chain_verify_ragged": (lambda a: _max_spec_len(a) + 1, lambda a: 1),
    "chain_verify_ragged_": (lambda a: _dim(a, "out", 1), lambda a: 1),
    # Node i owns slot i: child c's coin, the sample at node i.
    "tree_verify": (lambda a: _dim(a, "tokens", 1), lambda a: 1),
    # Drafted slot d (every pass reads the same noise).
    "refine_step": (lambda a: _dim(a, "base_logits", 1), lambda a: 1),
    "jacobi_refine": (lambda a: _dim(a, "base_logits", 1), lambda a: 1),
    "sequential_refine": (lambda a: _dim(a, "base_logits", 1), lambda a: 1),
    # Masked position l of the block.
    "dllm_step": (lambda a: _dim(a, "logits", 1), lambda a: 1),
    # The d-th step's position l: offset + d L + l per request, offset + d in the batch-row form.
    "spiffy_accept": (lambda a: _spiffy_steps(a) * _dim(a, "root_logits", 1), _spiffy_steps),
    # Row r of the shard's rows.
    "shard_row_stats": (lambda a: _dim(a, "logits", 1), lambda a: 1),
}


def offset_advance(op: Union[str, Callable], *args, **kwargs) -> int:
    """How far each request's ``offset`` must advance before the next call of ``op``.

    Pass the op (a function of ``xkernels`` or ``xkernels.distributed``, or its name) and the
    arguments of the call, as the op takes them (only the shapes and the stream's form are read, no
    tensor values, so it makes no host read). The per-request form (``seed`` or ``offset`` an int64
    ``[N]`` tensor) reads slots ``offset[n]`` to ``offset[n] + width - 1``, where ``width`` is:

    - ``chain_verify`` (token-wise and block verification): ``K + 1``; ``chain_verify_ragged``:
      ``max_spec_len + 1``; ``chain_verify_ragged_``: the width of ``out``;
    - ``tree_verify``: ``M``, the tree's nodes;
    - ``refine_step``, ``jacobi_refine``, ``sequential_refine``: ``D``, the drafted slots;
    - ``dllm_step``: ``L``, the block's positions;
    - ``spiffy_accept``: ``min(K + 1, L) * L`` (at most ``K + 1`` steps of ``L`` slots each);
    - ``shard_row_stats``: ``R``, the shard's rows.

    The batch-row form (ints or 0-dim tensors) keys the slot by its own counter field: any other
    offset is fresh noise, so the width is 1 (``spiffy_accept``: ``min(K + 1, L)``, one a step).

    Advancing by less reuses noise: the same ``(seed, offset + i)`` then feeds both calls, and their
    tokens are silently correlated. Token-wise verification reads no slot past the one it emits, so
    there ``offset[n]`` may instead be the absolute position of the request's first verified slot;
    block verification reads every drafted slot's coin and may not.

    Args:
        op: the op or its name, e.g. ``xkernels.chain_verify_ragged`` or ``"tree_verify"``.
        args, kwargs: the call's arguments, as the op takes them.

    Returns:
        int: the advance, ``>= 0`` (0 where a call reads no slot: an empty block).

    Raises:
        ValueError: an op that draws no noise, or a call without the argument that sets the width.
        TypeError: arguments the op's signature does not take.
    """
    name = op if isinstance(op, str) else getattr(op, "__name__", "")
    if name not in _RULES:
        raise ValueError(f"offset_advance: {name or repr(op)} is not a random op (known: {', '.join(sorted(_RULES))})")
    if isinstance(op, str):
        from . import ops
        op = getattr(ops, name)
    arguments = inspect.signature(op).bind_partial(*args, **kwargs).arguments
    rows = next((x.shape[0] for x in arguments.values() if isinstance(x, torch.Tensor) and x.dim()), 0)
    if name.startswith("chain_verify_ragged"):
        cu = arguments.get("cu_num_draft_tokens")
        rows = cu.shape[0] if isinstance(cu, torch.Tensor) and cu.dim() == 1 else rows
    per_request = any(is_per_row(arguments.get(k, 0), rows) for k in ("seed", "offset"))
    per_request_rule, batch_row_rule = _RULES[name]
    return int(per_request_rule(arguments) if per_request else batch_row_rule(arguments))
