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

  The embedder name lives in the schema metadata under ``memforest.embedder``.
  Reading and writing are vectorised (no per-row Python work for embeddings), so
  millions of rows are fine.

``jsonl`` (``.jsonl``, ``.ndjson``, ``.json``) -- one JSON object per line with keys
  ``id``, ``text``, ``timestamp`` and optional ``embedding``, ``tenant``, ``sources``,
  ``metadata``. An optional first line ``{"__memforest__": {"embedder": "..."}}``
  records the embedder name. Blank lines are skipped. A ``.json`` file holding one
  JSON array of such objects is read too.

Required columns are ``id``, ``text`` and ``timestamp``; timestamps may be ISO 8601
strings or epoch numbers. A file without embeddings is embedded on load with the
``embedder`` given to :func:`read_store`.

Every problem with a file raises ``ValueError`` naming the path (and the line or the
node id where there is one); a missing file raises ``FileNotFoundError``. Writes are
atomic: the data goes to a temporary file in the target directory which replaces the
target only once it is complete and synced.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
from typing import Any

import numpy as np

from .store import MemoryStore

__all__ = ["read_store", "write_store", "detect_format", "FORMATS", "atomic_open", "atomic_write_text"]

FORMATS = ("parquet", "jsonl")

_SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
}
_ALIASES = {"parquet": "parquet", "pq": "parquet", "jsonl": "jsonl", "json": "jsonl", "ndjson": "jsonl"}

REQUIRED_COLUMNS = ("id", "text", "timestamp")
OPTIONAL_COLUMNS = ("embedding", "tenant", "sources", "metadata")
HEADER_KEY = "__memforest__"
PARQUET_EMBEDDER_KEY = b"memforest.embedder"


# --------------------------------------------------------------------------- format
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


# ----------------------------------------------------------------------------- read
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
        cols, file_embedder = _read_parquet_columns(path)
    else:
        cols, file_embedder = _read_jsonl_columns(path)
    if tenants is not None:
        cols = _select_tenants(cols, tenants, path)
    if cols["embedding"] is not None:
        # Vectors come from the file: they are labelled with the model the file records (or a
        # name the caller passes as a string), never with the model the caller would embed with.
        emb_arg = file_embedder if file_embedder is not None else (embedder if isinstance(embedder, str) else None)
    else:
        emb_arg = embedder
    try:
        return MemoryStore.from_columns(
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
        raise ValueError(f"{path}: {e}") from e


def _select_tenants(cols: dict, tenants: str | list[str], path: str) -> dict:
    from .store import DEFAULT_TENANT

    want = [tenants] if isinstance(tenants, str) else list(tenants)
    n = len(cols["id"])
    raw = cols["tenant"] if cols["tenant"] is not None else [None] * n
    have = [DEFAULT_TENANT if t is None or (isinstance(t, float) and t != t) else str(t) for t in raw]
    names = list(dict.fromkeys(have))
    for t in want:
        if t not in names:
            raise ValueError(f"{path}: tenant must be one of {names}, got {t!r}")
    keep = [j for j, t in enumerate(have) if t in set(want)]
    out = {k: (None if v is None else (v[keep] if isinstance(v, np.ndarray) else [v[j] for j in keep]))
           for k, v in cols.items()}
    return out


def _read_parquet_columns(path: str) -> tuple[dict, str | None]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        wanted = [c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in schema.names]
        for c in REQUIRED_COLUMNS:
            if c not in schema.names:
                raise ValueError(f"{path}: missing required column {c!r} (columns: {schema.names})")
        table = pf.read(columns=wanted)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: cannot read as Parquet: {e}") from None
    meta = schema.metadata or {}
    file_embedder = meta.get(PARQUET_EMBEDDER_KEY)
    file_embedder = file_embedder.decode("utf-8") if file_embedder else None

    ids = table.column("id").to_pylist()
    cols: dict[str, Any] = {
        "id": ids,
        "text": table.column("text").to_pylist(),
        "timestamp": _parquet_timestamps(table.column("timestamp"), path),
        "embedding": None,
        "tenant": None,
        "sources": None,
        "metadata": None,
    }
    if "embedding" in table.column_names:
        cols["embedding"] = _parquet_embeddings(table.column("embedding"), ids, path)
    if "tenant" in table.column_names:
        cols["tenant"] = table.column("tenant").to_pylist()
    if "sources" in table.column_names:
        col = table.column("sources")
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            cols["sources"] = [_json_cell(v, "sources", i, path) for i, v in zip(ids, col.to_pylist())]
        else:
            cols["sources"] = col.to_pylist()
    if "metadata" in table.column_names:
        col = table.column("metadata")
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            cols["metadata"] = [_json_cell(v, "metadata", i, path) for i, v in zip(ids, col.to_pylist())]
        else:  # struct / map columns written by other tools
            vals = col.to_pylist()
            if pa.types.is_map(col.type):
                vals = [dict(v) if v is not None else None for v in vals]
            cols["metadata"] = vals
    return cols, file_embedder


def _json_cell(v: Any, what: str, node_id: Any, path: str) -> Any:
    if v is None or v == "":
        return None
    if v == "{}":  # the common case, skip the parser
        return {}
    try:
        return json.loads(v)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: {what} of node {node_id!r} is not valid JSON: {e}") from None


def _parquet_timestamps(col, path: str) -> list:
    """Timestamp column -> list of epoch floats (or raw values for MemoryStore to parse)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = col.type
    if col.null_count:
        return col.to_pylist()  # MemoryStore names the node with the missing value
    if pa.types.is_floating(t) or pa.types.is_integer(t):
        return pc.cast(col, pa.float64()).to_numpy().tolist()
    if pa.types.is_date(t):
        col = pc.cast(col, pa.timestamp("s"))
        t = col.type
    if pa.types.is_timestamp(t):
        per_second = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[t.unit]
        # Arrow stores instants as UTC counts; naive ones are read as UTC, like ISO strings.
        raw = pc.cast(col, pa.int64()).to_numpy()
        return (raw / per_second).tolist()
    return col.to_pylist()


def _parquet_embeddings(col, ids: list, path: str) -> np.ndarray | None:
    """list / fixed_size_list column -> float32 (N, D) numpy array, vectorised."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = col.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        raise ValueError(f"{path}: column 'embedding' must be a list of floats, got type {t}")
    n = len(col)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count:
        if arr.null_count == n:
            return None  # no embeddings at all: embed on load
        j = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"{path}: embedding of node {ids[j]!r} is missing while other nodes have one")
    if pa.types.is_fixed_size_list(t):
        d = t.list_size
    else:
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        d = int(lengths[0]) if n else 0
        bad = np.flatnonzero(lengths != d)
        if bad.size:
            j = int(bad[0])
            raise ValueError(
                f"{path}: embeddings must all have the same dimension, node {ids[0]!r} has {d} "
                f"but node {ids[j]!r} has {int(lengths[j])}"
            )
    if n and d == 0:
        raise ValueError(f"{path}: embeddings must have dimension > 0, got 0")
    values = arr.flatten()  # respects slicing/offsets
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise ValueError(f"{path}: column 'embedding' must hold numbers, got type {values.type}")
    if values.null_count:
        j = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0]) // d
        raise ValueError(f"{path}: embedding of node {ids[j]!r} contains a null value")
    flat = pc.cast(values, pa.float32()).to_numpy(zero_copy_only=False, writable=True)
    return flat.reshape(n, d)


def _read_jsonl_columns(path: str) -> tuple[dict, str | None]:
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf").lstrip()
    items = _read_json_array(path) if head.startswith(b"[") else None
    if items is None:
        items = _iter_jsonl(path)

    file_embedder = None
    ids, texts, stamps, embs, tenants, sources, metas = [], [], [], [], [], [], []
    emb_where: tuple[str, Any] | None = None  # where the first embedding / missing one was
    first_dim: tuple[int, Any] | None = None
    n_with = n_without = 0
    first = True
    for where, rec in items:
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: {where} must be a JSON object, got {type(rec).__name__}: {_short(rec)}")
        if first and HEADER_KEY in rec:
            first = False
            hdr = rec[HEADER_KEY]
            if not isinstance(hdr, dict):
                raise ValueError(f"{path}: {where}: header {HEADER_KEY!r} must be a JSON object, got {_short(hdr)}")
            name = hdr.get("embedder")
            if name is not None and not isinstance(name, str):
                raise ValueError(f"{path}: {where}: header embedder must be a string, got {_short(name)}")
            file_embedder = name
            continue
        first = False
        for key in REQUIRED_COLUMNS:
            if key not in rec:
                raise ValueError(f"{path}: {where} is missing required column {key!r}")
        node = rec["id"]
        e = rec.get("embedding")
        if e is None:
            n_without += 1
            if n_with:
                raise ValueError(f"{path}: {where}: embedding of node {node!r} is missing while other nodes have one")
            emb_where = emb_where or (where, node)
        else:
            n_with += 1
            if n_without:
                w, other = emb_where
                raise ValueError(f"{path}: {w}: embedding of node {other!r} is missing while other nodes have one")
            if not isinstance(e, list) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in e
            ):
                raise ValueError(f"{path}: {where}: embedding of node {node!r} must be a list of numbers, got {_short(e)}")
            if first_dim is None:
                first_dim = (len(e), node)
            elif len(e) != first_dim[0]:
                raise ValueError(
                    f"{path}: {where}: embeddings must all have the same dimension, node "
                    f"{first_dim[1]!r} has {first_dim[0]} but node {node!r} has {len(e)}"
                )
            embs.append(e)
        ids.append(node)
        texts.append(rec["text"])
        stamps.append(rec["timestamp"])
        tenants.append(rec.get("tenant"))
        sources.append(rec.get("sources"))
        metas.append(rec.get("metadata"))
    if n_with and first_dim[0] == 0:
        raise ValueError(f"{path}: embeddings must have dimension > 0, got 0")
    emb = np.asarray(embs, dtype=np.float32) if n_with else None
    cols = {"id": ids, "text": texts, "timestamp": stamps, "embedding": emb,
            "tenant": tenants, "sources": sources, "metadata": metas}
    return cols, file_embedder


def _iter_jsonl(path: str):
    with open(path, "rb") as f:
        for ln, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: line {ln} is not valid UTF-8: {e}") from None
            if ln == 1:
                line = line.lstrip("\ufeff")
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {ln} is not valid JSON: {e.msg} (column {e.colno})") from None
            yield f"line {ln}", rec


def iter_jsonl_objects(path: str):
    """``(where, record)`` per non-blank line of a JSONL file, where = ``"line N"``; a line
    that is not UTF-8, not JSON or not a JSON object raises ``ValueError`` naming it."""
    for where, rec in _iter_jsonl(path):
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: {where} must be a JSON object, got {type(rec).__name__}: {_short(rec)}")
        yield where, rec


def _read_json_array(path: str):
    """Items of a file holding one JSON array, or None when it is not one (then the
    line-by-line reader runs and reports the problem with its line number)."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            data = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, list):
        return None
    return ((f"item {j}", rec) for j, rec in enumerate(data))


def _short(v: Any, limit: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


# ---------------------------------------------------------------------------- write
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
    if fmt == "parquet":
        table = _to_arrow_table(store)  # build before touching the disk
    with atomic_open(path) as f:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, f, compression="zstd")
        else:
            _write_jsonl(store, f, iso=time_format == "iso")


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike):
    """Open a binary file that appears at ``path`` only when the block succeeds
    (temp file in the same folder, fsync, ``os.replace``); on error nothing changes."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp, fd = _create_temp(directory, os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        try:  # keep the mode of a file being replaced
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        except FileNotFoundError:
            pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(directory)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text file atomically (see :func:`atomic_open`)."""
    with atomic_open(path) as f:
        f.write(text.encode("utf-8"))


def _create_temp(directory: str, base: str) -> tuple[str, int]:
    """A new, exclusive temp file next to the target; mode 0o666 minus the umask."""
    for _ in range(100):
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file in {directory!r}")


def _fsync_dir(directory: str) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # e.g. Windows
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _dumps(v: Any, what: str, node_id: str) -> str:
    try:
        return json.dumps(v, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} of node {node_id!r} cannot be written as JSON: {e}") from None


def _to_arrow_table(store: MemoryStore):
    import pyarrow as pa

    n, d = len(store), store.dim
    emb = np.ascontiguousarray(store.embeddings.detach().to("cpu").numpy(), dtype=np.float32)
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), d)
    ts = np.ascontiguousarray(store.timestamps.detach().to("cpu").numpy(), dtype=np.float64)
    meta_json = [_dumps(m, "metadata", i) for i, m in zip(store.ids, store.metadata)]
    schema_meta = {}
    if store.embedder is not None:
        schema_meta[PARQUET_EMBEDDER_KEY] = str(store.embedder).encode("utf-8")
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("text", pa.string()),
            ("embedding", pa.list_(pa.float32(), d)),
            ("timestamp", pa.float64()),
            ("tenant", pa.string()),
            ("sources", pa.list_(pa.string())),
            ("metadata", pa.string()),
        ],
        metadata=schema_meta or None,
    )
    assert len(ts) == n
    return pa.Table.from_arrays(
        [
            pa.array(store.ids, type=pa.string()),
            pa.array(store.texts, type=pa.string()),
            embedding,
            pa.array(ts),
            pa.array(store.tenants, type=pa.string()),
            pa.array(store.sources, type=pa.list_(pa.string())),
            pa.array(meta_json, type=pa.string()),
        ],
        schema=schema,
    )


def _iso(ts: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def _write_jsonl(store: MemoryStore, f, *, iso: bool = False) -> None:
    if store.embedder is not None:
        f.write(json.dumps({HEADER_KEY: {"embedder": str(store.embedder)}}, ensure_ascii=False).encode("utf-8"))
        f.write(b"\n")
    emb = store.embeddings.detach().to("cpu").numpy()
    ts = store.timestamps.detach().to("cpu").tolist()
    if iso:
        ts = [_iso(t) for t in ts]
    buf: list[str] = []
    for j in range(len(store)):
        rec = {
            "id": store.ids[j],
            "text": store.texts[j],
            "timestamp": ts[j],
            "tenant": store.tenants[j],
            "sources": list(store.sources[j]),
            "metadata": store.metadata[j],
            "embedding": emb[j].tolist(),
        }
        buf.append(_dumps(rec, "record", store.ids[j]))
        if len(buf) >= 1024:
            f.write(("\n".join(buf) + "\n").encode("utf-8"))
            buf.clear()
    if buf:
        f.write(("\n".join(buf) + "\n").encode("utf-8"))
