"""The files of a store's inbox, and how a compaction takes them without losing an append.

Writers append to ``STORE.inbox.jsonl``: one record a line, the line and its newline in one
write to a file opened for appending (``echo '{...}' >> STORE.inbox.jsonl``), then close.
A compaction never rewrites, truncates or deletes that file. Under the store's lock it

1. reads every inbox file (:func:`inbox_files`: the taken files below, oldest first, then
   ``STORE.inbox.jsonl``) and checks their records;
2. **takes** the live file (:func:`take`): renames it to ``STORE.inbox.taken-K.jsonl`` (K one
   more than any taken file there). A writer that opens the inbox after the rename creates a
   new ``STORE.inbox.jsonl``; a line written between the read and the rename lands in the
   taken file, after the bytes that were read;
3. merges, and writes the store with a record of what it folded (:func:`folded_entry`: each
   taken file's name, the bytes read from it and their SHA-256, kept in the store's event
   trees JSON under ``"inbox"``);
4. **releases** the taken files (:func:`release`): a file with nothing after the bytes the
   store recorded is deleted. One with more (a line appended between the read and the
   rename, a last line whose writer has not written its newline yet) is left as it is, never
   rewritten, so a writer still holding it open loses nothing; the next run skips the bytes
   the store recorded (the name, the count and the digest must match) and reads the rest.

A run killed between 3 and 4 leaves the taken files whole; the next run finds the store's
record and skips or releases those bytes, so every record is folded exactly once. A run
killed before 3 leaves the records in the taken files, which the next run reads first. What
the protocol cannot see is a writer that keeps the inbox open across compactions and writes
a new line after its file was released: a writer opens, writes one line, and closes.
"""
from __future__ import annotations

import hashlib
import os
import re

from ..store.atomic import fsync_dir

__all__ = ["INBOX_SUFFIX", "inbox_path", "taken_paths", "inbox_files", "take", "folded_entry", "folded_prefix",
           "release"]

INBOX_SUFFIX = ".inbox.jsonl"
_TAKEN = ".inbox.taken-{}.jsonl"


def inbox_path(store: str | os.PathLike) -> str:
    """The live inbox of ``store``, the file writers append to."""
    return os.fspath(store) + INBOX_SUFFIX


def _taken_re(store: str) -> re.Pattern:
    base = re.escape(os.path.basename(store))
    return re.compile(base + r"\.inbox\.taken-([0-9]+)\.jsonl")


def taken_paths(store: str | os.PathLike) -> list[str]:
    """The taken inbox files of ``store`` that exist now, oldest (lowest K) first."""
    store = os.fspath(store)
    folder = os.path.dirname(os.path.abspath(store))
    pattern = _taken_re(store)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = sorted((int(m.group(1)), n) for n in names if (m := pattern.fullmatch(n)))
    return [os.path.join(os.path.dirname(store), n) for _, n in found]


def inbox_files(store: str | os.PathLike) -> list[str]:
    """Every inbox file of ``store`` in the order its records arrived: the taken files, then
    the live inbox (when it exists)."""
    live = inbox_path(store)
    return taken_paths(store) + ([live] if os.path.lexists(live) else [])


def take(store: str | os.PathLike) -> str:
    """Rename the live inbox to the next taken file and return its path (the caller holds
    the store's lock). Appends from then on create a new live inbox."""
    store = os.fspath(store)
    k = 1 + max((int(_taken_re(store).fullmatch(os.path.basename(p)).group(1)) for p in taken_paths(store)),
                default=0)
    dest = store + _TAKEN.format(k)
    os.rename(inbox_path(store), dest)
    fsync_dir(os.path.dirname(os.path.abspath(store)))
    return dest


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def folded_entry(path: str, data: bytes) -> dict:
    """What a store records of the taken file ``path`` whose first bytes ``data`` it folded."""
    return {"file": os.path.basename(path), "bytes": len(data), "sha256": _digest(data)}


def folded_prefix(path: str, data: bytes, folded: list[dict]) -> int:
    """How many leading bytes of the taken file ``path`` (content ``data``) the store's record
    ``folded`` says it already holds: the recorded count when the name, the count and the
    digest all match, else 0."""
    name = os.path.basename(path)
    for e in folded:
        if e["file"] == name and e["bytes"] <= len(data) and _digest(data[:e["bytes"]]) == e["sha256"]:
            return e["bytes"]
    return 0


def release(store: str | os.PathLike, folded: list[dict]) -> None:
    """Delete each taken file of ``store`` whose content is all in ``folded`` (the store's
    record: nothing but blank lines after the bytes it folded). A taken file with more is left
    as it is (a writer may still be finishing its last line there); the store's record tells the
    next run which of its bytes to skip. The caller holds the store's lock."""
    for path in taken_paths(store):
        with open(path, "rb") as f:
            data = f.read()
        n = folded_prefix(path, data, folded)
        if n and not data[n:].strip():
            os.unlink(path)
            fsync_dir(os.path.dirname(os.path.abspath(path)))
