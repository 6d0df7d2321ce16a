"""An on-disk cache of LLM replies (answers and verdicts), so a re-run of the LLM protocol
costs nothing: a reply is keyed by a hash of the model's identity, the prompt family and its
version, and the exact chat messages (which hold the retrieved context and the question).

Layout: ``<cache>/qa/part-<random>.jsonl``, one ``{"k": key, "v": reply}`` per line. Each
part is written atomically under a fresh name (runs sharing a cache never overwrite each
other); many parts are compacted into one on load. A failed request is never cached, so a
re-run asks again.

    >>> c = ReplyCache(None)
    >>> key = reply_key({"model": "m"}, "answer", "v1", [{"role": "user", "content": "hi"}])
    >>> c.get(key) is None
    True
    >>> c.put(key, "hello"); c.get(key)
    'hello'
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import secrets

from ..store.atomic import atomic_open

__all__ = ["ReplyCache", "reply_key"]

_COMPACT_AT = 32


def reply_key(identity: dict, kind: str, version: str, messages: list[dict]) -> str:
    """sha1 of (model identity, prompt kind, prompt version, messages)."""
    blob = json.dumps([identity, kind, version, messages], sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(blob.encode("utf-8")).hexdigest()


class ReplyCache:
    """Replies by key, in memory and (with a ``directory``) on disk; see the module docstring."""

    def __init__(self, directory: str | os.PathLike | None):
        self.directory = None if directory is None else os.path.join(os.fspath(directory), "qa")
        self._items: dict[str, str] = {}
        self._new: dict[str, str] = {}
        self.hits = 0
        self.misses = 0
        if self.directory is not None:
            self._load()

    def _load(self) -> None:
        parts = sorted(glob.glob(os.path.join(self.directory, "part-*.jsonl")))
        for path in parts:
            try:
                with open(path, encoding="utf-8") as f:
                    for line in f:
                        rec = json.loads(line)
                        self._items[rec["k"]] = rec["v"]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # unreadable, or removed by a concurrent compaction: skip it
        if len(parts) >= _COMPACT_AT and self._items:
            self._write(self._items)
            for path in parts:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def _write(self, items: dict[str, str]) -> None:
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, f"part-{secrets.token_hex(8)}.jsonl")
        with atomic_open(path) as f:
            for k, v in items.items():
                f.write((json.dumps({"k": k, "v": v}, ensure_ascii=False) + "\n").encode("utf-8"))

    def get(self, key: str, *, count: bool = True) -> str | None:
        """The cached reply, or None; ``count=False`` leaves the hit / miss counters alone."""
        v = self._items.get(key)
        if not count:
            return v
        if v is None:
            self.misses += 1
        else:
            self.hits += 1
        return v

    def put(self, key: str, reply: str) -> None:
        """Remember a reply (a string; failures are not cached)."""
        if not isinstance(reply, str):
            raise ValueError(f"reply must be a string (failed requests are not cached), got {reply!r}")
        self._items[key] = reply
        self._new[key] = reply

    def flush(self) -> int:
        """Write the replies added since the last flush as one part; returns how many."""
        n = len(self._new) if self.directory is not None else 0
        if n:
            self._write(self._new)
        self._new.clear()
        return n
