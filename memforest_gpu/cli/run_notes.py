"""The runs' notes (:mod:`memforest_gpu.notes`: a slow model load) on the command line: one
plain line each on stderr, none with ``--quiet``."""
from __future__ import annotations

import logging
import sys

from ..notes import NOTES

__all__ = ["show_notes"]


class _Stderr(logging.Handler):
    """Prints a note on the ``sys.stderr`` of the moment it is given."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stderr, flush=True)


def show_notes(*, quiet: bool) -> None:
    """Print the notes on stderr unless ``quiet``; never twice (they do not reach the root
    logger, whose ``-v`` format would repeat them)."""
    log = logging.getLogger(NOTES)
    log.propagate = False
    log.handlers = [logging.NullHandler()] if quiet else [_Stderr()]
    log.setLevel(logging.INFO)
