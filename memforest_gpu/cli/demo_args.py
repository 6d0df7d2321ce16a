"""The flags of ``memforest demo`` and their checks before anything loads (the run:
:mod:`.demo`)."""
from __future__ import annotations

from ..config import ConfigError, MergeConfig
from .path_checks import need_writable

__all__ = ["add_parser", "check"]


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="compress the bundled sample store and show what changed",
                       description="Compress the bundled sample store and show what changed.")
    d.add_argument("--ratio", type=float, default=0.5, help="fraction of each user's memories to remove")
    d.add_argument("--out", default=None, help="also write the sample and its compressed form in this folder")
    d.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")


def check(a) -> None:
    """The ratio, and the folder ``--out`` writes into."""
    try:
        MergeConfig(ratio=a.ratio)
    except ConfigError as e:
        raise ValueError(e.named("--ratio")) from None
    need_writable("--out", a.out, folder=True)
