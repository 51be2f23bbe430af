"""Typed Python entry points of the xkernels ops."""

from typing import Optional, Tuple, Union

import torch

from .reference.sampling import check_filter_order, is_per_row  # is_per_row: the one rule for a per-request seed/offset

Seed = Union[int, torch.Tensor]


def _tensor(value, name: str, optional: bool = False):
    """Tensors pass through; other arrays (CuPy, NumPy, JAX) come in zero-copy through DLPack; None
    only where the argument is optional."""
    if isinstance(value, torch.Tensor) or (value is None and optional):
        return value
    if hasattr(value, "__dlpack__"):
        return torch.from_dlpack(value)
    raise TypeError(f"{name} must be a torch.Tensor or support DLPack, got {type(value).__name__}")


def _scalar(value, name: str, kind=float):
    """float(value) or int(value), raising a TypeError that names the argument (a string is refused:
    it would be a caller's slip, even where it parses)."""
    if kind is int and isinstance(value, float) and not value.is_integer():  # int(2.5) would drop the .5
        raise TypeError(f"{name} must be an int, got {value}")
    if not isinstance(value, (str, bytes)):
        try:
            return kind(value)
        except (TypeError, ValueError, RuntimeError):
            pass
    raise TypeError(f"{name} must be {'an int' if kind is int else 'a float'}, got {type(value).__name__}")


def _rng(value: Seed, name: str):
    """An int goes in the int argument; a tensor overrides it at run time (CUDA-graph friendly)."""
    if isinstance(value, torch.Tensor) or hasattr(value, "__dlpack__"):
        return 0, _tensor(value, name)
    value = _scalar(value, name, int)
    if not -(2**63) <= value < 2**64:
        raise ValueError(f"{name} must fit in 64 bits, got {value}")
    return (value - 2**64 if value >= 2**63 else value), None


def _stream_form(value, name: str, n: int) -> None:
    """Refuses a one-element 1-D seed or offset with N > 1: the op layer reads it as one stream for
    the batch (the form that predates per-request streams), a caller most likely meant a stream per
    request. The batch-row form is chosen explicitly by an int or a 0-dim tensor."""
    if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == 1 and n > 1:
        raise ValueError(f"{name} is a one-element 1-D tensor but the batch has N = {n} rows: pass an int64 [N] "
                         f"tensor (a stream per request) or, for one stream for the batch keyed by the row, an int "
                         f"or a 0-dim tensor ({name}.reshape(()))")


def _rng_args(seed: Seed, offset: Seed, n: Optional[int] = None):
    """The schema's (seed, offset, seed_tensor, offset_tensor) from Python ints or tensors; with the
    batch's ``n``, a one-element 1-D tensor at ``n > 1`` raises (_stream_form)."""
    seed_int, seed_tensor = _rng(seed, "seed")
    offset_int, offset_tensor = _rng(offset, "offset")
    if n is not None:
        _stream_form(seed_tensor, "seed", n)
        _stream_form(offset_tensor, "offset", n)
    return seed_int, offset_int, seed_tensor, offset_tensor


def _ids(value, name: str):
    """A token-id tensor as the kernels take it: int32 ids widen to int64 (a copy of a few ids);
    any other dtype passes through for the op to refuse, naming the argument."""
    value = _tensor(value, name)
    return value.long() if value.dtype == torch.int32 else value


def _rows(value) -> int:
    """The batch size N of an argument whose first dimension is the batch (0 for a 0-dim one)."""
    return value.shape[0] if isinstance(value, torch.Tensor) and value.dim() else 0


Param = Union[None, int, float, torch.Tensor]  # a float parameter: None (off), a float or an [N] tensor
IntParam = Union[None, int, torch.Tensor]  # an integer one (top_k): None (off), an int or an [N] tensor


def _sampling_args(temperature, top_k: IntParam, top_p: Param, min_p: Param, seed: Seed, offset: Seed,
                   n: Optional[int] = None):
    """The schemas' (value, tensor) pairs of the sampling parameters and the stream, in order (with the
    batch's ``n``, the stream's form is checked: _stream_form)."""
    def pair(value, name, default, cast, none_is_off=True):
        value = _tensor(value, name) if isinstance(value, torch.Tensor) or hasattr(value, "__dlpack__") else value
        if isinstance(value, torch.Tensor):
            return default, value
        # None turns a filter off; a temperature has no "off" (0 is greedy, given as 0), so None raises
        return _scalar(default if value is None and none_is_off else value, name, cast), None

    seed_int, offset_int, seed_tensor, offset_tensor = _rng_args(seed, offset, n)
    return (*pair(temperature, "temperature", 0.0, float, none_is_off=False), *pair(top_k, "top_k", 0, int),
            *pair(top_p, "top_p", 1.0, float), *pair(min_p, "min_p", 0.0, float),
            seed_int, seed_tensor, offset_int, offset_tensor)


def _filter_order(filter_order: str) -> str:
    """The schemas' filter_order, refused here with a ValueError that names it (the op's own check
    raises a RuntimeError)."""
    check_filter_order(filter_order)
    return filter_order


def _check_method(method: str) -> bool:
    if method not in ("token", "block"):
        raise ValueError(f"method must be 'token' or 'block', got {method!r}")
    return method == "block"


def chain_verify(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    draft_probs: Optional[torch.Tensor] = None,
    temperature: Union[float, torch.Tensor] = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
    top_k: IntParam = None,
    top_p: Param = None,
    min_p: Param = None,
    method: str = "token",
    return_logprobs: bool = False,
    errors: Optional[torch.Tensor] = None,
    filter_order: str = "top_k_first",
):
    """Verify a chain of K draft tokens per sequence against the target's logits.

    Args:
        draft_tokens: int64 or int32 ``[N, K]``.
        target_logits: float32, bfloat16 or float16 ``[N, K+1, V]``; row ``i`` holds the
            target's next-token logits after the prefix plus the first ``i`` drafts.
        draft_probs: optional float32, bfloat16 or float16 ``[N, K, V]`` (an EAGLE drafter's
            bfloat16 q as it is: the kernels read it in its dtype, no float32 copy), the
            distributions the drafts were sampled from. Without it the drafts are treated as
            deterministic proposals.
        temperature: a float, or a float32 ``[N]`` tensor (a temperature per sequence; rows
            at 0 are greedy in the same call). 0 is greedy verification (ties go to the
            lowest index).
        top_k, top_p, min_p: the filters of each sequence's target distribution, each None
            (off), a scalar, or an ``[N]`` tensor (top_k int32/int64, 0 off; top_p float32 in
            (0, 1], 1 off; min_p float32 in [0, 1], 0 off); see :func:`chain_verify_ragged`.
        filter_order: the filters' order, as :func:`chain_verify_ragged` takes it.
        seed, offset: the Philox stream: int64 ``[N]`` tensors, a stream per sequence that does
            not depend on the batch (what an engine passes; ``offset[n]``: where the sequence's
            slots start, the next call's ``K + 1`` further, :func:`xkernels.offset_advance`:
            reusing a slot silently correlates the noise; see :func:`chain_verify_ragged`); or ints
            or 0-dim int64 tensors on the logits' device (a captured CUDA graph can advance them in
            place), one stream for the batch keyed by the batch row. A one-element 1-D tensor is
            per-sequence at ``N = 1`` and raises at ``N > 1``.
        method: ``"token"`` (token-wise verification) or ``"block"`` (block verification).
        return_logprobs: also return the log-probabilities of the emitted tokens.
        errors: optional int32 ``[N]``, a word a sequence, contiguous, on the logits' device: the
            asynchronous error flag, as :func:`chain_verify_ragged` takes it. Each sequence's
            invalid per-sequence values are OR-ed into its word as
            :class:`xkernels.errors.SamplingError` bits (1 ``temperature`` NaN, infinite or
            negative; 2 ``top_k < 0``; 4 ``top_p`` NaN or outside (0, 1]; 8 ``min_p`` NaN or
            outside [0, 1]) on the device, with no host sync (CUDA-graph capturable), instead of
            raising, on the CPU as on CUDA (with ``XKERNELS_CHECK=1`` too). They are read as off
            as without it (a temperature as greedy, ``top_k`` 0, ``top_p`` 1, ``min_p`` 0): the
            results are the same. Clamped, not flagged: an int64 ``top_k`` past int32 (it keeps
            every id) and a temperature whose float32 reciprocal overflows (greedy). Zero it
            before the call (bits accumulate); read it when the step already syncs. A call with
            ``errors`` runs :func:`chain_verify_ragged`'s kernels, which set the bits themselves:
            no extra launch (scalar parameters give the same tokens there).

    Returns:
        ``accept_len`` int64 ``[N]`` in ``[0, K]`` and ``out_tokens`` int64 ``[N, K+1]``:
        the accepted drafts, then the correction (or bonus) token, then -1. Each sequence
        emits ``accept_len + 1`` tokens. With ``return_logprobs``, also ``logprobs`` float32
        ``[N, K+1]`` (NaN padded), as :func:`chain_verify_ragged` gives them.

    At ``temperature > 0`` the emitted tokens are distributed exactly as sampling the
    target one token at a time: draft ``x_i`` is accepted when ``u * q_i(x_i) < p_i(x_i)``
    (``u < p_i(x_i)`` without draft_probs), and the first rejection draws from
    ``normalize(max(p_i - q_i, 0))`` (``p_i`` without ``x_i`` without draft_probs).
    A row whose softmax is undefined (a NaN, a +inf, or all -inf) is treated as a point
    mass at its ``torch.argmax``. Draft ids outside ``[0, V)`` raise on the CPU; on CUDA
    they are checked only with ``XKERNELS_CHECK=1`` (a host sync) and are otherwise
    rejected without being read. A call with per-sequence parameters, filters, streams,
    ``method="block"``, ``return_logprobs`` or ``errors`` runs :func:`chain_verify_ragged` over
    the dense layout.

    Raises:
        RuntimeError: a tensor of the wrong shape, dtype or device, a bad ``temperature``, or
            (on the CPU) draft ids outside ``[0, V)``: each message names the argument. With
            ``errors`` the per-sequence values are flagged there, never raised, on any device
            (scalars still raise: they are checked on the host without a sync).
        ValueError: a ``seed`` or ``offset`` int that does not fit in 64 bits, or a ``filter_order``
            other than ``"top_k_first"`` or ``"min_p_first"``.
        TypeError: an argument that is neither a tensor nor a DLPack array.

    Kernels:
        - CPU: sequences in parallel, each stops reading at its first rejection; vectorised
          argmax and exp-sum; float32 rows read in place at ``T`` 0 or 1; the sample draws
          Philox 8 draws at a time and takes an id's logs only if the top bits of its noise
          let it win.
        - CUDA: split-vocabulary row statistics, a warp per sequence finds the first rejection
          with a ballot, then one Gumbel-max pass over the one row that needs a sample; never
          syncs the host, CUDA-graph capturable.
    """
    draft_tokens, target_logits = _ids(draft_tokens, "draft_tokens"), _tensor(target_logits, "target_logits")
    draft_probs = _tensor(draft_probs, "draft_probs", optional=True)
    n = _rows(draft_tokens)
    rng = _rng_args(seed, offset, n)
    _filter_order(filter_order)  # the plain form has no filters, so no order, but a bad value still raises
    engine_form = (isinstance(temperature, torch.Tensor) or any(x is not None for x in (top_k, top_p, min_p))
                   or is_per_row(seed, n) or is_per_row(offset, n) or method != "token" or return_logprobs
                   or errors is not None)
    if not engine_form:
        return torch.ops.xkernels.chain_verify.default(
            draft_tokens, target_logits, draft_probs, _scalar(temperature, "temperature"), *rng)
    _check_method(method)
    if draft_tokens.dtype != torch.int64:  # as the plain form
        raise ValueError(f"draft_tokens must be int64 or int32, got {draft_tokens.dtype}")
    if draft_tokens.dim() != 2 or target_logits.dim() != 3 or tuple(target_logits.shape[:2]) != (
            n, draft_tokens.shape[1] + 1):
        raise ValueError(f"draft_tokens [N, K] and target_logits [N, K+1, V] do not match: "
                         f"{tuple(draft_tokens.shape)} and {tuple(target_logits.shape)}")
    k, vocab = draft_tokens.shape[1], target_logits.shape[2]
    if draft_probs is not None and tuple(draft_probs.shape) != (n, k, vocab):  # before the reshape loses it
        raise ValueError(f"draft_probs must have shape [N, K, V] = [{n}, {k}, {vocab}], got {list(draft_probs.shape)}")
    cu = torch.arange(1, n + 1, dtype=torch.int64, device=draft_tokens.device) * k
    out, emitted, logprobs = _ragged_buffers(n, k, target_logits.device, with_logprobs=return_logprobs)
    _ragged(draft_tokens.reshape(-1), cu, target_logits.reshape(n * (k + 1), vocab), k,
            None if draft_probs is None else draft_probs.reshape(n * k, vocab), temperature, top_k, top_p, min_p, seed,
            offset, method, out, emitted, logprobs, errors, filter_order)
    result = (emitted.long() - 1, out.long())
    return result + (logprobs,) if return_logprobs else result


def chain_verify_ragged(
    draft_tokens: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    max_spec_len: int,
    draft_probs: Optional[torch.Tensor] = None,
    temperature: Union[float, torch.Tensor] = 0.0,
    top_k: IntParam = None,
    top_p: Param = None,
    min_p: Param = None,
    seed: Seed = 0,
    offset: Seed = 0,
    method: str = "token",
    out: Optional[torch.Tensor] = None,
    num_emitted: Optional[torch.Tensor] = None,
    logprobs: Optional[torch.Tensor] = None,
    errors: Optional[torch.Tensor] = None,
    filter_order: str = "top_k_first",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify chains held flat, as vLLM holds them, with per-request sampling parameters.

    This allocating form returns vLLM's counts (emitted tokens, tokens first) and always the
    log-probabilities, as it did before the verify ops had one convention; kept for its callers.
    :func:`chain_verify_ragged_` is the same kernel with the verify ops' convention (accepted drafts
    first), into caller buffers, log-probabilities only when asked.

    Args:
        draft_tokens: int64 or int32 ``[T]``, every request's drafts one after another.
        cu_num_draft_tokens: int32 or int64 ``[N]``, the inclusive cumulative sum of the
            requests' draft counts ``K_n`` (a request may have 0 drafts).
        target_logits: float32, bfloat16 or float16 ``[T + N, V]``: request ``n``'s ``K_n + 1``
            rows are contiguous, from row ``cu[n-1] + n`` (``cu[-1] = 0``).
        max_spec_len: the width of the output less one; at least every ``K_n``.
        draft_probs: optional float32, bfloat16 or float16 ``[T, V]`` (read in its dtype, no
            float32 copy): the distributions the drafts were sampled from; without it the drafts
            are deterministic proposals.
        temperature: a float, or a float32 ``[N]`` tensor; rows at 0 are greedy.
        top_k: None, an int or an int32/int64 ``[N]`` tensor; 0 is off.
        top_p: None, a float or a float32 ``[N]`` tensor in (0, 1]; 1 is off.
        min_p: None, a float or a float32 ``[N]`` tensor in [0, 1]; 0 is off.
        filter_order: ``"top_k_first"`` (the default) applies top-k, top-p, then min-p;
            ``"min_p_first"`` (vLLM's order) applies min-p, then top-k, then top-p renormalised over
            what both keep. The two differ only where min-p and top-p are both on.
        seed, offset: int64 ``[N]`` tensors (what an engine passes): request ``n``'s noise at slot
            ``i`` is keyed by ``(seed[n], offset[n] + i)`` alone, so it gets the same tokens at any
            row of any batch. A call reads slots up to ``offset[n] + max_spec_len``: the next call's
            offset advances by :func:`xkernels.offset_advance` (``max_spec_len + 1``), or, keyed by
            position, ``offset[n] = position * (max_spec_len + 1)``; reusing a slot silently
            correlates the calls' noise. Token-wise, ``offset[n]`` may also be the absolute position
            of the request's first verified slot (a call reads no slot past the one it emits);
            block verification reads the coins of every drafted slot, so it may not. An int or a
            0-dim int64 tensor is the batch-row form: one stream for the batch, keyed by the
            request's row (:doc:`/concepts/random_streams`); a one-element 1-D tensor with ``N > 1``
            raises (say which form you mean).
        method: ``"token"``: token-wise verification, stopping at the first rejection;
            ``"block"``: block verification (Sun et al., ICLR 2025), which judges the block
            jointly and in expectation accepts at least as many drafts.
        out, num_emitted, logprobs: optional caller buffers (int32 ``[N, max_spec_len + 1]``,
            int32 ``[N]``, float32 ``[N, max_spec_len + 1]``, contiguous, on the logits' device)
            written in place; those not given are allocated (:func:`chain_verify_ragged_` takes
            buffers as its explicit in-place form).
        errors: optional int32 ``[N]``, contiguous, on the logits' device: the asynchronous error
            flag. The kernels OR each request's invalid per-row values into its word as
            :class:`xkernels.errors.SamplingError` bits (1 ``temperature`` NaN, infinite or
            negative; 2 ``top_k < 0``; 4 ``top_p`` NaN or outside (0, 1]; 8 ``min_p`` NaN or
            outside [0, 1]) on the device, with no host sync (CUDA-graph capturable), instead of
            raising, on the CPU as on CUDA (with ``XKERNELS_CHECK=1`` too). Zero it before the
            call (or once for several calls: bits accumulate); read it when the step already
            syncs. The flagged values are read as off as without it (a temperature as greedy,
            ``top_k`` 0, ``top_p`` 1, ``min_p`` 0): the results are the same.

    Returns:
        ``output_token_ids`` int32 ``[N, max_spec_len + 1]``: each request's accepted drafts,
        then its correction or bonus token, then -1; ``num_emitted`` int32 ``[N]``: accepted
        drafts + 1; ``logprobs`` float32 ``[N, max_spec_len + 1]``: log p' of each emitted token
        under its row's filtered distribution (0 where p' is a point mass: greedy rows and rows
        without a softmax), NaN padded.

    Request ``n`` follows the filtered distribution p' of each row: p = softmax(logits / T);
    keep the ``top_k`` most probable ids; then the smallest set of most probable ids whose
    mass, renormalised over the top-k set, reaches ``top_p``; then drop ids below ``min_p``
    times the largest probability; renormalise (with ``filter_order="min_p_first"``, min-p first,
    then top-k, then top-p over what both keep). Ids are ranked by logit, ties to the lower id
    (so the kept set is a prefix of that ranking), the same on every device. Verification is
    lossless for p': a draft is accepted with probability min(1, p'(x) / q(x)), the correction
    is drawn from normalize(max(p' - q, 0)) (p' without the rejected id for deterministic
    proposals) and the bonus token from p'. Request ``n``'s result equals :func:`chain_verify`
    on that request alone with the same parameters, seed and offset.

    Raises:
        RuntimeError: naming the argument: a negative, NaN or infinite temperature, ``top_p``
            outside (0, 1], ``min_p`` outside [0, 1], ``top_k < 0``, per-row tensors of another
            length, dtype or device, ``cu_num_draft_tokens`` that decreases or does not end at T,
            ``max_spec_len`` below a request's drafts, draft ids outside [0, V), and buffers of
            the wrong shape or dtype. Values are checked on the CPU, and on CUDA only with
            ``XKERNELS_CHECK=1``; without it the kernel stays memory-safe: counts are clamped into
            [0, T] and ``max_spec_len``, drafts outside [0, V) count as rejected, invalid per-row
            values read as off (a temperature as greedy). With ``errors`` the per-row values are
            never raised for, on any device: they are flagged there (scalar values still raise:
            they are checked on the host without a sync).
        ValueError: a ``method`` other than ``"token"`` or ``"block"``, or a ``filter_order`` other
            than ``"top_k_first"`` or ``"min_p_first"``.

    Kernels:
        - CPU: requests in parallel; the cut is found by a streaming top-k selection (a heap of
          k, blocks of 16 skipped by one vectorised max) or, for top-p alone, mass bands of 1/8
          nat and one ranked band, never a sort of the vocabulary.
        - CUDA: a filtered row's candidates by a streaming pass over (row, slice) items and a select
          block per row that finds the exact cut (count for top-k, 64-bit fixed-point mass for
          top-p, ties split by id) where the candidates hold it; a block per row prepares the other
          rows (statistics, and the radix selection for a filtered row the candidates do not
          settle); then a block per request walks its rows on those states; no host sync,
          CUDA-graph capturable, memory-safe on unchecked values.
    """
    if not 0 <= int(max_spec_len) < 2**31:  # the buffers' width, allocated below
        raise ValueError(f"max_spec_len must lie in [0, 2^31), got {max_spec_len}")
    out, num_emitted, logprobs = _ragged_buffers(_requests(cu_num_draft_tokens), int(max_spec_len),
                                                 _tensor(target_logits, "target_logits").device, out, num_emitted,
                                                 logprobs, with_logprobs=True)
    _ragged(draft_tokens, cu_num_draft_tokens, target_logits, int(max_spec_len), draft_probs, temperature, top_k,
            top_p, min_p, seed, offset, method, out, num_emitted, logprobs, errors, filter_order)
    return out, num_emitted, logprobs


def _ragged_buffers(n: int, max_spec_len: int, device, out=None, num_emitted=None, logprobs=None,
                    with_logprobs: bool = False):
    """The ragged kernel's buffers: those given, the others allocated; logprobs only with_logprobs
    (else None: the kernels neither compute nor write log-probabilities)."""
    width = max_spec_len + 1
    if out is None:
        out = torch.empty((n, width), dtype=torch.int32, device=device)
    if num_emitted is None:
        num_emitted = torch.empty((n,), dtype=torch.int32, device=device)
    if logprobs is None and with_logprobs:
        logprobs = torch.empty((n, width), dtype=torch.float32, device=device)
    return out, num_emitted, logprobs


def _requests(cu_num_draft_tokens) -> int:
    cu_num_draft_tokens = _tensor(cu_num_draft_tokens, "cu_num_draft_tokens")
    if cu_num_draft_tokens.dim() != 1:
        raise ValueError(f"cu_num_draft_tokens must have shape [N], got {list(cu_num_draft_tokens.shape)}")
    return cu_num_draft_tokens.shape[0]


def _ragged(draft_tokens, cu_num_draft_tokens, target_logits, max_spec_len, draft_probs, temperature, top_k, top_p,
            min_p, seed, offset, method, out, num_emitted, logprobs, errors, filter_order):
    """The one call of chain_verify_ragged_'s kernel both ragged forms make, into the given buffers."""
    block = _check_method(method)
    n = _requests(cu_num_draft_tokens)
    torch.ops.xkernels.chain_verify_ragged_.default(
        _tensor(draft_tokens, "draft_tokens"), _tensor(cu_num_draft_tokens, "cu_num_draft_tokens"),
        _tensor(target_logits, "target_logits"), max_spec_len, _tensor(draft_probs, "draft_probs", optional=True),
        *_sampling_args(temperature, top_k, top_p, min_p, seed, offset, n), block, out, num_emitted, logprobs,
        _tensor(errors, "errors", optional=True), _filter_order(filter_order))


def chain_verify_ragged_(
    draft_tokens: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    out: torch.Tensor,
    accept_len: torch.Tensor,
    *,
    logprobs: Optional[torch.Tensor] = None,
    draft_probs: Optional[torch.Tensor] = None,
    temperature: Union[float, torch.Tensor] = 0.0,
    top_k: IntParam = None,
    top_p: Param = None,
    min_p: Param = None,
    seed: Seed = 0,
    offset: Seed = 0,
    method: str = "token",
    errors: Optional[torch.Tensor] = None,
    filter_order: str = "top_k_first",
):
    """:func:`chain_verify_ragged` into caller buffers, with the verify ops' one convention: the
    accepted drafts' count first, then the tokens (as :func:`chain_verify` and :func:`tree_verify`).

    The form an engine captures in a CUDA graph: every output is a buffer it owns, written in place
    on the current stream, no host read, nothing allocated; without ``logprobs`` the kernels neither
    compute nor write log-probabilities.

    Args:
        draft_tokens, cu_num_draft_tokens, target_logits, draft_probs: as :func:`chain_verify_ragged`
            takes them (``draft_tokens`` int32 or int64).
        temperature, top_k, top_p, min_p, method, filter_order: as :func:`chain_verify_ragged` takes
            them.
        errors: optional int32 ``[N]``: the asynchronous error flag, as :func:`chain_verify_ragged`
            takes it: each request's invalid per-row values OR-ed in as
            :class:`xkernels.errors.SamplingError` bits, on the device, instead of raising; the
            results are unchanged (those values read as off).
        out: int32 ``[N, max_spec_len + 1]``, contiguous, on the logits' device: its width sets
            ``max_spec_len``; receives each request's accepted drafts, then its correction or bonus
            token, then -1.
        accept_len: int32 ``[N]``, contiguous, on the logits' device: receives each request's
            accepted drafts (it emits ``accept_len + 1`` tokens).
        logprobs: optional float32 ``[N, max_spec_len + 1]``: receives the emitted tokens'
            log-probabilities (as :func:`chain_verify_ragged` gives them, NaN padded); None (the
            default): none are computed.
        seed, offset: int64 ``[N]`` tensors, a stream per request (request ``n``'s slot ``i`` keyed by
            ``(seed[n], offset[n] + i)``); a call reads slots up to ``offset[n] + max_spec_len``, so
            the next call's offset advances by :func:`xkernels.offset_advance` (``max_spec_len + 1``):
            reusing a slot silently correlates the two calls' noise. An int or a 0-dim tensor is the
            batch-row form (:doc:`/concepts/random_streams`).

    Returns:
        tuple: ``(accept_len, out)``, the buffers given, and ``logprobs`` after them when it is given.

    Raises:
        ValueError: ``out`` not 2-D (or 0 wide), ``accept_len`` not int32 ``[N]``, or a one-element 1-D
            ``seed`` / ``offset`` with ``N > 1``; and what :func:`chain_verify_ragged` raises.

    Kernels:
        - CPU and CUDA: :func:`chain_verify_ragged`'s, then one in-place subtraction on ``accept_len``
          (the kernel counts the emitted tokens).
    """
    out, accept_len = _tensor(out, "out"), _tensor(accept_len, "accept_len")
    if out.dim() != 2 or out.shape[1] < 1:
        raise ValueError(f"out must have shape [N, max_spec_len + 1], got {list(out.shape)}")
    if (accept_len.dtype != torch.int32 or tuple(accept_len.shape) != (_requests(cu_num_draft_tokens),)
            or not accept_len.is_contiguous()):
        raise ValueError(f"accept_len must be a contiguous int32 [N] (N = cu_num_draft_tokens' length), got "
                         f"{accept_len.dtype} {list(accept_len.shape)}")
    logprobs = _tensor(logprobs, "logprobs", optional=True)
    _ragged(draft_tokens, cu_num_draft_tokens, target_logits, out.shape[1] - 1, draft_probs, temperature, top_k,
            top_p, min_p, seed, offset, method, out, accept_len, logprobs, errors, filter_order)
    accept_len.sub_(1)
    return (accept_len, out) if logprobs is None else (accept_len, out, logprobs)


def build_info() -> dict:
    """How libxkernels was built.

    Returns:
        dict of str: ``version``; ``cuda`` (bool: whether the CUDA kernels are in) and
        ``cuda_archs``; ``cpu_threads`` (``"openmp"``: the CPU kernels use torch's intra-op
        threads; ``"one"``) and ``cpu_read`` (the CPU's greedy float32 refine read a call takes
        now: ``"avx512"``, one fused kernel, or ``"sliced"``: GEMM then epilogue, also where
        ``XKERNELS_REFINE_READ=gemm`` forces it); and the build's other fields.
        ``python -m xkernels info`` prints them.
    """
    fields = dict(item.split("=", 1) for item in torch.ops.xkernels.build_info.default().split(";"))
    fields["cuda"] = fields["cuda"] == "yes"
    return fields


# The text the refine ops' docstrings share (Args and Raises), filled in by _refine_doc.
_REFINE_DOC = {
    "ctx": """\
        ctx: float32 ``[N, B, r]``, the pass-invariant context (``XPressRefiner.prepare(h)`` of the
            drafter's states), on the device of the other tensors.
""",
    "prefix_tokens": """\
        prefix_tokens: int64 ``[N, F + 1]``, the token before the block and the ``F = B - D``
            fixed slots.
""",
    "base_logits_weights": """\
        base_logits: float32, bfloat16 or float16 ``[N, D, V]``, the drafter's logits of the last
            ``D <= B`` slots (the drafted ones).
        weights: ``xkernels.RefinerWeights`` (``XPressRefiner.fold()``), float32 or bfloat16, on the
            same device; ``emb`` and ``w_read`` hold ``V`` rows.
""",
    "sampling": """\
        temperature: ``T >= 0``, finite: a float, or a float32 ``[N]`` tensor (one a sequence);
            0 (or a ``T`` whose float32 reciprocal overflows) is greedy, in the same launch as
            sampled rows.
        seed, offset: the Philox stream (:doc:`/concepts/random_streams`). Ints (64 bits) or
            one-element int64 tensors (read on the device: a captured CUDA graph reads them at
            replay): one stream for the batch, the noise keyed by (sequence row, drafted slot, id).
            Or int64 ``[N]`` tensors (the per-request form): sequence ``n``'s noise at drafted slot
            ``d`` is keyed by ``(seed[n], offset[n] + d)`` alone, so a sequence gets the same tokens
            at any row of any batch. Every pass (Jacobi iterations, sequential steps) reads the
            same noise of a slot; ``offset[n]`` is the absolute position of the block's first
            drafted slot, and the next call starts ``D`` further (the next block's position;
            :func:`xkernels.offset_advance`): reusing a slot silently correlates the calls' noise.
            A one-element 1-D tensor with ``N > 1`` raises (an int or a 0-dim tensor is the batch form).
        top_k: None, an int or an int32/int64 ``[N]`` tensor; 0 is off.
        top_p: None, a float or a float32 ``[N]`` tensor in (0, 1]; 1 is off.
        min_p: None, a float or a float32 ``[N]`` tensor in [0, 1]; 0 is off. A sampled row with
            a filter draws from the filtered distribution p' (:func:`chain_verify_ragged` states
            it; ``reference.sampling.filtered_probs``), and its log-prob is ``log p'(token)``.
            Greedy rows ignore the filters (the argmax is always kept).
        filter_order: ``"top_k_first"`` (the default) applies top-k, top-p, then min-p;
            ``"min_p_first"`` (vLLM's order) applies min-p, then top-k, then top-p renormalised over
            what both keep. The two differ only where min-p and top-p are both on.
        errors: optional int32 ``[N]``, a word a sequence: the asynchronous error flag, as
            :func:`dllm_step` takes it (the invalid per-sequence values flagged and read as off
            instead of raised; the results unchanged; one small extra launch on CUDA).
""",
    "raises": """\
        RuntimeError: a tensor of the wrong shape, dtype or device, a token id outside ``[0, V)``
            (on the CPU; on CUDA, unless ``XKERNELS_CHECK=1``, such an id reads a zero embedding
            row), a block beyond the CUDA kernels' 64 slots or a rank beyond 1024, a bad
            ``temperature`` (negative, NaN or infinite), ``top_k < 0``, ``top_p`` outside (0, 1],
            ``min_p`` outside [0, 1], or per-sequence tensors of another length, dtype or device:
            each message names the argument. Per-sequence values are checked on the CPU, and on
            CUDA only with ``XKERNELS_CHECK=1``; without it invalid values read as off (a
            temperature as greedy). With ``errors`` they are flagged there, never raised.
        TypeError: ``weights`` is not a ``RefinerWeights``, or an argument is neither a tensor nor
            a DLPack array.
        ValueError: a ``filter_order`` other than ``"top_k_first"`` or ``"min_p_first"``.
""",
}


def _refine_doc(fn):
    """Fills the ``{name}`` fields of a refine op's docstring with _REFINE_DOC's shared text."""
    if fn.__doc__:  # None under python -OO
        fn.__doc__ = fn.__doc__.format(**{k: v.rstrip("\n") for k, v in _REFINE_DOC.items()})
    return fn


def _weights(weights):
    from .refiner import RefinerWeights

    if not isinstance(weights, RefinerWeights):
        raise TypeError(f"weights must be an xkernels.RefinerWeights (see XPressRefiner.fold), got {type(weights).__name__}")
    return tuple(_tensor(w, name) for w, name in zip(weights, weights._fields))


@_refine_doc
def refine_step(
    ctx: torch.Tensor,
    prev_tokens: torch.Tensor,
    base_logits: torch.Tensor,
    weights,
    *,
    temperature: Union[float, torch.Tensor] = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
    top_k: IntParam = None,
    top_p: Param = None,
    min_p: Param = None,
    errors: Optional[torch.Tensor] = None,
    filter_order: str = "top_k_first",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One xPress refinement pass over a block of ``B`` slots whose last ``D`` are drafted.

    Per drafted slot: ``u = ctx + emb[prev]``, a per-channel causal mix over the block, a SwiGLU in
    rank space, then the refined logits ``l = base_logits + w_read z``; the token is
    ``argmax(l / T + G)`` (``argmax l`` at ``T = 0``). The ``[N, D, V]`` refined logits are never
    written.

    Args:
{ctx}
        prev_tokens: int64 ``[N, B]``; slot ``k`` reads the token of slot ``k - 1`` (slot 0 the
            token before the block).
{base_logits_weights}
{sampling}

    Returns:
        tuple: ``tokens`` int64 ``[N, D]`` and ``logprobs`` float32 ``[N, D]`` =
        ``log_softmax(l / T)[token]`` (``log_softmax(l)`` at ``T = 0``; ``log p'(token)`` for a
        filtered row).

    Raises:
{raises}

    Kernels:
        - CPU: the front with ATen; the greedy float32 read on AVX-512 is one kernel (tiles of ids
          against every row, products in registers, each row's max, argmax and sum of exp a lane
          a row, vocabulary chunks in parallel; ``XKERNELS_REFINE_READ=gemm`` forces the sliced
          read instead); otherwise the read in cache-sized vocabulary
          slices, one vendor GEMM each (oneDNN's bf16 GEMM for bfloat16 weights), then a parallel
          fused epilogue (bias, scale, Gumbel-max, online log-sum-exp). A sampled row with a
          filter is the exception: the epilogue copies its scaled logits to a V-float row, cut by
          a streaming top-k selection or top-p mass bands (no sort of the vocabulary), then
          sampled: two more passes over that row (bench/floors.md).
        - CUDA: three front kernels in rank space, then one cuBLAS GEMM of the whole read (bf16 in,
          fp32 out for bfloat16 weights; sliced over the vocabulary only where the products and
          weights pass 1 GiB or a sixteenth of the device memory) and a fused epilogue over (row,
          chunk) with 16-byte loads; a pass of up to 128 rows with bfloat16 weights (rank a
          multiple of 8 up to 256) instead streams ``w_read`` once through a fused tensor-core
          kernel that samples on the products (``XKERNELS_REFINE_READ=gemm|fused|auto`` forces one).
          With a filter in the call the epilogue also writes filtered rows' logits to a workspace
          (``N * D * V`` floats); a row with top-k or top-p is then read once by a grid of (row,
          slice) blocks that keep each slice's best candidates, and a block a row finds the cut from
          them and samples the kept ids. Min-p alone and the rows the candidates do not settle take
          a block a row: usually one read (the epilogue's partial results give the row's top and
          bound the cut's ids), else radix selection in two. No sort, no host sync.
    """
    return torch.ops.xkernels.refine_step.default(
        _tensor(ctx, "ctx"), _ids(prev_tokens, "prev_tokens"), _tensor(base_logits, "base_logits"),
        *_weights(weights), *_sampling_args(temperature, top_k, top_p, min_p, seed, offset, _rows(ctx)),
        _tensor(errors, "errors", optional=True), _filter_order(filter_order))


@_refine_doc
def jacobi_refine(
    ctx: torch.Tensor,
    prefix_tokens: torch.Tensor,
    base_logits: torch.Tensor,
    weights,
    *,
    max_iters: int,
    temperature: Union[float, torch.Tensor] = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
    top_k: IntParam = None,
    top_p: Param = None,
    min_p: Param = None,
    errors: Optional[torch.Tensor] = None,
    filter_order: str = "top_k_first",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Jacobi iteration of :func:`refine_step` over a batch, with a per-sequence early stop.

    The iterate starts at the drafter's own sample ``x0 = argmax(base_logits / T + G)``; every pass
    recomputes all drafted slots from the previous iterate (the same noise ``G`` each pass). A
    sequence stops after a pass that changes none of its tokens; converged sequences cost no
    further work. With ``max_iters >= D`` the result equals :func:`sequential_refine`.

    Args:
{ctx}
{prefix_tokens}
{base_logits_weights}
        max_iters: passes at most (``>= 0``; 0 returns the drafter's own sample).
{sampling}

    Returns:
        tuple: ``tokens`` int64 ``[N, D]``, ``logprobs`` float32 ``[N, D]`` (of the last pass each
        sequence ran; the drafter's own at ``max_iters = 0``) and ``iters`` int32 ``[N]`` (passes
        run).

    Raises:
{raises}

    Kernels:
        - CPU: :func:`refine_step`'s kernels, recomputing only the active sequences, and in each only
          the slots after its first change.
        - CUDA: a fixed launch sequence of at most ``D + 1`` passes (CUDA-graph capturable), the
          convergence flags on the device; blocks of converged sequences and final slots exit at
          once.
    """
    return torch.ops.xkernels.jacobi_refine.default(
        _tensor(ctx, "ctx"), _ids(prefix_tokens, "prefix_tokens"), _tensor(base_logits, "base_logits"),
        *_weights(weights), int(max_iters), *_sampling_args(temperature, top_k, top_p, min_p, seed, offset, _rows(ctx)),
        _tensor(errors, "errors", optional=True), _filter_order(filter_order))


@_refine_doc
def sequential_refine(
    ctx: torch.Tensor,
    prefix_tokens: torch.Tensor,
    base_logits: torch.Tensor,
    weights,
    *,
    temperature: Union[float, torch.Tensor] = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
    top_k: IntParam = None,
    top_p: Param = None,
    min_p: Param = None,
    errors: Optional[torch.Tensor] = None,
    filter_order: str = "top_k_first",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Left-to-right refinement, one drafted slot per step: slot ``d`` is decided from the
    decided slots before it (the DSpark Markov-head decode, which :func:`jacobi_refine` converges
    to and is measured against).

    Args:
{ctx}
{prefix_tokens}
{base_logits_weights}
{sampling}

    Returns:
        tuple: ``tokens`` int64 ``[N, D]`` and ``logprobs`` float32 ``[N, D]``.

    Raises:
{raises}

    Kernels:
        - CPU: :func:`refine_step`'s kernels, one slot per step.
        - CUDA: :func:`refine_step`'s kernels, one slot per step.
    """
    return torch.ops.xkernels.sequential_refine.default(
        _tensor(ctx, "ctx"), _ids(prefix_tokens, "prefix_tokens"), _tensor(base_logits, "base_logits"),
        *_weights(weights), *_sampling_args(temperature, top_k, top_p, min_p, seed, offset, _rows(ctx)),
        _tensor(errors, "errors", optional=True), _filter_order(filter_order))


# ---- draft trees (format: xkernels/tree.py) ----


def build_draft_tree(topk_logprobs: torch.Tensor, topk_tokens: torch.Tensor, budget: int, *,
                     mask: Optional[str] = None):
    """DDTree's best-first draft tree over per-slot candidates, built on the tensors' device.

    A node's score is the sum of its path's log-probs (float32 sums; a NaN log-prob or sum counts
    as -inf); the tree holds the ``budget`` best prefixes, popped best first, ties to the candidate
    pushed first (the next sibling, then the first child of each popped entry).

    Args:
        topk_logprobs: float32 ``[N, D, k]``, each slot's candidate log-probs sorted descending.
        topk_tokens: int64 ``[N, D, k]`` on the same device, the candidates: token ids, ``>= 0``
            and below ``2^31 - 1`` (a negative one would read as padding in the tree).
        budget: draft nodes to add (the tree has ``M = budget + 1`` nodes with the root).
        mask: ``None``, or the layout of the tree's attention mask to write as well, ``"bool"`` or
            ``"packed"`` (as :func:`tree_attention_mask`'s ``layout``), in the same op: on CUDA the
            build's own launch writes it, with no second op to dispatch.

    Returns:
        tuple: ``(tokens, parents, num_nodes, depth)``, int64 ``[N, M]``, ``[N, M]``, ``[N]``,
        ``[N, M]`` in :doc:`the tree format </concepts/formats>`. The root's token is -1 (it is the
        caller's last committed token); fewer nodes than ``M`` (a tiny ``D * k``) leave padding
        ``(-1, -1, 0)``. With ``mask``, ``(tokens, parents, num_nodes, depth, mask)``: ``mask``
        bitwise ``tree_attention_mask(parents, num_nodes=num_nodes, layout=mask)``, bool
        ``[N, M, M]`` or uint8 ``[N, M, ceil(M / 8)]`` (padding nodes see themselves only).

    Raises:
        RuntimeError: a tensor of the wrong shape, dtype or device, or a ``budget`` outside
            ``[0, 2^31 - 1)``, naming the argument; ``topk_tokens`` holding ids outside ``[0, 2^31
            - 1)`` on the CPU, and on CUDA with ``XKERNELS_CHECK=1`` (a host sync; unchecked, the
            kernel copies them as they are).
        ValueError: ``mask`` is neither ``None``, ``"bool"`` nor ``"packed"``.
        torch.OutOfMemoryError: outputs ``[N, budget + 1]`` (the mask ``[N, M, M]`` or
            ``[N, M, ceil(M / 8)]``) too large to allocate, naming ``budget``.

    Kernels:
        - CPU: sequences in parallel, the heap search of ``csrc/include/xkernels/tree.h``; with
          ``mask`` each sequence's rows right after its search (a node's row is its parent's row
          plus itself).
        - CUDA: a warp per sequence, each pop a warp-wide max over the frontier spread across its
          lanes (in shared memory; global scratch past 48 KB); with ``mask`` the warp then writes
          the rows, a lane per node walking its ancestors (``build_draft_tree_with_mask``).
    """
    if mask not in (None, "bool", "packed"):
        raise ValueError(f"mask must be None, 'bool' or 'packed', got {mask!r}")
    args = (_tensor(topk_logprobs, "topk_logprobs"), _ids(topk_tokens, "topk_tokens"), int(budget))
    if mask is None:
        return torch.ops.xkernels.build_draft_tree.default(*args)
    return torch.ops.xkernels.build_draft_tree_with_mask.default(*args, mask == "packed")


def tree_attention_mask(parents: torch.Tensor, *, num_nodes: Optional[torch.Tensor] = None,
                        layout: str = "bool") -> torch.Tensor:
    """Node ``i`` may attend to node ``j`` iff ``j`` is ``i`` or an ancestor of ``i``.

    Args:
        parents: int64 ``[N, M]``, the tree (:doc:`/concepts/formats`).
        num_nodes: optional int64 ``[N]``; nodes at or past it are padding. Padding nodes see themselves only.
        layout: ``"bool"``, or ``"packed"``: bit ``j % 8`` of byte ``j // 8`` (little-endian, the
            layout of FlashInfer's and SGLang's custom masks).

    Returns:
        Tensor: bool ``[N, M, M]``, or uint8 ``[N, M, ceil(M / 8)]`` packed, on the device of
        ``parents``.

    Raises:
        RuntimeError: a tensor of the wrong shape, dtype or device, or (on the CPU, or on CUDA with
            ``XKERNELS_CHECK=1``) an invalid tree: ``parents[:, 0] != -1``, a parent not below its
            node, ``num_nodes`` outside ``[1, M]``; each message names the argument.
        ValueError: ``layout`` is neither ``"bool"`` nor ``"packed"``.

    Kernels:
        - CPU: a node's row is its parent's row plus itself.
        - CUDA: a block per sequence, a thread per node walks its ancestors.
    """
    if layout not in ("bool", "packed"):
        raise ValueError(f"layout must be 'bool' or 'packed', got {layout!r}")
    return torch.ops.xkernels.tree_attention_mask.default(
        _ids(parents, "parents"), _tensor(num_nodes, "num_nodes", optional=True), layout == "packed")


def tree_positions(parents: torch.Tensor, *, num_nodes: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Each node's depth (root 0, padding 0): its rotary position after the prefix.

    Args:
        parents: int64 ``[N, M]``, the tree (:doc:`/concepts/formats`).
        num_nodes: optional int64 ``[N]``; nodes at or past it are padding.

    Returns:
        Tensor: int64 ``[N, M]`` on the device of ``parents``.

    Raises:
        RuntimeError: a tensor of the wrong shape, dtype or device, or (on the CPU, or on CUDA with
            ``XKERNELS_CHECK=1``) an invalid tree: ``parents[:, 0] != -1``, a parent not below its
            node, ``num_nodes`` outside ``[1, M]``; each message names the argument.

    Kernels:
        - CPU: a node's depth is its parent's plus one.
        - CUDA: a block per sequence, a thread per node walks its ancestors.
    """
    return torch.ops.xkernels.tree_positions.default(_ids(parents, "parents"),
                                                    _tensor(num_nodes, "num_nodes", optional=True))


def tree_verify(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    draft_probs: Optional[torch.Tensor] = None,
    without_replacement: bool = False,
    temperature: Union[float, torch.Tensor] = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
    num_nodes: Optional[torch.Tensor] = None,
    top_k: IntParam = None,
    top_p: Param = None,
    min_p: Param = None,
    errors: Optional[torch.Tensor] = None,
    filter_order: str = "top_k_first",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless verification of a draft tree in one pass over the rows it visits.

    Each sequence ``n`` follows the filtered distribution p' of each row (its temperature, then
    ``top_k``, ``top_p`` and ``min_p``, as :func:`chain_verify_ragged` states them; ties at a cut go
    to the lower id). A greedy row (temperature 0, or a row without a softmax) walks to the first
    child whose token is the row's argmax. Otherwise the emitted tokens follow p' exactly:
    deterministic children (without ``draft_probs``: ``r = p'``, child ``x`` accepted with
    probability ``r(x) / sum(r)``, else ``r(x) = 0``, so a duplicate cannot count twice), or children
    drawn from ``draft_probs`` (SpecInfer / SpecTr recursive rejection, ``r <- normalize(max(r - q,
    0))`` from ``r = p'``, optionally without replacement); a correction or bonus token is drawn from
    the last ``r`` (from p' where nothing was rejected). The rules are in
    ``csrc/include/xkernels/tree.h``. Node ``i`` owns slot ``i`` of the sequence's stream: child
    ``c``'s acceptance coin is slot ``c``'s, the sample at node ``i`` uses slot ``i``'s Gumbel noise.

    Args:
        tokens: int64 ``[N, M]``, each node's token (:doc:`/concepts/formats`); tokens of real
            nodes but the root lie in ``[0, V)``.
        parents: int64 ``[N, M]``, the tree.
        target_logits: float32, bfloat16 or float16 ``[N, M, V]``: row ``i`` holds the target's
            next-token logits after node ``i``'s path.
        draft_probs: optional float32, bfloat16 or float16 ``[N, M, V]`` (read in its dtype, no
            float32 copy): row ``i`` is the
            distribution the children of node ``i`` were drawn from (i.i.d., or ``without_replacement``); entries >= 0, each row
            divided by its sum (a row summing to 0 proposes nothing: its children are rejected).
            Without it the children are deterministic proposals (top-k, a best-first tree).
        without_replacement: the children of a node were drawn without replacement from its row.
        temperature: a float ``T >= 0``, finite, or a float32 ``[N]`` tensor (a temperature per
            sequence; rows at 0 are greedy in the same call). 0 is greedy.
        seed, offset: ints (64 bits) or one-element int64 tensors on the logits' device, read on
            the device (a captured CUDA graph reads them at replay): one stream for the batch,
            keyed by the sequence's row (:doc:`/concepts/random_streams`); or int64 ``[N]`` tensors:
            sequence ``n``'s node ``i`` uses slot ``offset[n] + i`` of the stream of ``seed[n]``
            alone, so it gets the same tokens at any row of any batch. A call reads slots
            ``offset[n]`` to ``offset[n] + M - 1``: the next call's offset must advance by at least
            ``M`` (:func:`xkernels.offset_advance`; e.g. ``offset = step * M``): reusing a slot silently
            correlates the calls' noise. A one-element 1-D tensor with ``N > 1`` raises.
        num_nodes: optional int64 ``[N]``; nodes at or past it are padding.
        top_k: None, an int or an int32/int64 ``[N]`` tensor; 0 is off.
        top_p: None, a float or a float32 ``[N]`` tensor in (0, 1]; 1 is off.
        min_p: None, a float or a float32 ``[N]`` tensor in [0, 1]; 0 is off.
        filter_order: ``"top_k_first"`` (the default) applies top-k, top-p, then min-p;
            ``"min_p_first"`` (vLLM's order) applies min-p, then top-k, then top-p renormalised over
            what both keep. The two differ only where min-p and top-p are both on.
        errors: optional int32 ``[N]``, a word a sequence, contiguous, on the logits' device: the
            asynchronous error flag. Each sequence's invalid per-sequence values are OR-ed into its
            word as :class:`xkernels.errors.SamplingError` bits (1 ``temperature`` NaN, infinite or
            negative; 2 ``top_k < 0``; 4 ``top_p`` NaN or outside (0, 1]; 8 ``min_p`` NaN or
            outside [0, 1]) on the device, with no host sync (CUDA-graph capturable), instead of
            raising, on the CPU as on CUDA (with ``XKERNELS_CHECK=1`` too). They are read as off as
            without it (a temperature as greedy, ``top_k`` 0, ``top_p`` 1, ``min_p`` 0): the
            results are the same. Clamped, not flagged: an int64 ``top_k`` past int32 (it keeps
            every id, as any ``top_k >= V``) and a temperature whose float32 reciprocal overflows
            (greedy). The tree's values (``parents``, ``num_nodes``, ``tokens``) are not flagged.
            Zero it before the call (bits accumulate); read it when the step already syncs. On
            CUDA it costs one small extra launch (a thread a sequence), made only with ``errors``
            and a per-sequence tensor.

    Returns:
        tuple: ``(accept_len [N], path [N, M], out_tokens [N, M])``, int64: the accepted drafts'
        count, the accepted nodes from the root (-1 padded), and the accepted tokens then the
        correction or bonus token (-1 padded). Sequence ``n`` emits ``accept_len[n] + 1`` tokens.

    Raises:
        RuntimeError: a tensor of the wrong shape, dtype or device; a negative or NaN temperature,
            ``top_p`` outside (0, 1], ``min_p`` outside [0, 1], ``top_k < 0``, per-row tensors of
            another length, dtype or device; or (on the CPU, or on CUDA with ``XKERNELS_CHECK=1``)
            an invalid tree: ``parents[:, 0] != -1``, a parent not below its node, ``num_nodes``
            outside ``[1, M]``; each message names the argument. A token outside ``[0, V)`` raises
            on the CPU; on CUDA such a token is never accepted and an invalid parent ends a walk
            (memory-safe on any values), and invalid per-row values read as off (a temperature as
            greedy), unless ``XKERNELS_CHECK=1``. With ``errors`` the per-sequence values are
            flagged there, never raised, on any device (scalars still raise: they are checked on
            the host without a sync).
        TypeError: an argument that is neither a tensor nor a DLPack array, or a scalar of the
            wrong kind.
        ValueError: a ``seed`` or ``offset`` int that does not fit in 64 bits, or a ``filter_order``
            other than ``"top_k_first"`` or ``"min_p_first"``.

    Kernels:
        - CPU: sequences in parallel, reading only the visited rows; a filtered row's cut by a
          streaming top-k selection or mass bands (as :func:`chain_verify_ragged`), never a sort.
        - CUDA: a block per sequence walks the tree, reading only the visited rows (without
          filters, on sm_90+, a cluster of two blocks, each reading half of every pass over a
          row); the residual stays on the device (``draft_probs`` read in its dtype, staged by
          ``cp.async``); with filters, the walk finds the cut of each row it visits from the
          candidates its statistics pass keeps (each warp's best 64 ids), with no other pass over
          the row where they settle it (with ``draft_probs``, q is read once more for its sum at a
          node with children, and the residual sums and the stop row's draw then take the kept ids
          alone, unless some q is below 0); top-p alone settles where its target lies clear of the
          bound of the row's total that the pass's float sums give; the rows the candidates do not
          settle by radix selection (no sort: usually one more pass over the row); never syncs
          the host.
    """
    return torch.ops.xkernels.tree_verify.default(
        _ids(tokens, "tokens"), _ids(parents, "parents"), _tensor(target_logits, "target_logits"),
        _tensor(draft_probs, "draft_probs", optional=True), bool(without_replacement),
        _tensor(num_nodes, "num_nodes", optional=True),
        *_sampling_args(temperature, top_k, top_p, min_p, seed, offset, _rows(tokens)),
        _tensor(errors, "errors", optional=True), _filter_order(filter_order))


def compact_kv_(cache: torch.Tensor, path: torch.Tensor, accept_len: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Moves the root's and the accepted nodes' cache entries behind the prefix, in place.

    Entries ``prefix_len + path[n, j]`` move to ``prefix_len + j`` for ``j = 0..accept_len[n]``
    (the outputs of :func:`tree_verify`), now contiguous behind the prefix.

    Args:
        cache: ``[N, H, L, d]`` of any dtype, contiguous in its last dimension (a KV buffer), with
            no two elements sharing memory (an expanded, stride-0 view raises, as torch's in-place
            ops refuse it: the moves would overwrite each other).
        path: int64 ``[N, M]`` on the cache's device, from :func:`tree_verify`.
        accept_len: int64 ``[N]`` on the cache's device.
        prefix_len: the cached prefix's length, in ``[0, L)``.

    Returns:
        Tensor: ``cache``.

    Raises:
        RuntimeError: a tensor of the wrong shape or device, an overlapping ``cache``, ``prefix_len``
            outside ``[0, L)``, or (on the CPU, or on CUDA with ``XKERNELS_CHECK=1``) a path that
            leaves the cache; on CUDA otherwise a bad path stops the moves.

    Kernels:
        - CPU: a copy per kept entry.
        - CUDA: a block per sequence and head.
    """
    torch.ops.xkernels.compact_kv_.default(cache, _tensor(path, "path"), _tensor(accept_len, "accept_len"),
                                           int(prefix_len))
    return cache


# ---- diffusion LLMs ----


def dllm_step(
    logits: torch.Tensor,
    block_tokens: torch.Tensor,
    mask_id: int,
    *,
    num_unmask: int = 1,
    threshold: Optional[float] = None,
    temperature: Union[float, torch.Tensor] = 0.0,
    top_k: IntParam = None,
    top_p: Param = None,
    min_p: Param = None,
    seed: Seed = 0,
    offset: Seed = 0,
    errors: Optional[torch.Tensor] = None,
    filter_order: str = "top_k_first",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of a masked diffusion LM's block decoding: LLaDA's low-confidence unmasking.

    At each masked position of sequence ``n``, ``x0`` is drawn from the step distribution p' of
    the sequence's parameters: ``softmax(logits / T)`` with the mask token's logit at -inf (it is
    never picked, so every step unmasks for real), filtered by ``top_k``, ``top_p`` and ``min_p``
    as :func:`chain_verify_ragged` states, renormalised (Gumbel-max: ``x0 = argmax(filtered(logits
    / T) + G)``; the argmax at ``T = 0``). ``confidence = softmax(logits)[x0]`` (the untempered,
    unfiltered softmax, as LLaDA and Fast-dLLM score it). The ``num_unmask`` most confident masked
    positions are unmasked (ties to the lower position), or with ``threshold`` every one above it
    and at least the best.

    Args:
        logits: float32, bfloat16 or float16 ``[N, L, V]``, the model's logits at the block's ``L``
            positions.
        block_tokens: int64 ``[N, L]`` on the same device, the block so far (``mask_id`` where still
            masked, ids in ``[0, V)`` elsewhere).
        mask_id: the mask token's id; it may lie outside ``[0, V)`` (a head without the mask
            token's logit: then no logit is excluded).
        num_unmask: how many masked positions to unmask (all if fewer are masked).
        threshold: instead, unmask every masked position whose confidence exceeds it, and at
            least the most confident one (Fast-dLLM's parallel decoding).
        temperature: a float ``T >= 0``, or a float32 ``[N]`` tensor (a temperature per
            sequence); sequences at 0 are greedy, in the same launch.
        top_k: None, an int or an int32/int64 ``[N]`` tensor; 0 is off.
        top_p: None, a float or a float32 ``[N]`` tensor in (0, 1]; 1 is off.
        min_p: None, a float or a float32 ``[N]`` tensor in [0, 1]; 0 is off.
        filter_order: ``"top_k_first"`` (the default) applies top-k, top-p, then min-p;
            ``"min_p_first"`` (vLLM's order) applies min-p, then top-k, then top-p renormalised over
            what both keep. The two differ only where min-p and top-p are both on.
        seed, offset: the Philox stream (:doc:`/concepts/random_streams`). Ints (64 bits) or
            one-element int64 tensors, read on the device (a captured CUDA graph reads them at
            replay): one stream for the batch, keyed by (sequence row, position, id); a loop passes
            an offset fixed by (block, step). Or int64 ``[N]`` tensors (a stream per request):
            sequence ``n``'s noise at position ``l`` is keyed by ``(seed[n], offset[n] + l)``
            alone, so it is the same at any row of any batch; the next call must advance
            ``offset[n]`` by at least ``L`` (:func:`xkernels.offset_advance`), as :func:`spiffy_accept`
            advances it between its steps: reusing a slot silently correlates the calls' noise. A
            one-element 1-D tensor with ``N > 1`` raises.
        errors: optional int32 ``[N]``, a word a sequence (as the per-sequence parameters),
            contiguous, on the logits' device: the asynchronous error flag. Each sequence's invalid
            per-sequence values are OR-ed into its word as :class:`xkernels.errors.SamplingError`
            bits (1 ``temperature`` NaN, infinite or negative; 2 ``top_k < 0``; 4 ``top_p`` NaN or
            outside (0, 1]; 8 ``min_p`` NaN or outside [0, 1]) on the device, with no host sync
            (CUDA-graph capturable), instead of raising, on the CPU as on CUDA (with
            ``XKERNELS_CHECK=1`` too). They are read as off as without it (a temperature as greedy,
            ``top_k`` 0, ``top_p`` 1, ``min_p`` 0): the results are the same. Clamped, not flagged:
            an int64 ``top_k`` past int32 (it keeps every id, as any ``top_k >= V``) and a
            temperature whose float32 reciprocal overflows (greedy). Zero it before the call (bits
            accumulate); read it when the step already syncs. On CUDA it costs one small extra
            launch (a thread a sequence), made only with ``errors`` and a per-sequence tensor.

    Returns:
        tuple: ``(new_block, positions, tokens, confidence)``: the block with the chosen positions
        unmasked, int64 ``[N, L]``; the chosen positions ascending and their tokens, int64
        ``[N, L]``, -1 padded; and float32 ``[N, L]`` confidences (-inf at unmasked positions, NaN
        for a row without a softmax, which ranks last).

    Raises:
        RuntimeError: a tensor of the wrong shape, dtype or device, ``num_unmask < 1``, a negative
            or NaN temperature, ``top_p`` outside (0, 1], ``min_p`` outside [0, 1], ``top_k < 0``,
            per-sequence tensors of another length, dtype or device, naming the argument;
            ``block_tokens`` holding ids outside ``[0, V)`` other than ``mask_id`` on the CPU, and
            on CUDA with ``XKERNELS_CHECK=1`` (a host sync; unchecked, the kernels only compare and
            copy them, and invalid per-sequence values read as off, a temperature as greedy). With
            ``errors`` the per-sequence values are flagged there, never raised, on any device
            (scalars still raise: they are checked on the host without a sync).
        ValueError: a ``filter_order`` other than ``"top_k_first"`` or ``"min_p_first"``.

    Kernels:
        - CPU: masked rows in parallel (a filtered row's cut as :func:`chain_verify_ragged`'s CPU
          kernel finds it, no sort), then the selection per sequence (the rule shared in
          ``csrc/include/xkernels/dllm.h``).
        - CUDA: with filters, the masked rows that sample with one: a block a row reads it once for
          its best candidates and raw statistics (the scan), a block a row picks the token from the
          candidates, and only a row they do not settle (top-k past them, ties at the cut, flat
          rows) takes the radix path (two more reads: the cut's radix selection, then the draw);
          the other masked rows in slices over the grid, merged by a warp a row; then a thread per
          sequence selects. No host sync, per-sequence tensors read on the device.
    """
    return torch.ops.xkernels.dllm_step.default(
        _tensor(logits, "logits"), _ids(block_tokens, "block_tokens"), int(mask_id), int(num_unmask),
        None if threshold is None else _scalar(threshold, "threshold"),
        *_sampling_args(temperature, top_k, top_p, min_p, seed, offset, _rows(logits)),
        _tensor(errors, "errors", optional=True), _filter_order(filter_order))


# ---- Spiffy ----


def spiffy_materialize(
    logits: torch.Tensor,
    block_tokens: torch.Tensor,
    mask_id: int,
    graph,
    *,
    keep: int,
    temperature: Union[float, torch.Tensor] = 0.0,
    top_k: IntParam = None,
    top_p: Param = None,
    min_p: Param = None,
    errors: Optional[torch.Tensor] = None,
    filter_order: str = "top_k_first",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fills a Spiffy draft graph with concrete drafts and keeps the most promising.

    Node ranks ``(i, j)`` become positions and tokens (:doc:`/concepts/formats`): position rank
    ``i`` orders the masked positions by the untempered top-1 probability (higher first, NaN last,
    ties to the lower position), vocabulary rank ``j`` orders a position's tokens by logit (ties to
    the lower id; the mask token counts as -inf). A node's local score is the mean log-probability
    of its tokens; a usable node's score is the mean of it and its best usable child's (the
    geometric mean of the probabilities). Nodes are kept best first from a frontier that starts at
    the root's children, so every kept node is a child of the root or of a kept node.

    Args:
        logits: float32, bfloat16 or float16 ``[N, L, V]``, the step distribution at the root (the
            block as it is).
        block_tokens: int64 ``[N, L]``, the block (``mask_id`` where masked, ids in ``[0, V)``
            elsewhere).
        mask_id: the mask token's id (as in :func:`dllm_step`, it may lie outside ``[0, V)``).
        graph: an :class:`xkernels.spiffy.DraftGraph` on the logits' device.
        keep: how many drafts to keep (at most the graph's nodes besides the root).
        temperature, top_k, top_p, min_p, filter_order: the step distribution p' the scores use, as
            :func:`dllm_step` takes them (scalars or ``[N]`` tensors): ``softmax(logits / T)``
            filtered (a token the filters drop has probability 0, so a node holding it is
            unusable); ``softmax(logits)``, unfiltered, at ``T = 0``.
        errors: optional int32 ``[N]``, a word a sequence: the asynchronous error flag, as
            :func:`dllm_step` takes it (the invalid per-sequence values flagged and read as off
            instead of raised; the results unchanged; one small extra launch on CUDA).

    Returns:
        tuple: ``(draft_blocks [N, keep, L], node_ids [N, keep], scores [N, keep])``, int64, int64
        and float32 ``exp(score)``, in the order kept; a slot left over when the frontier runs out
        holds the block itself, node -1 and score 0.

    Raises:
        RuntimeError: a tensor of the wrong shape, dtype or device, bad sampling parameters (as
            :func:`dllm_step`), or (on the CPU) graph values out of range (ranks beyond the block
            or past rank 8, ``keep`` beyond the graph) or ``block_tokens`` ids outside ``[0, V)`` other than ``mask_id``, naming the argument; the
            CUDA kernels skip out-of-range graph values instead and copy the block's ids as they are
            (both are checked there with ``XKERNELS_CHECK=1``).
        ValueError: a ``filter_order`` other than ``"top_k_first"`` or ``"min_p_first"``.

    Kernels:
        - CPU: rows in parallel (statistics and top 8 tokens), then ranking, scores and selection per
          sequence (``csrc/include/xkernels/spiffy.h``).
        - CUDA: every masked row in slices over the grid (statistics, tempered sum, top 8 tokens);
          with filters, then the filtered rows' scan (a block a slice keeps its best candidates) and
          a select on those candidates (a block a row: the cut and the kept ids' tempered sum), and
          the radix path only for a row the candidates do not settle; then a block per sequence:
          warps merge the rows, then one block-wide argmax per kept node.
    """
    return torch.ops.xkernels.spiffy_materialize.default(
        _tensor(logits, "logits"), _ids(block_tokens, "block_tokens"), int(mask_id),
        _tensor(graph.ranks, "graph.ranks"), _tensor(graph.child_ptr, "graph.child_ptr"),
        _tensor(graph.children, "graph.children"), int(keep),
        *_sampling_args(temperature, top_k, top_p, min_p, 0, 0)[:8], _tensor(errors, "errors", optional=True),
        _filter_order(filter_order))


def spiffy_accept(
    root_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_blocks: torch.Tensor,
    node_ids: torch.Tensor,
    block_tokens: torch.Tensor,
    mask_id: int,
    *,
    num_unmask: int = 1,
    threshold: Optional[float] = None,
    temperature: Union[float, torch.Tensor] = 0.0,
    top_k: IntParam = None,
    top_p: Param = None,
    min_p: Param = None,
    seed: Seed = 0,
    offset: Seed = 0,
    errors: Optional[torch.Tensor] = None,
    filter_order: str = "top_k_first",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Spiffy's verification: commits every step that one-step-per-call decoding would take and
    whose logits the forward already computed.

    Takes :func:`dllm_step`'s step, with the same parameters, from the root's logits; while the
    new block equals a kept draft, takes the next step from that draft's logits, computed in the
    same forward for exactly that block. Lossless at any temperature and filter: each committed
    step is :func:`dllm_step`'s (x0 drawn from its filtered p') on the true logits of the block
    reached, with the stream :func:`dllm_step` would get at that step.

    Args:
        root_logits: float32, bfloat16 or float16 ``[N, L, V]``, the logits of the block as it is.
        draft_logits: ``[N, K, L, V]`` of the same dtype, the logits of each kept draft's block.
        draft_blocks: int64 ``[N, K, L]``, the drafts (:func:`spiffy_materialize`).
        node_ids: int64 ``[N, K]``; a draft with a negative id is unused.
        block_tokens: int64 ``[N, L]``, the block (``mask_id`` where masked, ids in ``[0, V)``
            elsewhere).
        mask_id: the mask token's id (as in :func:`dllm_step`, it may lie outside ``[0, V)``).
        num_unmask: how many masked positions to unmask (all if fewer are masked).
        threshold: instead, unmask every masked position whose confidence exceeds it, and at
            least the most confident one (Fast-dLLM's parallel decoding).
        temperature, top_k, top_p, min_p, filter_order: as :func:`dllm_step` takes them (scalars or
            ``[N]`` tensors).
        seed, offset: the stream, in either of :func:`dllm_step`'s forms. The ``d``-th step
            (from 0) draws what :func:`dllm_step` draws at offset ``offset + d`` in the scalar form,
            and at ``offset[n] + d * L`` per request; so the next call passes ``offset +
            num_steps`` (scalar form; a loop usually passes an offset fixed by (block, step) and
            counts the steps taken) or ``offset + num_steps * L`` per request; a call reads at most
            :func:`xkernels.offset_advance` of them (``min(K + 1, L) * L`` per request). Reusing a
            slot silently correlates the calls' noise.
        errors: optional int32 ``[N]``, a word a sequence: the asynchronous error flag, as
            :func:`dllm_step` takes it (the invalid per-sequence values flagged and read as off
            instead of raised; the results unchanged; one small extra launch on CUDA).

    Returns:
        tuple: ``(num_steps [N], positions [N, L], tokens [N, L], new_block [N, L], continue_from
        [N])``, int64: the steps taken, the unmasked positions and their tokens in the order
        committed (-1 padded), the new block, and the draft whose logits gave the last step (-1:
        the root).

    Raises:
        RuntimeError: a tensor of the wrong shape, dtype or device, ``num_unmask < 1``, or bad
            sampling parameters (as :func:`dllm_step`), naming the argument; ``block_tokens`` as in
            :func:`dllm_step` (draft blocks and node ids are only compared: any values are safe).
        ValueError: a ``filter_order`` other than ``"top_k_first"`` or ``"min_p_first"``.

    Kernels:
        - CPU: sequences in parallel, each step's rows with :func:`dllm_step`'s row rule.
        - CUDA: a prepare kernel first picks, over the whole GPU, the root's masked rows and (where
          the sequences are few) each kept draft's at the step the walk would reach it at; then a
          thread block cluster of 8 blocks per sequence (sm_90+; a block below) walks the steps: a
          step not prepared has its masked rows dealt out a block a row (with filters, the row's
          cut found in its own reads, as :func:`dllm_step`'s radix path), then warp 0 of block 0
          selects, matches the new block against the kept drafts and plans the next step; two
          cluster barriers a step.
    """
    return torch.ops.xkernels.spiffy_accept.default(
        _tensor(root_logits, "root_logits"), _tensor(draft_logits, "draft_logits"),
        _ids(draft_blocks, "draft_blocks"), _tensor(node_ids, "node_ids"), _ids(block_tokens, "block_tokens"),
        int(mask_id), int(num_unmask), None if threshold is None else _scalar(threshold, "threshold"),
        *_sampling_args(temperature, top_k, top_p, min_p, seed, offset, _rows(root_logits)),
        _tensor(errors, "errors", optional=True), _filter_order(filter_order))


def spiffy_attention_mask(
    num_drafts: int,
    block_size: int,
    prefix_len,
    *,
    max_prefix_len: Optional[int] = None,
    layout: str = "bool",
    device=None,
) -> torch.Tensor:
    """The attention mask of one forward over ``[prefix, real block, num_drafts draft copies]``.

    Each copy is ``block_size`` tokens at the block's positions. Every query sees the prefix and
    its own copy of the block (bidirectionally), never another copy: the real block never sees the
    drafts and a draft never sees the real block.

    Args:
        num_drafts: the draft copies after the real block.
        block_size: the block's length.
        prefix_len: an int (one sequence), or int64 ``[N]`` per sequence (keys past a sequence's
            prefix, up to ``max_prefix_len``, are padding).
        max_prefix_len: the prefix keys of every row; needed with a ``prefix_len`` tensor (default:
            ``prefix_len``).
        layout: ``"bool"``, or ``"packed"`` uint8 rows of ``ceil(K / 8)`` bytes, bit ``k % 8`` of
            byte ``k // 8`` (as :func:`tree_attention_mask`).
        device: the mask's device for an int ``prefix_len`` (a tensor's device otherwise).

    Returns:
        Tensor: bool ``[Q, K]`` for an int ``prefix_len`` (``[N, Q, K]`` for a tensor), ``Q = (1 +
        num_drafts) * block_size``, ``K = max_prefix_len + Q``; or the packed bytes.

    Raises:
        ValueError: a bad ``layout``, an int ``prefix_len`` outside ``[0, 2^31)``, or a
            ``prefix_len`` tensor without ``max_prefix_len``.
        RuntimeError: a ``prefix_len`` tensor of the wrong shape or dtype, sizes outside ``[0,
            2^31)`` (``Q`` and ``K`` too), naming the argument.
        torch.OutOfMemoryError: a mask too large to allocate, naming the sizes.

    Kernels:
        - CPU: two key ranges per row (memset).
        - CUDA: a thread per output byte.
    """
    if layout not in ("bool", "packed"):
        raise ValueError(f"layout must be 'bool' or 'packed', got {layout!r}")
    single = not (isinstance(prefix_len, torch.Tensor) or hasattr(prefix_len, "__dlpack__"))
    if single:
        prefix_len = _scalar(prefix_len, "prefix_len", int)
        if not 0 <= prefix_len < 2**31:  # else max_prefix_len, taken from it, would be blamed
            raise ValueError(f"prefix_len must lie in [0, 2^31), got {prefix_len}")
    # A fill, not a copy of host data: the int form stays capturable in a CUDA graph.
    lens = (torch.full((1,), prefix_len, dtype=torch.int64, device=device) if single
            else _tensor(prefix_len, "prefix_len"))
    if max_prefix_len is None:
        if not single:
            raise ValueError("spiffy_attention_mask: give max_prefix_len with a prefix_len tensor")
        max_prefix_len = prefix_len
    mask = torch.ops.xkernels.spiffy_attention_mask.default(lens, int(num_drafts), int(block_size),
                                                            int(max_prefix_len), layout == "packed")
    return mask[0] if single else mask


# ---- vocabulary-parallel sampling (xkernels/distributed.py) ----


def shard_row_stats(
    logits: torch.Tensor,
    vocab_start: int,
    *,
    rows: Optional[torch.Tensor] = None,
    exclude: Optional[torch.Tensor] = None,
    draft_probs: Optional[torch.Tensor] = None,
    residual_stats: Optional[torch.Tensor] = None,
    ignore_id: int = -1,
    sample: bool = False,
    raw_stats: bool = False,
    temperature: Union[float, torch.Tensor] = 0.0,
    seed: Seed = 0,
    offset: Seed = 0,
    cut_value: Optional[torch.Tensor] = None,
    cut_id: Optional[torch.Tensor] = None,
    errors: Optional[torch.Tensor] = None,
):
    """The per-shard pass of vocabulary-parallel verification and sampling (:doc:`/guides/tensor_parallel`).

    For each selected row, with ``a = logits / T`` (the logits at ``T = 0``; ``T`` the sequence's
    temperature), ``ignore_id``'s logit counted as -inf, and, with a cut, every id ranked after the
    row's cut (``(cut_value, cut_id)``: ids rank by ``a``, a higher one first, ties to the lower id)
    counted as -inf too:

    - ``row_max``, ``row_sum = sum exp(s - row_max)`` (0 when ``row_max`` is not finite) and
      ``top_id`` (torch.argmax's global id: NaN first, ties to the lowest id; -1 for an empty
      shard) of ``s = a``, or of the raw logits with ``raw_stats``;
    - with ``sample``: the Gumbel-max ``(pick_score, pick_id)`` over the shard of ``log w + G``,
      ``G`` the package's noise of (sequence ``n``, position = the row, global id) or, with
      per-request streams, of (``seed[n]``, ``offset[n] +`` the row, global id), ``w = exp(a)``
      but the ids of ``exclude``; with ``draft_probs`` and ``residual_stats``, rows below ``Q``
      draw from the residual ``w = max(softmax(a) - q, 0)``. ``pick_logit`` is ``s`` at the pick.
      No pick: ``-inf, -1, -inf``. On a row without a softmax the pick is meaningless (the ops use
      the argmax there).

    The maximum over shards of ``(pick_score, -pick_id)`` is the unsharded ops' token, and the
    shards' ``(row_max, row_sum)`` combine by log-sum-exp. With the whole vocabulary's top-k / top-p
    / min-p cut of each row (:mod:`xkernels.distributed` finds it from the shards), the statistics
    and picks are those of the filtered distribution.

    Args:
        logits: float32, bfloat16 or float16 ``[N, R, V_local]``, the global ids ``[vocab_start,
            vocab_start + V_local)`` of one vocabulary shard.
        vocab_start: the shard's first global id.
        rows: optional int64 ``[N, S]``, the rows to read (default every row); an index outside
            ``[0, R)`` raises on the CPU, and on CUDA, unless ``XKERNELS_CHECK=1``, gets the empty
            results ``-inf, 0, -1`` without a host read.
        exclude: optional int64 ``[N, S, E]``, global ids a pick may not take (-1 padded).
        draft_probs: optional float32 ``[N, Q, V_local]``, the drafts' distributions of the shard.
        residual_stats: float32 ``[N, S, 2]``, the global max and sum of ``a`` (with ``draft_probs``).
        ignore_id: a global id whose logit counts as -inf (-1: none).
        sample: also draw the Gumbel-max pick (needs ``T > 0``; with a per-sequence temperature the
            rows at 0 get no pick).
        raw_stats: the statistics of the raw logits instead of ``a`` (the cut then acts on the pick only).
        temperature: ``T >= 0``, finite: a float, or a float32 ``[N]`` tensor, a temperature per
            sequence (rows at 0 are greedy: their statistics are of the logits, without the cut).
        seed, offset: the Philox stream (:doc:`/concepts/random_streams`): ints (64 bits), or
            one-element int64 tensors on the logits' device, read on the device (a captured CUDA
            graph reads them at replay); or int64 ``[N]`` tensors, a stream per request that does not
            depend on the batch (row ``r`` of sequence ``n`` draws the noise of ``(seed[n], offset[n] +
            r)``, as :func:`chain_verify_ragged` draws slot ``r``).
        cut_value, cut_id: optional float32 and int64 (or int32) ``[N, S]``, together: each selected
            row keeps the ids ``x`` with ``a_x > cut_value`` or ``a_x == cut_value`` and ``x <= cut_id``
            (global ids; ``sampling_params.h`` ``filter_keeps``).
        errors: optional int32 ``[N]``, a word a sequence, contiguous, on the logits' device: the
            asynchronous error flag. A per-sequence ``temperature`` that is NaN, infinite or
            negative ORs :class:`xkernels.errors.SamplingError` ``TEMPERATURE`` (1) into its
            sequence's word on the device, with no host sync (CUDA-graph capturable), instead of
            raising, on the CPU as on CUDA (with ``XKERNELS_CHECK=1`` too), and is read as greedy,
            as without it: the results are the same. Clamped, not flagged: a temperature whose
            float32 reciprocal overflows (greedy). The cut's values are not flagged. Zero it before
            the call (bits accumulate). On CUDA it costs one small extra launch (a thread a
            sequence), made only with ``errors`` and a ``temperature`` tensor.

    Returns:
        tuple: ``(row_max, row_sum, top_id, pick_score, pick_id, pick_logit)``, each ``[N, S]``
        (float32, float32, int64, float32, int64, float32).

    Raises:
        RuntimeError: a tensor of the wrong shape, dtype or device, ``sample`` at ``T = 0``, a
            missing ``residual_stats``, a ``cut_value`` without ``cut_id``, or a bad ``temperature``
            (per-row values checked on the CPU, and on CUDA with ``XKERNELS_CHECK=1``; with
            ``errors``, flagged there instead, on any device), naming the argument.
        ValueError: a ``seed`` or ``offset`` int that does not fit in 64 bits.
        TypeError: an argument that is neither a tensor nor a DLPack array.

    Kernels:
        - CPU: the selected rows in parallel, each a scaled copy of the shard's row (aligned to a
          multiple of 4 global ids, so the Philox draws are the global ids' draws) with the ids past
          the cut at -inf, its statistics, then the Gumbel-max pick.
        - CUDA: one launch, a block per selected row: the row's softmax statistics, then the
          Gumbel-max, both passes by 16-byte loads (row_reduce.cuh's reader), each id scored with
          its global id's Philox word only if its weight plus the largest noise can reach the best
          score so far; no host reads.
    """
    temperature, temperature_tensor, *_, seed_int, seed_tensor, offset_int, offset_tensor = _sampling_args(
        temperature, None, None, None, seed, offset, _rows(logits))
    return torch.ops.xkernels.shard_row_stats.default(
        _tensor(logits, "logits"), int(vocab_start), _tensor(rows, "rows", optional=True),
        _tensor(exclude, "exclude", optional=True), _tensor(draft_probs, "draft_probs", optional=True),
        _tensor(residual_stats, "residual_stats", optional=True), int(ignore_id), bool(sample), bool(raw_stats),
        temperature, seed_int, offset_int, seed_tensor, offset_tensor, temperature_tensor,
        _tensor(cut_value, "cut_value", optional=True), _tensor(cut_id, "cut_id", optional=True),
        _tensor(errors, "errors", optional=True))


def shard_cut_histogram(
    logits: torch.Tensor,
    scale: torch.Tensor,
    prefix: torch.Tensor,
    shift: int,
    vocab_start: int,
    *,
    ignore_id: int = -1,
    row_max: Optional[torch.Tensor] = None,
    keep_value: Optional[torch.Tensor] = None,
    keep_id: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One round of the radix select that finds a sharded row's whole-vocabulary top-k or top-p cut
    (:func:`xkernels.distributed.filter_cuts` runs the rounds and all-reduces the histograms).

    Each id of row ``r`` has a scaled logit ``a = logits[r] * scale[r]`` (``ignore_id``'s at -inf)
    and a 63-bit key, ascending in the ranking (a higher ``a`` first, ties to the lower global id):
    the 32 order-preserving bits of ``a`` (``-0`` as ``+0``), complemented, above the 31-bit global
    id. The candidates are the keys whose bits above ``shift + 8`` equal ``prefix[r]`` (every key
    at ``shift = 56``); each adds its weight to the bucket of its key's 8 bits at ``shift``. A
    weight is 1 for an id whose ``a`` is above -inf, or with ``row_max`` the mass ``exp(a -
    row_max[r])`` clamped to ``[0, 1]``; with ``keep_value`` / ``keep_id`` only the ids that cut keeps
    (``a > keep_value``, or equal at a global id ``<= keep_id``) weigh, and a NaN never does.

    Weights are summed exactly, as 62-bit fixed point split in two: ``floor(w 2^62) = hi 2^31 +
    lo``. So a histogram does not depend on the order of the sums, the device, or how the
    vocabulary is sharded, and the shards' histograms add up (an all-reduce) to the whole row's.
    Eight rounds, each one picking a bucket (:func:`shard_cut_pick`) and appending its digit to
    ``prefix``, end at one key: the cut, ties included.

    Args:
        logits: float32, bfloat16 or float16 ``[R, V_local]``, the global ids ``[vocab_start,
            vocab_start + V_local)``.
        scale: float32 ``[R]``, each row's inverse temperature (1 for logits already scaled).
        prefix: int64 ``[R]``, the digits the earlier rounds chose (0 in the first).
        shift: the round's digit, one of 56, 48, ..., 0.
        vocab_start: the shard's first global id (``vocab_start + V_local < 2^31``).
        ignore_id: a global id whose logit counts as -inf (-1: none).
        row_max: optional float32 ``[R]``: weigh by mass, ``row_max`` the whole row's max of ``a``.
        keep_value, keep_id: optional float32 and int64 (or int32) ``[R]``, together: an earlier
            cut outside which ids weigh 0 (top-p within top-k).

    Returns:
        torch.Tensor: int64 ``[R, 2, 256]``, the weights' ``hi`` parts then their ``lo`` parts by bucket.

    Raises:
        RuntimeError: a tensor of the wrong shape, dtype or device, a ``shift`` that is not a digit's,
            ``keep_value`` without ``keep_id``, or ``vocab_start + V_local`` past ``2^31``, naming the
            argument.
        TypeError: an argument that is neither a tensor nor a DLPack array.

    Kernels:
        - CPU: the rows in parallel, each a scaled copy of the row, then one loop that keys, weighs and
          counts the candidates.
        - CUDA: one launch, several blocks a row, each over a strided share of its 16-byte chunks in
          rounds of 4 loads in flight a thread, into a shared-memory histogram: a count's lanes of one
          bucket added by one atomic of their number (ballot), a mass an atomic an id (integer sums,
          so any order gives the same); then into the row's; no host reads.
    """
    return torch.ops.xkernels.shard_cut_histogram.default(
        _tensor(logits, "logits"), _tensor(scale, "scale"), _tensor(prefix, "prefix"), int(shift), int(vocab_start),
        int(ignore_id), _tensor(row_max, "row_max", optional=True), _tensor(keep_value, "keep_value", optional=True),
        _tensor(keep_id, "keep_id", optional=True))


def shard_cut_candidates(
    logits: torch.Tensor,
    scale: torch.Tensor,
    count: int,
    vocab_start: int,
    *,
    ignore_id: int = -1,
    row_max: Optional[torch.Tensor] = None,
):
    """Each row's ``count`` lowest :func:`shard_cut_histogram` keys, for a top-k of ``k <= count``
    over a sharded vocabulary without rounds: the k lowest keys of the whole row are among the
    shards' ``count`` lowest, so one all-gather of them gives the cut, and with their weights a
    top-p within it (:func:`xkernels.distributed.filter_cuts` with ``top_k_bound``).

    Row ``r``'s ids have scaled logits ``a = logits[r] * scale[r]`` (``ignore_id``'s at -inf) and the
    keys of :func:`shard_cut_histogram` (ascending in the ranking: a higher ``a`` first, ties to the
    lower global id). Of the ids above -inf (a NaN is never one), the ``count`` lowest keys, in
    ascending order, then the key of ``(-inf, 2^31 - 1)``, past every such key, where the row has
    fewer. With ``row_max``, each key's weight as :func:`shard_cut_histogram` weighs it by mass
    (``exp(a - row_max[r])`` clamped to ``[0, 1]``, as ``floor(w 2^62) = hi 2^31 + lo``; on each
    device the same bits as that op's), 0 for the filler.

    Args:
        logits: float32, bfloat16 or float16 ``[R, V_local]``, the global ids ``[vocab_start,
            vocab_start + V_local)``.
        scale: float32 ``[R]``, each row's inverse temperature.
        count: the keys a row returns, ``0 <= count <= 4096``.
        vocab_start: the shard's first global id (``vocab_start + V_local < 2^31``).
        ignore_id: a global id whose logit counts as -inf (-1: none).
        row_max: optional float32 ``[R]``, the whole row's max of ``a``: return the keys' masses.

    Returns:
        tuple: ``(keys int64 [R, count], weights int64 [R, count, 2])``: the weights' ``(hi, lo)``,
        ``[R, 0, 2]`` without ``row_max``.

    Raises:
        RuntimeError: a tensor of the wrong shape, dtype or device, a ``count`` outside ``[0, 4096]``,
            or ``vocab_start + V_local`` past ``2^31``, naming the argument.
        TypeError: an argument that is neither a tensor nor a DLPack array.

    Kernels:
        - CPU: the rows in parallel, one pass a row into a heap of the lowest keys (a chunk's ids
          tested first against the value of the heap's largest).
        - CUDA: one launch, a block a row. A ``count`` up to 128 in one pass over the row: each warp
          keeps the keys below its threshold by ballot and raises it when its buffer fills, then the
          warps' lists merge by rank. A larger one: a radix select of the ``count``-th key in
          shared memory (8-bit rounds until its bucket is wholly kept, about 2-4 passes for distinct
          values), one gather pass and a bitonic sort of the kept keys. No host reads.
    """
    return torch.ops.xkernels.shard_cut_candidates.default(
        _tensor(logits, "logits"), _tensor(scale, "scale"), int(count), int(vocab_start), int(ignore_id),
        _tensor(row_max, "row_max", optional=True))


def shard_cut_pick(hist: torch.Tensor, prefix: torch.Tensor, before: torch.Tensor, target: torch.Tensor):
    """The bucket each row's radix select takes from a round's all-reduced
    :func:`shard_cut_histogram`, so that the rounds between the collectives run on the device
    without host reads (:func:`xkernels.distributed.filter_cuts` calls it after each all-reduce).

    For row ``r``, the cumulative weight ``before[r] + hist[r]``'s buckets ``0..b`` (hi and lo parts
    summed apart, as int64 that wrap like torch's) is compared as the float64 number ``hi 2^31 +
    lo`` with ``target[r]``; the bucket is the number of buckets below the target, at most 255 (the
    last bucket where the whole row stays below it). Returns the new prefix ``prefix * 256 +
    bucket`` and the weight ranked before that bucket (``before`` plus the buckets before it).

    Args:
        hist: int64 ``[R, P, 256]``: the weights' hi parts, and with ``P = 2`` their lo parts (``P =
            1``: counts, whose lo parts are 0).
        prefix: int64 ``[R]``, the digits chosen so far.
        before: int64 ``[R, 2]``, the weight (hi, lo) ranked before the prefix's keys.
        target: float64 ``[R]``, the weight to reach, in units of ``2^-62`` (a count ``k``: ``k 2^62``).

    Returns:
        tuple: ``(prefix [R], before [R, 2])``, int64, new tensors.

    Raises:
        RuntimeError: a tensor of the wrong shape, dtype or device, naming the argument.
        TypeError: an argument that is neither a tensor nor a DLPack array.

    Kernels:
        - CPU: the rows in parallel (one loop of 256 buckets a row).
        - CUDA: one launch, a thread a row; no host reads.
    """
    return torch.ops.xkernels.shard_cut_pick.default(_tensor(hist, "hist"), _tensor(prefix, "prefix"),
                                                     _tensor(before, "before"), _tensor(target, "target"))
