"""The memory store: a validated column table with embeddings kept as one tensor.

Shape vocabulary used across the package: N nodes, D embedding dim, K clusters,
T trees, E edges, Q queries, C candidates.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..device import resolve_device
from .codes import check_vector_codes
from .column_checks import (
    DEFAULT_TENANT,
    _check_ids,
    _check_metadata,
    _check_sources,
    _check_tenants,
    _check_texts,
    _check_timestamps,
)
from .columns import (
    ArrowView,
    ColumnView,
    MetadataView,
    TenantView,
    _encode_tenants,
    _identity_sources,
    _large_str,
    compact_codes,
    dumps_meta,
)
from .event_trees import EventTrees
from .keys import NodeKeys
from .timeutil import format_date

__all__ = ["DEFAULT_TENANT", "ArrowView", "ColumnView", "MemoryStore", "MetadataView", "TenantView",
           "as_embedding_tensor"]



def as_embedding_tensor(x: Any, *, device: torch.device | None = None, what: str = "embeddings") -> torch.Tensor:
    """Turn a torch tensor, numpy array, CuPy array (zero-copy via DLPack) or nested list
    into a float32 (N, D) tensor. Nothing is copied when the input already is one on `device`.

    Shape: (N, D) -> (N, D)
    """
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, np.ndarray):
        t = torch.from_numpy(x)
    elif hasattr(x, "__dlpack__") and type(x).__module__.split(".")[0] in ("cupy", "jax", "jaxlib"):
        t = torch.from_dlpack(x)  # zero-copy on the array's own device
    elif isinstance(x, (list, tuple)) and x and all(isinstance(r, torch.Tensor) for r in x):
        dims = {tuple(r.shape) for r in x}
        if len(dims) > 1 or len(next(iter(dims))) != 1:
            raise ValueError(f"{what} must all be 1-D vectors of one dimension, got shapes {sorted(dims)}")
        t = torch.stack(list(x))
    elif isinstance(x, (list, tuple)):
        dims = {len(row) if isinstance(row, (list, tuple, np.ndarray)) else -1 for row in x}
        if len(dims) > 1:
            raise ValueError(f"{what} must all have the same dimension, got dimensions {sorted(dims)}")
        if dims == {-1}:
            raise ValueError(f"{what} must be a list of vectors, got a flat list")
        try:
            t = torch.tensor(np.asarray(x, dtype=np.float32))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{what} must be numeric vectors: {e}") from None
    elif hasattr(x, "__dlpack__"):
        t = torch.from_dlpack(x)
    else:
        raise ValueError(f"{what} must be a torch tensor, numpy/CuPy array or list of vectors, got {type(x).__name__}")
    if t.ndim != 2:
        raise ValueError(f"{what} must be 2-D (N, D), got shape {tuple(t.shape)}")
    if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"{what} must be floating point, got dtype {t.dtype}")
    if device is not None and t.device != device:
        t = t.to(device)
    return t.to(torch.float32)


def _normalise_checked(e: torch.Tensor, ids: Sequence[str], what: str = "embedding",
                       chunk: int = 4096) -> torch.Tensor:
    """``e`` with unit rows, checked finite and non-zero; a block of ``chunk`` rows at a time,
    so no float64 copy of the whole matrix is made. Rows are divided by their float64 norm
    only when some row is not already unit length (then every row is, as a new tensor).

    The check reads one float64 norm per row (a NaN or inf makes it non-finite; a float32 row
    cannot overflow it) in one pass; the division recomputes the norms as ``double().norm()``.

    Shape: (N, D) -> (N, D)
    """
    N = e.shape[0]
    norms = torch.empty(N, dtype=torch.float64, device=e.device)
    for c in range(0, N, chunk):
        norms[c:c + chunk] = torch.linalg.vector_norm(e[c:c + chunk], dim=1, dtype=torch.float64)
    finite = torch.isfinite(norms)
    if not bool(finite.all()):
        i = int((~finite).nonzero()[0])
        raise ValueError(f"{what} of node {ids[i]!r} must be finite, got NaN or inf")
    zero = norms <= 1e-12
    if bool(zero.any()):
        i = int(zero.nonzero()[0])
        raise ValueError(f"{what} of node {ids[i]!r} must have non-zero norm, got norm 0")
    if bool(((norms - 1.0).abs() <= 1e-6).all()):
        return e  # already unit length: keep the exact values (a load/save round trip is bit-exact)
    for c in range(0, N, chunk):
        norms[c:c + chunk] = e[c:c + chunk].double().norm(dim=1)
    out = torch.empty(e.shape, dtype=torch.float32, device=e.device)
    for c in range(0, N, chunk):
        out[c:c + chunk] = (e[c:c + chunk].double() / norms[c:c + chunk, None]).to(torch.float32)
    return out


@dataclass(init=False, repr=False, eq=False)
class MemoryStore:
    """A table of memory nodes, kept as columns. Build one with :meth:`from_columns` or
    :meth:`from_records` (they validate); the constructor only converts (no validation).

    Columns (read-only)
    - ids, texts: Arrow large_string arrays; ``store.ids`` / ``store.texts`` are read-only
      sequences of str over them
    - embeddings: tensor (N, D), L2-normalised, on any device (float32, or a storage dtype)
    - timestamps: float64 tensor (N,), epoch seconds, on the embeddings' device
    - tenants: integer codes ``tenant_codes`` (N,) int64 on the device (``tenant_codes_np``
      on the host) and the name table ``tenant_table`` (first appearance); nothing ever
      crosses a tenant; ``store.tenants`` is a sequence of names
    - sources: original ids each node stands for, an Arrow list<large_string> array; an
      original's is ``[its id]``
    - metadata: one JSON object per node kept as JSON text, parsed on access
    - embedder: name of the model that produced the embeddings, when known
    - time_format: ``"iso"`` when the timestamps came in as ISO 8601 strings (a JSONL
      file is then written back with ISO strings), else ``None`` (epoch numbers)
    - event_trees: the event trees ``compact`` keeps (:class:`~.event_trees.EventTrees`: tree
    per node,
      centres per tenant), or ``None`` for a store without them
    - keys: what merged nodes are searched by besides their text's vector
      (:class:`~.keys.NodeKeys`: key vectors per node with their sources, and the scoring rule),
      or ``None`` (every node searched by its text's vector)
    - vector_codes: how a file written from the store holds its vectors, ``"float32"`` or
      ``"int8"`` (:mod:`.codes`); a store read from a file keeps the file's
    """

    # the constructor's arguments, as dataclass fields (``dataclasses.replace(store, embedder=None)``
    # works); ids, texts, tenants, sources and metadata are read back through their views
    ids: ColumnView
    texts: ColumnView
    embeddings: torch.Tensor
    timestamps: torch.Tensor
    tenants: ColumnView
    sources: ColumnView
    metadata: ColumnView
    embedder: str | None
    time_format: str | None
    event_trees: EventTrees | None
    keys: NodeKeys | None
    vector_codes: str

    def __init__(self, ids, texts, embeddings: torch.Tensor, timestamps: torch.Tensor, tenants, sources=None,
                 metadata=None, embedder: str | None = None, time_format: str | None = None,
                 event_trees: EventTrees | None = None, keys: NodeKeys | None = None,
                 vector_codes: str = "float32"):
        self._ids = _large_str(ids)
        self._texts = _large_str(texts)
        self.embeddings = embeddings
        self.timestamps = timestamps
        self.tenant_table, self.tenant_codes_np = _encode_tenants(tenants)
        self.tenant_codes = torch.as_tensor(self.tenant_codes_np, dtype=torch.int64).to(embeddings.device)
        if sources is None:
            self._sources = _identity_sources(self._ids)
        elif isinstance(sources, ArrowView):
            self._sources = sources.arrow
        elif isinstance(sources, (pa.Array, pa.ChunkedArray)):
            self._sources = sources.combine_chunks() if isinstance(sources, pa.ChunkedArray) else sources
        else:
            self._sources = pa.array([list(s) for s in sources], type=pa.large_list(pa.large_string()))
        if metadata is None:
            self._meta = pa.array(np.full(len(self._ids), "{}", dtype=object), type=pa.large_string())
        elif isinstance(metadata, ArrowView):
            self._meta = metadata.arrow
        else:
            ids_ = self._ids
            self._meta = pa.array([dumps_meta(m, ids_[j].as_py()) for j, m in enumerate(metadata)],
                                  type=pa.large_string())
        self.embedder = embedder
        self.time_format = time_format
        if event_trees is not None and len(event_trees.tree) != len(self._ids):
            raise ValueError(f"event_trees.tree must have one tree id per node ({len(self._ids)}), "
                             f"got {len(event_trees.tree)}")
        self.event_trees = event_trees
        if keys is not None and len(keys) != len(self._ids):
            raise ValueError(f"keys must have one entry per node ({len(self._ids)}), got {len(keys)}")
        self.keys = keys
        check_vector_codes(vector_codes)
        self.vector_codes = vector_codes

    # ------------------------------------------------------------------ build
    @classmethod
    def from_columns(
        cls,
        *,
        ids: Sequence[Any],
        texts: Sequence[Any],
        timestamps: Sequence[Any] | torch.Tensor | np.ndarray,
        embeddings: Any = None,
        tenants: Sequence[Any] | None = None,
        sources: Sequence[Any] | None = None,
        metadata: Sequence[Any] | None = None,
        embedder: Any = None,
        device: torch.device | str | None = None,
    ) -> MemoryStore:
        """Validate columns and build a store. ``embeddings=None`` embeds ``texts`` with
        ``embedder`` (an :class:`~memforest_gpu.mergers.embedders.Embedder`).

        Columns may be Python sequences or Arrow arrays (``ids``, ``texts``, ``tenants``:
        strings; ``sources``: list of strings; ``metadata``: JSON text, null or ``""`` for
        ``{}``); Arrow columns are validated with vectorised kernels, not per node.

        Raises ``ValueError`` naming the first bad value (empty store, duplicate ids,
        non-finite/zero/mixed-dimension embeddings, unreadable timestamps, ...).
        """

        n = len(ids)
        if n == 0:
            raise ValueError("store must have at least one node, got 0 nodes")
        for name, col in (("texts", texts), ("timestamps", timestamps), ("tenants", tenants),
                          ("sources", sources), ("metadata", metadata)):
            if col is not None and len(col) != n:
                raise ValueError(f"column {name!r} must have one value per id ({n}), got {len(col)}")
        ids_ = _check_ids(ids)
        texts_ = _check_texts(texts, ids_)
        ts, time_format = _check_timestamps(timestamps, ids_)
        names, codes = _check_tenants(tenants, ids_)
        sources_ = _check_sources(sources, ids_)
        meta_ = _check_metadata(metadata, ids_)

        if embeddings is None:
            if embedder is None:
                raise ValueError("embeddings are missing and no embedder was given to compute them")
            dev = resolve_device(device)
            emb = as_embedding_tensor(embedder.embed(texts_.to_pylist()), device=dev, what="embedder output")
            embedder_name = embedder.name
        else:
            dev = resolve_device(device) if device is not None else None
            emb = as_embedding_tensor(embeddings, device=dev)
            if emb.shape[0] != n:
                raise ValueError(f"embeddings must have one row per id ({n}), got shape {tuple(emb.shape)}")
            embedder_name = embedder if isinstance(embedder, str) else getattr(embedder, "name", None)
        emb = _normalise_checked(emb, ArrowView(ids_))
        ts_t = torch.as_tensor(ts, dtype=torch.float64).to(emb.device)
        return cls(ids_, texts_, emb.contiguous(), ts_t, TenantView(names, codes), sources_, meta_,
                   embedder_name, time_format)

    @classmethod
    def from_records(cls, records: Iterable[dict], *, embedder=None, device=None) -> MemoryStore:
        """Build from dicts with keys id, text, timestamp and optional embedding, tenant,
        sources, metadata. A record missing a required key raises naming it."""
        recs = list(records)
        if not recs:
            raise ValueError("store must have at least one node, got 0 nodes")
        for j, r in enumerate(recs):
            if not isinstance(r, dict):
                raise ValueError(f"record {j} must be a JSON object, got {type(r).__name__}")
            for key in ("id", "text", "timestamp"):
                if key not in r:
                    raise ValueError(f"record {j} is missing required column {key!r}")
        has_emb = [r.get("embedding") is not None for r in recs]
        if any(has_emb) and not all(has_emb):
            j = has_emb.index(False)
            raise ValueError(f"embedding of node {recs[j]['id']!r} is missing while other nodes have one")
        return cls.from_columns(
            ids=[r["id"] for r in recs],
            texts=[r["text"] for r in recs],
            timestamps=[r["timestamp"] for r in recs],
            embeddings=[r["embedding"] for r in recs] if all(has_emb) else None,
            tenants=[r.get("tenant") for r in recs],
            sources=[r.get("sources") for r in recs],
            metadata=[r.get("metadata") for r in recs],
            embedder=embedder,
            device=device,
        )

    # ----------------------------------------------------------------- views
    @property
    def ids(self) -> ArrowView:
        return ArrowView(self._ids)

    @property
    def texts(self) -> ArrowView:
        return ArrowView(self._texts)

    @property
    def tenants(self) -> TenantView:
        return TenantView(self.tenant_table, self.tenant_codes_np)

    @property
    def sources(self) -> ArrowView:
        return ArrowView(self._sources)

    @property
    def metadata(self) -> MetadataView:
        return MetadataView(self._meta)

    def columns(self) -> dict:
        """The Arrow columns: ids, texts, sources (list<large_string>), metadata (JSON text)."""
        return {"ids": self._ids, "texts": self._texts, "sources": self._sources, "metadata": self._meta}

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    @property
    def device(self) -> torch.device:
        return self.embeddings.device

    def tenant_names(self) -> list[str]:
        """Tenants in order of first appearance."""
        return list(self.tenant_table)

    def tenant_index(self) -> tuple[list[str], torch.Tensor]:
        """(names, codes): codes (N,) int64 on the store's device, name order = first appearance."""
        return list(self.tenant_table), self.tenant_codes

    def take(self, index: Sequence[int] | torch.Tensor) -> MemoryStore:
        """A new store with the rows ``index`` (in that order). No validation is repeated."""

        if isinstance(index, torch.Tensor):
            idx = index.detach().cpu().numpy().astype(np.int64)
        else:
            idx = np.asarray(list(index) if not isinstance(index, np.ndarray) else index, dtype=np.int64)
        it = torch.as_tensor(idx, dtype=torch.int64, device=self.device)
        pi = pa.array(idx, type=pa.int64())
        names, codes = compact_codes(self.tenant_table, self.tenant_codes_np[idx])
        trees = self.event_trees.take(idx, names) if self.event_trees is not None else None
        keys = self.keys.take(idx) if self.keys is not None else None
        return MemoryStore(self._ids.take(pi), self._texts.take(pi), self.embeddings[it], self.timestamps[it],
                           TenantView(names, codes), self._sources.take(pi), ArrowView(self._meta.take(pi)),
                           self.embedder, self.time_format, trees, keys, self.vector_codes)

    def select_tenant(self, tenant: str) -> MemoryStore:
        if tenant not in self.tenant_table:
            raise ValueError(f"tenant must be one of {self.tenant_names()}, got {tenant!r}")
        return self.take(np.flatnonzero(self.tenant_codes_np == self.tenant_table.index(tenant)))

    def to(self, device: torch.device | str) -> MemoryStore:
        d = torch.device(device)
        return MemoryStore(self._ids, self._texts, self.embeddings.to(d), self.timestamps.to(d), self.tenants,
                           self._sources, ArrowView(self._meta), self.embedder, self.time_format, self.event_trees,
                           self.keys.to(d) if self.keys is not None else None, self.vector_codes)

    def records(self, *, with_embedding: bool = True) -> list[dict]:
        """One dict per node, the layout the file formats use."""
        emb = self.embeddings.detach().to("cpu", torch.float32).numpy() if with_embedding else None
        ts = self.timestamps.detach().cpu().tolist()
        out = []
        for j, (i, t, ten, s, m) in enumerate(zip(self.ids, self.texts, self.tenants, self.sources, self.metadata)):
            r = {"id": i, "text": t, "timestamp": ts[j], "tenant": ten, "sources": s, "metadata": m}
            if emb is not None:
                r["embedding"] = emb[j].tolist()
            out.append(r)
        return out

    def info(self) -> dict:
        """Counts, tenants, dimension and time span, as plain JSON-able values."""

        ts = self.timestamps
        counts = np.bincount(self.tenant_codes_np, minlength=len(self.tenant_table))
        per = {t: int(c) for t, c in zip(self.tenant_table, counts.tolist())}
        lengths = pc.list_value_length(self._sources).to_numpy(zero_copy_only=False)
        return {
            "nodes": len(self),
            "originals": int(lengths.sum()),
            "tenants": len(per),
            "nodes_per_tenant": per,
            "dim": self.dim,
            "embedder": self.embedder,
            "time_first": format_date(float(ts.min())),
            "time_last": format_date(float(ts.max())),
            "merged_nodes": int((lengths > 1).sum()),
            "keys": int(self.keys.vectors.shape[0]) if self.keys is not None else 0,
            "keys_rule": self.keys.rule if self.keys is not None else None,
            "vectors": self.vector_codes,
        }
