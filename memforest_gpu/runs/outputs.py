"""Output targets: checked before any work is done, and locked while a run writes them.

:func:`check_output` refuses, up front, every target a run could only fail on at the end
(no or an unknown suffix, ``-``, a directory, a folder that cannot be written) and every
target that is one of the run's inputs (the same path, a symlink or a hard link to it),
which the final atomic replace would otherwise destroy. :class:`OutputLock` keeps two
runs from writing the same output at once.
"""
from __future__ import annotations

import errno
import logging
import os
import secrets
import time

from ..store.atomic import remove_stale_temps
from ..store.io import detect_format

__all__ = ["check_output", "check_not_input", "same_file", "OutputLock", "LOCK_SUFFIX", "why_not_created"]

log = logging.getLogger("memforest_gpu")

LOCK_SUFFIX = ".lock"


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when ``a`` and ``b`` are one file: the same path, or a symlink / hard link to it
    (same device and inode). A path that does not exist is nobody's file."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def why_not_created(e: OSError) -> str:
    """Why a file or folder could not be created in an existing folder, in words: "No such file or
    directory" there means the folder takes no new entries (a virtual file system such as /proc)."""
    if e.errno == errno.ENOENT:
        return ("the system lets nothing be created there (a virtual folder such as /proc or /sys): choose a folder "
                "on a disk")
    return e.strerror or str(e)


def check_not_input(path: str | os.PathLike, inputs, *, what: str = "output") -> None:
    """Raise ``ValueError`` when ``path`` is (or links to) one of ``inputs``."""
    for src in inputs:
        if src is not None and same_file(path, src):
            how = "is" if os.path.abspath(path) == os.path.abspath(src) else "is a link to"
            raise ValueError(f"{what} must not be the input file: {os.fspath(path)!r} {how} {os.fspath(src)!r} "
                             "(writing it would destroy the input); choose another path")


def check_output(path: str | os.PathLike, *, format: str | None = None, inputs=(), what: str = "output",
                 format_flag: str = "format", needs_format: bool = True) -> str | None:
    """Check that a run can write ``path`` at the end, before it starts; return its format.

    Raises ``ValueError`` naming ``what`` for: ``-`` or an empty path; a suffix that names
    no format (and no ``format``; ``format_flag`` is named in the message); a directory; a
    path that is one of ``inputs``; a folder that cannot be written (checked by creating
    and removing a probe file, so read-only mounts and permissions both count). A missing
    folder is fine when its nearest existing parent is writable (it is created later).
    Nothing is left on disk.
    """
    p = os.fspath(path)
    if p.strip() in ("", "-"):
        raise ValueError(f"{what} must be a file path (writing to standard output is not supported), got {p!r}")
    fmt = detect_format(p, format, flag=format_flag) if needs_format else None
    if os.path.isdir(p):
        raise ValueError(f"{what} must be a file, got the directory {p!r}")
    check_not_input(p, inputs, what=what)
    folder = os.path.dirname(os.path.abspath(p))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{what}'s folder must be a directory, got the file {existing!r} on the path of {p!r}")
    probe = os.path.join(existing, f".memforest-probe.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise ValueError(f"{what} must be in a writable folder, cannot write in {existing!r}: "
                         f"{why_not_created(e)}") from None
    os.close(fd)
    os.unlink(probe)
    return fmt


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    except OSError as e:
        return e.errno != errno.ESRCH
    return True


class OutputLock:
    """A lock file ``OUT.lock`` beside ``output``, created with ``O_CREAT | O_EXCL`` and
    holding the pid of the run that writes ``output``.

    A second run finds the file and stops with "another run is writing OUT". A lock left
    by a run that died (its pid is no longer alive, or the file is empty and older than
    ``grace`` seconds) is stale: it is removed and taken over. Use as a context manager.

    Once the lock is taken, the temp files of ``output`` (and of each path in ``also``, files
    written under the same lock) that a killed run left behind (``.OUT.<hex>.tmp``,
    :func:`~memforest_gpu.store.atomic.stale_temps`) are removed, with one warning naming them:
    while the lock is held no other run can be writing one.
    """

    def __init__(self, output: str | os.PathLike, *, grace: float = 10.0, also=()):
        self.output = os.fspath(output)
        self.path = self.output + LOCK_SUFFIX
        self.grace = grace
        self.also = [os.fspath(p) for p in also]
        self._held = False

    def acquire(self) -> OutputLock:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        except OSError as e:
            raise ValueError(f"the folder of {self.output!r} must exist or be creatable, cannot create it: "
                             f"{e.strerror or e}") from None
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner is not None:
                    raise ValueError(f"another run is writing {self.output!r} (pid {owner}, lock file "
                                     f"{self.path!r}); wait for it to finish, or delete the lock file if no "
                                     "such run exists") from None
                log.warning("removing the stale lock %s (its run is gone)", self.path)
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
                continue
            except OSError as e:
                raise ValueError(f"the lock file {self.path!r} must be writable (a run writing {self.output!r} "
                                 f"takes it), cannot create it: {e.strerror or e}") from None
            with os.fdopen(fd, "w") as f:
                f.write(f"{os.getpid()}\n")
            self._held = True
            removed = remove_stale_temps([self.output, *self.also])
            if removed:
                log.warning("removed %d temporary file(s) left by an interrupted run: %s", len(removed),
                            ", ".join(os.path.basename(p) for p in removed))
            return self
        raise ValueError(f"could not take the lock {self.path!r}: other runs keep taking it")

    def _owner(self) -> int | str | None:
        """The pid of a live lock holder (``"unknown"`` when the lock is fresh but still
        empty), ``None`` when the lock is stale or gone."""
        try:
            with open(self.path) as f:
                raw = f.read().strip()
            age = time.time() - os.stat(self.path).st_mtime
        except FileNotFoundError:
            return None
        try:
            pid = int(raw)
        except ValueError:
            return "unknown" if age < self.grace else None
        return pid if _pid_alive(pid) else None

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
