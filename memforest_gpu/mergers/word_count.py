"""The word counter: a cheap token estimate when no tokenizer is at hand (words plus
punctuation marks, ``len(re.findall(r"\\w+|[^\\w\\s]", text))``), for a few texts in Python
and for a whole Arrow column without a Python string per text.

:func:`count_words_arrow` gives exactly :func:`count_words`'s numbers: it counts the maximal
runs of word characters plus the characters that are neither word nor space (what the
pattern's two branches match), with Python's own ``\\w`` and ``\\s`` deciding the class of
each distinct character the column holds, so the Unicode rules are the same by construction.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["WORD_PATTERN", "count_words", "count_words_arrow"]

WORD_PATTERN = re.compile(r"\w+|[^\w\s]")
_WORD, _SPACE = re.compile(r"\w"), re.compile(r"\s")
_OTHER, _IS_WORD, _IS_SPACE = 0, 1, 2


def count_words(texts: Sequence[str]) -> list[int]:
    """Cheap token estimate when no tokenizer is at hand: words plus punctuation marks."""
    return [len(WORD_PATTERN.findall(t)) for t in texts]


_BLOCK_BYTES = 1 << 23  # UTF-8 bytes counted at once (text_blocks)


def count_words_arrow(texts, *, block: int = 1 << 16) -> np.ndarray:
    """:func:`count_words` of every string of an Arrow string column (``pa.Array``,
    ``pa.ChunkedArray`` or a store's ``ArrowView``), ``block`` strings at a time (fewer where
    they pass 8 MiB), with numpy over the UTF-8 bytes: no Python string per text.

    Shape: (N,) -> (N,) int64

    >>> import pyarrow as pa
    >>> count_words_arrow(pa.array(["Alice's cat, Miso.", "  ", "日本語 テキスト"])).tolist()
    [6, 0, 2]
    """

    arr = getattr(texts, "arrow", texts)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not isinstance(arr, pa.Array) or not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        raise ValueError(f"texts must be an Arrow string array, got {type(arr).__name__}"
                         + (f" of {arr.type}" if isinstance(arr, pa.Array) else ""))
    if arr.null_count:
        raise ValueError(f"texts must be strings, got {arr.null_count} null(s)")
    if pa.types.is_string(arr.type):
        arr = arr.cast(pa.large_string())
    out = np.empty(len(arr), dtype=np.int64)
    for lo, hi in text_blocks(arr, block):  # the counts' per-byte arrays: ~10 bytes a byte of text
        part = arr.slice(lo, hi - lo)
        try:
            part.validate(full=True)  # valid UTF-8, as count_words's Python strings are
        except pa.ArrowInvalid as e:
            raise ValueError(f"texts must be valid UTF-8: {e}") from None
        out[lo:hi] = _count_block(part)
    return out


def text_blocks(arr, block: int):
    """Row ranges ``(lo, hi)`` covering the Arrow string array ``arr``: ``block`` texts each, fewer
    where they would pass :data:`_BLOCK_BYTES` bytes (a longer text alone). Shape: (N,) -> ranges"""
    n = len(arr)
    if not n:
        return
    wide = pa.types.is_large_string(arr.type)
    off = np.frombuffer(arr.buffers()[1], dtype=np.int64 if wide else np.int32)[arr.offset:arr.offset + n + 1]
    off = off.astype(np.int64, copy=False)  # int32 offsets plus the bound could wrap near 2 GiB
    lo = 0
    while lo < n:
        hi = min(n, lo + block, max(lo + 1, int(np.searchsorted(off, off[lo] + _BLOCK_BYTES, "right")) - 1))
        yield lo, hi
        lo = hi


def _count_block(a) -> np.ndarray:
    """Word counts of one large_string array. Shape: (n,) -> (n,) int64"""
    _, off_buf, data_buf = a.buffers()
    off = np.frombuffer(off_buf, dtype=np.int64)[a.offset:a.offset + len(a) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8)[off[0]:off[-1]] if data_buf is not None and len(a) \
        else np.zeros(0, dtype=np.uint8)
    off = off - off[0]
    if len(data) and int(data.max()) >= 0x80:
        lead = (data & 0xC0) != 0x80  # (B,) the first byte of each character
        cls = _classes(_code_points(data, lead))  # (C,)
        char_at = np.concatenate([[0], np.cumsum(lead, dtype=np.int64)])[off]  # (n + 1,) text starts
    else:  # ASCII: one byte, one character
        cls, char_at = _classes(data), off
    word = cls == _IS_WORD
    tok = cls == _OTHER
    tok[1:] |= word[1:] > word[:-1]  # a run of word characters starts here ...
    first = char_at[:-1][char_at[:-1] < char_at[1:]]  # (the first character of each non-empty text)
    tok[first] = word[first] | (cls[first] == _OTHER)  # ... or at a text's first character
    cs = np.zeros(len(tok) + 1, dtype=np.int64)
    np.cumsum(tok, out=cs[1:])
    return cs[char_at[1:]] - cs[char_at[:-1]]


def _code_points(data: np.ndarray, lead: np.ndarray) -> np.ndarray:
    """The code point of each character of valid UTF-8 bytes; only the multi-byte ones are
    decoded. Shape: (B,), (B,) -> (C,) int32"""
    p = np.flatnonzero(lead)
    cp = data[p].astype(np.int32)  # (C,) the lead bytes: ASCII characters are done
    multi = np.flatnonzero(cp >= 0x80)
    if len(multi):
        q, b0 = p[multi], cp[multi]
        last = len(data) - 1

        def cont(k):  # the k-th continuation byte's 6 bits (clipped reads are masked out below)
            return data[np.minimum(q + k, last)].astype(np.int32) & 0x3F

        c1, c2, c3 = cont(1), cont(2), cont(3)
        cp[multi] = np.where(b0 < 0xE0, ((b0 & 0x1F) << 6) | c1,
                             np.where(b0 < 0xF0, ((b0 & 0x0F) << 12) | (c1 << 6) | c2,
                                      ((b0 & 0x07) << 18) | (c1 << 12) | (c2 << 6) | c3))
    return cp


def _classes(cp: np.ndarray) -> np.ndarray:
    """Class of each code point (word, space or other), decided by Python's ``re`` for each
    distinct one. Shape: (C,) -> (C,) uint8"""
    if not len(cp):
        return np.zeros(0, dtype=np.uint8)
    present = np.flatnonzero(np.bincount(cp))  # (U,) distinct code points
    table = np.zeros(int(present[-1]) + 1, dtype=np.uint8)
    table[present] = [_char_class(c) for c in present.tolist()]
    return table[cp]


@functools.lru_cache(maxsize=1 << 16)
def _char_class(c: int) -> int:
    ch = chr(c)
    return _IS_WORD if _WORD.match(ch) else _IS_SPACE if _SPACE.match(ch) else _OTHER
