"""Mem0's pgvector store read and written natively, over the connection pool Mem0 opened.

Mem0's table is ``<collection> (id uuid primary key, vector vector(D), payload jsonb)``.
Reads page through a server-side cursor (``page`` rows per round trip, one snapshot for the
whole read); writes and deletes take a whole batch per statement. Vectors travel as
pgvector's text form, which holds float32 values exactly. JSONB keeps no key order of its
own: it stores keys in its canonical order, so a payload reads back the same each time.
Works with either driver Mem0 picked (psycopg 3 or psycopg2).
"""
from __future__ import annotations

import json
from contextlib import contextmanager

import numpy as np

from .points import Point

__all__ = ["pg_read", "pg_read_ids", "pg_write", "pg_delete", "pg_table_dim", "vector_text"]


@contextmanager
def _connection(vs):
    """A connection from Mem0's pool: committed when the block ends, rolled back on an error."""
    vs._ensure_collection()
    pool = vs.connection_pool
    conn = pool.getconn()
    try:
        yield conn
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        pool.putconn(conn)


def _table(vs) -> str:
    return '"' + vs.collection_name.replace('"', '""') + '"'


def _where(filters: dict) -> tuple[str, list]:
    """Mem0's own filter form for key == value: ``payload->>key = value`` (text)."""
    if not filters:
        return "", []
    parts, params = [], []
    for k, v in filters.items():
        parts.append("payload->>%s = %s")
        params += [k, json.dumps(v) if isinstance(v, bool) else str(v)]
    return " WHERE " + " AND ".join(parts), params


def _vector(text: str) -> np.ndarray:
    """pgvector's text form ``[0.1,0.2,...]`` -> (D,) float32."""
    return np.array(text[1:-1].split(","), dtype=np.float32)


def vector_text(v: np.ndarray) -> str:
    """(D,) float32 -> pgvector's text form; every value written exactly."""
    return "[" + ",".join(repr(x) for x in np.asarray(v, dtype=np.float32).tolist()) + "]"


def _payload(p) -> dict:
    return dict(json.loads(p) if isinstance(p, str) else (p or {}))


def pg_read(vs, filters: dict, page: int) -> list[Point]:
    """Every row matching ``filters`` in id order, through one server-side cursor."""
    where, params = _where(filters)
    out: list[Point] = []
    with _connection(vs) as conn:
        cur = conn.cursor(name="memforest_read")
        try:
            cur.itersize = page
            cur.execute(f"SELECT id::text, vector::text, payload FROM {_table(vs)}{where} ORDER BY id", params)
            while True:
                rows = cur.fetchmany(page)
                for i, v, p in rows:
                    if v is None:
                        raise ValueError(f"memory {i} has no vector in table {vs.collection_name!r}")
                    out.append(Point(i, _vector(v), _payload(p)))
                if len(rows) < page:
                    return out
        finally:
            cur.close()


def pg_read_ids(vs, ids: list[str], page: int) -> dict[str, Point]:
    out: dict[str, Point] = {}
    with _connection(vs) as conn:
        cur = conn.cursor()
        for lo in range(0, len(ids), page):
            cur.execute(f"SELECT id::text, vector::text, payload FROM {_table(vs)} WHERE id = ANY(%s::uuid[])",
                        (list(ids[lo:lo + page]),))
            for i, v, p in cur.fetchall():
                out[i] = Point(i, _vector(v), _payload(p))
        cur.close()
    return out


def pg_write(vs, points: list[Point], batch: int = 256) -> None:
    """Insert ``points`` with their ids; a row already there is overwritten (vector and payload)."""
    sql = (f"INSERT INTO {_table(vs)} (id, vector, payload) SELECT i::uuid, v::vector, p::jsonb "
           "FROM unnest(%s::text[], %s::text[], %s::text[]) AS u(i, v, p) "
           "ON CONFLICT (id) DO UPDATE SET vector = EXCLUDED.vector, payload = EXCLUDED.payload")
    with _connection(vs) as conn:
        cur = conn.cursor()
        for lo in range(0, len(points), batch):
            chunk = points[lo:lo + batch]
            cur.execute(sql, ([p.id for p in chunk], [vector_text(p.vector) for p in chunk],
                              [json.dumps(p.payload) for p in chunk]))
        cur.close()


def pg_delete(vs, ids: list[str], batch: int = 1024) -> None:
    with _connection(vs) as conn:
        cur = conn.cursor()
        for lo in range(0, len(ids), batch):
            cur.execute(f"DELETE FROM {_table(vs)} WHERE id = ANY(%s::uuid[])", (list(ids[lo:lo + batch]),))
        cur.close()


def pg_table_dim(cur, table: str) -> tuple[bool, int | None, list[str]]:
    """(the table exists with Mem0's columns, the dimension of its ``vector`` column, the tables
    of the ``public`` schema), read with the cursor ``cur``."""
    cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1")
    names = [r[0] for r in cur.fetchall()]
    if table not in names:
        return False, None, names
    cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "JOIN pg_class c ON a.attrelid = c.oid JOIN pg_namespace n ON c.relnamespace = n.oid "
                "WHERE n.nspname = 'public' AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped", (table,))
    cols = dict(cur.fetchall())
    if not {"id", "vector", "payload"} <= set(cols) or not str(cols["vector"]).startswith("vector"):
        raise ValueError(f"vector_store.config.collection_name must name a Mem0 pgvector table (columns id, vector, "
                         f"payload), got {table!r} with columns {sorted(cols)}")
    t = str(cols["vector"])
    return True, int(t[t.index("(") + 1:-1]) if "(" in t else None, names
