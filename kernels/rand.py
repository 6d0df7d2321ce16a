"""Counter-based uniforms: the same random numbers on every device, for any batch.

``u = counter_uniform(seed, streams, step, n)`` is a pure function of its integer inputs,
computed with int64 tensor arithmetic that never overflows (values stay below 2^31,
products below 2^62), so CPU and CUDA produce bit-identical numbers, and a problem's
numbers depend only on its own stream key, never on what else is in the batch. No host
generator, no host->device copy of random numbers, no device read.

Quality: a few rounds of a Lehmer generator modulo the prime 2^31 - 1 with xor-shifts
between them; ample for sampling seeds, not for cryptography.
"""
from __future__ import annotations

import torch

__all__ = ["counter_uniform", "stream_keys"]

_P = 2147483647  # 2^31 - 1, prime
_A = (48271, 69621, 16807, 39373)


def _mix(x: torch.Tensor) -> torch.Tensor:
    for a in _A:
        x = (x * a) % _P
        x = x ^ (x >> 13)
        x = (x * a + 12345) % _P
    return x


def stream_keys(values: list[int] | torch.Tensor, device=None) -> torch.Tensor:
    """Stream keys (T,) int64 in [0, 2^31 - 1) from arbitrary non-negative integers (e.g. crc32
    of a name)."""
    t = torch.as_tensor(values, dtype=torch.int64, device=device)
    return _mix(t % _P)


def counter_uniform(seed: int, streams: torch.Tensor, step: int, n: int) -> torch.Tensor:
    """Uniforms in (0, 1) for ``n`` positions of each stream at ``step``.

    Shape: streams (T,) int64 -> (T, n) float64
    """
    dev = streams.device
    base = _mix((streams % _P) * 7 + int(seed) % _P)  # (T,)
    base = _mix((base + int(step) % _P) % _P)
    pos = torch.arange(n, dtype=torch.int64, device=dev)
    x = _mix((base[:, None] * 3 + pos[None, :]) % _P)  # (T, n)
    return (x.to(torch.float64) + 0.5) / _P
