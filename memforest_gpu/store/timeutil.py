"""Timestamps: parse ISO 8601 / epoch seconds, and format a date for memory text.

All timestamps inside the package are float epoch seconds (UTC). Naive ISO strings
are read as UTC so that the same file gives the same numbers on every machine.
"""
from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

__all__ = ["parse_timestamp", "format_date", "MONTHS", "DATE_TAG", "EPOCH_MIN", "EPOCH_MAX"]

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
#: a date tag as :func:`format_date` writes it in memory text, ``[8 May 2023]``, at the start
#: of the text or after whitespace; groups: day, month name, year
#: the epoch seconds of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: every timestamp, whatever
#: its input form, must lie in between (dates outside cannot be formatted)
EPOCH_MIN = -62135596800.0
EPOCH_MAX = 253402300799.0
DATE_TAG = re.compile(r"(?:^|(?<=\s))\[(\d{1,2}) (" + "|".join(MONTHS) + r") (\d{4})\]")


def parse_timestamp(value: Any, *, where: str = "timestamp") -> float:
    """Return epoch seconds (float) for an ISO 8601 string, a number, or a datetime.

    Raises ``ValueError`` naming ``where`` and the value when it cannot be read or lies
    outside the years 1..9999 (saying so when the value looks like milliseconds).
    """
    out = _parse(value, where)
    if not math.isfinite(out):
        raise ValueError(f"{where} must be finite, got {value!r}")
    if not EPOCH_MIN <= out <= EPOCH_MAX:
        hint = ""
        numeric = _is_number(value) if isinstance(value, str) else not isinstance(value, datetime)
        for unit, scale in (("milliseconds", 1e3), ("microseconds", 1e6), ("nanoseconds", 1e9)):
            if numeric and EPOCH_MIN <= out / scale <= EPOCH_MAX:
                hint = f"; it looks like epoch {unit} ({format_date(out / scale)}): divide by {scale:.0f}"
                break
        raise ValueError(f"{where} must be a date in the years 1..9999 (epoch seconds {EPOCH_MIN:.0f}.."
                         f"{EPOCH_MAX:.0f}), got {value!r}{hint}")
    return out


def _parse(value: Any, where: str) -> float:
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{where} must be ISO 8601 or epoch seconds, got {value!r}")
    if isinstance(value, (int, float)):
        out = float(value)
    elif isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=UTC)
        out = _epoch(dt, value, where)
    elif isinstance(value, str):
        s = value.strip()
        try:
            out = float(s)
        except ValueError:
            try:
                dt = datetime.fromisoformat(s.replace("Z", "+00:00") if s.endswith("Z") else s)
            except ValueError:
                raise ValueError(
                    f"{where} must be ISO 8601 or epoch seconds, got {value!r}"
                ) from None
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=UTC)
            out = _epoch(dt, value, where)
    else:
        try:  # numpy scalars and the like
            out = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where} must be ISO 8601 or epoch seconds, got {value!r}") from None
    return out


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _epoch(dt: datetime, value: Any, where: str) -> float:
    try:
        return dt.timestamp()
    except (OverflowError, ValueError, OSError):  # e.g. year 1 with a positive offset
        raise ValueError(f"{where} must be a date in the years 1..9999, got {value!r}") from None


def format_date(ts: float) -> str:
    """Format epoch seconds as a day, e.g. ``1683554160.0 -> '8 May 2023'`` (UTC)."""
    ts = float(ts)
    day = ts // 86400.0  # a UTC day is 86,400 POSIX seconds
    if math.isfinite(day) and ts - day * 86400.0 < 86399.999:  # clear of the microsecond rounding at midnight
        try:
            return _day_label(int(day))
        except (OverflowError, ValueError, OSError):
            pass  # out of datetime's range: the plain path below raises as it always did
    dt = datetime.fromtimestamp(ts, tz=UTC)
    return f"{dt.day} {dt:%B} {dt.year}"


@lru_cache(maxsize=1 << 14)
def _day_label(day: int) -> str:
    """The label of UTC day ``day`` (days since the epoch)."""
    dt = datetime.fromtimestamp(day * 86400.0, tz=UTC)
    return f"{dt.day} {dt:%B} {dt.year}"
