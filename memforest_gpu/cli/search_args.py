"""The flags of ``memforest search`` and ``memforest info`` and their checks before anything
loads (the runs: :mod:`.search`, :mod:`.info`)."""
from __future__ import annotations

import re

from ..config import FILLS, MIN_CONTEXT_TOKENS
from .flags import add_renamed_flag, check_embedder_flag
from .path_checks import need_input
from .tenants import check_tenant_given

__all__ = ["add_search_parser", "add_info_parser", "check_search", "check_info"]


def add_search_parser(sub) -> None:
    """``memforest search``: hits, or with ``--max-tokens`` the context (retrieval/context.py)."""
    s = sub.add_parser("search", help="search a store", description="Search a memory store with a text query.")
    s.add_argument("store", help="the store to search (.parquet or .jsonl)")
    s.add_argument("query", help="the query text")
    s.add_argument("-k", type=int, default=None, help="hits to show (default 10; with --max-tokens: hits read, 40)")
    s.add_argument("--agpr", action="store_true", help="anchor-guided propagation re-ranking")
    s.add_argument("--tenant", default=None,
                   help="search only this tenant's memories (needed when the store has several tenants)")
    s.add_argument("--json", action="store_true", help="print the hits as JSON")
    s.add_argument("--max-tokens", type=int, default=None, metavar="TOKENS",
                   help="show the context instead: pieces filling TOKENS whitespace tokens (256: the evaluation's @B)")
    add_renamed_flag(s, "--budget", "--max-tokens", "max_tokens", type=int)
    s.add_argument("--fill", default=None, choices=FILLS,
                   help="with --max-tokens: pooled (the part of a merged node that matched first, the last pieces by "
                        "their best sentences; the default for a store with keys) | ranked (parts, the last cut) | "
                        "focused (the last piece by its best sentences) | plain (whole nodes in rank order)")
    s.add_argument("--embedder", default="auto",
                   help="auto: the store's recorded model (all-MiniLM-L6-v2 for a store without vectors) | "
                        "default (all-MiniLM-L6-v2) | PATH: the model of the store's vectors")
    s.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")


def add_info_parser(sub) -> None:
    i = sub.add_parser("info", help="counts, tenants, dimension, time span",
                       description="Counts, tenants, dimension and time span of a store (embeds nothing).")
    i.add_argument("store", help="the store to describe (.parquet or .jsonl)")
    i.add_argument("--json", action="store_true", help="print the numbers as JSON")


def check_search(a) -> None:
    """The query, the numbers, the embedder's value, the store's file and, for a Parquet
    store of several tenants, ``--tenant``."""
    check_embedder_flag(a.embedder, allowed=("auto", "default"))
    if not a.query.strip():
        raise ValueError(f"QUERY must be a text to search for, got {a.query!r}")
    bad = re.search("[\ud800-\udfff]", a.query)  # bytes that are not UTF-8 arrive as lone surrogates
    if bad:
        raise ValueError(f"QUERY must be UTF-8 text, got {a.query!r} (a byte that is not UTF-8 at character "
                         f"{bad.start()})")
    if a.k is not None and a.k < 1:
        raise ValueError(f"-k must be an integer >= 1, got {a.k}")
    if a.max_tokens is not None and a.max_tokens < MIN_CONTEXT_TOKENS:
        raise ValueError(f"--max-tokens must be an integer >= {MIN_CONTEXT_TOKENS} (whitespace tokens; a piece's date "
                         f"tag takes 3), got {a.max_tokens}")
    if a.fill is not None and a.max_tokens is None:
        raise ValueError(f"--fill {a.fill} needs --max-tokens TOKENS (the whitespace tokens of context to fill)")
    need_input(a.store)
    check_tenant_given(a.store, a.tenant)


def check_info(a) -> None:
    need_input(a.store)
