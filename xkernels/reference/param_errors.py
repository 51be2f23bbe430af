"""Reference of the asynchronous error flag (xkernels.errors.SamplingError): each request's bits
for its invalid per-row sampling values, and those values read as off, as the kernels read them.
Only [N] tensors are flagged: scalars are checked on the host, which needs no sync."""

from typing import Optional, Tuple

import torch

from ..errors import SamplingError


def _rows(x) -> Optional[torch.Tensor]:
    return x if isinstance(x, torch.Tensor) and x.dim() == 1 else None


def param_errors(n: int, temperature=0.0, top_k=None, top_p=None, min_p=None) -> torch.Tensor:
    """The error words of n requests, int32 [n]: the bits of each request's invalid per-row values
    (temperature, top_p and min_p compared as float32, top_k as an integer). Tensor ops only, on
    the per-row tensors' device (the CPU without one), no host read: xkernels.distributed flags
    with it on the device."""
    t, k, p, m = (_rows(x) for x in (temperature, top_k, top_p, min_p))
    given = [x for x in (t, k, p, m) if x is not None]
    bits = torch.zeros(n, dtype=torch.int32, device=given[0].device if given else "cpu")
    checks = (
        (t, lambda x: ~(torch.isfinite(x.float()) & (x.float() >= 0)), SamplingError.TEMPERATURE),
        (k, lambda x: x < 0, SamplingError.TOP_K),
        (p, lambda x: ~((x.float() > 0) & (x.float() <= 1)), SamplingError.TOP_P),
        (m, lambda x: ~((x.float() >= 0) & (x.float() <= 1)), SamplingError.MIN_P),
    )
    for values, bad, bit in checks:
        if values is not None:
            bits |= torch.where(bad(values.detach()), int(bit), 0).to(torch.int32)
    return bits


def read_as_off(bits: torch.Tensor, temperature=0.0, top_k=None, top_p=None, min_p=None) -> Tuple:
    """(temperature, top_k, top_p, min_p) with each flagged per-row value replaced by its off
    value (temperature 0: greedy; top_k 0, top_p 1, min_p 0), on the CPU; others as given."""
    def off(x, bit, value):
        if _rows(x) is None:
            return x
        return torch.where((bits & int(bit)) != 0, torch.tensor(value, dtype=x.dtype), x.detach().cpu())

    return (off(temperature, SamplingError.TEMPERATURE, 0.0), off(top_k, SamplingError.TOP_K, 0),
            off(top_p, SamplingError.TOP_P, 1.0), off(min_p, SamplingError.MIN_P, 0.0))


def flagged(errors: Optional[torch.Tensor], n: int, temperature=0.0, top_k=None, top_p=None, min_p=None) -> Tuple:
    """An op's flag: with errors (int32 [n]), each request's bits OR-ed into it (in place) and
    (temperature, top_k, top_p, min_p) returned read as off; without it, the values as given."""
    if errors is None:
        return temperature, top_k, top_p, min_p
    bits = param_errors(n, temperature, top_k, top_p, min_p)
    errors |= bits.to(errors.device)
    return read_as_off(bits, temperature, top_k, top_p, min_p)
