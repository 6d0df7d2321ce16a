"""Read-only column views over a store's Arrow arrays and tenant codes, and the helpers
that build those arrays (large strings, identity sources, tenant encoding, JSON metadata).
:class:`~memforest_gpu.store.memory_store.MemoryStore` exposes its columns through these views."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["ArrowView", "ColumnView", "MetadataView", "TenantView", "compact_codes"]


def dumps_meta(m: Any, node_id: Any) -> str:
    try:
        return json.dumps(m, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"metadata of node {node_id!r} cannot be written as JSON: {e}") from None


def loads_meta(s: str | None) -> dict:
    return {} if s is None or s == "{}" else json.loads(s)


class ColumnView(Sequence):
    """A read-only sequence over one column of a store: ``len``, indexing (plain Python
    values), slicing and iteration (lists), ``==`` against any sequence. Values are made on
    access, a block at a time when iterating; the column itself is never copied."""

    _block = 1 << 14

    def __init__(self, n: int):
        self._n = n

    def _values(self, lo: int, hi: int) -> list:  # rows lo..hi as Python values
        raise NotImplementedError

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            lo, hi, step = i.indices(self._n)
            if step == 1:
                return self._values(lo, max(lo, hi))
            return [self[j] for j in range(lo, hi, step)]
        j = int(i)  # numpy / torch integers too
        if j < 0:
            j += self._n
        if not 0 <= j < self._n:
            raise IndexError(f"index must be in [{-self._n}, {self._n}), got {i}")
        return self._values(j, j + 1)[0]

    def __iter__(self):
        for lo in range(0, self._n, self._block):
            yield from self._values(lo, min(self._n, lo + self._block))

    def __eq__(self, other):
        if isinstance(other, (ColumnView, list, tuple)):
            return len(other) == self._n and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other):
        return list(self) + list(other)

    def __radd__(self, other):
        return list(other) + list(self)

    def __repr__(self) -> str:
        head = self._values(0, min(self._n, 3))
        return f"{type(self).__name__}({head!r}{' ...' if self._n > 3 else ''}, n={self._n})"


class ArrowView(ColumnView):
    """Strings or lists of strings held in one Arrow array."""

    def __init__(self, arr):
        super().__init__(len(arr))
        self.arrow = arr

    def _values(self, lo, hi):
        return self.arrow.slice(lo, hi - lo).to_pylist()


class MetadataView(ArrowView):
    """JSON objects kept as JSON text, parsed on access (``{}`` without the parser)."""

    def _values(self, lo, hi):
        return [loads_meta(s) for s in self.arrow.slice(lo, hi - lo).to_pylist()]


class TenantView(ColumnView):
    """Tenant names from integer codes and a name table."""

    def __init__(self, names: list[str], codes: np.ndarray):
        super().__init__(len(codes))
        self.names, self.codes = names, codes

    def _values(self, lo, hi):
        nm = self.names
        return [nm[c] for c in self.codes[lo:hi].tolist()]

    def count(self, value) -> int:
        return int((self.codes == self.names.index(value)).sum()) if value in self.names else 0


def _large_str(x) -> Any:
    """An Arrow large_string array of ``x`` (a view's array is reused, not copied)."""

    if isinstance(x, ArrowView):
        x = x.arrow
    if isinstance(x, pa.ChunkedArray):
        x = x.combine_chunks() if x.num_chunks != 1 else x.chunk(0)
    if isinstance(x, pa.Array):
        return x if x.type == pa.large_string() else x.cast(pa.large_string())
    return pa.array(list(x), type=pa.large_string())


def _identity_sources(ids) -> Any:
    """Each node's sources = [its id], as a list array over the ids (no Python list per node)."""

    return pa.LargeListArray.from_arrays(pa.array(np.arange(len(ids) + 1, dtype=np.int64)), ids)


def _encode_tenants(names_in) -> tuple[list[str], np.ndarray]:
    """(names in order of first appearance, codes (N,) int64) of a tenant column."""
    if isinstance(names_in, TenantView):
        return names_in.names, names_in.codes
    arr = _large_str(names_in)
    enc = arr.dictionary_encode()  # dictionary in order of first appearance
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return enc.dictionary.to_pylist(), codes


def compact_codes(names: list[str], codes: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Drop names no row uses and renumber in order of first appearance.

    Shape: codes (N,) -> (N,)
    """
    if len(codes) == 0:
        return [], codes.astype(np.int64)
    u, first = np.unique(codes, return_index=True)
    order = u[np.argsort(first, kind="stable")]
    if len(order) == len(names) and np.array_equal(order, np.arange(len(names))):
        return names, codes
    remap = np.zeros(len(names), dtype=np.int64)
    remap[order] = np.arange(len(order))
    return [names[j] for j in order.tolist()], remap[codes]
