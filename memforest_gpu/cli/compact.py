"""``memforest compact STORE --max-nodes-per-tenant N``: a thin command over
:func:`~memforest_gpu.runs.compact.compact_file`; each flag maps to a config field."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys

from ..config import CompactConfig, ConfigError
from ..engine.compaction import keys_bound, rule_differs
from ..mergers import MissingOptionError, get_merger
from ..printable import printable
from ..runs.compact import compact_file
from ..runs.preflight import check_store
from ..store.atomic import atomic_write_text
from ..store.io import file_keys_rule
from . import review as review_cli
from .flags import (
    CLI_NAMES,
    add_config_arguments,
    as_flag_error,
    check_embedder_flag,
    config_from_args,
    option_error,
    parse_options,
)

__all__ = ["add_parser", "run", "format_compact", "add_budget_arguments", "budget_from_args"]


def add_budget_arguments(p, *, flag: str = "--max-nodes-per-tenant", what: str = "tenant") -> None:
    """The budget flags (fields of :class:`~memforest_gpu.config.CompactConfig`)."""
    p.add_argument(flag, dest="max_nodes", type=int, required=True, metavar="N",
                   help=f"the budget: a {what} holding more than N memories is compacted")
    p.set_defaults(budget_flag=flag)
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


def budget_from_args(a):
    if getattr(a, "ratio", None) is not None:
        raise ValueError("--ratio does not apply to compact: the budget sets how many memories each tenant loses")
    flag = getattr(a, "budget_flag", "--max-nodes-per-tenant")
    try:
        budget = CompactConfig(max_nodes=a.max_nodes, low_water=a.low_water, repartition_growth=a.repartition_growth,
                               repartition=a.repartition, slack=a.slack)
    except ConfigError as e:
        if e.field == "max_nodes":
            raise ValueError(e.named(flag)) from None
        raise ValueError(as_flag_error(e, a)) from None
    if budget.target("") < 1:  # the budget would compact a tenant to no memory at all
        least = math.ceil(1 / a.low_water - 1e-9)
        raise ValueError(f"{flag} must be at least {least} with --low-water {a.low_water:g} (a tenant over budget is "
                         f"compacted to floor({a.low_water:g} x N) memories, which must leave one), got {a.max_nodes}")
    return budget


def add_parser(subparsers) -> None:
    c = subparsers.add_parser(
        "compact", help="keep every tenant of a store within a budget, in place",
        description="Compact every tenant of STORE that holds more than its budget, in place: new memories "
                    "(rows without a tree, and the inbox STORE.inbox.jsonl) are placed into the tenant's event "
                    "trees and only the trees that received memories or must shrink are re-planned. Tenants "
                    "within budget are not touched. docs/compaction.md")
    c.add_argument("store", help="the store (.parquet or .jsonl), rewritten atomically")
    add_budget_arguments(c)
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
    c.add_argument("--quiet", action="store_true", help="no progress bars")
    review_cli.add_review_argument(c)


def _store_keys_rule(a, cfg):
    """Without --keys / --text-weight, a store with keys is compacted under its own rule; with
    them, they must equal it (the engine refuses another rule, named here by its flags)."""
    if not os.path.isfile(a.store):
        return cfg
    rule = file_keys_rule(a.store)
    if rule is None:
        return cfg
    if a.keys is None and a.text_weight is None:
        keys = -1 if rule["max_keys"] is None else rule["max_keys"]
        return dataclasses.replace(cfg, merge=dataclasses.replace(cfg.merge, keys=keys,
                                                                  text_weight=rule["text_weight"]))
    if rule_differs(rule, cfg.merge):
        mk = cfg.merge.max_keys if cfg.merge.keys != 0 else 0
        raise ValueError(f"--keys and --text-weight must be the store's rule (--keys {keys_bound(rule['max_keys'])} "
                         f"--text-weight {rule['text_weight']:g}) to compact it, got --keys {keys_bound(mk)} "
                         f"--text-weight {cfg.merge.text_weight:g}: every node's keys follow that rule; to change "
                         f"it, run memforest compress STORE NEW_STORE --keys K --text-weight W")
    return cfg


def run(a) -> int:
    budget = budget_from_args(a)
    cfg = config_from_args(a)
    check_embedder_flag(a.embedder)
    check_store(a.store, dry_run=a.dry_run, report=a.report, others=(review_cli.review_roles(a),), names=CLI_NAMES)
    cfg = _store_keys_rule(a, cfg)
    review_cli.check_review(a.review, [a.store])
    try:
        merger = get_merger(a.merger, **parse_options(a.merger_option))
    except MissingOptionError as e:
        raise ValueError(e.message(f"--merger-option {e.missing[0]}=...")) from None
    except ValueError as e:
        raise ValueError(option_error(e, ["merger"])) from None  # the options are --merger-option pairs
    res = compact_file(a.store, budget, cfg, embedder=a.embedder, merger=merger, device=a.device,
                       progress=not a.quiet and sys.stderr.isatty(), dry_run=a.dry_run,
                       replace_changed=a.replace_changed, review=bool(a.review))
    print(format_compact(res))
    if a.dry_run:
        print("dry run: nothing merged, nothing written")
    elif res.written:
        print(f"wrote {a.store}")
    elif res.inbox_known or res.inbox_incomplete:
        print("every tenant is within budget and the inbox holds nothing new to fold in: the store is unchanged")
    else:
        print("every tenant is within budget and the inbox is empty: nothing written")
    d = res.report.to_dict()
    d.update({"written": res.written, "inbox": res.inbox, "replayed": res.replayed, "seconds": res.seconds,
              "inbox_known": res.inbox_known, "inbox_incomplete": len(res.inbox_incomplete),
              "inbox_incomplete_files": res.inbox_incomplete,
              "inbox_replaced": res.inbox_replaced})
    if a.report:
        atomic_write_text(a.report, json.dumps(d, indent=2, default=str))
    if a.review:
        review_cli.write_review(a.review, review_page(res, d, a.store, dry_run=a.dry_run,
                                                      command="compact" + (" --dry-run" if a.dry_run else "")))
    return 0


def review_page(res, d: dict, store: str, *, dry_run: bool, command: str) -> dict:
    """The review page of a compaction: its compacted tenants, their merges (a dry run: the
    first round's pairs), the report's figures."""
    r = res.report
    notes = [f"{len(r.tenants)} of {r.tenants_in} tenants over budget; the others are untouched and not listed"]
    eng = (r.engine.to_dict() if r.engine is not None else {})
    rep = {**{k: eng[k] for k in ("schedule", "merger", "embedder", "max_node_tokens", "condensed",
                                  "condensed_tokens", "fallbacks", "trees", "kept") if k in eng}, **d}
    work = res.work if res.work is not None else review_cli.load_columns(store)
    paths = {"store": store}
    if dry_run:
        return review_cli.page_from_plan(work, res.planned, rep, command=command, paths=paths, notes=notes)
    return review_cli.page_from_merges(work, res.merges, rep, command=command, paths=paths, notes=notes)


def inbox_lines(res) -> list[str]:
    """What the inbox held besides the records folded in (nothing when it held nothing else)."""
    lines = []
    if res.inbox_known:
        lines.append(f"{res.inbox_known} inbox record(s) already in the store (same id and text, or merged): not "
                     "folded in again")
    if res.inbox_replaced:
        lines.append(f"{res.inbox_replaced} store memories replaced by inbox records with other text "
                     "(--replace-changed)")
    for path in res.inbox_incomplete:
        lines.append(f"1 incomplete line left in {path} (no final newline: a record still being written, or cut off; "
                     "it is read once it ends with a newline)")
    return lines


def format_compact(res, *, max_tenants: int = 20) -> str:
    """Per compacted tenant: nodes in, budget, kept, new memories, placed, new trees, trees
    re-planned of all; then totals and time per step."""
    r = res.report
    lines = [f"{'tenant':<24} {'in':>7} {'budget':>7} {'out':>7} {'new':>6} {'placed':>6} {'+trees':>6} "
             f"{'replanned':>10}  note"]
    for t in r.tenants[:max_tenants]:
        note = ("partitioned in full; " if t["repartitioned"] else "") + \
               (f"short by {t['shortfall']}" if t["shortfall"] else "")
        lines.append(f"{printable(t['tenant'])[:24]:<24} {t['nodes_in']:>7} {t['budget']:>7} {t['nodes_out']:>7} "
                     f"{t['new']:>6} {t['placed']:>6} {t['new_trees']:>6} {t['trees_replanned']:>4} of "
                     f"{t['trees']:<4}  {note.rstrip('; ')}")
    if len(r.tenants) > max_tenants:
        lines.append(f"... and {len(r.tenants) - max_tenants} more compacted tenants")
    lines.append(f"{len(r.tenants)} of {r.tenants_in} tenants over budget; nodes {r.nodes_in} -> {r.nodes_out}; "
                 f"{r.merges} merges in {r.rounds} rounds" + (f"; {res.inbox} inbox records folded in" if res.inbox
                                                              else "")
                 + (f"; {res.replayed} merges replayed from the journal" if res.replayed else ""))
    if r.shortfall:
        lines.append(f"shortfall: {r.shortfall} removals could not be made (reported per tenant above)")
    lines += inbox_lines(res)
    lines.append("time: " + ", ".join(f"{k} {v:.2f}s" for k, v in res.seconds.items()))
    return "\n".join(lines)
