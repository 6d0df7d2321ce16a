"""The checks of a command's files that need nothing loaded: a file it reads exists and can be
read, a file or folder it writes lies in a folder it can write. They run before a command's
module is imported; the run checks every path again in full (the path rule, the formats:
:mod:`memforest_gpu.runs.preflight`), so these only answer the common mistakes at once."""
from __future__ import annotations

import os

__all__ = ["need_input", "need_writable"]


def need_input(path: str | None, kind: str = "memory store file") -> None:
    """``path`` must exist (``FileNotFoundError`` naming ``kind``, as the run's own check
    says it) and, when it is a file, be readable."""
    if path is None:
        return
    if not os.path.exists(path):
        raise FileNotFoundError(f"{kind} not found: {path!r}")
    if os.path.isfile(path) and not os.access(path, os.R_OK):
        raise PermissionError(f"{kind} cannot be read: {path!r} (permission denied)")


def need_writable(what: str, path: str | None, *, folder: bool = False) -> None:
    """The nearest existing folder of ``path`` (a file to write; ``folder``: a folder to write
    files into, itself when it exists) must be a folder this process may write in; ``what``
    names the path in the message (``OUTPUT``, ``--out``)."""
    if path is None or not path.strip() or path.strip() == "-":
        return  # the run's checks word these
    existing = os.path.abspath(path) if folder else os.path.dirname(os.path.abspath(path))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if os.path.isdir(existing) and not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{what} must be in a writable folder, cannot write in {existing!r}: permission denied")
