"""Backups of a Mem0 scope: one Parquet file with every point's id, vector, sparse vectors
and payload, written atomically before memforest changes anything.

Columns: ``collection`` (``"memories"``, or ``"entities"`` for Mem0's entity store),
``id`` string, ``vector`` list<float32>, ``sparse`` JSON string or null, ``payload`` JSON
string (the payload exactly as read, key order kept). The schema metadata key
``memforest.mem0.backup`` holds a JSON object: version, provider, collection,
entity_collection (null when the store has none), scope (the filters), created (ISO 8601),
count, entities, dim.
"""
from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...store.atomic import atomic_open
from .vectors import Point, payload_json

__all__ = ["write_backup", "read_backup", "read_backup_header", "BACKUP_KEY"]

BACKUP_KEY = b"memforest.mem0.backup"
VERSION = 1


def write_backup(path: str | os.PathLike, points: list[Point], *, provider: str, collection: str,
                 scope: dict, entities: list[Point] = (), entity_collection: str | None = None) -> dict:
    """Write ``points`` (and the scope's ``entities``) to ``path`` (Parquet) atomically;
    returns the header written."""

    dim = int(points[0].vector.shape[0]) if points else 0
    header = {"version": VERSION, "provider": provider, "collection": collection,
              "entity_collection": entity_collection, "scope": dict(scope),
              "created": datetime.now(UTC).isoformat(), "count": len(points), "entities": len(entities),
              "dim": dim}
    rows = [("memories", p) for p in points] + [("entities", p) for p in entities]
    table = pa.table({
        "collection": pa.array([c for c, _ in rows], pa.string()),
        "id": pa.array([p.id for _, p in rows], pa.string()),
        "vector": pa.array([p.vector.astype(np.float32) for _, p in rows], pa.list_(pa.float32())),
        "sparse": pa.array([None if p.sparse is None else json.dumps(p.sparse) for _, p in rows], pa.string()),
        "payload": pa.array([payload_json(p.payload) for _, p in rows], pa.string()),
    })
    table = table.replace_schema_metadata({BACKUP_KEY: json.dumps(header).encode("utf-8")})
    with atomic_open(path) as f:
        pq.write_table(table, f, compression="zstd")
    return header


def read_backup_header(path: str | os.PathLike) -> dict:
    """The header of a backup written by :func:`write_backup` (its rows are not read)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"backup file not found: {path!r}")
    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception as e:  # noqa: BLE001 - arrow raises many types for a bad file
        raise ValueError(f"{path}: cannot read as Parquet: {e}") from None
    return _header(meta, path)


def _header(meta: dict, path: str) -> dict:
    raw = meta.get(BACKUP_KEY)
    if raw is None:
        raise ValueError(f"{path}: not a memforest Mem0 backup (no {BACKUP_KEY.decode()!r} header)")
    header = json.loads(raw)
    if header.get("version") != VERSION:
        raise ValueError(f"{path}: backup version must be {VERSION}, got {header.get('version')!r}")
    return header


def read_backup(path: str | os.PathLike) -> tuple[dict, list[Point], list[Point]]:
    """(header, memories, entities) of a backup written by :func:`write_backup`."""

    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"backup file not found: {path!r}")
    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - arrow raises many types for a bad file
        raise ValueError(f"{path}: cannot read as Parquet: {e}") from None
    header = _header(table.schema.metadata or {}, path)
    cols = [table.column(c).to_pylist() for c in ("collection", "id", "vector", "sparse", "payload")]
    out: dict[str, list[Point]] = {"memories": [], "entities": []}
    for c, i, v, s, p in zip(*cols):
        out[c].append(Point(i, np.asarray(v, dtype=np.float32), json.loads(p), None if s is None else json.loads(s)))
    return header, out["memories"], out["entities"]
