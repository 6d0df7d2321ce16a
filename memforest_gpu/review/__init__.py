"""The review page of a compression or a dry run: :mod:`.groups` finds the run's merged nodes
(from its merge log, plan or stores), :mod:`.data` builds what the page shows from them and the
run's report (within :mod:`.limits`); :mod:`.page` renders it as one self-contained HTML file.

The names below are imported at their first use, so that the command line's parser reads
:class:`~.limits.Limits` without loading the rest."""
from __future__ import annotations

from ..lazy import public_names

#: public name -> the module that defines it
_PUBLIC = {
    "Limits": "memforest_gpu.review.limits", "review_data": "memforest_gpu.review.data",
    "render_page": "memforest_gpu.review.page",
    **dict.fromkeys(["Groups", "groups_from_merges", "groups_from_plan", "groups_from_stores", "load_columns"],
                    "memforest_gpu.review.groups"),
}

__all__ = ["Groups", "Limits", "groups_from_merges", "groups_from_plan", "groups_from_stores", "load_columns",
           "review_data", "render_page"]


__getattr__, __dir__ = public_names(__name__, _PUBLIC)
