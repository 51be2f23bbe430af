"""The random streams every reference draws from, and the temperature rule every op shares.

Philox4x32-10 keyed as in csrc/include/xkernels/philox.h, so the references draw the same
tokens as the kernels for the same (seed, offset).
"""

import math
import struct
from typing import Tuple

import torch


_MASK32 = 0xFFFFFFFF
COIN_DRAW = 0xFFFFFFFF  # the Philox draw index of the acceptance coin


def _mulhilo(a: int, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of a * b for a 32-bit constant a and int64 tensor b in [0, 2^32)."""
    lo_part = a * (b & 0xFFFF)
    hi_part = a * (b >> 16)
    mid = lo_part + ((hi_part & 0xFFFF) << 16)
    return (hi_part >> 16) + (mid >> 32), mid & _MASK32


def philox4x32_10(counter, key):
    """Philox4x32-10 on int64 tensors holding 32-bit words. counter: 4 tensors, key: 2 ints or 0-dim tensors."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        hi0, lo0 = _mulhilo(0xD2511F53, c0)
        hi1, lo1 = _mulhilo(0xCD9E8D57, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + 0x9E3779B9) & _MASK32
        k1 = (k1 + 0xBB67AE85) & _MASK32
    return c0, c1, c2, c3


def int64_on(x, device) -> torch.Tensor:
    """x as an int64 tensor on `device` (a tensor's own device for None). A Python int is filled in
    on the device: torch.tensor / as_tensor of it would copy from host memory, which syncs the host
    and breaks CUDA-graph capture."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype=torch.int64) if device is None else x.to(device=device, dtype=torch.int64)
    return torch.full((), x, dtype=torch.int64, device=device)


def philox_draw(seed, offset, sequence, position, draw) -> torch.Tensor:
    """The 4 words of Philox draw `draw` of (sequence, position): counter = (draw, position,
    sequence, offset_lo), key = (seed_lo, seed_hi ^ offset_hi). seed and offset: ints, or
    one-element int64 tensors (their 64 bits, computed on their device: no host read). Returns
    int64 [..., 4], on the device of the first tensor of (sequence, position, draw) (the CPU if
    none is one)."""
    seed, offset = (x.reshape(()) if isinstance(x, torch.Tensor) else x for x in (seed, offset))
    device = next((x.device for x in (sequence, position, draw) if isinstance(x, torch.Tensor)), None)
    sequence, position, draw = torch.broadcast_tensors(*(int64_on(x, device) for x in (sequence, position, draw)))
    # Masks, not % 2**64: the same words from a Python int and from an int64 tensor's two's complement.
    counter = (draw, position, sequence, torch.zeros_like(draw) + (offset & _MASK32))
    key = (seed & _MASK32, ((seed >> 32) ^ (offset >> 32)) & _MASK32)
    return torch.stack(philox4x32_10(counter, key), dim=-1)


def uniform_open(words: torch.Tensor) -> torch.Tensor:
    """Uniforms strictly inside (0, 1) from 32-bit words: (top 23 bits + 0.5) / 2^23, in float32."""
    return ((words >> 9).to(torch.float32) + 0.5) * 2.0**-23


def gumbel_noise(seed: int, offset: int, sequence: int, position: int, vocab: int) -> torch.Tensor:
    """Gumbel noise of vocabulary ids 0..vocab-1 at (sequence, position): word v % 4 of draw v // 4."""
    draws = torch.arange((vocab + 3) // 4)
    words = philox_draw(seed, offset, sequence, position, draws).reshape(-1)[:vocab]
    return -torch.log(-torch.log(uniform_open(words)))


def acceptance_coins(seed: int, offset: int, n: int, k: int) -> torch.Tensor:
    """The acceptance uniform of every (sequence, row): [n, k] float32."""
    seq = torch.arange(n)[:, None]
    row = torch.arange(k)[None, :]
    return uniform_open(philox_draw(seed, offset, seq, row, COIN_DRAW)[..., 0])


def _as_int(value) -> int:
    return int(value.item()) if isinstance(value, torch.Tensor) else int(value)


def inverse_temperature(temperature: float) -> float:
    """The float32 reciprocal 1 / T the kernels scale logits by, or 0.0 for greedy decoding:
    T must be finite and >= 0; T = 0, and a T > 0 whose reciprocal overflows float32 (below
    about 2.9e-39, the T -> 0 limit), are greedy."""
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
    if temperature == 0:
        return 0.0
    try:  # rounded to float32 in Python: no tensor, so nothing a host-read guard would flag
        inv = struct.unpack("f", struct.pack("f", 1.0 / temperature))[0]
    except OverflowError:  # Pythons that refuse to round a large double to inf
        return 0.0
    return inv if math.isfinite(inv) else 0.0


def acceptance_coins_at(seed: int, offset: int, sequence: int, position: int) -> torch.Tensor:
    """The acceptance uniform of one (sequence, position)."""
    return uniform_open(philox_draw(seed, offset, sequence, position, COIN_DRAW)[..., 0])


def gumbel_noise_of_ids(seed: int, offset: int, sequence: int, position: int, ids: torch.Tensor) -> torch.Tensor:
    """The Gumbel noise of the global vocabulary ids `ids` at (sequence, position): word id % 4 of
    draw id // 4, as gumbel_noise gives it for the whole vocabulary."""
    words = philox_draw(seed, offset, sequence, position, ids // 4).gather(-1, (ids % 4)[..., None])[..., 0]
    return -torch.log(-torch.log(uniform_open(words)))
