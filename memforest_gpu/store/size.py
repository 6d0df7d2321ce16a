"""What a store takes: the vector rows a search scores and the bytes of its texts and vectors.

Compression is measured against the same store uncompressed **in the same encoding** (an int8
store against an int8 store): writing vectors as int8 codes is an encoding, a quarter of the
bytes whatever the store, not compression. So a size is taken in a given encoding
(:data:`~.codes.VECTOR_CODES`: ``float32`` is 4 bytes a value, ``int8`` one):

- ``rows``: the vectors a search scores, one per node, or one per key for a node with keys
  (:mod:`.keys`: a node with K keys is K blended rows);
- ``vectors``: the vectors the store holds, one per node plus every key;
- ``text_bytes``: the UTF-8 bytes of the texts; ``vector_bytes``: those of the vectors.

Ids, sources, timestamps and metadata are left out: a compressed store keeps every original
id (provenance) and the uncompressed one holds them too.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import pyarrow.compute as pc

from .codes import check_vector_codes
from .memory_store import MemoryStore

__all__ = ["StoreSize", "store_size", "bytes_per_vector"]


def bytes_per_vector(dim: int, encoding: str) -> int:
    """Bytes of one ``dim``-dimensional vector in ``encoding`` (int8 codes need no scale)."""
    check_vector_codes(encoding)
    return dim * (1 if encoding == "int8" else 4)


@dataclass(frozen=True)
class StoreSize:
    """A store's size in one encoding (module docstring)."""

    nodes: int
    originals: int  # the original memories its nodes stand for
    rows: int  # vector rows a search scores
    vectors: int  # vectors held: one per node plus every key
    text_bytes: int
    vector_bytes: int
    encoding: str

    @property
    def bytes(self) -> int:
        """Texts and vectors."""
        return self.text_bytes + self.vector_bytes

    def to_dict(self) -> dict:
        return {**asdict(self), "bytes": self.bytes}


def store_size(store: MemoryStore, encoding: str | None = None) -> StoreSize:
    """The size of ``store`` in ``encoding`` (default: the encoding its file uses,
    ``store.vector_codes``)."""
    encoding = encoding or store.vector_codes
    keys = store.keys
    n = len(store)
    n_keys = int(keys.vectors.shape[0]) if keys is not None else 0
    keyed = int((keys.counts > 0).sum()) if keys is not None else 0
    texts = store.columns()["texts"]
    text_bytes = int(pc.sum(pc.binary_length(texts)).as_py() or 0) if len(texts) else 0
    originals = int(pc.sum(pc.list_value_length(store.sources.arrow)).as_py() or 0) if n else 0
    return StoreSize(nodes=n, originals=originals, rows=n - keyed + n_keys, vectors=n + n_keys,
                     text_bytes=text_bytes, vector_bytes=(n + n_keys) * bytes_per_vector(store.dim, encoding),
                     encoding=encoding)
