"""The results page: docs/results/README.md, rendered from the benchmarks' JSON records.

    python bench/results.py                     # render docs/results/README.md from docs/results/records/
    python bench/results.py --check             # exit 1 when the committed page is not the records' rendering
    python bench/results.py add-eval RUN/results.json --id ID --title TITLE --command "memforest eval ..."
    python bench/results.py add-compare compare.json --id ID --title TITLE --section speed

No figure on the page is typed by hand: every one comes from a record, one JSON file per
benchmark run under ``docs/results/records/``, and each group of records (same machine, same
date, same source) states its machine and date once. A record::

    {"format": "memforest-record/1",
     "title": "what was measured", "section": "speed | search | compaction | quality | gpu",
     "order": 10,                                  # place within the section (optional)
     "command": "the command that gave the figures (a string or a list of them)",
     "machine": "2 x86-64 cores, 24 GiB, no GPU, torch 2.13.0 (CPU build)",
     "date": "YYYY-MM-DD", "revision": "the commit measured (optional)",
     "source": {"kind": "measured"}                # or, for figures copied from earlier docs:
               {"kind": "transcribed", "page": "docs/performance.md", "at": "83c80c9"},
     "notes": ["markdown lines shown under the figures (optional)"],
     ...and one of:
     "table": {"columns": [...], "rows": [[...], ...]},
     "eval": <the results.json memforest eval wrote>,  "view": {"metrics": [...], "cut": "B", ...},
     "compare": <the --json file bench/compare.py wrote>, "view": {"metrics": [...]}}

``add-eval`` and ``add-compare`` wrap a run's own output into a record (machine, date and
revision taken from this machine and checkout unless given) and render the page again.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
RECORDS = RESULTS / "records"
PAGE = RESULTS / "README.md"
FORMAT = "memforest-record/1"
SECTIONS = {"speed": "Compression: time and memory", "search": "Search", "compaction": "Compaction and Mem0",
            "quality": "Quality", "gpu": "GPU"}
KINDS = ("table", "eval", "compare")
EVAL_VIEW = {"metrics": ["ansr_retention", "ansr_content_retention"], "cut": "B", "retriever": "plain",
             "category": "all"}


class RecordError(ValueError):
    """A record that does not follow the format (module docstring)."""


def check_record(name: str, r: dict) -> None:
    """Refuse a record the page cannot state honestly: no machine, date, command or source."""
    def need(cond, what):
        if not cond:
            raise RecordError(f"{name}: {what}")
    need(r.get("format") == FORMAT, f"format must be {FORMAT!r}, got {r.get('format')!r}")
    for key in ("title", "section", "machine", "date"):
        need(isinstance(r.get(key), str) and r[key].strip(), f"{key} must be a non-empty string")
    need(len(r["date"]) == 10 and r["date"][4] == "-" and r["date"][7] == "-", f"date must be YYYY-MM-DD, got "
         f"{r['date']!r}")
    cmd = r.get("command")
    need(isinstance(cmd, str) and cmd.strip() or isinstance(cmd, list) and cmd and all(isinstance(c, str) for c in cmd),
         "command must be a string or a list of strings")
    src = r.get("source") or {}
    need(src.get("kind") in ("measured", "transcribed"), "source.kind must be 'measured' or 'transcribed'")
    if src["kind"] == "transcribed":
        need(src.get("page") and src.get("at"), "a transcribed record names the page and the revision it was "
             "copied from (source.page, source.at)")
    kinds = [k for k in KINDS if k in r]
    need(len(kinds) == 1, f"a record holds exactly one of {KINDS}, got {kinds}")
    if "table" in r:
        t = r["table"]
        need(isinstance(t.get("columns"), list) and isinstance(t.get("rows"), list), "table needs columns and rows")
        bad = [i for i, row in enumerate(t["rows"]) if len(row) != len(t["columns"])]
        need(not bad, f"table rows {bad} do not have {len(t['columns'])} cells")


def load_records(folder: Path = RECORDS) -> list[tuple[str, dict]]:
    """Every record of ``folder`` (``*.json``), checked, by file name."""
    out = []
    for path in sorted(folder.glob("*.json")):
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
        check_record(path.name, rec)
        out.append((path.stem, rec))
    return out


def cell(v) -> str:
    """One table cell: numbers with thousands separators, text as written (pipes escaped)."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return "–" if math.isnan(v) else f"{v:,.6g}" if abs(v) >= 1000 else f"{v:.6g}"
    return str(v).replace("|", "\\|")


def md_table(columns: list, rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + " --- |" * len(columns)]
    return out + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]


def _pct(v: float | None) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}"


def eval_table(data: dict, view: dict | None = None) -> tuple[list, list[list], list[str]]:
    """A ``memforest eval`` results.json as one table: a row per method, a column per ratio, each
    cell the view's metrics (retentions and shares in %, mean over seeds) joined by " / "."""
    v = {**EVAL_VIEW, **(view or {})}
    want = {m: [] for m in v["metrics"]}
    cells: dict[tuple, dict[str, list[float]]] = {}
    for r in data["records"]:
        if r.get("seed") == "mean" or r.get("value") is None or r.get("metric") not in want:
            continue
        if r.get("category", "all") != v["category"]:
            continue
        if r.get("cut") not in ("-", v["cut"]) or r.get("retriever") not in ("-", v["retriever"]):
            continue
        sched = r.get("schedule") or "-"
        method = r["method"] if sched in ("-", None) else f"{r['method']}:{sched}"
        cells.setdefault((method, float(r["ratio"])), {}).setdefault(r["metric"], []).append(float(r["value"]))
    methods = sorted({m for m, _ in cells})
    ratios = sorted({x for _, x in cells if x > 0})
    fmt = lambda m, xs: _pct(statistics.fmean(xs)) if m.endswith(("retention", "share")) else cell(
        statistics.fmean(xs))
    rows = []
    for m in methods:
        if m == "none":  # the uncompressed store: the denominator of every retention
            continue
        got = [cells.get((m, x), {}) for x in ratios]
        rows.append([m, *(" / ".join(fmt(k, g[k]) if k in g else "–" for k in v["metrics"]) for g in got)])
    meta = data.get("meta", {})
    facts = [f"{k} {meta[k]}" for k in ("benchmark", "nodes", "questions") if k in meta]
    notes = [(f"Cells: {' / '.join(v['metrics'])} at cut {v['cut']}, {v['retriever']} retrieval, category "
              f"{v['category']}, in % (mean over seeds). " + ("; ".join(facts) + "." if facts else "")).strip()]
    return ["method", *[f"ratio {x:g}" for x in ratios]], rows, notes


def compare_table(data: dict, view: dict | None = None) -> tuple[list, list[list], list[str]]:
    """bench/compare.py's --json as a table: each metric's medians and the median B / A of the
    interleaved pairs with its min and max."""
    a, b = data["a"]["runs"], data["b"]["runs"]
    keys = sorted(set().union(*a, *b))
    if view and view.get("metrics"):
        keys = [k for k in view["metrics"] if k in keys]
    rows = []
    for k in keys:
        va, vb = [r[k] for r in a if k in r], [r[k] for r in b if k in r]
        pairs = [rb[k] / ra[k] for ra, rb in zip(a, b) if k in ra and k in rb and ra[k] > 0]
        ratio = f"{statistics.median(pairs):.3f} [{min(pairs):.3f}, {max(pairs):.3f}]" if pairs else "–"
        rows.append([k, statistics.median(va) if va else None, statistics.median(vb) if vb else None, ratio])
    cols = ["metric", f"A = {data['a']['rev']}", f"B = {data['b']['rev']}", "B / A (min, max)"]
    return cols, rows, [f"{len(a)} runs of A and {len(b)} of B, interleaved."]


def figures(r: dict) -> tuple[list, list[list], list[str]]:
    if "table" in r:
        return r["table"]["columns"], r["table"]["rows"], []
    if "eval" in r:
        return eval_table(r["eval"], r.get("view"))
    return compare_table(r["compare"], r.get("view"))


def group_key(r: dict) -> tuple:
    return r["machine"], r["date"]


def group_header(r: dict) -> str:
    return f"**Machine:** {r['machine']}. **Date:** {r['date']}."


def provenance(rid: str, r: dict) -> str:
    s = r["source"]
    line = f"<a id=\"{rid}\"></a>Record `records/{rid}.json`" + (f", code at {r['revision']}" if r.get("revision")
                                                                  else "") + "."
    if s["kind"] == "transcribed":
        return line + (f" *Transcribed from `{s['page']}` at revision {s['at']}: copied from the earlier "
                       "documentation, not measured again.*")
    return line + " Measured."


def render_record(rid: str, r: dict) -> list[str]:
    cols, rows, extra = figures(r)
    cmds = r["command"] if isinstance(r["command"], list) else [r["command"]]
    out = [f"### {r['title']}", "", provenance(rid, r), "", "```bash", *cmds, "```", ""]
    out += md_table(cols, rows) + [""]
    notes = [*extra, *r.get("notes", [])]
    return out + ([f"- {n}" for n in notes] + [""] if notes else [])


def render(records: list[tuple[str, dict]]) -> str:
    """The whole page (module docstring)."""
    out = ["# Results", "",
           "What memforest measured: speed, memory, search and quality. This page is generated by "
           "`python bench/results.py` from the JSON records in [records/](records/), one per benchmark run; "
           "do not edit it by hand (`tests/test_results_page.py` renders it again and compares). Each group "
           "of records names its machine and date once; figures from one machine and day compare with each "
           "other, not with another group's. Transcribed records hold figures copied from the documentation "
           "before this page existed, with the page and revision they came from; runs measured since are "
           "marked *Measured*. How each benchmark works: [bench/README.md](../../bench/README.md); what was "
           "tried on the way: [the studies](../studies/README.md). The newest group of each section comes first.", ""]
    order = list(SECTIONS) + sorted({r["section"] for _, r in records} - set(SECTIONS))
    for sec in order:
        recs = sorted(((i, r) for i, r in records if r["section"] == sec),
                      key=lambda ir: (group_key(ir[1]), ir[1].get("order", 0), ir[0]))
        recs.sort(key=lambda ir: ir[1]["date"], reverse=True)  # the newest group first (a stable sort)
        if not recs:
            continue
        out += [f"## {SECTIONS.get(sec, sec.capitalize())}", ""]
        last = None
        for rid, r in recs:
            if group_key(r) != last:
                out += [group_header(r), ""]
                last = group_key(r)
            out += render_record(rid, r)
    return "\n".join(out).rstrip("\n") + "\n"


def machine_line() -> str:
    """This machine in words: cores, memory, device, torch."""
    try:
        import torch
        dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
        tv = f", torch {torch.__version__}"
    except ImportError:
        dev, tv = "no GPU", ""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30 if hasattr(os, "sysconf") else 0
    return f"{os.cpu_count()} {platform.machine()} cores, {mem:.0f} GiB, {dev}{tv}"


def revision() -> str:
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def slim_eval(data: dict) -> dict:
    """What a page shows of a results.json: each metric over all questions (not per category),
    averaged over seeds (``seeds``: how many), without the per-cell timings."""
    groups: dict[tuple, list[float]] = {}
    for r in data["records"]:
        if r.get("category", "all") != "all" or r.get("seed") == "mean" or r.get("value") is None:
            continue
        key = (r["method"], r.get("schedule") or "-", r["ratio"], r["retriever"], r["cut"], r["metric"])
        groups.setdefault(key, []).append(float(r["value"]))
    records = [{"method": m, "schedule": s, "ratio": x, "retriever": rt, "cut": c, "metric": k,
                "value": statistics.fmean(v), "seeds": len(v)} for (m, s, x, rt, c, k), v in groups.items()]
    return {"meta": {k: v for k, v in data.get("meta", {}).items() if k != "cells"}, "records": records}


def add(kind: str, a) -> Path:
    """Wrap a run's own output file into a record, write it, and render the page again."""
    with open(a.file, encoding="utf-8") as f:
        data = json.load(f)
    if kind == "eval":
        data = slim_eval(data)
    rec = {"format": FORMAT, "title": a.title, "section": a.section, "order": a.order,
           "command": a.command or (" ".join(data["command"]) if kind == "compare" else ""),
           "machine": a.machine or machine_line(), "date": a.date or time.strftime("%Y-%m-%d"),
           "revision": a.revision if a.revision is not None else revision(), "source": {"kind": "measured"},
           kind: data}
    if a.notes:
        rec["notes"] = a.notes
    if a.metrics:
        rec["view"] = {"metrics": a.metrics.split(",")}
    path = Path(a.records) / f"{a.id}.json"
    check_record(path.name, rec)
    path.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", default=str(RECORDS), help="the records' folder (default docs/results/records)")
    ap.add_argument("--page", default=str(PAGE), help="the page to write (default docs/results/README.md)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page differs")
    sub = ap.add_subparsers(dest="action")
    for kind in ("eval", "compare"):
        p = sub.add_parser(f"add-{kind}", help=f"record a run's {'results.json' if kind == 'eval' else '--json'}")
        p.add_argument("file")
        p.add_argument("--id", required=True, help="the record's file name, without .json")
        p.add_argument("--title", required=True)
        p.add_argument("--section", default="quality" if kind == "eval" else "speed", choices=list(SECTIONS))
        p.add_argument("--order", type=int, default=0)
        p.add_argument("--command", default=None, help="the command that wrote FILE")
        p.add_argument("--machine", default=None, help="default: this machine")
        p.add_argument("--date", default=None, help="YYYY-MM-DD (default: today)")
        p.add_argument("--revision", default=None, help="default: this checkout's HEAD")
        p.add_argument("--metrics", default=None, help="comma list of the metrics to show")
        p.add_argument("--notes", action="append", default=[], help="a line under the figures (repeatable)")
    a = ap.parse_args(argv)
    try:
        if a.action:
            print(f"wrote {add(a.action.removeprefix('add-'), a)}")
        page = render(load_records(Path(a.records)))
    except (RecordError, OSError, KeyError, json.JSONDecodeError) as e:
        print(f"results.py: error: {e}", file=sys.stderr)
        return 2
    path = Path(a.page)
    if a.check:
        same = path.exists() and path.read_text(encoding="utf-8") == page
        print("the page matches its records" if same else f"{path} differs from its records: run "
              "python bench/results.py", file=sys.stdout if same else sys.stderr)
        return 0 if same else 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
