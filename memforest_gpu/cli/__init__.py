"""``memforest``: the thin command line over the Python API; each flag maps to a config field.

:mod:`.commands` builds the parser from each command's ``*_args`` module (its flags and the
checks that need nothing loaded: :mod:`.compress_args`, :mod:`.search_args`,
:mod:`.demo_args`, :mod:`.compact_args`, :mod:`.adapters_args`, :mod:`.eval_args`,
:mod:`.review_args`; :mod:`.flags` holds the flags every compressing command shares), checks
them, and only then imports the module that runs the command (:mod:`.compress`,
:mod:`.search`, :mod:`.info`, :mod:`.demo`, :mod:`.compact`, :mod:`.adapters`, :mod:`.eval`,
:mod:`.review`; their errors worded by :mod:`.running`, their report by :mod:`.report_text`).
:mod:`.distributed` is the command line of ``python -m memforest_gpu.distributed``. Entry
point: ``memforest_gpu.cli:main`` (also ``python -m memforest_gpu.cli``).
"""
from .commands import main

__all__ = ["main"]
