"""Byte sizes as people write them (``4G``, ``512M``, ``1.5G``, ``64KiB``; powers of 1024),
read by :func:`parse_size` and written by :func:`format_size`."""
from __future__ import annotations

import re

__all__ = ["parse_size", "format_size"]

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str | int, *, flag: str = "memory_budget") -> int:
    """``"4G"``, ``"512M"``, ``"1.5G"``, ``"64KiB"`` or a byte count -> bytes (powers of 1024).

    Raises ``ValueError`` naming ``flag``, the value and the rule."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*", str(text), flags=re.IGNORECASE)
        if not m:
            raise ValueError(f"{flag} must be a size such as 4G, 512M or a byte count (units K, M, G, T), "
                             f"got {text!r}")
        value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise ValueError(f"{flag} must be greater than 0 bytes, got {text!r}")
    return value


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover
