"""The flags of ``memforest compact`` (and the node-limit flags ``mem0 compact`` shares) and their
checks before anything loads (the run: :mod:`.compact`)."""
from __future__ import annotations

import math

from ..config import CompactConfig, ConfigError
from .flags import add_config_arguments, as_flag_error, check_embedder_flag, config_from_args, parse_options
from .path_checks import need_input
from .review_args import add_review_argument, check_review_path

__all__ = ["add_parser", "add_limit_arguments", "limits_from_args", "check"]


def add_limit_arguments(p, *, flag: str = "--max-nodes-per-tenant", what: str = "tenant") -> None:
    """The node-limit flags (fields of :class:`~memforest_gpu.config.CompactConfig`)."""
    p.add_argument(flag, dest="max_nodes", type=int, required=True, metavar="N",
                   help=f"the budget: a {what} holding more than N memories is compacted")
    p.set_defaults(limit_flag=flag)
    p.add_argument("--low-water", type=float, default=0.8,
                   help=f"a {what} over budget is compacted down to floor(LOW_WATER * N) memories")
    p.add_argument("--repartition-growth", type=float, default=1.0,
                   help=f"partition a {what} again in full once the memories placed into its trees since its "
                        "last full partition reach this multiple of its size then (1.0: it has doubled)")
    p.add_argument("--slack", type=float, default=0.05,
                   help="re-plan, besides the trees that received memories, every tree more than SLACK x its size "
                        "above its fair share of what the tenant keeps")
    p.add_argument("--repartition", action="store_true",
                   help=f"partition every compacted {what} again in full, whatever its state")


def limits_from_args(a) -> CompactConfig:
    """The node-limit flags' :class:`~memforest_gpu.config.CompactConfig`; a bad value names its
    flag."""
    if getattr(a, "ratio", None) is not None:
        raise ValueError("--ratio does not apply to compact: the budget sets how many memories each tenant loses")
    flag = getattr(a, "limit_flag", "--max-nodes-per-tenant")
    try:
        limits = CompactConfig(max_nodes=a.max_nodes, low_water=a.low_water, repartition_growth=a.repartition_growth,
                               repartition=a.repartition, slack=a.slack)
    except ConfigError as e:
        if e.field == "max_nodes":
            raise ValueError(e.named(flag)) from None
        raise ValueError(as_flag_error(e, a)) from None
    if limits.target("") < 1:  # the limits would compact a tenant to no memory at all
        least = math.ceil(1 / a.low_water - 1e-9)
        raise ValueError(f"{flag} must be at least {least} with --low-water {a.low_water:g} (a tenant over budget is "
                         f"compacted to floor({a.low_water:g} x N) memories, which must leave one), got {a.max_nodes}")
    return limits


def add_parser(subparsers) -> None:
    c = subparsers.add_parser(
        "compact", help="keep every tenant of a store within a budget, in place",
        description="Compact every tenant of STORE that holds more than its budget, in place: new memories "
                    "(rows without a tree, and the inbox STORE.inbox.jsonl) are placed into the tenant's event "
                    "trees and only the trees that received memories or must shrink are re-planned. Tenants "
                    "within budget are not touched. docs/compaction.md")
    c.add_argument("store", help="the store (.parquet or .jsonl), rewritten atomically")
    add_limit_arguments(c)
    add_config_arguments(c)
    c.add_argument("--embedder", default="auto", help="auto | default | none | PATH, as in memforest compress")
    c.add_argument("--merger", default="extractive", help="who writes merged text (see memforest compress)")
    c.add_argument("--merger-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the merger, e.g. model=/models/qwen (VALUE read as JSON when it parses)")
    c.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    c.add_argument("--resume", action="store_true",
                   help="continue from STORE.journal.jsonl (compact always does: the flag is accepted for "
                        "symmetry with compress)")
    c.add_argument("--dry-run", action="store_true", help="print what would be removed where; write nothing")
    c.add_argument("--report", default=None, help="also write the run report as JSON to this path")
    c.add_argument("--replace-changed", action="store_true",
                   help="an inbox record whose id is an unmerged memory of the store with other text replaces it "
                        "(default: such a record stops the run, naming its line)")
    c.add_argument("--quiet", action="store_true", help="no progress bars, no note of a slow model load")
    add_review_argument(c)


def check(a) -> None:
    """The node limits, the config's flags, the embedder's value, the merger's options, the store
    and the review page's path."""
    limits_from_args(a)
    config_from_args(a)
    check_embedder_flag(a.embedder)
    parse_options(a.merger_option)
    need_input(a.store)
    check_review_path(a.review)
