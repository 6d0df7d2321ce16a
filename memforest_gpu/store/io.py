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
  Reading is streamed in record batches straight into the store's columns (Arrow arrays
  and one preallocated float32 tensor; ``tenants=`` filters each batch), writing goes out
  in row groups of 65,536 rows; no Python object per row, so millions of rows are fine.

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

import json
import os
from datetime import UTC
from typing import Any

import numpy as np

from .atomic import atomic_open
from .memory_store import MemoryStore

__all__ = ["FORMATS", "detect_format", "read_store", "write_store"]

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
        cols, file_embedder = _read_parquet_columns(path, tenants)
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
    """Keep only the rows of ``tenants`` (JSONL columns: Python lists)."""
    from .memory_store import DEFAULT_TENANT

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


_BATCH_ROWS = 1 << 16  # rows per Parquet record batch read
_READ_BUFFER = 1 << 22  # bytes of the Parquet reader's stream buffer per column
ROW_GROUP_ROWS = 1 << 16  # rows per Parquet row group written (a reader can stream the file)


def _tenant_mask(pf, want: list[str], path: str):
    """Rows of ``want`` tenants: one pass over the tenant column alone. Returns (count, per-batch
    masks) for the batches :func:`_read_parquet_columns` reads, or raises naming the tenants."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from .memory_store import DEFAULT_TENANT

    names: dict[str, None] = {}
    masks, count = [], 0
    has = "tenant" in pf.schema_arrow.names
    for rb in pf.iter_batches(batch_size=_BATCH_ROWS, columns=["tenant"] if has else ["id"]):
        if has:
            col = pc.cast(rb.column(0), pa.large_string())
            col = pc.if_else(pc.equal(col, ""), pa.scalar(None, pa.large_string()), col).fill_null(DEFAULT_TENANT)
        else:
            col = pa.array(np.full(rb.num_rows, DEFAULT_TENANT, dtype=object), type=pa.large_string())
        names.update(dict.fromkeys(col.unique().to_pylist()))
        m = pc.is_in(col, value_set=pa.array(want, type=pa.large_string()))
        masks.append(m)
        count += pc.sum(m).as_py() or 0
    for t in want:
        if t not in names:
            # first appearance order, as the store names them
            raise ValueError(f"{path}: tenant must be one of {_first_appearance(pf, has)}, got {t!r}")
    return count, masks


def _first_appearance(pf, has: bool) -> list[str]:
    import pyarrow as pa
    import pyarrow.compute as pc

    from .memory_store import DEFAULT_TENANT

    if not has:
        return [DEFAULT_TENANT]
    col = pc.cast(pf.read(columns=["tenant"]).column(0), pa.large_string()).combine_chunks()
    col = pc.if_else(pc.equal(col, ""), pa.scalar(None, pa.large_string()), col).fill_null(DEFAULT_TENANT)
    return col.dictionary_encode().dictionary.to_pylist()


def _read_parquet_columns(path: str, tenants: str | list[str] | None = None) -> tuple[dict, str | None]:
    """The file's columns, read in record batches: ids, texts, tenants, sources and metadata
    as Arrow arrays, embeddings straight into one preallocated float32 (N, D) tensor (no
    Python object per node, no float64 copy). ``tenants``: only those tenants' rows are kept,
    batch by batch (the whole table is never in memory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # buffered, not pre-buffered: a column chunk is streamed through a small buffer instead of
        # being loaded whole (a file written as one row group would otherwise be in memory twice)
        pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=_READ_BUFFER)
        schema = pf.schema_arrow
        wanted = [c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in schema.names]
        for c in REQUIRED_COLUMNS:
            if c not in schema.names:
                raise ValueError(f"{path}: missing required column {c!r} (columns: {schema.names})")
        masks = None
        if tenants is not None:
            want = [tenants] if isinstance(tenants, str) else list(tenants)
            n, masks = _tenant_mask(pf, want, path)
        else:
            n = pf.metadata.num_rows
        meta = schema.metadata or {}
        file_embedder = meta.get(PARQUET_EMBEDDER_KEY)
        file_embedder = file_embedder.decode("utf-8") if file_embedder else None
        has_emb = "embedding" in wanted
        if has_emb:
            et = schema.field("embedding").type
            if not (pa.types.is_list(et) or pa.types.is_large_list(et) or pa.types.is_fixed_size_list(et)):
                raise ValueError(f"{path}: column 'embedding' must be a list of floats, got type {et}")
        parts: dict[str, list] = {c: [] for c in wanted if c != "embedding"}
        emb = None  # (n, D) float32, allocated at the first batch with a vector
        state = {"pos": 0, "d": None, "null": None, "first_id": None}
        for b, rb in enumerate(pf.iter_batches(batch_size=_BATCH_ROWS, columns=wanted)):
            if masks is not None:
                rb = rb.filter(masks[b])
            if rb.num_rows == 0:
                continue
            ids_b = rb.column("id")
            for c in parts:
                parts[c].append(rb.column(c))
            if has_emb:
                emb = _embeddings_batch(rb.column("embedding"), ids_b, path, n, emb, state)
            state["pos"] += rb.num_rows
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: cannot read as Parquet: {e}") from None

    def col(c):
        if c not in parts:
            return None
        arrs = parts[c]
        if not arrs:
            return pa.array([], type=schema.field(c).type)
        return pa.chunked_array(arrs, type=arrs[0].type).combine_chunks()

    ids = col("id")
    cols: dict[str, Any] = {
        "id": ids,
        "text": col("text"),
        "timestamp": _parquet_timestamps(col("timestamp"), path),
        "embedding": None if state["null"] else emb,  # all-null vectors: embed on load
        "tenant": col("tenant"),
        "sources": None,
        "metadata": None,
    }
    if "sources" in parts:
        c = col("sources")
        if pa.types.is_string(c.type) or pa.types.is_large_string(c.type):
            cols["sources"] = [_json_cell(v, "sources", i, path) for i, v in zip(ids.to_pylist(), c.to_pylist())]
        else:
            cols["sources"] = c
    if "metadata" in parts:
        c = col("metadata")
        if pa.types.is_string(c.type) or pa.types.is_large_string(c.type):
            cols["metadata"] = _metadata_text(c, ids, path)
        else:  # struct / map columns written by other tools
            vals = c.to_pylist()
            if pa.types.is_map(c.type):
                vals = [dict(v) if v is not None else None for v in vals]
            cols["metadata"] = vals
    return cols, file_embedder


def _metadata_text(col, ids, path: str):
    """A JSON-text metadata column as Arrow, with invalid JSON reported as the reader does."""
    import pyarrow as pa
    import pyarrow.compute as pc

    todo = np.flatnonzero(~pc.equal(col.fill_null("{}"), "{}").fill_null(True).to_numpy(zero_copy_only=False))
    for j in todo.tolist():  # only rows other than {} are parsed (once more in the store)
        _json_cell(col[j].as_py(), "metadata", ids[j].as_py(), path)
    return col if col.type == pa.large_string() else col.cast(pa.large_string())


def _embeddings_batch(arr, ids, path: str, n: int, emb, state: dict):
    """Copy one batch of the embedding column into ``emb`` (allocated here at the first
    vector: (n, D) float32) at row ``state['pos']``; checks nulls and dimensions, naming the node."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import torch

    t = arr.type
    m = len(arr)
    nulls = arr.null_count
    if state["null"] is None:  # the first row decides: vectors everywhere, or nowhere
        state["null"] = bool(arr[0].as_py() is None) if m else None
    if state["null"]:
        if nulls != m:
            # vectors after missing ones: name the first node without one (row 0 of the file)
            raise ValueError(f"{path}: embedding of node {state['first_id']!r} is missing while other nodes have one")
        if state["first_id"] is None:
            state["first_id"] = ids[0].as_py()
        return emb
    if nulls:
        j = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"{path}: embedding of node {ids[j].as_py()!r} is missing while other nodes have one")
    if pa.types.is_fixed_size_list(t):
        d = t.list_size
        if state["d"] is None:
            state["d"], state["d_id"] = d, ids[0].as_py()
    else:
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        if state["d"] is None:
            state["d"], state["d_id"] = int(lengths[0]), ids[0].as_py()
        d = state["d"]
        bad = np.flatnonzero(lengths != d)
        if bad.size:
            j = int(bad[0])
            raise ValueError(
                f"{path}: embeddings must all have the same dimension, node {state['d_id']!r} has {d} "
                f"but node {ids[j].as_py()!r} has {int(lengths[j])}"
            )
    if d == 0:
        raise ValueError(f"{path}: embeddings must have dimension > 0, got 0")
    values = arr.flatten()  # respects slicing/offsets
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise ValueError(f"{path}: column 'embedding' must hold numbers, got type {values.type}")
    if values.null_count:
        j = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0]) // d
        raise ValueError(f"{path}: embedding of node {ids[j].as_py()!r} contains a null value")
    if emb is None:
        emb = torch.empty(n, d, dtype=torch.float32)
    if values.type != pa.float32():
        values = pc.cast(values, pa.float32())
    pos = state["pos"]
    emb.numpy()[pos:pos + m] = values.to_numpy(zero_copy_only=False).reshape(m, d)
    return emb


def _json_cell(v: Any, what: str, node_id: Any, path: str) -> Any:
    if v is None or v == "":
        return None
    if v == "{}":  # the common case, skip the parser
        return {}
    try:
        return json.loads(v)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: {what} of node {node_id!r} is not valid JSON: {e}") from None


def _parquet_timestamps(col, path: str):
    """Timestamp column -> float64 epoch seconds (N,) numpy, or raw values for MemoryStore to parse."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = col.type
    if col.null_count:
        return col.to_pylist()  # MemoryStore names the node with the missing value
    if pa.types.is_floating(t) or pa.types.is_integer(t):
        return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
    if pa.types.is_date(t):
        col = pc.cast(col, pa.timestamp("s"))
        t = col.type
    if pa.types.is_timestamp(t):
        per_second = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[t.unit]
        # Arrow stores instants as UTC counts; naive ones are read as UTC, like ISO strings.
        raw = pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False)
        return raw / per_second
    return col.to_pylist()


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

            pq.write_table(table, f, compression="zstd", row_group_size=ROW_GROUP_ROWS)
        else:
            _write_jsonl(store, f, iso=time_format == "iso")


def _dumps(v: Any, what: str, node_id: str) -> str:
    try:
        return json.dumps(v, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} of node {node_id!r} cannot be written as JSON: {e}") from None


def _to_arrow_table(store: MemoryStore):
    """The store as one Arrow table in the file layout (see the module docstring). The
    store's Arrow columns are reused; the vectors are a zero-copy view of a float32 host copy."""
    import pyarrow as pa

    n, d = len(store), store.dim
    emb = store.embeddings.detach().to("cpu", torch_float32())
    emb = np.ascontiguousarray(emb.numpy())
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), d)
    ts = np.ascontiguousarray(store.timestamps.detach().to("cpu").numpy(), dtype=np.float64)
    cols = store.columns()
    names = pa.array(store.tenant_table, type=pa.string())
    tenant = names.take(pa.array(store.tenant_codes_np, type=pa.int64()))
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
            cols["ids"].cast(pa.string()),
            cols["texts"].cast(pa.string()),
            embedding,
            pa.array(ts),
            tenant,
            cols["sources"].cast(pa.list_(pa.string())),
            cols["metadata"].cast(pa.string()),
        ],
        schema=schema,
    )


def torch_float32():
    import torch

    return torch.float32


def _iso(ts: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(ts, tz=UTC).isoformat()


def _write_jsonl(store: MemoryStore, f, *, iso: bool = False, block: int = 1 << 12) -> None:
    """One JSON object per line, ``block`` rows at a time (never a dict per node for the whole store)."""
    if store.embedder is not None:
        f.write(json.dumps({HEADER_KEY: {"embedder": str(store.embedder)}}, ensure_ascii=False).encode("utf-8"))
        f.write(b"\n")
    ids, texts, tenants, sources, metas = store.ids, store.texts, store.tenants, store.sources, store.metadata
    for lo in range(0, len(store), block):
        hi = min(len(store), lo + block)
        emb = store.embeddings[lo:hi].detach().to("cpu", torch_float32()).numpy()
        ts = store.timestamps[lo:hi].detach().to("cpu").tolist()
        if iso:
            ts = [_iso(t) for t in ts]
        buf = [_dumps({"id": i, "text": t, "timestamp": s_, "tenant": ten, "sources": src, "metadata": m,
                       "embedding": e.tolist()}, "record", i)
               for i, t, s_, ten, src, m, e in zip(ids[lo:hi], texts[lo:hi], ts, tenants[lo:hi], sources[lo:hi],
                                                    metas[lo:hi], emb)]
        f.write(("\n".join(buf) + "\n").encode("utf-8"))
