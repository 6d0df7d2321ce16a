"""``memforest``: the thin command line over the Python API; each flag maps to a config field.

:mod:`.commands` builds the parser and runs ``compress``, ``search``, ``info`` and ``demo``
(:mod:`.demo`); :mod:`.adapters` adds ``mem0 compress|restore`` and ``graph compress``,
:mod:`.eval` adds ``eval``; :mod:`.flags` holds the flags every compressing command shares
and :mod:`.report` the run report they print. Entry point: ``memforest_gpu.cli:main``
(also ``python -m memforest_gpu.cli``).
"""
from .commands import main

__all__ = ["main"]
