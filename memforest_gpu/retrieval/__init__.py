"""Search a memory store, per tenant: plain top-k or AGPR re-ranking (docs/method.md section 4).

:mod:`.retriever` holds :class:`Retriever` and :func:`search` (exact torch search);
:mod:`.index` finds the candidates with a faiss index instead (:class:`IndexedRetriever`),
scoring them the same way; :mod:`.context` turns hits into the context of a token budget
(:func:`.context.context`: the parts of merged nodes that matched first; :class:`Piece`).
"""
from .context import Piece
from .index import IndexConfig, IndexedRetriever
from .retriever import Retriever, SearchResult, search

__all__ = ["Retriever", "SearchResult", "search", "IndexedRetriever", "IndexConfig", "Piece"]
