"""The review page of a compression or a dry run: :mod:`.data` builds what it shows from the
run's report, merge log and stores; :mod:`.page` renders it as one self-contained HTML file."""
from .data import Groups, Limits, groups_from_merges, groups_from_plan, groups_from_stores, load_columns, review_data
from .page import render_page

__all__ = ["Groups", "Limits", "groups_from_merges", "groups_from_plan", "groups_from_stores", "load_columns",
           "review_data", "render_page"]
