"""JSON Lines store files (the layout is in :mod:`.io`): one JSON object per line, an optional
header line recording the embedder, blank lines skipped; a ``.json`` file holding one JSON
array of such objects is read too. Every problem names the path and the line."""
from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import numpy as np
import torch

from .codes import VECTOR_CODES, int8_codes
from .event_trees import event_trees_json
from .keys import keys_rule_from_json, keys_rule_json
from .keys_io import keys_records, keys_rule_of
from .layout import HEADER_KEY, REQUIRED_COLUMNS, TREE_COLUMN
from .memory_store import DEFAULT_TENANT, MemoryStore

__all__ = ["read_jsonl_columns", "select_tenants", "iter_jsonl_objects", "write_jsonl", "header_forest"]


def _items(path: str):
    """``(where, record)`` of a JSON Lines file, or of a ``.json`` file holding one array."""
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf").lstrip()
    items = _read_json_array(path) if head.startswith(b"[") else None
    return _iter_jsonl(path) if items is None else items


def read_jsonl_columns(path: str) -> tuple[dict, str | None]:
    items = _items(path)
    file_embedder = trees_json = keys_rule = None
    codes = "float32"
    ids, texts, stamps, embs, tenants, sources, metas, trees, keys, key_src = [], [], [], [], [], [], [], [], [], []
    emb_where: tuple[str, Any] | None = None  # where the first embedding / missing one was
    first_dim: tuple[int, Any] | None = None
    n_with = n_without = 0
    first = True
    for where, rec in items:
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: {where} must be a JSON object, got {type(rec).__name__}: {short_repr(rec)}")
        if first and HEADER_KEY in rec:
            first = False
            file_embedder, trees_json, keys_rule, codes = _header(rec[HEADER_KEY], path, where)
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
                raise ValueError(f"{path}: {where}: embedding of node {node!r} must be a list of numbers, "
                                 f"got {short_repr(e)}")
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
        trees.append(_tree(rec.get(TREE_COLUMN), node, path, where))
        keys.append(rec.get("keys"))
        key_src.append(rec.get("key_sources"))
    if n_with and first_dim[0] == 0:
        raise ValueError(f"{path}: embeddings must have dimension > 0, got 0")
    emb = np.asarray(embs, dtype=np.float32) if n_with else None
    cols = {"id": ids, "text": texts, "timestamp": stamps, "embedding": emb,
            "tenant": tenants, "sources": sources, "metadata": metas,
            "tree": trees if any(t is not None for t in trees) else None, "event_trees": trees_json,
            "keys": keys if any(k is not None for k in keys) else None,
            "key_sources": key_src if any(k is not None for k in key_src) else None, "keys_rule": keys_rule,
            "vector_codes": codes}
    return cols, file_embedder


def _header(hdr: Any, path: str, where: str) -> tuple:
    """(embedder, event trees JSON, keys rule JSON, vector codes) of the header line."""
    if not isinstance(hdr, dict):
        raise ValueError(f"{path}: {where}: header {HEADER_KEY!r} must be a JSON object, got {short_repr(hdr)}")
    name = hdr.get("embedder")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"{path}: {where}: header embedder must be a string, got {short_repr(name)}")
    codes = hdr.get("vectors", "float32")
    if codes not in VECTOR_CODES:
        raise ValueError(f"{path}: {where}: header vectors must be one of {list(VECTOR_CODES)}, "
                         f"got {short_repr(codes)}")
    return (name, json.dumps(hdr["forest"]) if hdr.get("forest") is not None else None,
            json.dumps(hdr["keys"]) if hdr.get("keys") is not None else None, codes)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_in(v: Any) -> re.Match | None:
    """The first lone surrogate in a record's value (strings, list items, keys and values)."""
    if isinstance(v, str):
        return _SURROGATE.search(v)
    items = [x for kv in v.items() for x in kv] if isinstance(v, dict) else v if isinstance(v, list) else []
    return next((m for m in map(_surrogate_in, items) if m is not None), None)


def lone_surrogate(path: str) -> str | None:
    """Where the JSON Lines store ``path`` holds a lone surrogate (a ``\\ud800`` escape without its
    pair: JSON reads it, UTF-8 cannot hold it), as ``"line N: FIELD of node ID ..."``; ``None``
    when it holds none."""
    for where, rec in _items(path):
        if not isinstance(rec, dict) or HEADER_KEY in rec:
            continue
        for field in ("id", "text", "tenant", "sources", "metadata"):
            m = _surrogate_in(rec.get(field))
            if m is not None:
                return (f"{where}: {field} of node {short_repr(rec.get('id'))} must be Unicode text, got a lone "
                        f"surrogate {m.group()!r} (half of a UTF-16 pair) at character {m.start()}")
    return None


def _tree(v: Any, node: Any, path: str, where: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{path}: {where}: tree of node {node!r} must be an integer or null, got {short_repr(v)}")
    if v < 0:
        raise ValueError(f"{path}: {where}: tree of node {node!r} must be an integer >= 0 or null (a node not placed "
                         f"yet), got {v}")
    return v


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
            raise ValueError(f"{path}: {where} must be a JSON object, got {type(rec).__name__}: {short_repr(rec)}")
        yield where, rec


def header_keys_rule(path: str) -> dict | None:
    """The keys' rule a JSON Lines store records in its header; the default rule when it has
    keys and no header says (:func:`~.keys_io.keys_rule_of`); ``None`` without keys."""
    first = True
    for where, rec in iter_jsonl_objects(path):
        if first and isinstance(rec, dict) and isinstance(rec.get(HEADER_KEY), dict):
            rule = rec[HEADER_KEY].get("keys")
            if rule is not None:
                return keys_rule_from_json(json.dumps(rule), f"{path}: {where}")
        elif isinstance(rec, dict) and rec.get("keys") is not None:
            return keys_rule_of(None, None, path)
        first = False
    return None


def header_forest(path: str) -> str | None:
    """The event trees JSON a JSON Lines store's header records (``None``: no header, or none
    there), read from its first line only."""
    with open(path, "rb") as f:
        line = f.readline().lstrip(b"\xef\xbb\xbf")
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    hdr = rec.get(HEADER_KEY) if isinstance(rec, dict) else None
    return json.dumps(hdr["forest"]) if isinstance(hdr, dict) and hdr.get("forest") is not None else None


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


def short_repr(v: Any, limit: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def select_tenants(cols: dict, tenants: str | list[str], path: str) -> dict:
    """Keep only the rows of ``tenants`` (JSONL columns: Python lists)."""
    want = [tenants] if isinstance(tenants, str) else list(tenants)
    n = len(cols["id"])
    raw = cols["tenant"] if cols["tenant"] is not None else [None] * n
    have = [DEFAULT_TENANT if t is None or (isinstance(t, float) and t != t) else str(t) for t in raw]
    names = list(dict.fromkeys(have))
    for t in want:
        if t not in names:
            raise ValueError(f"{path}: tenant must be one of {names}, got {t!r}")
    keep = [j for j, t in enumerate(have) if t in set(want)]
    out = {k: (v if k in ("event_trees", "keys_rule", "vector_codes") or v is None else (v[keep] if isinstance(v,
                                                                                np.ndarray) else [v[j] for j in keep]))
           for k, v in cols.items()}
    return out


def _dumps(v: Any, what: str, node_id: str) -> str:
    try:
        return json.dumps(v, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} of node {node_id!r} cannot be written as JSON: {e}") from None


def iso_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat()


def write_jsonl(store: MemoryStore, f, *, iso: bool = False, block: int = 1 << 12) -> None:
    """One JSON object per line, ``block`` rows at a time (never a dict per node for the whole
    store)."""
    header = {"embedder": str(store.embedder)} if store.embedder is not None else {}
    if store.event_trees is not None:  # compact's state (:mod:`.event_trees`): the header's "forest", a "tree" per node
        header["forest"] = json.loads(event_trees_json(store.event_trees, store.tenant_table))
    if store.keys is not None:  # what merged nodes are searched by (:mod:`.keys`): the rule, and per node its keys
        header["keys"] = json.loads(keys_rule_json(store.keys))
    int8 = store.vector_codes == "int8"
    if int8:  # vectors as int8 codes (:mod:`.codes`): short integers
        header["vectors"] = "int8"
    if header:
        f.write(json.dumps({HEADER_KEY: header}, ensure_ascii=False).encode("utf-8"))
        f.write(b"\n")
    ids, texts, tenants, sources, metas = store.ids, store.texts, store.tenants, store.sources, store.metadata
    trees = store.event_trees.tree.tolist() if store.event_trees is not None else None
    for lo in range(0, len(store), block):
        hi = min(len(store), lo + block)
        emb = int8_codes(store.embeddings[lo:hi]) if int8 else \
            store.embeddings[lo:hi].detach().to("cpu", torch.float32).numpy()
        ts = store.timestamps[lo:hi].detach().to("cpu").tolist()
        if iso:
            ts = [iso_time(t) for t in ts]
        buf = [_dumps({"id": i, "text": t, "timestamp": s_, "tenant": ten, "sources": src, "metadata": m,
                       "embedding": e.tolist()}, "record", i)
               for i, t, s_, ten, src, m, e in zip(ids[lo:hi], texts[lo:hi], ts, tenants[lo:hi], sources[lo:hi],
                                                    metas[lo:hi], emb)]
        if trees is not None:
            buf = [b[:-1] + f', "{TREE_COLUMN}": {"null" if t < 0 else t}}}' for b, t in zip(buf, trees[lo:hi])]
        if store.keys is not None:
            buf = [b if v is None else b[:-1] + ", " + json.dumps({"keys": v, "key_sources": ks})[1:]
                   for b, (v, ks) in zip(buf, keys_records(store.keys, lo, hi, store.vector_codes))]
        f.write(("\n".join(buf) + "\n").encode("utf-8"))
