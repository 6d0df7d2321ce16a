"""The path rule: no file a command writes is a file it reads or writes in another role.

Every command lists the paths it touches as :class:`PathRole` objects (what reads, what
writes, and the files a run writes beside its output: ``OUT.lock``, ``OUT.journal.jsonl``,
``OUT.parts/``; for ``compact`` the store itself, ``STORE.inbox.jsonl``, ``STORE.lock`` and
``STORE.journal.jsonl``) and calls :func:`check_paths` before any work. Two paths are one
file when they are the same after links and ``..`` are resolved (:func:`os.path.realpath`),
or when both exist with the same device and inode (a hard link). A path that goes up
(``..``) out of a folder that does not exist is refused too: the system would not find it,
although the text looks fine.

The message names both roles, both paths and the rule, e.g. ``--report must not be OUTPUT:
'out.jsonl' is 'out.jsonl' (one would overwrite the other); choose another path``.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

from .budget_groups import parts_dir
from .inbox_files import inbox_path
from .journal import journal_path
from .outputs import LOCK_SUFFIX, why_not_created

__all__ = ["PathRole", "reads", "writes", "output_files", "store_files", "check_paths", "same_path"]


@dataclass(frozen=True)
class PathRole:
    """One path of a command: ``what`` names it in messages (a flag, ``OUTPUT``, ``the lock
    file of OUTPUT``); ``writes``: the command creates, replaces or deletes it; ``folder``:
    a folder the command writes files into (it may not be an existing file); ``owned``: a
    folder the command deletes whole (no other path may lie inside it)."""

    what: str
    path: str
    writes: bool
    folder: bool = False
    owned: bool = False

    @property
    def desc(self) -> str:
        """How a message names it as the other party: a written path by its name, a read one
        as ``the input file`` (with its flag or name unless it is ``INPUT``)."""
        if self.writes:
            return self.what
        return "the input file" if self.what == "INPUT" else f"the input file ({self.what})"


def reads(what: str, path) -> list[PathRole]:
    """A path the command only reads (nothing when ``path`` is ``None``)."""
    return [] if path is None else [PathRole(what, os.fspath(path), False)]


def writes(what: str, path, *, folder: bool = False, owned: bool = False) -> list[PathRole]:
    """A path the command writes (nothing when ``path`` is ``None``)."""
    return [] if path is None else [PathRole(what, os.fspath(path), True, folder or owned, owned)]


def output_files(what: str, path, *, lock: bool = True, journal: bool = True, parts: bool = False) -> list[PathRole]:
    """An output and the files a run writes beside it while it runs: its lock, its merge
    journal, and (a ``--memory-budget`` run) its parts folder."""
    if path is None:
        return []
    p = os.fspath(path)
    out = writes(what, p)
    if lock:
        out += writes(f"the lock file of {what} ({os.path.basename(p)}{LOCK_SUFFIX})", p + LOCK_SUFFIX)
    if journal:
        out += writes(f"the merge journal of {what} ({os.path.basename(journal_path(p))})", journal_path(p))
    if parts:
        out += writes(f"the parts folder of {what} ({os.path.basename(parts_dir(p))})", parts_dir(p), owned=True)
    return out


def store_files(path, *, dry_run: bool = False) -> list[PathRole]:
    """The files of ``compact STORE``: the store and its inbox (read, and rewritten unless
    ``dry_run``), its lock and merge journal (a dry run takes neither, but no other path of
    the command may take their names)."""
    p = os.fspath(path)
    if dry_run:
        return reads("STORE", p) + reads("the inbox of STORE", inbox_path(p)) + output_files("STORE", p)[1:]
    return output_files("STORE", p) + writes(f"the inbox of STORE ({os.path.basename(inbox_path(p))})",
                                             inbox_path(p))


def same_path(a: str, b: str) -> str | None:
    """How ``a`` and ``b`` are one file (``"is"``, ``"resolves to"``, ``"is a link to"``,
    ``"is a hard link to"``), or ``None`` when they are not."""
    if os.path.abspath(a) == os.path.abspath(b) and os.pardir not in (a + os.sep + b).split(os.sep):
        return "is"
    if os.path.realpath(a) == os.path.realpath(b):
        return "is a link to" if os.path.islink(a) or os.path.islink(b) else "resolves to"
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return None
    return "is a hard link to" if (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino) else None


def _missing_folder(path: str) -> str | None:
    """The first folder of ``path`` that does not exist and that the path then leaves with
    ``..`` (so the system cannot follow it), or ``None``."""
    parts = path.split(os.sep)
    for i, part in enumerate(parts):
        if part == os.pardir and i > 0:
            head = os.sep.join(parts[:i]) or os.sep
            if not os.path.isdir(head):
                return head
    return None


def _check_parent(r: PathRole) -> None:
    """A written path's nearest existing folder must be a folder (not a file on its way), and
    a written folder that does not exist yet must be creatable there."""
    if os.path.exists(r.path):
        return
    parent = os.path.dirname(os.path.abspath(r.path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{r.what} must be a path through folders, got {r.path!r}: {parent!r} on its way is a file")
    if r.folder:
        probe = os.path.join(parent, f".memforest-probe.{secrets.token_hex(6)}")
        try:
            os.mkdir(probe)
            os.rmdir(probe)
        except OSError as e:
            raise ValueError(f"{r.what} must be a folder memforest can create, cannot create folders in {parent!r}: "
                             f"{why_not_created(e)}") from None


def check_paths(*groups: list[PathRole]) -> None:
    """Refuse, with one ``ValueError``, any path a command writes that is (after links and
    ``..``) a path it reads or writes in another role or lies inside a folder it deletes whole,
    an empty written path, a written path through a missing folder left with ``..``, a
    written folder that is an existing file and a written file that is an existing folder."""
    roles = [r for g in groups for r in g]
    for r in roles:
        if r.writes and not r.path.strip():
            raise ValueError(f"{r.what} must be a path, got {r.path!r}")
        if r.writes:
            gone = _missing_folder(r.path)
            if gone is not None:
                raise ValueError(f"{r.what} must be a path the system can follow, got {r.path!r}: the folder "
                                 f"{gone!r} does not exist, so '..' cannot leave it; write the path without it")
            if r.folder and os.path.exists(r.path) and not os.path.isdir(r.path):
                raise ValueError(f"{r.what} must be a folder, got the file {r.path!r}")
            if not r.folder and os.path.isdir(r.path):
                raise ValueError(f"{r.what} must be a file, got the directory {r.path!r}")
            _check_parent(r)
    for j, b in enumerate(roles):
        for a in roles[:j]:
            if not (a.writes or b.writes) or (a.folder and b.folder):  # two folders may hold each one's files
                continue
            _inside(a, b)
            _inside(b, a)
            how = same_path(b.path, a.path)
            if how is None:
                continue
            w, o = (b, a) if b.writes else (a, b)
            why = "one would overwrite the other" if o.writes else "writing it would destroy the input"
            raise ValueError(f"{w.what} must not be {o.desc}: {w.path!r} {how} {o.path!r} ({why}); "
                             "choose another path")


def _inside(folder: PathRole, other: PathRole) -> None:
    """Refuse ``other`` inside a folder the command deletes whole."""
    if not folder.owned:
        return
    top = os.path.realpath(folder.path)
    if os.path.realpath(other.path).startswith(top + os.sep):
        raise ValueError(f"{other.what} must not be inside {folder.what}: {other.path!r} is in {folder.path!r}, "
                         "which the run deletes when it ends; choose another path")
