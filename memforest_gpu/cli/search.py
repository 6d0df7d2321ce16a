"""``memforest search``: a thin command over :func:`~memforest_gpu.api.search_file` (its flags
and their checks: :mod:`.search_args`)."""
from __future__ import annotations

import json

from ..api import search_file
from ..printable import printable
from ..store.timeutil import format_date
from .running import guarded
from .search_args import check_search

__all__ = ["run"]


@guarded
def run(a) -> int:
    """``memforest search``: the hits, or with ``--max-tokens`` the context's pieces."""
    check_search(a)
    hits = search_file(a.store, [a.query], k=a.k, agpr=a.agpr, tenant=a.tenant, embedder=a.embedder,
                       device=a.device, max_tokens=a.max_tokens, fill=a.fill)[0]
    if a.json:
        print(json.dumps(hits, ensure_ascii=False, indent=2))  # JSON escapes the C0 control characters itself
        return 0
    if a.max_tokens is not None:  # pieces: their text holds their date tag
        for r, p in enumerate(hits, 1):
            print(f"{r:>2}. ({p['score']:.3f}) {printable(p['text'])}{' [cut]' if p['cut'] else ''}  "
                  f"<- {printable(p['id'])}")
        return 0
    for r, h in enumerate(hits, 1):
        print(f"{r:>2}. [{format_date(h['timestamp'])}] ({h['score']:.3f}) {printable(h['text'])}")
    return 0
