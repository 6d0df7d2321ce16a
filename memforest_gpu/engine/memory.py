"""How a run saves memory: one object the caller hands in, whose choices never change an output.

The method's stages read as the method; where a run can hold less, they ask this object:

- ``overwrite_input``: the run may write into the input store's vector table. Each merged
  vector then takes a dead row of the input (its earliest original's,
  :meth:`~.node_vectors.NodeVectors.put`) where the output's keys allow it (:meth:`reuses_rows`),
  and the output's vectors are a view of the input's first rows: no second (N, D) table.
  For callers that drop the input after the run, as every file run does (``runs/``).
- ``mapped_texts``: the bytes of texts from which the output's texts are written a block at
  a time into a mapped spill file (:mod:`memforest_gpu.store.mapped_texts`; -1: never).
- ``tile_elements``: elements of one temporary tensor of the partition (its k-means and
  reassignment are tiled to it).
- ``trim``: freed heap pages (and the pages of mapped texts) handed back between stages and
  rounds (:func:`memforest_gpu.heap.release_free_heap`), so a peak of one stage is not
  carried into the next.

:meth:`MemoryPlan.from_environment` reads the one setting that comes from the environment
(``MEMFOREST_MAPPED_TEXTS``); :func:`~.compression.compress` takes that plan when handed none.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import CompressConfig
from ..heap import release_free_heap, release_mappings
from ..store.mapped_texts import MAPPED_TEXT_BYTES, mapped_text_bytes
from ..store.memory_store import MemoryStore

__all__ = ["MemoryPlan"]


@dataclass(frozen=True)
class MemoryPlan:
    """A run's memory-saving choices (module docstring): the same output under any of them."""

    overwrite_input: bool = False
    mapped_texts: int = MAPPED_TEXT_BYTES
    tile_elements: int = 1 << 24
    trim: bool = True

    @classmethod
    def from_environment(cls, **choices) -> MemoryPlan:
        """The plan with ``choices``, its mapped-texts bound from ``MEMFOREST_MAPPED_TEXTS``
        where it is set (a value that is not a whole number raises ``ValueError``)."""
        return cls(**{"mapped_texts": mapped_text_bytes(), **choices})

    def release(self, min_free: int = 0) -> None:
        """Hand freed heap pages back (when at least ``min_free`` bytes of the heap are free)."""
        if self.trim:
            release_free_heap(min_free)

    def release_mappings(self) -> None:
        """Hand back the pages of mapped texts a stage paged in."""
        if self.trim:
            release_mappings()

    def maps_texts(self, nbytes: int) -> bool:
        """Whether an output of ``nbytes`` bytes of texts has them mapped."""
        return 0 <= self.mapped_texts <= nbytes

    def reuses_rows(self, cfg: CompressConfig, emb: torch.Tensor, store: MemoryStore) -> bool:
        """Whether merged vectors go into the input's own dead rows: the run may overwrite the
        input, the vectors are stored in its dtype, and the output's keys need no input vector
        but as its int8 code (no keys, or every source's key as int8 codes), kept before its
        row is overwritten."""
        m = cfg.merge
        same = getattr(torch, cfg.storage_dtype) == emb.dtype
        return self.overwrite_input and same and \
            (m.keys == 0 or (m.max_keys is None and m.vectors == "int8" and store.keys is None))
