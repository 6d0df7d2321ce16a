"""The progress bars of a run."""
from __future__ import annotations

from contextlib import contextmanager

from tqdm.auto import tqdm

__all__ = ["progress_bar"]


@contextmanager
def progress_bar(show: bool, total: int, desc: str, *, unit: str):
    """A tqdm bar of ``total`` ``unit`` while the block runs, or ``None`` when not ``show``."""
    if not show:
        yield None
        return
    bar = tqdm(total=total, desc=desc, unit=unit, leave=False)
    try:
        yield bar
    finally:
        bar.close()
