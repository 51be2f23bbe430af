"""One verify step of a serving engine over vLLM's flat layout, prepared on the device.

:class:`RaggedVerifier` holds the step's buffers across steps (outputs, each request's seed and
offset) and derives everything the op needs from the engine's device tensors, with no host read, so
that a step can run inside a captured CUDA graph. It imports nothing from vLLM:
:mod:`xkernels.integrations.vllm` uses it in vLLM's V1 model runner, and another runner (V2's
rejection step, an engine of its own) can take it as it is.
"""

import random
from typing import Callable, Optional, Sequence

import torch

from .. import ops
from ..streams import offset_advance


def has_kernel(device_type: str) -> bool:
    """Whether ``chain_verify_ragged_`` has a kernel for ``device_type`` (``"cpu"``, ``"cuda"``).

    Args:
        device_type: a torch device type.

    Returns:
        bool.
    """
    return torch._C._dispatch_has_kernel_for_dispatch_key("xkernels::chain_verify_ragged_", device_type.upper())


def request_rows(cu_num_draft_tokens: torch.Tensor):
    """Each request's first and bonus rows in the op's layout (request ``n``'s ``K_n`` draft rows,
    then its bonus row, from row ``cu[n-1] + n``), computed on the tensor's device.

    Args:
        cu_num_draft_tokens: int32 or int64 ``[N]``, the inclusive cumulative draft counts.

    Returns:
        tuple: ``(first_rows, bonus_rows)``, int64 ``[N]``.
    """
    cu = cu_num_draft_tokens.long()
    index = torch.arange(cu.shape[0], device=cu.device)
    bonus = cu + index
    return torch.cat([cu.new_zeros(1), cu[:-1]]) + index if cu.shape[0] else bonus, bonus


def row_requests(bonus_rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    """The request of each of the ``num_rows = T + N`` logits rows (int64 ``[T + N]``, on the device):
    the first request whose bonus row is at or after the row.

    Args:
        bonus_rows: int64 ``[N]`` (:func:`request_rows`).
        num_rows: ``T + N``, the logits' rows (a shape, known on the host).

    Returns:
        Tensor: int64 ``[T + N]``.
    """
    return torch.searchsorted(bonus_rows, torch.arange(num_rows, device=bonus_rows.device))


class RaggedVerifier:
    """The buffers and the stream bookkeeping of :func:`xkernels.chain_verify_ragged_` steps.

    Each request keeps one seed for its lifetime (its own, or one drawn on the host when its id first
    appears); the seeds live in a device buffer that is written only when the batch's requests change
    (one asynchronous host-to-device copy), so a steady batch costs no transfer and a captured graph
    reads them at replay. Request ``n``'s offset is ``position[n] * width``, ``position[n]`` the
    absolute position of its first verified row and ``width`` :func:`xkernels.offset_advance` of the
    widest step (``max_spec_len + 1``): positions grow by at least one a step, so no two steps share a
    ``(seed, slot)``. ``errors[:N]`` holds, after a step, each request's invalid per-row sampling values
    as :class:`xkernels.errors.SamplingError` bits (the op's asynchronous error flag, cleared on the
    device at each step), for the engine to read when it already syncs.

    Args:
        max_requests: the most requests a step holds.
        max_spec_len: the most drafts a request has in any step (the stream's width is set by it).
        device: where the buffers live (the logits' device).
        method: ``"token"`` or ``"block"`` verification.
    """

    def __init__(self, max_requests: int, max_spec_len: int, device, method: str = "token"):
        self.max_requests, self.max_spec_len, self.method = int(max_requests), int(max_spec_len), method
        self.width = offset_advance("chain_verify_ragged", max_spec_len=self.max_spec_len,
                                    seed=torch.zeros(2, dtype=torch.int64))
        device = torch.device(device)
        # Flat, so that a step's [N, max_spec_len_step + 1] view is contiguous, as the op requires.
        self._out = torch.full((self.max_requests * self.width,), -1, dtype=torch.int32, device=device)
        self.accept_len = torch.zeros(self.max_requests, dtype=torch.int32, device=device)
        self.seed = torch.zeros(self.max_requests, dtype=torch.int64, device=device)
        self.offset = torch.zeros(self.max_requests, dtype=torch.int64, device=device)
        self.errors = torch.zeros(self.max_requests, dtype=torch.int32, device=device)
        self._ids: list = []  # the requests whose seeds self.seed holds, in row order
        self._known: dict = {}  # request id -> seed, for the requests of the last batch

    def resized(self, max_requests: int) -> "RaggedVerifier":
        """A verifier for up to ``max_requests`` that keeps this one's requests and their seeds."""
        grown = RaggedVerifier(max_requests, self.max_spec_len, self.seed.device, self.method)
        grown._known = self._known
        return grown

    def set_requests(self, req_ids: Sequence, seed_of: Callable[[int], Optional[int]] = lambda row: None) -> None:
        """Names the rows' requests; uploads their seeds only when they differ from the last call's.

        Args:
            req_ids: the batch's request ids (any hashable), in row order; ``None`` ids get a fresh
                seed at every call (a warm-up batch).
            seed_of: ``row -> seed`` of a request that brings its own (a seeded request), else None.
                Read only for a request seen for the first time.
        """
        req_ids = list(req_ids)
        if len(req_ids) > self.max_requests:
            raise ValueError(f"a batch of {len(req_ids)} requests, more than max_requests = {self.max_requests}")
        if None in req_ids:  # no positions either: a fresh stream from offset 0
            self.offset[:len(req_ids)].zero_()
        if req_ids == self._ids and None not in req_ids:
            return
        known, seeds = {}, []
        for row, rid in enumerate(req_ids):
            seed = self._known.get(rid) if rid is not None else None
            if seed is None:
                own = seed_of(row)
                seed = own if own is not None else random.getrandbits(64)
                seed = seed - (1 << 64) if seed >= 1 << 63 else seed
            known[rid] = seed
            seeds.append(seed)
        self._ids, self._known = req_ids, known
        # Pageable memory is staged at once, so this copy waits for no device work.
        self.seed[:len(seeds)].copy_(torch.tensor(seeds, dtype=torch.int64), non_blocking=True)

    def set_positions(self, first_positions: torch.Tensor) -> None:
        """Each request's offset from the absolute position of its first verified row, on the device.

        Args:
            first_positions: int ``[N]`` on the buffers' device.
        """
        n = first_positions.shape[0]
        torch.mul(first_positions.to(device=self.offset.device, dtype=torch.int64), self.width, out=self.offset[:n])

    def verify(self, draft_tokens, cu_num_draft_tokens, target_logits, max_spec_len: int, **params):
        """One :func:`xkernels.chain_verify_ragged_` call into the held buffers, with the seeds and
        offsets set last.

        Args:
            draft_tokens, cu_num_draft_tokens, target_logits: the op's, vLLM's layout.
            max_spec_len: this step's width less one (at most the constructor's).
            **params: ``draft_probs``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``filter_order``.

        Returns:
            tuple: ``(accept_len [N], out [N, max_spec_len + 1])``, int32 views of the held buffers,
            valid until the next call (and ``errors[:N]``, this step's error words).
        """
        n, width = cu_num_draft_tokens.shape[0], int(max_spec_len) + 1
        if width > self.width:
            raise ValueError(f"max_spec_len {max_spec_len} is above the verifier's {self.max_spec_len}")
        out = self._out[:n * width].view(n, width)
        errors = self.errors[:n].zero_()  # the op ORs into it: this step's words only
        return ops.chain_verify_ragged_(draft_tokens, cu_num_draft_tokens, target_logits, out, self.accept_len[:n],
                                        seed=self.seed[:n], offset=self.offset[:n], method=self.method,
                                        errors=errors, **params)
