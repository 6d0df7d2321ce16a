"""Crash-safe file writes: a file appears at its path only when it was written completely
(temp file beside it, fsync, ``os.replace``, fsync of the folder)."""
from __future__ import annotations

import contextlib
import os
import secrets

__all__ = ["atomic_open", "atomic_write_text", "fsync_dir"]


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
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
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
