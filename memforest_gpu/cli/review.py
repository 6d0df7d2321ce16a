"""``memforest review IN OUT --out PAGE.html`` and the ``--review PAGE.html`` option of the
compressing commands: thin doors to :mod:`memforest_gpu.review` (their flags:
:mod:`.review_args`)."""
from __future__ import annotations

import json
import os

import numpy as np

from ..review.data import review_data
from ..review.groups import groups_from_merges, groups_from_plan, groups_from_stores, load_columns
from ..review.limits import Limits
from ..review.match import check_report, check_stores
from ..review.page import render_page
from ..runs.outputs import check_output
from ..runs.paths import check_paths, reads, writes
from ..store.atomic import atomic_write_text
from ..store.io import detect_format
from ..store.size import store_size
from .review_args import SUFFIXES, limits_from_args
from .running import guarded

__all__ = ["review_roles", "check_review", "run", "write_review", "page_from_files", "page_from_stores",
           "page_from_merges", "page_from_plan", "load_columns"]


def review_roles(a) -> list:
    """The ``--review`` path for :func:`~memforest_gpu.runs.paths.check_paths`."""
    return writes("--review", getattr(a, "review", None))


def check_review(path: str | None, inputs=(), what: str = "--review") -> None:
    """A page path must end in .html / .htm and be writable, and Plotly must be there
    (checked before any work)."""
    if path is None:
        return
    if os.path.splitext(path)[1].lower() not in SUFFIXES:
        raise ValueError(f"{what} must be an .html file, got {path!r}")
    check_output(path, inputs=[i for i in inputs if i], what=what, needs_format=False)
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise ImportError(f"{what} draws its plots with Plotly, which is not installed: pip install plotly "
                          "(or pip install -e '.[review]')") from None


def write_review(path: str, data: dict) -> None:
    atomic_write_text(path, render_page(data))
    s = data["sample"]
    print(f"wrote review page {path} ({os.path.getsize(path) / 1e6:.1f} MB; {s['shown']} of {s['of']} "
          f"{'planned pairs' if data['summary']['planned'] else 'merged nodes'} listed)")


def _counts(store) -> dict:
    names = store.tenant_names()
    return dict(zip(names, np.bincount(store.tenant_codes_np, minlength=len(names)).tolist()))


def page_from_merges(before, merges, report: dict | None, *, command: str, paths: dict, after=None,
                     limits: Limits | None = None, notes=None) -> dict:
    """A run that kept its merge log (``before``: the store it read)."""
    return review_data(before, groups_from_merges(before, merges), command=command, report=report,
                       after_counts=_counts(after) if after is not None else None, limits=limits, paths=paths,
                       notes=notes)


def page_from_plan(before, merges, report: dict | None, *, command: str, paths: dict, limits: Limits | None = None,
                   notes=None) -> dict:
    """A dry run's first-round plan."""
    return review_data(before, groups_from_plan(before, merges), command=command, report=report, limits=limits,
                       paths=paths, notes=notes)


def page_from_files(input: str, output: str, report: dict | None, *, command: str, format=None, out_format=None,
                    limits: Limits | None = None, paths: dict | None = None) -> dict:
    """An input and an output store file."""
    before = load_columns(input, format=format, vectors=True)
    after = load_columns(output, format=out_format, vectors=True)  # its rows and bytes (store/size.py)
    return page_from_stores(before, after, report, command=command, limits=limits,
                            paths=paths or {"input": input, "output": output})


def page_from_stores(before, after, report: dict | None, *, command: str, limits: Limits | None = None,
                     paths: dict) -> dict:
    """An input and an output store, read."""
    return review_data(before, groups_from_stores(before, after), command=command, report=report,
                       after_counts=_counts(after), limits=limits, paths=paths, sizes=_sizes(before, after))


def _sizes(before, after) -> dict | None:
    """Both stores' vector rows and bytes in the output's encoding (None: no vectors)."""
    if getattr(before, "dim", 0) <= 0 or getattr(after, "dim", 0) != before.dim:
        return None
    enc = after.vector_codes
    return {"size_in": store_size(before, enc).to_dict(), "size_out": store_size(after, enc).to_dict()}


@guarded
def run(a) -> int:
    """``memforest review``: check every path, read both stores, write the page."""
    limits = limits_from_args(a)
    check_paths(reads("INPUT", a.input), reads("OUTPUT", a.output), reads("--report", a.report),
                writes("--out", a.out))
    detect_format(a.input, a.format, flag="--format")
    detect_format(a.output, a.out_format, flag="--out-format")
    check_review(a.out, [a.input, a.output, a.report], what="--out")
    for p in (a.input, a.output):
        if not os.path.exists(p):
            raise FileNotFoundError(f"memory store file not found: {p!r}")
    report = None
    if a.report:
        try:
            with open(a.report, encoding="utf-8") as f:
                report = json.load(f)
        except ValueError as e:
            raise ValueError(f"--report {a.report!r} must be a run report (JSON), cannot read it: {e}") from None
        if not isinstance(report, dict):
            raise ValueError(f"--report {a.report!r} must hold a JSON object (a run report), got "
                             f"{type(report).__name__}")
        report = report.get("engine") if "engine" in report and "nodes_in" not in report else report
    before = load_columns(a.input, format=a.format, vectors=True)
    after = load_columns(a.output, format=a.out_format, vectors=True)  # its rows and bytes (store/size.py)
    check_stores(before, after, input=a.input, output=a.output)  # nothing is written for files that do not match
    if report is not None:
        check_report(report, before, after, path=a.report, input=a.input, output=a.output)
    data = page_from_stores(before, after, report, command="compress", limits=limits,
                            paths={"input": a.input, "output": a.output, **({"report": a.report} if a.report else {})})
    write_review(a.out, data)
    return 0
