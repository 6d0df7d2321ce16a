"""The growing node table of one compression run: originals ``0..N-1``, merged nodes appended.

One place for what a merge does to a node's bookkeeping (SPEC section 3), shared by the
engine and the merging baselines so both follow the same rules:

- the pair goes to the merger older first: by timestamp, then by the earliest original inside;
- the merged node: id :func:`merged_id` of its sources, timestamp ``max(t_a, t_b)``,
  ``sources_a + sources_b``, tenant unchanged, metadata ``{**meta_a, **meta_b}`` plus
  ``merged_from`` (the two ids);
- output order: live nodes by the earliest original inside (originals keep their order).
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import torch

from .mergers.base import MemoryItem, MergePair
from .store import MemoryStore

__all__ = ["NodeTable", "merged_id"]


def merged_id(sources: list[str]) -> str:
    """Content-addressed id of a merged node: stable across runs and machines."""
    h = hashlib.sha1("\x1f".join(sorted(sources)).encode("utf-8")).hexdigest()[:16]
    return f"mf-{h}"


class NodeTable:
    """Per-row columns of every node a run has seen (rows are never removed)."""

    def __init__(self, store: MemoryStore):
        self.store = store
        self.ids = list(store.ids)
        self.texts = list(store.texts)
        self.ts = store.timestamps.detach().cpu().tolist()
        self.tenant = list(store.tenants)
        self.sources = [list(s) for s in store.sources]
        self.meta = [dict(m) for m in store.metadata]
        self.first = list(range(len(store)))  # smallest original index inside, for output order

    def order(self, a: int, b: int) -> tuple[int, int]:
        """(older, newer): by timestamp, then by the earliest original inside."""
        return (a, b) if (self.ts[a], self.first[a]) <= (self.ts[b], self.first[b]) else (b, a)

    def merge_pair(self, older: int, newer: int) -> MergePair:
        """The merger's input for two rows (pass them through :meth:`order` first)."""
        return MergePair(MemoryItem(self.ids[older], self.texts[older], self.ts[older]),
                         MemoryItem(self.ids[newer], self.texts[newer], self.ts[newer]), self.tenant[older])

    def add(self, older: int, newer: int, text: str) -> int:
        """Append the merged node of two rows with the merger's ``text``; returns its row."""
        src = self.sources[older] + self.sources[newer]
        self.ids.append(merged_id(src))
        self.texts.append(text)
        self.ts.append(max(self.ts[older], self.ts[newer]))
        self.tenant.append(self.tenant[older])
        self.sources.append(src)
        self.meta.append({**self.meta[older], **self.meta[newer], "merged_from": [self.ids[older], self.ids[newer]]})
        self.first.append(min(self.first[older], self.first[newer]))
        return len(self.ids) - 1

    def output_order(self, live: Sequence[int] | np.ndarray) -> np.ndarray:
        """``live`` rows in output order (earliest original inside; stable)."""
        live = np.asarray(live, dtype=np.int64)
        return live[np.argsort([self.first[i] for i in live], kind="stable")]

    def to_store(self, rows: np.ndarray, embeddings: torch.Tensor) -> MemoryStore:
        """The store of ``rows`` (already in output order); ``embeddings`` (len(rows), D) match them."""
        return MemoryStore(
            [self.ids[i] for i in rows], [self.texts[i] for i in rows], embeddings,
            torch.tensor([self.ts[i] for i in rows], dtype=torch.float64, device=embeddings.device),
            [self.tenant[i] for i in rows], [self.sources[i] for i in rows], [self.meta[i] for i in rows],
            self.store.embedder,
        )
