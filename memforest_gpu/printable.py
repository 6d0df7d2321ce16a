"""Text from a store shown on the terminal: its control characters written as escapes."""
from __future__ import annotations

import re

__all__ = ["printable"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with control characters (ANSI escapes, carriage returns, newlines, bidi
    overrides) written as escapes, so a stored memory, id or tenant name cannot drive the
    terminal or forge a line of a table."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
