"""``memforest compact STORE --max-nodes-per-tenant N``: a thin command over
:func:`~memforest_gpu.runs.compact_run.compact_file`; each flag maps to a config field (the flags
and their checks: :mod:`.compact_args`)."""
from __future__ import annotations

import dataclasses
import json
import os
import sys

from ..engine.compaction import keys_bound, rule_differs
from ..mergers import MissingOptionError, get_merger
from ..printable import printable
from ..runs.compact_run import compact_file
from ..runs.preflight import check_store
from ..store.atomic import atomic_write_text
from ..store.io import file_keys_rule
from . import review as review_cli
from .compact_args import check, limits_from_args
from .flags import config_from_args, parse_options
from .running import CLI_NAMES, guarded, option_error

__all__ = ["run", "format_compact", "review_page", "inbox_lines"]


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


@guarded
def run(a) -> int:
    """``memforest compact``: every check first, then the compaction, its table and the
    optional report and review page."""
    check(a)
    limits = limits_from_args(a)
    cfg = config_from_args(a)
    check_store(a.store, dry_run=a.dry_run, report=a.report, others=(review_cli.review_roles(a),), names=CLI_NAMES)
    cfg = _store_keys_rule(a, cfg)
    review_cli.check_review(a.review, [a.store])
    try:
        merger = get_merger(a.merger, **parse_options(a.merger_option))
    except MissingOptionError as e:
        raise ValueError(e.message(f"--merger-option {e.missing[0]}=...")) from None
    except ValueError as e:
        raise ValueError(option_error(e, ["merger"])) from None  # the options are --merger-option pairs
    res = compact_file(a.store, limits, cfg, embedder=a.embedder, merger=merger, device=a.device,
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
