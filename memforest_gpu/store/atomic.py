"""Crash-safe file writes: a file appears at its path only when it was written completely
(temp file beside it, fsync, ``os.replace``, fsync of the folder).

The temp file of ``dir/name`` is ``dir/.name.<12 hex digits>.tmp``. A process killed with
SIGKILL between creating it and renaming it leaves it behind (empty or partial, never the
file itself): :func:`remove_stale_temps` removes those of a path, for a caller that holds the
path's lock (so no other run can be writing one)."""
from __future__ import annotations

import contextlib
import os
import re
import secrets

__all__ = ["atomic_open", "atomic_write_text", "fsync_dir", "stale_temps", "remove_stale_temps"]

_HEX = 6  # bytes of randomness in a temp file's name (12 hex digits)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike):
    """Open a binary file that appears at ``path`` only when the block succeeds
    (temp file in the same folder, fsync, ``os.replace``); on error nothing changes."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp, fd = _create_temp(directory, os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        try:  # keep the mode of a file being replaced
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        except FileNotFoundError:
            pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(directory)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text file atomically (see :func:`atomic_open`)."""
    with atomic_open(path) as f:
        f.write(text.encode("utf-8"))


def _create_temp(directory: str, base: str) -> tuple[str, int]:
    """A new, exclusive temp file next to the target; mode 0o666 minus the umask."""
    for _ in range(100):
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(_HEX)}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file in {directory!r}")


def fsync_dir(directory: str) -> None:
    """fsync a folder so a rename inside it survives a crash (a no-op where folders cannot be
    opened)."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # e.g. Windows
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def stale_temps(path: str | os.PathLike) -> list[str]:
    """The temp files :func:`atomic_open` makes for ``path`` that exist now (only names of
    exactly that pattern, in ``path``'s folder), sorted."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(rf"\.{re.escape(os.path.basename(path))}\.[0-9a-f]{{{2 * _HEX}}}\.tmp")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(os.path.join(directory, n) for n in names
                  if pattern.fullmatch(n) and os.path.isfile(os.path.join(directory, n)))


def remove_stale_temps(paths) -> list[str]:
    """Remove the temp files of each of ``paths`` (:func:`stale_temps`) left by a run that was
    killed; returns those removed. Call it only while holding the lock of ``paths`` (their
    temp files are then no other run's work in progress)."""
    removed = []
    for path in paths:
        for tmp in stale_temps(path):
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                continue
            except OSError:
                continue  # left as it is: not ours to fight over (read-only folder, another owner)
            removed.append(tmp)
    return removed
