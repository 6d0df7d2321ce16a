"""A store's texts kept in a memory-mapped spill file instead of the process's memory.

A Parquet file's texts are read a record batch at a time into an unlinked temporary file
(``TMPDIR``; it is gone once the store is) and the store's text column is one Arrow
``large_string`` array over that file, mapped read-only: its character data is paged in where
a stage reads it (the checks, the token counts, a round's merged pairs, the output), and
:func:`memforest_gpu.heap.release_free_heap` hands those pages back between stages and rounds
(``madvise(MADV_DONTNEED)``: they stay in the page cache, not in the process). The rounds'
planning never reads the input's texts, so it does not hold them. The offsets (8 bytes a text)
and the null bitmap stay in memory. A ``TMPDIR`` on tmpfs keeps the file in memory anyway.
``MEMFOREST_MAPPED_TEXTS`` sets the bytes from which a file's texts are mapped (-1: never).

The array holds the same values as the file's column read whole (tests/test_mapped_texts.py).
"""
from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from ..heap import register_mapping, release_mappings

__all__ = ["TextSpill", "SpillError", "MAPPED_TEXT_BYTES", "text_spill", "mapped_text_bytes", "maps", "mapped_column"]

# a file's texts (uncompressed, as its metadata counts them) from which they are mapped, not held
MAPPED_TEXT_BYTES = 16 << 20


def text_spill(pf, threshold: int | None = None) -> TextSpill | None:
    """A spill for the texts of the Parquet file ``pf`` (a ``pq.ParquetFile``) when they are
    strings (anything else takes the reader's own checks) of at least ``threshold`` bytes
    uncompressed, as the file's metadata counts them (default :data:`MAPPED_TEXT_BYTES`; a
    negative threshold never spills; ``None``: ``MEMFOREST_MAPPED_TEXTS`` where it is set); else
    ``None``."""
    limit = mapped_text_bytes() if threshold is None else threshold
    t = pf.schema_arrow.field("text").type
    if limit < 0 or not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return None
    return TextSpill() if _text_bytes(pf.metadata) >= limit else None


def maps(nbytes: int) -> bool:
    """Whether texts of ``nbytes`` bytes are mapped (:func:`mapped_text_bytes`)."""
    return 0 <= mapped_text_bytes() <= nbytes


def mapped_column(blocks: Iterable[pa.Array]) -> pa.Array:
    """The texts ``blocks`` yield in turn (each released before the next is made) as one
    ``large_string`` array over a mapped spill file; the mapped pages a block was read from are
    handed back after it. Shape: blocks (B_i,) -> (sum B_i,)"""
    spill = TextSpill()
    for b in blocks:
        spill.append(b)
        release_mappings()
    return spill.finish()


def mapped_text_bytes() -> int:
    """The bytes of texts from which they are mapped: ``MEMFOREST_MAPPED_TEXTS`` where it is
    set, else :data:`MAPPED_TEXT_BYTES` (-1: never)."""
    raw = os.environ.get("MEMFOREST_MAPPED_TEXTS", "").strip()
    if not raw:
        return MAPPED_TEXT_BYTES
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"MEMFOREST_MAPPED_TEXTS must be a whole number of bytes (-1: never), "
                         f"got {raw!r}") from None


def _text_bytes(md) -> int:
    """The text column's uncompressed bytes in the file's metadata ``md``."""
    if not md.num_row_groups:
        return 0
    cols = [md.row_group(0).column(j).path_in_schema for j in range(md.num_columns)]
    if "text" not in cols:
        return 0
    j = cols.index("text")
    return sum(md.row_group(g).column(j).total_uncompressed_size for g in range(md.num_row_groups))


class SpillError(OSError):
    """The spill file could not be written or mapped (the message says where and what to do)."""


@contextlib.contextmanager
def _spilling():
    try:
        yield
    except SpillError:
        raise
    except OSError as e:
        raise SpillError(f"cannot write the texts' spill file in {tempfile.gettempdir()!r} ({e}): set TMPDIR "
                         f"to a folder on a disk with room for them, or MEMFOREST_MAPPED_TEXTS=-1 to hold "
                         f"them in memory") from None


class TextSpill:
    """Texts appended a batch at a time to a temporary file; :meth:`finish` maps it and returns
    them as one ``large_string`` array (the same values, nulls included)."""

    def __init__(self, directory: str | None = None):
        with _spilling():
            self._f = tempfile.TemporaryFile(dir=directory)
        self._offsets = [np.zeros(1, dtype=np.int64)]
        self._valid: list[np.ndarray] = []
        self._size = self._n = self._nulls = 0

    def append(self, arr: pa.Array) -> None:
        """One batch's texts (string or large_string). Shape: (B,) -> appended"""
        if isinstance(arr, pa.ChunkedArray):
            for c in arr.chunks:
                self.append(c)
            return
        B = len(arr)
        if B == 0:
            return
        arr = arr if arr.type == pa.large_string() else arr.cast(pa.large_string())
        _, offs_buf, data_buf = arr.buffers()
        offs = np.frombuffer(offs_buf, dtype=np.int64, count=B + 1, offset=arr.offset * 8)
        lo, hi = int(offs[0]), int(offs[-1])
        if hi > lo:
            with _spilling():
                self._f.write(memoryview(data_buf)[lo:hi])
        self._offsets.append(offs[1:] - lo + self._size)
        self._valid.append(arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else np.ones(B, bool))
        self._size += hi - lo
        self._n += B
        self._nulls += arr.null_count

    def finish(self) -> pa.Array:
        """The texts appended: one ``large_string`` array over the mapped file."""
        with _spilling():
            self._f.flush()
            mm = mmap.mmap(self._f.fileno(), self._size, access=mmap.ACCESS_READ) if self._size else None
        if mm is not None:
            register_mapping(mm)
            data = pa.py_buffer(mm)  # the buffer keeps the mapping alive; the file is already unlinked
        else:
            data = pa.py_buffer(b"")
        self._f.close()
        offsets = pa.py_buffer(np.concatenate(self._offsets))
        validity = None
        if self._nulls:
            validity = pa.py_buffer(np.packbits(np.concatenate(self._valid), bitorder="little"))
        self._offsets = self._valid = None
        return pa.Array.from_buffers(pa.large_string(), self._n, [validity, offsets, data], null_count=self._nulls)
