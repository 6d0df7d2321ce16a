"""The records of a store file's inbox: memories added since the last compaction.

The inbox is ``STORE.inbox.jsonl`` and the files a compaction took from it
(:mod:`.inbox_files`, which says how a compaction takes them without losing an append).
The protocol of its lines (docs/compaction.md, "The inbox"):

- one JSON object per line, in the store's record layout; a record is complete when its line
  ends with a newline. Blank lines are ignored.
- a last line without its newline is a record still being written (or a torn write): it is
  left in its file for the next run, and reported (``incomplete``).
- a line that is not one JSON object (bad JSON, two records glued on one line, an array), a
  record the store's layout refuses, or an id twice in the inbox refuses the whole
  compaction, naming the file, the line and the reason: nothing is folded in.
- a record without ``tenant`` belongs to the store's only tenant; with several tenants it is
  refused.
- a record whose id the store already holds is counted (``known``) and not folded again when
  the store's node has the same text; a node with other text refuses the compaction, unless
  ``replace``: the record then replaces that unmerged node. An id that is an original inside
  a merged node refuses it, with or without ``replace`` (that text is gone: nothing to compare,
  and nothing replaces part of a merged node). A record the store already folded from a taken
  file is never read again (:mod:`.inbox_files`: the store records what it folded).
- a record whose ``sources`` name an original the store holds is refused (every original is
  in exactly one node).
- a record's fields are the store's record layout (``id``, ``text``, ``timestamp``,
  ``tenant``, ``embedding``, ``sources``, ``metadata``): ``tree``, ``keys`` or ``key_sources``
  (made by the compaction) or any other field refuses it, never dropped without a word; a
  ``tenant`` must be a string (``123`` is not the tenant ``"123"``); an ``embedding`` a list
  of finite numbers, of the same length on every line (the line that differs is named).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..store.memory_store import MemoryStore
from .errors import OptionError
from .inbox_files import folded_prefix, inbox_files, inbox_path

__all__ = ["Inbox", "read_inbox", "StoreIds", "ids_in", "drop_rows"]

_FIELDS = {"id", "text", "timestamp", "tenant", "embedding", "sources", "metadata"}  # a record's fields
_MADE = {"tree", "keys", "key_sources"}  # what compaction makes: never in a new record


@dataclass
class StoreIds:
    """What a store holds of some wanted ids. Per id that names a node: ``row`` (its row),
    ``tenant``, ``text`` (filled by the caller from ``row``); ``merged``: those nodes that are
    merged; ``inside``: ids found inside a merged node's sources, with that node's id."""

    row: dict = field(default_factory=dict)
    tenant: dict = field(default_factory=dict)
    text: dict = field(default_factory=dict)
    merged: set = field(default_factory=set)
    inside: dict = field(default_factory=dict)

    def add(self, ids, sources, tenant_of, wanted: pa.Array, offset: int = 0) -> None:
        """Look ``wanted`` (Arrow large strings) up in one batch of a store's columns (Arrow
        arrays: ids, sources; ``tenant_of(j)``: row j's tenant) whose first row is the
        store's row ``offset``."""
        at = pc.index_in(wanted, value_set=ids.cast(pa.large_string())).to_pylist()
        for w, j in zip(wanted.to_pylist(), at):
            if j is not None:
                self.row[w], self.tenant[w] = offset + j, tenant_of(j)
                if sources[j].as_py() != [w]:
                    self.merged.add(w)
        flat = sources.flatten().cast(pa.large_string())
        hit = pc.is_in(wanted, value_set=flat).to_numpy(zero_copy_only=False)
        found = [w for w, h in zip(wanted.to_pylist(), hit) if h and w not in self.row]
        if found:
            at = pc.index_in(pa.array(found, type=pa.large_string()), value_set=flat).to_numpy(zero_copy_only=False)
            parent = pc.list_parent_indices(sources).to_numpy(zero_copy_only=False)
            self.inside.update((w, ids[int(parent[a])].as_py()) for w, a in zip(found, at))

    def held(self, x: str) -> bool:
        return x in self.row or x in self.inside


@dataclass
class Inbox:
    """The complete records of a store's inbox files (``records``, each read at ``where[j]``:
    its file and line), the bytes read of each file up to its last newline (``read``), and what
    was not folded: ``incomplete`` (the files whose last line has no newline yet) and ``known``
    (records whose id the store already holds)."""

    records: list[dict]
    where: list[tuple[str, int]]
    read: dict[str, bytes] = field(default_factory=dict)
    incomplete: list[str] = field(default_factory=list)
    known: int = 0
    replaced: list[str] = field(default_factory=list)

    def _where(self, j: int) -> str:
        path, line = self.where[j]
        return f"{path}, line {line}"

    def set_tenants(self, tenants: list[str]) -> None:
        """Give a record without ``tenant`` the store's only tenant; refuse it otherwise."""
        for j, r in enumerate(self.records):
            if r.get("tenant") is None:
                if len(tenants) != 1:
                    raise ValueError(f"{self._where(j)}: tenant of record {r['id']!r} must be given when the store "
                                     f"has {len(tenants)} tenants ({_short(tenants)}), got none")
                r["tenant"] = tenants[0]

    def wanted(self) -> pa.Array:
        """Every id the store must be asked about: the records' ids and their sources."""
        ids = [str(r["id"]) for r in self.records]
        ids += [str(x) for r in self.records for x in (r.get("sources") or []) if isinstance(x, str)]
        return pa.array(list(dict.fromkeys(ids)), type=pa.large_string())

    def settle(self, held: StoreIds, *, replace: bool = False) -> None:
        """Drop the records the store already holds (counted in ``known``); refuse a record
        whose id names a node with other text (``replace``: it replaces an unmerged node) and
        one whose ``sources`` name an original the store holds."""
        keep = []
        for j, r in enumerate(self.records):
            i = str(r["id"])
            if i in held.row:
                if held.text[i] == r.get("text"):
                    self.known += 1
                    continue
                if not replace or i in held.merged:
                    rule = ("that node is a merged node, which nothing replaces (its originals would be lost): give "
                            "the record a new id" if i in held.merged else
                            "pass {replace_changed} to replace the store's node with it")
                    raise OptionError(f"{self._where(j)}: text of record {i!r} must equal the text of the store's "
                                      f"node {i!r} (the id is taken), got other text; " + rule)
                if held.tenant[i] != r["tenant"]:
                    raise ValueError(f"{self._where(j)}: tenant of record {i!r} must be the tenant of the node it "
                                     f"replaces ({held.tenant[i]!r}), got {r['tenant']!r}")
                self.replaced.append(i)
            elif i in held.inside:
                raise OptionError(f"{self._where(j)}: id of record {i!r} must be new to the store, got an original "
                                  f"inside the merged node {held.inside[i]!r}, whose own text is gone (it cannot be "
                                  "compared, and nothing replaces part of a merged node): give the record a new id, "
                                  "or remove the line if it is a memory the store already holds")
            for x in r.get("sources") or []:
                if isinstance(x, str) and x != i and held.held(x):
                    raise ValueError(f"{self._where(j)}: sources of record {i!r} must not name a memory the store "
                                     f"holds, got {x!r} (every original is in exactly one node)")
            keep.append(j)
        self.records = [self.records[j] for j in keep]
        self.where = [self.where[j] for j in keep]

    def store(self, embedder, dim: int | None = None) -> MemoryStore | None:
        """The records as a store (embedded with ``embedder`` when they have no vectors), or
        ``None`` when none is left. An error names the file and the line of the record."""
        if not self.records:
            return None
        if getattr(embedder, "name", None) is None and getattr(embedder, "dim", 0) == 0:
            for j, r in enumerate(self.records):
                if r.get("embedding") is None:
                    raise OptionError(f"{self._where(j)}: record {r['id']!r} has no embedding, and the store records "
                                      "no model to embed it: pass {embedder=default} or PATH, or give its embedding")
        try:
            st = MemoryStore.from_records(self.records, embedder=embedder)
        except ValueError as e:
            raise ValueError(f"{self._locate(str(e))}: {e}") from None
        if dim is not None and st.dim != dim:
            j = next((j for j, r in enumerate(self.records) if r.get("embedding") is not None
                      and len(r["embedding"]) != dim), 0)
            raise ValueError(f"{self._where(j)}: embedding of record {self.records[j]['id']!r} must have the store's "
                             f"dimension ({dim}), got {st.dim}")
        return st

    def _locate(self, message: str) -> str:
        """The file and line of the record a store error names (by its id), else the file."""
        for j, r in enumerate(self.records):
            if repr(r["id"]) in message or repr(str(r["id"])) in message:
                return self._where(j)
        return ", ".join(dict.fromkeys(p for p, _ in self.where))


def _short(names: list[str], n: int = 5) -> str:
    return ", ".join(repr(x) for x in names[:n]) + (", ..." if len(names) > n else "")


def _parse(raw: bytes, ln: int, path: str) -> dict | None:
    """One line of the inbox: its record, ``None`` for a blank line."""
    if not raw.strip():
        return None
    try:
        rec = json.loads(raw)
    except RecursionError:
        raise ValueError(f"{path}, line {ln}: a record must be a flat JSON object, got nesting too deep to read; "
                         "nothing was folded in") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}, line {ln}: a record must be UTF-8 text, got bytes that are not ({e.reason} at "
                         f"byte {e.start}); nothing was folded in") from None
    except json.JSONDecodeError as e:
        glued = e.msg == "Extra data"
        why = ("two records glued on one line (each record must end with a newline)" if glued
               else f"bad JSON ({e.msg}, column {e.colno})")
        raise ValueError(f"{path}, line {ln}: a line must hold one JSON record, got {why}; fix or remove the line "
                         "(nothing was folded in)") from None
    if not isinstance(rec, dict):
        raise ValueError(f"{path}, line {ln}: a record must be a JSON object, got {type(rec).__name__}; fix or "
                         "remove the line (nothing was folded in)")
    for key in ("id", "text", "timestamp"):
        if key not in rec:
            raise ValueError(f"{path}, line {ln}: a record must have {key!r}, got the keys {sorted(rec)}; fix or "
                             "remove the line (nothing was folded in)")
    if not isinstance(rec["id"], str) or not rec["id"]:
        raise ValueError(f"{path}, line {ln}: id must be a non-empty string, got {rec['id']!r}")
    made = sorted(set(rec) & _MADE)
    if made:
        raise ValueError(f"{path}, line {ln}: record {rec['id']!r} must not carry {made[0]!r} (a new memory's "
                         f"{'key vectors are' if made[0] != 'tree' else 'tree is'} made by the compaction), got "
                         f"{_shown(rec[made[0]])}; remove the field (nothing was folded in)")
    other = sorted(set(rec) - _FIELDS)
    if other:
        raise ValueError(f"{path}, line {ln}: the fields of record {rec['id']!r} must be among {sorted(_FIELDS)}, "
                         f"got {other[0]!r} (put anything else under metadata); nothing was folded in")
    if rec.get("tenant") is not None and (not isinstance(rec["tenant"], str) or not rec["tenant"]):
        raise ValueError(f"{path}, line {ln}: tenant of record {rec['id']!r} must be a non-empty string, got "
                         f"{_shown(rec['tenant'])}; nothing was folded in")
    e = rec.get("embedding")
    if e is not None and (not isinstance(e, list) or not e or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in e)):
        raise ValueError(f"{path}, line {ln}: embedding of record {rec['id']!r} must be a list of finite numbers, got "
                         f"{_shown(e)}; nothing was folded in")
    return rec


def _shown(value) -> str:
    kind = {str: "a string", list: "a list", dict: "an object", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)
    r = repr(value)
    return f"{kind} {r if len(r) <= 60 else r[:57] + '...'}"


def read_inbox(store: str | os.PathLike, folded: list[dict] | tuple = ()) -> Inbox:
    """Parse every inbox file of the store file ``store`` (:func:`~.inbox_files.inbox_files`:
    the taken files, oldest first, then the live inbox) by the protocol (module docstring).
    ``folded``: the store's record of the taken bytes it already holds; those bytes are
    skipped (a run killed after writing the store, before releasing them). No file: an empty
    inbox."""
    box = Inbox([], [])
    first: dict = {}  # id -> (file, line) where it was first seen
    dim = None  # (values per embedding, where the first one was)
    for path in inbox_files(store):
        if not os.path.isfile(path):
            raise ValueError(f"the inbox {path!r} must be a file of JSON lines, got a folder or another kind of file")
        with open(path, "rb") as f:
            data = f.read()
        start = folded_prefix(path, data, list(folded)) if path != inbox_path(store) else 0
        good = data.rfind(b"\n") + 1
        line0 = data[:start].count(b"\n")
        for ln, raw in enumerate(data[start:good].split(b"\n")[:-1], line0 + 1):
            rec = _parse(raw, ln, path)
            if rec is None:
                continue
            if rec["id"] in first:
                at = first[rec["id"]]
                seen = f"line {at[1]}" if at[0] == path else f"{at[0]}, line {at[1]}"
                raise ValueError(f"{path}, line {ln}: id must be new to the inbox, got {rec['id']!r}, already on "
                                 f"{seen}; nothing was folded in")
            first[rec["id"]] = (path, ln)
            if rec.get("embedding") is not None:
                if dim is None:
                    dim = (len(rec["embedding"]), path, ln)
                elif len(rec["embedding"]) != dim[0]:
                    seen = f"line {dim[2]}" if dim[1] == path else f"{dim[1]}, line {dim[2]}"
                    raise ValueError(f"{path}, line {ln}: embedding of record {rec['id']!r} must have {dim[0]} values "
                                     f"like the record on {seen}, got {len(rec['embedding'])}; nothing was folded in")
            box.records.append(rec)
            box.where.append((path, ln))
        box.read[path] = data[:max(good, start)]
        if data[max(good, start):].strip():
            box.incomplete.append(path)
    return box


def ids_in(store: MemoryStore, wanted: pa.Array) -> StoreIds:
    """:class:`StoreIds` of ``wanted`` in a store held in memory."""
    held = StoreIds()
    cols = store.columns()
    names, codes = store.tenant_table, store.tenant_codes_np
    held.add(cols["ids"], cols["sources"], lambda j: names[codes[j]], wanted)
    held.text = {w: cols["texts"][r].as_py() for w, r in held.row.items()}
    return held


def drop_rows(store: MemoryStore, ids: list[str]) -> MemoryStore:
    """``store`` without the nodes ``ids`` (replaced by inbox records)."""
    gone = pc.is_in(store.columns()["ids"], value_set=pa.array(ids, type=pa.large_string()))
    return store.take(np.flatnonzero(~gone.to_numpy(zero_copy_only=False)))
