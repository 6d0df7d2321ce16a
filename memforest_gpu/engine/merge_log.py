"""A run's merges as columns: :class:`MergeLog`, a sequence of :class:`~.result.MergeRecord`.

A run keeps one entry per merge (500,000 at 1M nodes, ratio 0.5). As Python objects each was a
record plus fresh strings for the two inputs' ids and a float (about 250 bytes); here it is five
numbers (round, the older, newer and merged rows of the run's node table, the similarity), and a
record is made when it is read, from the table's own ids and texts (a block of records at a time
when iterated). A log keeps only those columns of the table alive (:class:`RowNames`: not the
input's vectors or texts, nor the table's numeric columns).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .node_table import NodeTable, gather_rows
from .result import MergeRecord

__all__ = ["MergeLog", "RowNames"]

_READ_BLOCK = 4096  # records made at once when a log is iterated


class RowNames:
    """What a merge log reads of a run's node table: every row's id and tenant, merged rows'
    texts. The table's merged rows are appended to the same lists, so a later one reads the
    earlier rows the same."""

    def __init__(self, table: NodeTable):
        self.n, self.o_ids, self.m_ids, self.m_texts = table.n, table.ids.orig.arrow, table.m_ids, table.m_texts
        self.names, self.code = table.store.tenant_table, table.tenant.codes

    def ids_of(self, rows: np.ndarray) -> list[str]:
        return gather_rows(rows, self.n, self.o_ids, self.m_ids)

    def texts_of(self, rows: np.ndarray) -> list[str]:
        """Merged rows' texts (the table's own strings)."""
        return [self.m_texts[j] for j in (np.asarray(rows, dtype=np.int64) - self.n).tolist()]

    def tenant_of(self, rows: np.ndarray) -> list[str]:
        return [self.names[c] for c in self.code[rows].tolist()]


class MergeLog(Sequence):
    """Merges of a run's node table, in order, read as :class:`MergeRecord` s (``names``: the
    table's :class:`RowNames`).

    Shape: round, older, newer, into, similarity (P,): the round number, the older / newer input
    rows, the merged row (the table's rows) and the cosine of the two inputs
    """

    def __init__(self, names: RowNames, round: np.ndarray, older: np.ndarray, newer: np.ndarray, into: np.ndarray,
                 similarity: np.ndarray):
        P = len(older)
        cols = [np.asarray(round, dtype=np.int32), np.asarray(older, dtype=np.int64), np.asarray(newer, dtype=np.int64),
                np.asarray(into, dtype=np.int64), np.asarray(similarity, dtype=np.float64)]
        if any(c.shape != (P,) for c in cols):
            raise ValueError(f"a merge log's columns must all have shape ({P},), got {[c.shape for c in cols]}")
        self.names = names
        self.round, self.older, self.newer, self.into, self.similarity = cols

    @classmethod
    def of_round(cls, table: NodeTable, number: int, older: np.ndarray, newer: np.ndarray, into: np.ndarray,
                 sims) -> MergeLog:
        """One round's merges (all numbered ``number``) in ``table``."""
        return cls(RowNames(table), np.full(len(older), number, dtype=np.int32), older, newer, into,
                   np.asarray(sims, dtype=np.float64))

    @classmethod
    def concat(cls, table: NodeTable, logs: Sequence[MergeLog]) -> MergeLog:
        """The merges of ``logs`` (logs of ``table``, earlier rounds first), one after another."""
        cols = [np.concatenate([getattr(g, c) for g in logs]) if logs else np.zeros(0)
                for c in ("round", "older", "newer", "into", "similarity")]
        return cls(RowNames(table), *cols)

    def __len__(self) -> int:
        return len(self.older)

    def _records(self, sel) -> list[MergeRecord]:
        """The records at ``sel`` (a slice or host int array), their strings read in bulk."""
        t, older, newer, into = self.names, self.older[sel], self.newer[sel], self.into[sel]
        ten, ia, ib = t.tenant_of(older), t.ids_of(older), t.ids_of(newer)
        ids, texts = t.ids_of(into), t.texts_of(into)
        rnd, w = self.round[sel].tolist(), self.similarity[sel].tolist()
        return [MergeRecord(rnd[k], ten[k], ia[k], ib[k], w[k], ids[k], texts[k]) for k in range(len(ia))]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return MergeLog(self.names, self.round[i], self.older[i], self.newer[i], self.into[i], self.similarity[i])
        k = int(i)
        if not -len(self) <= k < len(self):
            raise IndexError(f"merge {i} of a log of {len(self)}")
        return self._records(np.array([k % len(self)]))[0]

    def __iter__(self) -> Iterator[MergeRecord]:
        for r0 in range(0, len(self), _READ_BLOCK):
            yield from self._records(slice(r0, r0 + _READ_BLOCK))

    def __eq__(self, other) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # a sequence compared by value

    def __reduce__(self):
        return list, (list(self),)  # pickled as the records themselves (the table does not travel)

    def __repr__(self) -> str:
        return f"MergeLog({len(self)} merges)"
