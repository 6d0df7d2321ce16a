"""The flags of ``memforest review IN OUT --out PAGE.html`` and of the ``--review PAGE.html``
option of the compressing commands, and their checks before anything loads (the run:
:mod:`.review`)."""
from __future__ import annotations

from ..review.limits import Limits
from .path_checks import need_input, need_writable

__all__ = ["add_parser", "add_review_argument", "add_limit_arguments", "limits_from_args", "check_review_path",
           "check", "SUFFIXES"]

SUFFIXES = (".html", ".htm")
#: the page's limits (fields of :class:`~memforest_gpu.review.limits.Limits`) -> their flags
LIMIT_FLAGS = {"max_nodes": "--max-nodes", "max_flagged": "--max-flagged", "per_tenant": "--per-tenant",
               "full_tenants": "--full-tenants", "full_limit": "--full-limit", "low_similarity": "--low-similarity",
               "long_span_days": "--long-span-days"}


def add_review_argument(p) -> None:
    p.add_argument("--review", default=None, metavar="PAGE.html",
                   help="also write a review page of the run: one self-contained HTML file (summary, plots, merged "
                        "nodes beside their sources; a dry run: the planned pairs) (default: none)")


def check_review_path(path: str | None, what: str = "--review") -> None:
    """A page path must lie in a writable folder. Its suffix is the run's to check
    (:func:`~.review.check_review`), after the path rule: a page that is another path of the
    run is refused as such first."""
    need_writable(what, path)


def add_parser(sub) -> None:
    r = sub.add_parser("review", help="a review page (one HTML file) of a compression: what merged into what",
                       description="Write one self-contained HTML page that shows what a compression did: the run's "
                                   "figures, plots, and every merged node of OUTPUT beside its sources in INPUT (a "
                                   "bounded sample for big stores). Opens offline; fetches nothing. Refuses, writing "
                                   "nothing, an OUTPUT not compressed from INPUT and a --report of another run. "
                                   "docs/cli.md")
    r.add_argument("input", help="the store before the compression (.parquet or .jsonl)")
    r.add_argument("output", help="the compressed store (.parquet or .jsonl)")
    r.add_argument("--out", required=True, metavar="PAGE.html", help="the page to write")
    r.add_argument("--report", default=None, help="the run's --report JSON: seconds per stage, asked ratio, "
                                                  "condensed merges, fallbacks (default: figures from the stores)")
    r.add_argument("--format", default=None, help="INPUT's format: parquet | jsonl (default: from the suffix)")
    r.add_argument("--out-format", default=None, help="OUTPUT's format (default: from the suffix)")
    add_limit_arguments(r)


def add_limit_arguments(p) -> None:
    d = Limits()
    p.add_argument("--max-nodes", type=int, default=d.max_nodes, help="merged nodes listed on the page, at most")
    p.add_argument("--max-flagged", type=int, default=d.max_flagged,
                   help="flagged merged nodes listed first, at most (within --max-nodes)")
    p.add_argument("--per-tenant", type=int, default=d.per_tenant,
                   help="merged nodes listed per tenant besides the largest tenants")
    p.add_argument("--full-tenants", type=int, default=d.full_tenants,
                   help="the largest tenants listed in full (up to --full-limit merged nodes each)")
    p.add_argument("--full-limit", type=int, default=d.full_limit, help="merged nodes listed per largest tenant")
    p.add_argument("--low-similarity", type=float, default=d.low_similarity, help="flag merges below this cosine")
    p.add_argument("--long-span-days", type=float, default=d.long_span_days,
                   help="flag merged nodes whose sources lie more days apart")


def limits_from_args(a) -> Limits:
    """The page's :class:`~memforest_gpu.review.limits.Limits` of the flags; a bad value
    names its flag."""
    try:
        return Limits(**{k: getattr(a, k) for k in LIMIT_FLAGS})
    except ValueError as e:
        msg = str(e)
        for k, f in LIMIT_FLAGS.items():
            if msg.startswith(k + " "):
                msg = f + msg[len(k):]
        raise ValueError(msg) from None


def check(a) -> None:
    """``memforest review``: the limits, the page's path, and the files it reads."""
    limits_from_args(a)
    check_review_path(a.out, what="--out")
    for p in (a.input, a.output):
        need_input(p)
    need_input(a.report, "--report file")
