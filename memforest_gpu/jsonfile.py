"""JSON read from a file or a file's text, every problem named by the file and where it breaks
(the benchmark loaders and the Mem0 config share it)."""
from __future__ import annotations

import json
from typing import Any

__all__ = ["read_json", "loads_json"]


def loads_json(text: str, path: str, what: str) -> Any:
    """``json.loads(text)``; bad JSON (or nesting too deep) raises ``ValueError`` as
    ``"{path} must be {what}, got bad JSON at line L column C: ..."``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} must be {what}, got bad JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise ValueError(f"{path} must be {what}, got nesting too deep to read") from None


def read_json(path: str, what: str) -> Any:
    """The parsed JSON of the UTF-8 file ``path`` (errors as :func:`loads_json`; a byte that is
    not UTF-8 is named by its offset)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} must be UTF-8 text, got a byte that is not ({e.reason} at byte {e.start})") from None
    return loads_json(text, path, what)
