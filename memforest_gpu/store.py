"""The memory store: a validated column table with embeddings kept as one tensor.

Shape vocabulary used across the package: N nodes, D embedding dim, K clusters,
T trees, E edges, Q queries, C candidates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from .timeutil import parse_timestamp

__all__ = ["MemoryStore", "as_embedding_tensor", "DEFAULT_TENANT"]

DEFAULT_TENANT = "default"


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


def _is_iso(s: str) -> bool:
    """A timestamp string that is not a number (so it was read as ISO 8601)."""
    try:
        float(s)
    except ValueError:
        return True
    return False


def _normalise_checked(e: torch.Tensor, ids: Sequence[str], what: str = "embedding") -> torch.Tensor:
    finite = torch.isfinite(e).all(dim=1)  # (N,)
    if not bool(finite.all()):
        i = int((~finite).nonzero()[0])
        raise ValueError(f"{what} of node {ids[i]!r} must be finite, got NaN or inf")
    norms = e.double().norm(dim=1)  # (N,) in float64: a large finite vector must not overflow to inf
    zero = norms <= 1e-12
    if bool(zero.any()):
        i = int(zero.nonzero()[0])
        raise ValueError(f"{what} of node {ids[i]!r} must have non-zero norm, got norm 0")
    if bool(((norms - 1.0).abs() <= 1e-6).all()):
        return e  # already unit length: keep the exact values (a load/save round trip is bit-exact)
    return (e.double() / norms[:, None]).to(torch.float32)


@dataclass(eq=False)
class MemoryStore:
    """A table of memory nodes. Build one with :meth:`from_columns` or :meth:`from_records`
    (they validate); the fields are then read-only by convention.

    Fields
    - ids: unique node ids (N,)
    - texts: memory texts (N,)
    - embeddings: float32 tensor (N, D), L2-normalised, on any device
    - timestamps: float64 tensor (N,), epoch seconds, on the embeddings' device
    - tenants: scope of each node (N,); nothing ever crosses a tenant
    - sources: original ids each node stands for (N,); an original's is ``[its id]``
    - metadata: one JSON object per node (N,)
    - embedder: name of the model that produced the embeddings, when known
    - time_format: ``"iso"`` when the timestamps came in as ISO 8601 strings (a JSONL
      file is then written back with ISO strings), else ``None`` (epoch numbers)
    """

    ids: list[str]
    texts: list[str]
    embeddings: torch.Tensor
    timestamps: torch.Tensor
    tenants: list[str]
    sources: list[list[str]]
    metadata: list[dict]
    embedder: str | None = None
    time_format: str | None = None

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
    ) -> "MemoryStore":
        """Validate columns and build a store. ``embeddings=None`` embeds ``texts`` with
        ``embedder`` (an :class:`~memforest_gpu.embedders.Embedder`).

        Raises ``ValueError`` naming the first bad value (empty store, duplicate ids,
        non-finite/zero/mixed-dimension embeddings, unreadable timestamps, ...).
        """
        from .device import resolve_device

        n = len(ids)
        if n == 0:
            raise ValueError("store must have at least one node, got 0 nodes")
        for name, col in (("texts", texts), ("timestamps", timestamps), ("tenants", tenants),
                          ("sources", sources), ("metadata", metadata)):
            if col is not None and len(col) != n:
                raise ValueError(f"column {name!r} must have one value per id ({n}), got {len(col)}")
        ids_ = []
        for i in ids:
            if isinstance(i, np.integer):
                i = int(i)
            if not isinstance(i, (str, int)) or isinstance(i, bool) or str(i) == "":
                raise ValueError(f"id must be a non-empty string, got {i!r}")
            ids_.append(str(i))
        seen: set[str] = set()
        for i in ids_:
            if i in seen:
                raise ValueError(f"ids must be unique, got duplicate id {i!r}")
            seen.add(i)
        texts_ = []
        for i, t in zip(ids_, texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"text of node {i!r} must be a non-empty string, got {t!r}")
            texts_.append(t)
        if isinstance(timestamps, torch.Tensor):
            timestamps = timestamps.detach().cpu().tolist()
        ts = [parse_timestamp(v, where=f"timestamp of node {i!r}") for i, v in zip(ids_, timestamps)]
        time_format = "iso" if all(isinstance(v, str) and _is_iso(v) for v in timestamps) else None
        if tenants is None:
            tenants_ = [DEFAULT_TENANT] * n
        else:
            tenants_ = []
            for i, t in zip(ids_, tenants):
                if t is None or (isinstance(t, float) and math.isnan(t)):
                    t = DEFAULT_TENANT
                if not isinstance(t, (str, int)) or isinstance(t, bool) or str(t) == "":
                    raise ValueError(f"tenant of node {i!r} must be a non-empty string, got {t!r}")
                tenants_.append(str(t))
        if sources is None:
            sources_ = [[i] for i in ids_]
        else:
            sources_ = []
            for i, s in zip(ids_, sources):
                if s is None:
                    s = [i]
                if isinstance(s, np.ndarray):
                    s = s.tolist()
                if isinstance(s, str) or not isinstance(s, (list, tuple)) or not s:
                    raise ValueError(f"sources of node {i!r} must be a non-empty list of ids, got {s!r}")
                sources_.append([str(x) for x in s])
            owner: dict[str, str] = {}
            for i, s in zip(ids_, sources_):
                for x in s:
                    if x in owner:
                        raise ValueError(
                            f"sources must not overlap, got original {x!r} in both {owner[x]!r} and {i!r}"
                        )
                    owner[x] = i
        if metadata is None:
            meta_ = [{} for _ in range(n)]
        else:
            meta_ = []
            for i, m in zip(ids_, metadata):
                if m is None:
                    m = {}
                if not isinstance(m, dict):
                    raise ValueError(f"metadata of node {i!r} must be a JSON object, got {m!r}")
                meta_.append(dict(m))

        if embeddings is None:
            if embedder is None:
                raise ValueError("embeddings are missing and no embedder was given to compute them")
            dev = resolve_device(device)
            emb = as_embedding_tensor(embedder.embed(texts_), device=dev, what="embedder output")
            embedder_name = embedder.name
        else:
            dev = resolve_device(device) if device is not None else None
            emb = as_embedding_tensor(embeddings, device=dev)
            if emb.shape[0] != n:
                raise ValueError(f"embeddings must have one row per id ({n}), got shape {tuple(emb.shape)}")
            embedder_name = embedder if isinstance(embedder, str) else getattr(embedder, "name", None)
        emb = _normalise_checked(emb, ids_)
        ts_t = torch.tensor(ts, dtype=torch.float64, device=emb.device)
        return cls(ids_, texts_, emb.contiguous(), ts_t, tenants_, sources_, meta_, embedder_name, time_format)

    @classmethod
    def from_records(cls, records: Iterable[dict], *, embedder=None, device=None) -> "MemoryStore":
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
    def __len__(self) -> int:
        return len(self.ids)

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    @property
    def device(self) -> torch.device:
        return self.embeddings.device

    def tenant_names(self) -> list[str]:
        """Tenants in order of first appearance."""
        return list(dict.fromkeys(self.tenants))

    def tenant_index(self) -> tuple[list[str], torch.Tensor]:
        """(names, codes): codes (N,) int64 on the store's device, name order = first appearance."""
        names = self.tenant_names()
        pos = {t: j for j, t in enumerate(names)}
        codes = torch.tensor([pos[t] for t in self.tenants], dtype=torch.int64, device=self.device)
        return names, codes

    def take(self, index: Sequence[int] | torch.Tensor) -> "MemoryStore":
        """A new store with the rows ``index`` (in that order). No validation is repeated."""
        idx = index.tolist() if isinstance(index, torch.Tensor) else list(index)
        it = torch.as_tensor(idx, dtype=torch.int64, device=self.device)
        return MemoryStore(
            [self.ids[i] for i in idx], [self.texts[i] for i in idx], self.embeddings[it],
            self.timestamps[it], [self.tenants[i] for i in idx], [list(self.sources[i]) for i in idx],
            [dict(self.metadata[i]) for i in idx], self.embedder, self.time_format,
        )

    def select_tenant(self, tenant: str) -> "MemoryStore":
        idx = [i for i, t in enumerate(self.tenants) if t == tenant]
        if not idx:
            raise ValueError(f"tenant must be one of {self.tenant_names()}, got {tenant!r}")
        return self.take(idx)

    def to(self, device: torch.device | str) -> "MemoryStore":
        d = torch.device(device)
        return MemoryStore(self.ids, self.texts, self.embeddings.to(d), self.timestamps.to(d), self.tenants,
                           self.sources, self.metadata, self.embedder, self.time_format)

    def records(self, *, with_embedding: bool = True) -> list[dict]:
        """One dict per node, the layout the file formats use."""
        emb = self.embeddings.detach().cpu().numpy() if with_embedding else None
        ts = self.timestamps.detach().cpu().tolist()
        out = []
        for j in range(len(self)):
            r = {"id": self.ids[j], "text": self.texts[j], "timestamp": ts[j], "tenant": self.tenants[j],
                 "sources": list(self.sources[j]), "metadata": dict(self.metadata[j])}
            if emb is not None:
                r["embedding"] = emb[j].tolist()
            out.append(r)
        return out

    def info(self) -> dict:
        """Counts, tenants, dimension and time span, as plain JSON-able values."""
        from .timeutil import format_date

        ts = self.timestamps
        per = {t: 0 for t in self.tenant_names()}
        for t in self.tenants:
            per[t] += 1
        n_orig = sum(len(s) for s in self.sources)
        return {
            "nodes": len(self),
            "originals": n_orig,
            "tenants": len(per),
            "nodes_per_tenant": per,
            "dim": self.dim,
            "embedder": self.embedder,
            "time_first": format_date(float(ts.min())),
            "time_last": format_date(float(ts.max())),
            "merged_nodes": sum(1 for s in self.sources if len(s) > 1),
        }
