"""Retrieval from a (compressed) store: plain top-k or AGPR, batched over queries of any mix
of tenants, never across tenants."""
from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..config import RetrievalConfig
from ..kernels.agpr import agpr_rerank, topk_rows, topk_search
from ..renamed import renamed_keyword
from ..store.memory_store import MemoryStore
from .context import MIN_CONTEXT_TOKENS, check_fill, context, default_fill, whole_tags
from .keyed import KeyedLayout, keyed_search, node_best

__all__ = ["Retriever", "SearchResult", "search"]


@dataclass
class SearchResult:
    """index (Q, k) store row per hit (-1 = none), score (Q, k) final score, similarity (Q, k)
    the node's similarity: its cosine, or for a node with keys the store's blend of its text's and
    best key's cosines (:mod:`memforest_gpu.store.keys`)."""

    index: torch.Tensor
    score: torch.Tensor
    similarity: torch.Tensor

    def context(self, store: MemoryStore, queries: torch.Tensor, *, max_tokens: int | None = None,
                fill: str | None = None, embedder=None, **renamed) -> list[list[dict]]:
        """Per query, the context filling ``max_tokens`` whitespace tokens from these hits: pieces
        (id, sources, text with its date tag, score, cut) in the order shown; ``fill``: ``"pooled"``
        (a merged node's parts that matched first, the last pieces by their best sentences; the
        default for a store with keys, which needs ``embedder``), ``"ranked"``, ``"focused"`` or
        ``"plain"`` (whole nodes in rank order); a last piece cut inside its date tag is left out
        (:func:`~.context.whole_tags`). :mod:`.context`. ``budget=``: the old name of
        ``max_tokens``."""
        max_tokens = renamed_keyword("context", renamed, "budget", "max_tokens", max_tokens)
        ctx = context(store, self, queries, max_tokens=max_tokens, fill=fill, embedder=embedder)
        return [[{k: v for k, v in p.as_dict().items() if k != "node"} for p in whole_tags(row)] for row in ctx]

    def hits(self, store: MemoryStore) -> list[list[dict]]:
        """Per query, the hits as dicts (id, text, timestamp, tenant, sources, score,
        similarity)."""
        out = []
        idx, sc, sim = self.index.cpu().tolist(), self.score.cpu().tolist(), self.similarity.cpu().tolist()
        ts = store.timestamps.cpu().tolist()
        for q in range(len(idx)):
            row = []
            for j, s, c in zip(idx[q], sc[q], sim[q]):
                if j < 0:
                    continue
                row.append({"id": store.ids[j], "text": store.texts[j], "timestamp": ts[j],
                            "tenant": store.tenants[j], "sources": store.sources[j], "score": s, "similarity": c})
            out.append(row)
        return out


class Retriever:
    """Holds a store's rows grouped by tenant, so repeated searches do no set-up.

    Layout: the rows sorted by tenant code (store order inside a tenant), one (N, D) matrix
    with each tenant a contiguous segment ``[start, start + size)``; nothing per tenant is
    built. A search answers queries for any mix of tenants in a few batched calls: queries
    whose tenant has at most ``large`` rows are grouped by segment length (powers of two) and
    scored against their own padded segment in one batched product per group; a tenant with
    more rows is searched as a view of its segment (one matrix product per queried big tenant,
    of which there are at most N / ``large``). A store with keys (merged nodes searched by their
    text blended with their best key) holds a node with keys as one blended row per key
    (:class:`~.keyed.KeyedLayout`), scored by the same products, each node taking its best row.

    >>> r = Retriever(store)
    >>> res = r.search(query_embeddings, tenants=["alice"] * Q, config=RetrievalConfig(k=10,
    ...     agpr=True))
    """

    # tenants with more rows than this are searched one segment (a view) at a time, by one matrix product
    # for all their queries; smaller ones are gathered into padded groups (a gather costs what the product does)
    large = 256
    shared = 2  # a tenant whose queries x rows pass large * shared is searched by one product too
    tile_elements = 1 << 25  # most elements of gathered (Q_b, n, D) segments held at a time

    def __init__(self, store: MemoryStore):
        self.store = store
        names, codes = store.tenant_index()
        self.tenants = names
        self._code = {t: j for j, t in enumerate(names)}  # name -> code: one lookup per query
        n_ten = len(names)
        sizes = torch.bincount(codes, minlength=n_ten)
        self._size = sizes.cpu().numpy().astype(np.int64)  # (n_ten,) host: grouping queries reads nothing
        self._start = np.cumsum(self._size) - self._size  # (n_ten,)
        self._start_t = torch.as_tensor(self._start, dtype=torch.int64, device=store.device)
        grouped = codes.shape[0] and bool((codes[1:] >= codes[:-1]).all())  # already grouped: no copy
        self._rows = torch.arange(codes.shape[0], device=store.device) if grouped else \
            torch.argsort(codes, stable=True)  # (N,) store row at each grouped position
        self._ts = store.timestamps if grouped else store.timestamps[self._rows]
        # merged nodes' keys: every tenant's nodes and keys in one matrix (None: every node is searched by
        # its text's vector, from the (N, D) tenant-grouped vectors)
        keyed = store.keys is not None and len(store.keys.vectors) > 0
        self._layout = KeyedLayout(store.embeddings, store.keys, self._rows, self._size) if keyed else None
        self._emb = None if keyed else store.embeddings if grouped else store.embeddings[self._rows]

    def _resolve_tenants(self, tenants, Q: int) -> np.ndarray:
        """Tenant code per query. Shape: -> (Q,) int64 host"""
        if tenants is None:
            if len(self.tenants) != 1:
                raise ValueError(f"tenant must be given for a store with several tenants, one of {self._names_msg()}")
            return np.zeros(Q, dtype=np.int64)
        if isinstance(tenants, str):
            j = self._code.get(tenants)
            if j is None:
                raise ValueError(f"tenant must be one of {self._names_msg()}, got {tenants!r}")
            return np.full(Q, j, dtype=np.int64)
        tenants = list(tenants)
        if len(tenants) != Q:
            raise ValueError(f"tenants must have one entry per query ({Q}), got {len(tenants)}")
        code = self._code
        out = np.fromiter((code.get(t, -1) for t in tenants), dtype=np.int64, count=Q)
        if (out < 0).any():
            raise ValueError(f"tenant must be one of {self._names_msg()}, got {tenants[int(np.argmin(out))]!r}")
        return out

    def _names_msg(self) -> str:
        n = len(self.tenants)
        return str(self.tenants) if n <= 20 else f"{self.tenants[:20]}... ({n} tenants)"

    def _segment(self, t: int) -> tuple[int, int]:
        s = int(self._start[t])
        return s, s + int(self._size[t])

    def _candidates(self, codes: np.ndarray, queries: torch.Tensor, c: int):
        """The ``c`` most similar rows of each query's own tenant, best first (exact search,
        ties to the lower store row; :class:`~memforest_gpu.retrieval.index.IndexedRetriever`
        swaps in
        faiss indexes here).

        Shape: codes (Q,) host, queries (Q, D) -> sims (Q, c), pos (Q, c) grouped position
               (-1 / -inf where the tenant has fewer rows)
        """
        Q = queries.shape[0]
        dev = queries.device
        sims = torch.full((Q, c), float("-inf"), device=dev)
        pos = torch.full((Q, c), -1, dtype=torch.int64, device=dev)
        n_q = self._size[codes]  # (Q,)
        big = self._is_big(codes, n_q)
        self._big_candidates(codes, queries, c, np.flatnonzero(big), sims, pos)
        lay = self._layout
        A = self._emb if lay is None else lay.matrix  # rows scored: nodes, or nodes and keys
        a_size = n_q if lay is None else lay.size[codes]  # (Q,) rows of each query's segment
        a_start = self._start if lay is None else lay.start
        cls = np.ceil(np.log2(np.maximum(a_size, 1))).astype(np.int64)
        D = queries.shape[1]
        for k in np.unique(cls[~big]).tolist():  # padded groups of similar segment length
            sel = np.flatnonzero(~big & (cls == k))
            n, na = int(n_q[sel].max()), int(a_size[sel].max())
            step = max(1, self.tile_elements // max(1, na * D))
            col = torch.arange(na, device=dev)
            for q0 in range(0, len(sel), step):
                qs = sel[q0:q0 + step]
                qi = torch.as_tensor(qs, dtype=torch.int64, device=dev)
                st = torch.as_tensor(self._start[codes[qs]], dtype=torch.int64, device=dev)  # (Qb,) node starts
                ast = torch.as_tensor(a_start[codes[qs]], dtype=torch.int64, device=dev)  # (Qb,) row starts
                nsz = torch.as_tensor(n_q[qs], dtype=torch.int64, device=dev)[:, None]
                ok = col[None, :] < torch.as_tensor(a_size[qs], dtype=torch.int64, device=dev)[:, None]  # (Qb, na)
                at = torch.where(ok, ast[:, None] + col[None, :], torch.zeros_like(ast)[:, None])
                Xg = A.index_select(0, at.reshape(-1)).view(len(qs), na, D)  # (Qb, na, D)
                S = torch.bmm(Xg.float(), queries[qi].float()[:, :, None])[:, :, 0]  # (Qb, na)
                if lay is not None:  # each node's best row (a node with keys has one row per key)
                    S = node_best(S.masked_fill(~ok, float("-inf")), torch.where(ok, lay.column[at], 0), n)  # (Qb, n)
                S = S[:, :n].masked_fill(col[None, :n] >= nsz, float("-inf"))
                cc = min(c, n)
                v, j = topk_rows(S, cc)
                sims[qi, :cc] = v
                pos[qi, :cc] = torch.where(torch.isfinite(v), st[:, None] + j, torch.full_like(j, -1))
        return sims, pos

    def _is_big(self, codes: np.ndarray, n_q: np.ndarray) -> np.ndarray:
        """Which queries are searched by their tenant's own product (a view of its segment): those
        of a tenant with more than ``large`` rows, or whose queries in this batch times its rows
        pass ``large * shared`` (one product for them all costs less than gathering the segment
        once per query). Shape: codes (Q,), n_q (Q,) rows of each query's tenant -> (Q,) bool"""
        per_tenant = np.bincount(codes, minlength=len(self._size))[codes]  # (Q,) queries of the tenant
        return (n_q > self.large) | (per_tenant * n_q > self.large * self.shared)

    def _big_candidates(self, codes: np.ndarray, queries: torch.Tensor, c: int, bq: np.ndarray, sims, pos) -> None:
        """The candidates of the queries ``bq`` of big tenants, written into ``sims`` / ``pos``: the
        queries sorted by segment length class and tenant, each tenant's scores one matrix product
        over its own segment (a view) written into a block of rows padded to the class's longest
        segment, and one top-c per block (not one per tenant)."""
        if not bq.size:
            return
        dev = queries.device
        n_q = self._size[codes[bq]]
        cls = np.ceil(np.log2(n_q)).astype(np.int64)
        bq, cls = bq[np.lexsort((codes[bq], cls))], np.sort(cls)  # by class, then tenant
        for k in np.unique(cls).tolist():
            sel = bq[cls == k]
            n = int(self._size[codes[sel]].max())
            rows = n if self._layout is None else int(self._layout.size[codes[sel]].max())  # nodes (and keys)
            step = max(1, self.tile_elements // rows)
            for q0 in range(0, len(sel), step):
                qs = sel[q0:q0 + step]
                S = torch.full((len(qs), n), float("-inf"), device=dev)  # (Qb, n) node scores, padded
                ts, first = np.unique(codes[qs], return_index=True)
                bounds = np.append(first, len(qs))
                qi = torch.as_tensor(qs, dtype=torch.int64, device=dev)
                Qb = queries[qi]
                for j, t in enumerate(ts.tolist()):
                    lo, hi = int(bounds[j]), int(bounds[j + 1])
                    self._scores(t, Qb[lo:hi], out=S[lo:hi, :int(self._size[t])])
                cc = min(c, n)
                v, i = topk_rows(S, cc)  # (Qb, cc)
                st = torch.as_tensor(self._start[codes[qs]], dtype=torch.int64, device=dev)[:, None]
                sims[qi, :cc] = v
                pos[qi, :cc] = torch.where(torch.isfinite(v), st + i, torch.full_like(i, -1))

    def _scores(self, t: int, q: torch.Tensor, out: torch.Tensor) -> None:
        """Tenant ``t``'s node scores by the store's rule (its text's cosine, or the keys' blend),
        written into ``out`` (a view of the padded block: the product writes there, no copy).
        Shape: q (Q_t, D), out (Q_t, n_t)"""
        if self._layout is None:
            torch.mm(q.float(), self._emb[slice(*self._segment(t))].float().T, out=out)
            return
        A, n, column = self._layout.segment(t)
        if column is None:
            torch.mm(q.float(), A.float().T, out=out)
            return
        Sa = q.float() @ A.float().T  # (Q_t, rows)
        out.fill_(float("-inf")).scatter_reduce_(1, column.expand(Sa.shape), Sa, reduce="amax", include_self=True)

    def _search_segment(self, t: int, q: torch.Tensor, c: int):
        """The ``c`` best nodes of tenant ``t`` by the store's rule (its text's cosine, or the keys'
        blend). Shape: q (Q_t, D) -> sims (Q_t, c'), index (Q_t, c') node column"""
        if self._layout is None:
            return topk_search(q, self._emb[slice(*self._segment(t))], c)
        A, n, column = self._layout.segment(t)
        return keyed_search(q, A, n, column, c)

    def node_vectors(self, t: int) -> torch.Tensor:
        """Tenant ``t``'s node vectors (text), a view, for a tenant none of whose nodes has keys
        (a node with keys is held as blended rows, :class:`~.keyed.KeyedLayout`).
        Shape: -> (n_t, D)"""
        if self._layout is None:
            return self._emb[slice(*self._segment(t))]
        A, n, column = self._layout.segment(t)
        if column is not None:
            raise ValueError(f"tenant {self.tenants[t]!r} has nodes with keys: its rows are blended, not text vectors")
        return A

    def search(self, queries: torch.Tensor, *, tenants: str | Sequence[str] | None = None,
               config: RetrievalConfig | None = None) -> SearchResult:
        """Shape: queries (Q, D) normalised -> SearchResult with (Q, k) tensors."""
        cfg = config or RetrievalConfig()
        Q = queries.shape[0]
        if queries.ndim != 2 or queries.shape[1] != self.store.dim:
            raise ValueError(f"queries must be (Q, {self.store.dim}), got shape {tuple(queries.shape)}")
        codes = self._resolve_tenants(tenants, Q)
        dev = self.store.device
        queries = torch.nn.functional.normalize(queries.to(dev, torch.float32), dim=1)
        k = cfg.k
        C = cfg.L * k if cfg.agpr else k
        sims, pos = self._candidates(codes, queries, C)  # (Q, C)
        if cfg.agpr:
            valid = pos >= 0
            order, v = agpr_rerank(sims, self._ts[pos.clamp(min=0)], valid, k, lam=cfg.lam, gamma=cfg.gamma)
            pos, s_sel = pos.gather(1, order), sims.gather(1, order)
            v = torch.where(pos >= 0, v, torch.full_like(v, float("-inf")))
        else:
            s_sel, v = sims, sims
        index = torch.full((Q, k), -1, dtype=torch.int64, device=dev)
        score = torch.full((Q, k), float("-inf"), device=dev)
        simil = torch.full((Q, k), float("-inf"), device=dev)
        kk = pos.shape[1]
        index[:, :kk] = torch.where(pos >= 0, self._rows[pos.clamp(min=0)], torch.full_like(pos, -1))
        score[:, :kk] = v.float()
        simil[:, :kk] = s_sel.float()
        return SearchResult(index, score, simil)


CONTEXT_DEPTH = 40  # hits read to fill max_tokens when k is not given: the evaluation's @B depth (L x k)


def search(store: MemoryStore, queries, *, k: int | None = None, agpr: bool = False, tenant=None, embedder=None,
           config: RetrievalConfig | None = None, max_tokens: int | None = None,
           fill: str | None = None, **renamed) -> list[list[dict]]:
    """Search ``store`` with text queries (needs ``embedder``) or a (Q, D) tensor of query
    embeddings. Returns per query a list of hit dicts, best first (``k`` hits, default 10); with
    ``max_tokens``, the context of :meth:`SearchResult.context` instead: pieces filling
    ``max_tokens`` whitespace tokens (at least :data:`~.context.MIN_CONTEXT_TOKENS`) from the best
    ``k`` hits (default :data:`CONTEXT_DEPTH`), by ``fill``. ``budget=``: the old name of
    ``max_tokens``."""
    max_tokens = renamed_keyword("search", renamed, "budget", "max_tokens", max_tokens)
    if max_tokens is None and fill is not None:
        raise ValueError(f"fill={fill!r} needs max_tokens (whitespace tokens of context)")
    if max_tokens is not None:  # refused before any embedding or search
        if (isinstance(max_tokens, numbers.Integral) and not isinstance(max_tokens, bool)
                and max_tokens < MIN_CONTEXT_TOKENS):
            raise ValueError(f"max_tokens must be an integer >= {MIN_CONTEXT_TOKENS} (whitespace tokens; a piece's "
                             f"date tag takes 3), got {max_tokens!r}")
        check_fill(default_fill(store) if fill is None else fill, max_tokens, store, embedder)
    cfg = config or RetrievalConfig(k=k if k is not None else 10 if max_tokens is None else CONTEXT_DEPTH, agpr=agpr)
    if isinstance(queries, str):
        queries = [queries]
    if isinstance(queries, (list, tuple)):
        if embedder is None:
            raise ValueError("text queries need an embedder (the model that made the store's vectors)")
        qe = embedder.embed(list(queries))
    else:
        qe = torch.as_tensor(queries)
    res = Retriever(store).search(qe, tenants=tenant, config=cfg)
    if max_tokens is None:
        return res.hits(store)
    return res.context(store, qe, max_tokens=max_tokens, fill=fill, embedder=embedder)
