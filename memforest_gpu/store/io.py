"""Read and write memory stores as Parquet or JSON Lines.

Formats (see :data:`FORMATS`):

``parquet`` (``.parquet``, ``.pq``) -- one row per node, zstd-compressed::

    id         string
    text       string
    embedding  fixed_size_list<float32>[D]   (list<float*> also read)
    timestamp  float64 epoch seconds          (ints, ISO strings, timestamp/date types also read)
    tenant     string
    sources    list<string>
    metadata   string (one JSON object per row)
    keys       list<fixed_size_list<float32>[D]>  (optional, null = none; :mod:`.keys`)
    key_sources  list<list<string>>           (optional, one id list per key)
    keys_rule  string                         (optional, the keys' rule, JSON, on rows with keys)
    embedder   string                         (optional, the model of the vectors on every row)

  The embedder name lives in the schema metadata under ``memforest.embedder`` and in the
  ``embedder`` column (:mod:`.embedder_io`), the keys' rule (:mod:`.keys`) under
  ``memforest.keys`` and in the ``keys_rule`` column: a tool that drops the file's metadata
  keeps both.
  Reading is streamed in record batches straight into the store's columns (Arrow arrays
  and one preallocated float32 tensor; ``tenants=`` filters each batch), writing goes out
  in row groups of 65,536 rows; no Python object per row, so millions of rows are fine.

``jsonl`` (``.jsonl``, ``.ndjson``, ``.json``) -- one JSON object per line with keys
  ``id``, ``text``, ``timestamp`` and optional ``embedding``, ``tenant``, ``sources``,
  ``metadata``, ``keys``, ``key_sources``. An optional first line
  ``{"__memforest__": {"embedder": "...", "keys": {...}}}`` records the embedder name (and the
  keys' rule). Blank lines are skipped. A ``.json`` file holding one
  JSON array of such objects is read too.

Required columns are ``id``, ``text`` and ``timestamp``; timestamps may be ISO 8601
strings or epoch numbers. A file without embeddings is embedded on load with the
``embedder`` given to :func:`read_store`.

Every problem with a file raises ``ValueError`` naming the path (and the line or the
node id where there is one); a missing file raises ``FileNotFoundError``. Writes are
atomic: the data goes to a temporary file in the target directory which replaces the
target only once it is complete and synced.

This module picks the format and wires the readers and writers of :mod:`.parquet` and
:mod:`.jsonl`; the columns they share are in :mod:`.layout`.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import jsonl, parquet
from .atomic import atomic_open
from .event_trees import EventTrees, NegativeTreeError, event_trees_from_json, tree_from_column
from .keys_io import DEFAULT_RULE, keys_from_columns, keys_rule_of
from .memory_store import MemoryStore

log = logging.getLogger(__name__)

__all__ = ["FORMATS", "detect_format", "read_store", "write_store", "file_keys_rule"]

FORMATS = ("parquet", "jsonl")

_SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
}
_ALIASES = {"parquet": "parquet", "pq": "parquet", "jsonl": "jsonl", "json": "jsonl", "ndjson": "jsonl"}


def detect_format(path: str | os.PathLike, format: str | None = None, *, flag: str | None = "format") -> str:
    """Return ``"parquet"`` or ``"jsonl"`` from ``format`` when given, else from the suffix.

    Raises ``ValueError`` listing the valid formats and suffixes when neither tells; the
    messages call the option ``flag`` (e.g. ``"--out-format"`` for the command line; ``None``
    when there is no such option to suggest).
    """
    if format is not None:
        key = str(format).strip().lower().lstrip(".")
        if key not in _ALIASES:
            raise ValueError(f"{flag or 'format'} must be one of {list(FORMATS)}, got {format!r}")
        return _ALIASES[key]
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in _SUFFIXES:
        raise ValueError(
            f"cannot tell the format of {os.fspath(path)!r} from its suffix {suffix!r}: "
            f"format must be one of {list(FORMATS)} (suffixes {sorted(_SUFFIXES)})"
            + ("" if flag is None else f", or pass {flag + ' FORMAT' if flag.startswith('-') else flag + '=...'}")
        )
    return _SUFFIXES[suffix]


def read_store(
    path: str | os.PathLike,
    *,
    format: str | None = None,
    embedder: Any = None,
    device: Any = None,
    tenants: str | list[str] | None = None,
) -> MemoryStore:
    """Load a :class:`MemoryStore` from a Parquet or JSONL file.

    ``embedder`` (an object with ``.name`` and ``.embed(texts)``) is used only when the
    file has no embeddings; then it is required. ``device`` is where the tensors go.
    The embedder name recorded in the file, when present, is restored; a file's vectors
    whose model is not recorded keep ``embedder=None`` (unknown) unless ``embedder`` is a
    string naming it. ``tenants``: keep only these tenants' nodes (checked against the
    file's tenants before anything is embedded).
    """
    path = os.fspath(path)
    fmt = detect_format(path, format)
    if not os.path.exists(path):
        raise FileNotFoundError(f"memory store file not found: {path!r}")
    if not os.path.isfile(path):
        raise ValueError(f"{path}: not a regular file")
    if fmt == "parquet":
        cols, file_embedder = parquet.read_parquet_columns(path, tenants)
    else:
        cols, file_embedder = jsonl.read_jsonl_columns(path)
        if tenants is not None:
            cols = jsonl.select_tenants(cols, tenants, path)
    if cols["embedding"] is not None:
        # Vectors come from the file: they are labelled with the model the file records (or a
        # name the caller passes as a string), never with the model the caller would embed with.
        emb_arg = file_embedder if file_embedder is not None else (embedder if isinstance(embedder, str) else None)
    else:
        emb_arg = embedder
    try:
        store = MemoryStore.from_columns(
            ids=cols["id"],
            texts=cols["text"],
            timestamps=cols["timestamp"],
            embeddings=cols["embedding"],
            tenants=cols["tenant"],
            sources=cols["sources"],
            metadata=cols["metadata"],
            embedder=emb_arg,
            device=device,
        )
    except ValueError as e:
        if isinstance(e, UnicodeEncodeError) and fmt == "jsonl":  # a lone surrogate: name its line, node and field
            raise ValueError(f"{path}: {jsonl.lone_surrogate(path) or e}") from None
        raise ValueError(f"{path}: {e}") from e
    if cols.get("tree") is not None or cols.get("event_trees") is not None:
        try:
            tree = tree_from_column(cols["tree"], len(store))
        except NegativeTreeError as e:  # the row in the file when it was read whole
            row = f"row {e.row} " if tenants is None else ""
            raise ValueError(f"{path}: {row}(node {store.ids[e.row]!r}): {e}") from None
        except (ValueError, TypeError) as e:  # pyarrow's cast errors are ValueErrors (ArrowInvalid)
            raise ValueError(f"{path}: column 'tree' must hold integers (compact's event trees), got: {e}") from None
        states = event_trees_from_json(cols["event_trees"], path)
        if cols.get("event_trees") is None and (tree >= 0).any():
            log.warning("%s: the event trees' state is missing (a tool rewrote the file without its metadata): "
                        "each tenant is partitioned again at its next compaction", path)
        store.event_trees = EventTrees(tree, states)
    store.keys = keys_from_columns(cols, store, path)
    store.vector_codes = cols.get("vector_codes", "float32")
    cols = None
    _release_arrow_memory()
    return store


def _release_arrow_memory() -> None:
    """Hand the memory Arrow's pool keeps from freed buffers back to the system (the file's
    decoded batches, copied into tensors by now: about 200 MB at 1M nodes, d = 384, which no
    later stage would reuse: tensors do not come from Arrow's pool)."""
    pa.default_memory_pool().release_unused()


def write_store(store: MemoryStore, path: str | os.PathLike, *, format: str | None = None,
                time_format: str | None = "store") -> None:
    """Write ``store`` to ``path`` atomically (temp file + fsync + ``os.replace``).

    On any error the temp file is removed and an existing file at ``path`` is untouched.
    Parent directories are created. ``time_format``: ``"iso"`` writes JSONL timestamps as
    ISO 8601 strings (UTC), ``None`` as epoch seconds; the default follows
    ``store.time_format`` (ISO when they were read as ISO). Parquet always holds float64
    epoch seconds.
    """
    path = os.fspath(path)
    fmt = detect_format(path, format)
    if time_format == "store":
        time_format = store.time_format
    if time_format not in (None, "iso"):
        raise ValueError(f"time_format must be one of [None, 'iso'], got {time_format!r}")
    if fmt == "parquet":  # the first row group is built before touching the disk, the others as they are written
        first = parquet.arrow_rows(store, 0, min(len(store), parquet.ROW_GROUP_ROWS))
    with atomic_open(path) as f:
        if fmt == "parquet":
            parquet.write_parquet_store(store, f, first=first)
            first = None
        else:
            jsonl.write_jsonl(store, f, iso=time_format == "iso")


def file_keys_rule(path: str | os.PathLike, *, format: str | None = None) -> dict | None:
    """The keys' rule of the store file ``path`` (``{"text_weight": w, "max_keys": k}``), read
    without loading the store: the file's metadata (Parquet) or header (JSON Lines), else the
    ``keys_rule`` column, else the default rule when the file has keys; ``None`` for a file
    without keys."""
    path = os.fspath(path)
    if detect_format(path, format) == "parquet":
        try:
            schema = pq.read_schema(path)
        except (pa.ArrowException, OSError):
            return None  # not Parquet: the run that reads it says so
        if "keys" not in schema.names:
            return None
        meta = (schema.metadata or {}).get(parquet.PARQUET_KEYS_KEY)
        rows = pq.read_table(path, columns=["keys_rule"]).column("keys_rule") if "keys_rule" in schema.names \
            else None
        return keys_rule_of(meta, rows, path) if meta is not None or rows is not None else dict(DEFAULT_RULE)
    return jsonl.header_keys_rule(path)
