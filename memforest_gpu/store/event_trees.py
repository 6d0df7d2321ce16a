"""A store's event trees, kept with it so that ``compact`` can place new memories into them.

Per node, ``tree``: its tree, a tenant-local id (``-1``: not placed yet, i.e. new since the
tenant's last compaction, or never partitioned). Per tenant, a :class:`TenantTrees`: the
centre of each tree as one *original* id inside the centre node (sources never split, so
the live node holding that id is the centre however often it was merged), the tenant's
node count at its last full partition, the nodes placed into its trees since then, and
which partition config built them.

In files (:mod:`.parquet`, :mod:`.jsonl`): a nullable integer column / key ``tree`` and one
JSON object (Parquet schema metadata ``memforest.forest``; the JSON Lines header's
``"forest"``, the keys stores have always used)::

    {"version": 1, "configs": [{...PartitionConfig fields...}, ...],
     "tenants": {"alice": {"c": ["a-17", "a-3"], "p": 812, "a": 40, "k": 0}, ...}}

``c``: centre ids by tree id; ``p``: nodes at the last full partition; ``a``: nodes placed
since; ``k``: index into ``configs``; ``r`` (optional): each tree's radius, the least cosine
of a member to its centre (kept so that placing a few memories does not read every member).
Tenants are written in sorted order, so a state split over files (``--memory-budget``
parts) joins back to the same text.

``"inbox"`` (optional): the inbox files a compaction folded into the store, each
``{"file": name, "bytes": n, "sha256": hex}`` (the first ``n`` bytes of that taken file, and
their digest), so that a run killed before it released them never folds them twice
(:mod:`memforest_gpu.runs.inbox_files`).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["EventTrees", "TenantTrees", "EVENT_TREES_VERSION", "event_trees_json", "event_trees_from_json",
           "folded_from_json", "tree_column", "tree_from_column", "NegativeTreeError"]

EVENT_TREES_VERSION = 1

log = logging.getLogger("memforest_gpu")


@dataclass
class TenantTrees:
    """One tenant's trees: ``centres[t]`` an original id inside tree t's centre node."""

    centres: list[str]
    partitioned: int  # the tenant's nodes when it was last partitioned in full
    arrived: int = 0  # nodes placed into its trees since then
    config: dict = field(default_factory=dict)  # the PartitionConfig fields that built the trees
    radius: list[float] | None = None  # per tree: the least cosine of a member to its centre (None: not known)

    @property
    def n_trees(self) -> int:
        return len(self.centres)


@dataclass
class EventTrees:
    """Tree per node and trees per tenant. Shape: tree (N,) int64, -1 = not placed."""

    tree: np.ndarray
    tenants: dict[str, TenantTrees] = field(default_factory=dict)
    folded: list[dict] = field(default_factory=list)  # the inbox files this store folded in (module docstring)

    def take(self, idx: np.ndarray, names: list[str]) -> EventTrees:
        """The rows ``idx``, with the state of the tenants ``names`` (those present)."""
        return EventTrees(self.tree[idx], {t: self.tenants[t] for t in names if t in self.tenants})

    @classmethod
    def empty(cls, n: int) -> EventTrees:
        return cls(np.full(n, -1, dtype=np.int64), {})


def event_trees_json(trees: EventTrees, names: list[str]) -> str:
    """The state of the tenants ``names`` (those that have one) as the files' JSON text."""
    configs: list[dict] = []
    keys: dict[str, int] = {}
    tenants = {}
    for t in sorted(n for n in names if n in trees.tenants):
        s = trees.tenants[t]
        key = json.dumps(s.config, sort_keys=True)
        if key not in keys:
            keys[key] = len(configs)
            configs.append(s.config)
        tenants[t] = {"c": list(s.centres), "p": int(s.partitioned), "a": int(s.arrived), "k": keys[key]}
        if s.radius is not None:
            tenants[t]["r"] = [float(x) for x in s.radius]
    out = {"version": EVENT_TREES_VERSION, "configs": configs, "tenants": tenants}
    if trees.folded:
        out["inbox"] = trees.folded
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def event_trees_from_json(text: str | bytes | None, where: str) -> dict[str, TenantTrees]:
    """Per-tenant states from the files' JSON text (``None``: none). A state of another
    version is not used, with one warning (its tenants are partitioned again in full at their
    next compaction). A bad state (``p: -5``, a count that is not an integer >= 0, ...) is
    refused naming the file, the part of the state and the rule."""
    if text is None:
        return {}
    what = f"{where}: the event trees recorded in the store (memforest.forest)"
    try:
        d = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{what} must be JSON, got bad JSON ({e})") from None
    _need(isinstance(d, dict), what, "a JSON object with version, configs and tenants", d)
    if d.get("version") != EVENT_TREES_VERSION:
        log.warning("%s are of version %r, this memforest reads version %d: they are not used, and the store's "
                    "tenants are partitioned again in full at their next compaction", what, d.get("version"),
                    EVENT_TREES_VERSION)
        return {}
    configs, tenants = d.get("configs"), d.get("tenants")
    _need(isinstance(configs, list) and all(isinstance(c, dict) for c in configs), f"{what}: configs",
          "a list of objects", configs)
    _need(isinstance(tenants, dict), f"{what}: tenants", "an object (tenant -> state)", tenants)
    out = {}
    for t, s in tenants.items():
        rule = "an object with c (centre ids), p, a (integers >= 0) and k (an index into configs)"
        _need(isinstance(s, dict) and isinstance(s.get("c"), list) and all(_count(s.get(x)) for x in "pak"),
              f"{what}: tenant {t!r}", rule, s)
        _need(0 <= s["k"] < len(configs), f"{what}: tenant {t!r}'s k", f"an index into configs (< {len(configs)})",
              s["k"])
        r = s.get("r")
        _need(r is None or (isinstance(r, list) and len(r) == len(s["c"]) and all(isinstance(x, (int, float))
                                                                                   for x in r)),
              f"{what}: tenant {t!r}'s r", "a list of one number per centre", r)
        out[str(t)] = TenantTrees([str(c) for c in s["c"]], s["p"], s["a"], dict(configs[s["k"]]),
                                  [float(x) for x in r] if r is not None else None)
    return out


def folded_from_json(text: str | bytes | None, where: str) -> list[dict]:
    """The ``"inbox"`` record of the files' JSON text (module docstring): the inbox files the
    store folded in; ``[]`` without one. A record of another shape is refused naming the file."""
    if text is None:
        return []
    try:
        d = json.loads(text)
    except ValueError:
        return []  # event_trees_from_json refuses it, naming the file
    value = d.get("inbox") if isinstance(d, dict) else None
    if value is None:
        return []
    _need(isinstance(value, list) and all(
        isinstance(e, dict) and isinstance(e.get("file"), str) and isinstance(e.get("sha256"), str)
        and _count(e.get("bytes")) for e in value),
        f"{where}: the inbox files recorded in the store (memforest.forest)",
        "a list of {file, bytes, sha256} objects", value)
    return [{"file": e["file"], "bytes": e["bytes"], "sha256": e["sha256"]} for e in value]


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _need(ok: bool, what: str, rule: str, value) -> None:
    if not ok:
        shown = repr(value)
        raise ValueError(f"{what} must be {rule}, got {shown if len(shown) <= 80 else shown[:77] + '...'}")


def tree_column(tree: np.ndarray):
    """The ``tree`` column: an Arrow int64 array, null where not placed."""

    return pa.array(tree, type=pa.int64(), mask=tree < 0)


class NegativeTreeError(ValueError):
    """A ``tree`` value below 0: a node is in tree 0, 1, ... of its tenant, or in none (null)."""

    def __init__(self, row: int, value: int):
        super().__init__(f"tree must be an integer >= 0 or null (a node not placed yet), got {value}")
        self.row, self.value = row, value


def tree_from_column(col, n: int) -> np.ndarray:
    """(n,) int64 tree ids from an Arrow / list column (null: -1), or all -1. A negative value
    raises :class:`NegativeTreeError` (its ``row`` in ``col``)."""

    if col is None:
        return np.full(n, -1, dtype=np.int64)
    if not isinstance(col, (pa.Array, pa.ChunkedArray)):
        col = pa.array([None if v is None else int(v) for v in col], type=pa.int64())
    vals = pc.cast(col, pa.int64())
    out = vals.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    neg = np.flatnonzero((out < 0) & vals.is_valid().to_numpy(zero_copy_only=False))
    if neg.size:
        raise NegativeTreeError(int(neg[0]), int(out[neg[0]]))
    return out
