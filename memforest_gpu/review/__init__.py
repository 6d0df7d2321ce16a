"""The review page of a compression or a dry run: :mod:`.groups` finds the run's merged nodes
(from its merge log, plan or stores), :mod:`.data` builds what the page shows from them and the
run's report; :mod:`.page` renders it as one self-contained HTML file."""
from .data import Limits, review_data
from .groups import Groups, groups_from_merges, groups_from_plan, groups_from_stores, load_columns
from .page import render_page

__all__ = ["Groups", "Limits", "groups_from_merges", "groups_from_plan", "groups_from_stores", "load_columns",
           "review_data", "render_page"]
