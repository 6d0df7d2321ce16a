"""Retrieval from a (compressed) store: plain top-k or AGPR, batched, never across tenants."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .config import RetrievalConfig
from .kernels import agpr_rerank, topk_search
from .store import MemoryStore

__all__ = ["Retriever", "SearchResult", "search"]


@dataclass
class SearchResult:
    """index (Q, k) store row per hit (-1 = none), score (Q, k) final score, similarity (Q, k) cosine."""

    index: torch.Tensor
    score: torch.Tensor
    similarity: torch.Tensor

    def hits(self, store: MemoryStore) -> list[list[dict]]:
        """Per query, the hits as dicts (id, text, timestamp, tenant, sources, score, similarity)."""
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

    >>> r = Retriever(store)
    >>> res = r.search(query_embeddings, tenants=["alice"] * Q, config=RetrievalConfig(k=10, agpr=True))
    """

    def __init__(self, store: MemoryStore):
        self.store = store
        names, codes = store.tenant_index()
        self.tenants = names
        self._rows = {t: torch.nonzero(codes == j).flatten() for j, t in enumerate(names)}
        self._emb = {t: store.embeddings[r] for t, r in self._rows.items()}  # (N_t, D) each
        self._ts = {t: store.timestamps[r] for t, r in self._rows.items()}

    def _resolve_tenants(self, tenants, Q: int) -> list[str]:
        if tenants is None:
            if len(self.tenants) != 1:
                raise ValueError(f"tenant must be given for a store with several tenants, one of {self.tenants}")
            return [self.tenants[0]] * Q
        if isinstance(tenants, str):
            tenants = [tenants] * Q
        tenants = list(tenants)
        if len(tenants) != Q:
            raise ValueError(f"tenants must have one entry per query ({Q}), got {len(tenants)}")
        for t in tenants:
            if t not in self._rows:
                raise ValueError(f"tenant must be one of {self.tenants}, got {t!r}")
        return tenants

    def _candidates(self, tenant: str, queries: torch.Tensor, c: int):
        """The ``c`` most similar rows of one tenant per query, best first (exact search;
        :class:`~memforest_gpu.index.IndexedRetriever` swaps in a faiss index here).
        Shape: queries (Q, D) -> sims (Q, c'), tenant row (Q, c') with -1 where fewer exist"""
        return topk_search(queries, self._emb[tenant], c)

    def search(self, queries: torch.Tensor, *, tenants: str | Sequence[str] | None = None,
               config: RetrievalConfig | None = None) -> SearchResult:
        """Shape: queries (Q, D) normalised -> SearchResult with (Q, k) tensors."""
        cfg = config or RetrievalConfig()
        Q = queries.shape[0]
        if queries.ndim != 2 or queries.shape[1] != self.store.dim:
            raise ValueError(f"queries must be (Q, {self.store.dim}), got shape {tuple(queries.shape)}")
        tens = self._resolve_tenants(tenants, Q)
        dev = self.store.device
        queries = torch.nn.functional.normalize(queries.to(dev, torch.float32), dim=1)
        k = cfg.k
        index = torch.full((Q, k), -1, dtype=torch.int64, device=dev)
        score = torch.full((Q, k), float("-inf"), device=dev)
        simil = torch.full((Q, k), float("-inf"), device=dev)
        by_t: dict[str, list[int]] = {}
        for q, t in enumerate(tens):
            by_t.setdefault(t, []).append(q)
        for t, qs in by_t.items():
            qi = torch.as_tensor(qs, dtype=torch.int64, device=dev)
            C = cfg.L * k if cfg.agpr else k
            sims, cand = self._candidates(t, queries[qi], C)  # (Q_t, C')
            if cfg.agpr:
                valid = cand >= 0
                times = self._ts[t][cand.clamp(min=0)]
                order, v = agpr_rerank(sims, times, valid, k, lam=cfg.lam, gamma=cfg.gamma)
                cand, s_sel = cand.gather(1, order), sims.gather(1, order)
                v = torch.where(cand >= 0, v, torch.full_like(v, float("-inf")))
            else:
                s_sel, v = sims, sims
            kk = cand.shape[1]
            rows = self._rows[t][cand.clamp(min=0)]
            index[qi, :kk] = torch.where(cand >= 0, rows, torch.full_like(rows, -1))
            score[qi, :kk] = v.float()
            simil[qi, :kk] = s_sel.float()
        return SearchResult(index, score, simil)


def search(store: MemoryStore, queries, *, k: int = 10, agpr: bool = False, tenant=None, embedder=None,
           config: RetrievalConfig | None = None) -> list[list[dict]]:
    """Search ``store`` with text queries (needs ``embedder``) or a (Q, D) tensor of query
    embeddings. Returns per query a list of hit dicts, best first."""
    cfg = config or RetrievalConfig(k=k, agpr=agpr)
    if isinstance(queries, str):
        queries = [queries]
    if isinstance(queries, (list, tuple)):
        if embedder is None:
            raise ValueError("text queries need an embedder (the model that made the store's vectors)")
        qe = embedder.embed(list(queries))
    else:
        qe = torch.as_tensor(queries)
    return Retriever(store).search(qe, tenants=tenant, config=cfg).hits(store)
