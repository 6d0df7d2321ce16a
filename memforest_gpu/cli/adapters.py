"""``memforest mem0 compress|compact|restore`` and ``memforest graph compress``: thin commands
over :mod:`memforest_gpu.adapters.mem0.inplace` and :mod:`memforest_gpu.adapters.graph` (their
flags and checks: :mod:`.adapters_args`). ``main(argv)`` runs them on their own.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import sys

import torch

from ..adapters.graph import compress_graph, read_graph, write_graph
from ..adapters.m3_streammeco import compress_video
from ..adapters.m3agent import is_m3_agent_path, load_video_graph, save_video_graph
from ..adapters.mem0.compaction import compact_mem0
from ..adapters.mem0.inplace import Scope, close_memory, compress_mem0, format_plan, load_memory, restore_mem0
from ..adapters.mem0.restore import open_for_restore
from ..api import resolve_embedder
from ..mergers import get_merger
from ..mergers.embedders import get_embedder
from ..runs.outputs import check_output
from ..runs.paths import check_paths, reads, writes
from ..runs.preflight import preflight
from ..store.atomic import atomic_write_text
from ..store.io import detect_format
from ..store.memory_store import MemoryStore
from . import review as review_cli
from .adapters_args import add_parser, check
from .compact_args import limits_from_args
from .flags import check_embedder_flag, config_from_args, parse_options, refuse_ignored
from .parser import Parser, check_usage
from .report_text import format_report
from .running import CLI_NAMES, guarded

__all__ = ["run", "main"]


def _config(a):
    return config_from_args(a)


def _merger(a):
    return get_merger(a.merger, **parse_options(a.merger_option))


def _progress(a) -> bool:  # bars only on a terminal
    return not a.quiet and sys.stderr.isatty()


def _write_report(a, d: dict) -> None:
    if a.report:
        atomic_write_text(a.report, json.dumps(d, indent=2, default=str))


def _mem0_compress(a) -> int:

    scope = Scope(user_id=a.user_id, agent_id=a.agent_id, run_id=a.run_id, all_tenants=a.all_tenants)
    cfg, merger = _config(a), _merger(a)  # bad options fail before Mem0 is opened
    check_paths(reads("--config", a.config), writes("--backup", a.backup), writes("--report", a.report),
                review_cli.review_roles(a))
    if a.backup:
        check_output(a.backup, inputs=[a.config], what="--backup", needs_format=False)
    if a.report:
        check_output(a.report, inputs=[a.config, a.backup], what="--report", needs_format=False)
    review_cli.check_review(a.review, [a.config])
    memory = load_memory(a.config, quiet=not _progress(a))
    try:
        res = compress_mem0(memory, scope, cfg, merger=merger, backup=a.backup, dry_run=a.dry_run,
                            device=a.device, progress=_progress(a), write_path=a.write_path)
    finally:
        close_memory(memory)
    print(format_plan(res, max_groups=a.show))
    if a.dry_run:
        print("dry run: nothing written, nothing deleted")
    elif res.groups:
        print(f"backup: {res.backup}")
        if res.relinked:
            print(f"entities relinked to merged memories: {res.relinked}")
        print(f"added {len(res.groups)} merged memories, deleted {len(res.deleted)}; "
              f"undo with: memforest mem0 restore {res.backup} --config {a.config}")
    else:
        print("nothing to merge: the store is unchanged")
    print("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in res.seconds.items()))
    _write_report(a, {"scope": res.scope.filters or "all", "memories_in": res.n_in, "dry_run": res.dry_run,
                      "seconds": res.seconds,
                      "backup": res.backup, "deleted": res.deleted, "left_alone": res.left_alone,
                      "merged": [g.__dict__ for g in res.groups],
                      "engine": res.report.to_dict() if res.report else None})
    _mem0_review(a, res, "mem0 compress", ratio=cfg.merge.ratio)
    return 0


def _mem0_review(a, res, command: str, ratio: float | None = None) -> None:
    """The review page of a Mem0 run (its scope's memories and their merges); ``ratio``: the
    ``--ratio`` asked (a compression's)."""
    if not a.review:
        return
    command += " --dry-run" if a.dry_run else ""
    notes = [f"scope {res.scope.filters or 'all'}: {res.n_in} memories"
             + (f"; left alone: {', '.join(f'{k} {v}' for k, v in res.left_alone.items())}" if res.left_alone else "")]
    if a.dry_run and not res.planned:
        notes.append("dry run: compressed in memory (the merger was called); nothing written to Mem0")
    rep = res.report.to_dict() if res.report is not None else {}
    if "engine" in rep:  # a compaction: the engine's figures beside the compaction's rows
        eng = rep.get("engine") or {}
        rep = {**{k: eng[k] for k in ("schedule", "merger", "embedder", "max_node_tokens", "condensed",
                                      "condensed_tokens", "fallbacks", "trees") if k in eng}, **rep}
    rep["seconds"] = res.seconds
    if ratio is not None:
        rep["ratio_asked"] = ratio
    paths = {"config": a.config}
    if res.work is None:  # nothing to compress in the scope
        work = MemoryStore.from_columns(ids=[], texts=[], timestamps=[], embeddings=torch.ones(0, 1))
        page = review_cli.page_from_plan(work, [], rep, command=command, paths=paths, notes=notes)
    elif res.planned:
        page = review_cli.page_from_plan(res.work, res.merges, rep, command=command, paths=paths, notes=notes)
    else:
        page = review_cli.page_from_merges(res.work, res.merges, rep, command=command, paths=paths, notes=notes)
    review_cli.write_review(a.review, page)


def _mem0_compact(a) -> int:
    ids = {k: getattr(a, k) for k in ("user_id", "agent_id", "run_id") if getattr(a, k)}
    scope = Scope(**ids) if ids else Scope(all_tenants=True)
    limits, cfg, merger = limits_from_args(a), _config(a), _merger(a)  # bad options fail before Mem0 is opened
    state = a.state or a.config + ".compact.json"
    check_paths(reads("--config", a.config), writes("--state", state), writes("--backup", a.backup),
                writes("--report", a.report), review_cli.review_roles(a))
    for path, what in ((a.backup, "--backup"), (a.report, "--report"), (state, "--state")):
        if path:
            check_output(path, inputs=[a.config], what=what, needs_format=False)
    review_cli.check_review(a.review, [a.config])
    memory = load_memory(a.config, quiet=not _progress(a))
    try:
        res = compact_mem0(memory, limits, cfg, scope=scope, state=state, merger=merger, backup=a.backup,
                           dry_run=a.dry_run, device=a.device, progress=_progress(a), write_path=a.write_path,
                           plan=bool(a.review))
    finally:
        close_memory(memory)
    rep = res.report
    over = len(rep.tenants) if rep is not None else 0
    print(format_plan(res, max_groups=a.show))
    print(f"{over} tenant(s) over a budget of {a.max_nodes} memories" + (
        "; " + ", ".join(f"{t['tenant']} {t['nodes_in']} -> {t['nodes_out']}" for t in rep.tenants[:10])
        + (" ..." if over > 10 else "") if over else ""))
    if a.dry_run:
        print("dry run: nothing written, nothing deleted")
    elif res.groups:
        print(f"backup: {res.backup}\nadded {len(res.groups)} merged memories, deleted {len(res.deleted)}; state "
              f"{state}; undo with: memforest mem0 restore {res.backup} --config {a.config}")
    print("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in res.seconds.items()))
    _write_report(a, {"scope": res.scope.filters or "all", "memories_in": res.n_in, "dry_run": res.dry_run,
                      "seconds": res.seconds, "backup": res.backup, "deleted": res.deleted, "state": state,
                      "left_alone": res.left_alone, "merged": [g.__dict__ for g in res.groups],
                      "engine": rep.to_dict() if rep is not None else None})
    _mem0_review(a, res, "mem0 compact")
    return 0


def _mem0_restore(a) -> int:
    memory = open_for_restore(a.config, a.backup, quiet=True)
    try:
        r = restore_mem0(memory, a.backup)
    finally:
        close_memory(memory)
    print(f"restored scope {r['scope'] or 'all'} from {a.backup}: {r['count']} memories; {r['restored']} put back, "
          f"{r['rewritten']} rewritten, {r['unchanged']} unchanged, {r['removed']} removed ({r['seconds']:.1f} s)")
    if "entities" in r:
        e = r["entities"]
        print(f"entities: {e['restored']} put back, {e['rewritten']} rewritten, {e['unchanged']} unchanged, "
              f"{e['removed']} removed")
    return 0


def _graph_compress(a) -> int:

    if is_m3_agent_path(a.input, a.format):
        check_paths(reads("INPUT", a.input), writes("OUTPUT", a.output), writes("--report", a.report),
                    review_cli.review_roles(a))
        review_cli.check_review(a.review, [a.input])
        if a.review:
            raise ValueError("--review applies to graph files (JSONL or Parquet), got an M3-Agent pickle: convert it "
                             "or drop --review")
        check_output(a.output, inputs=[a.input], what="OUTPUT", needs_format=False)
        if a.report:
            check_output(a.report, inputs=[a.input], what="--report", needs_format=False)
        return _m3_compress(a)
    preflight(a.input, a.output, format=a.format, out_format=a.out_format, report=a.report,
              others=(review_cli.review_roles(a),), lock=False, journal=False, names=CLI_NAMES, kind="graph file")
    review_cli.check_review(a.review, [a.input])
    refuse_ignored(a, {"m3_vectors": "auto"}, "applies only to an M3-Agent graph (a .pkl input or --format m3-agent)")
    cfg = _config(a)
    check_embedder_flag(a.embedder)
    merger = _merger(a)
    load_emb = None if a.embedder == "none" else get_embedder("default" if a.embedder == "auto" else a.embedder,
                                                              device=a.device)
    g = read_graph(a.input, format=a.format, embedder=load_emb, device=a.device)
    if g.texts is None:
        raise ValueError(f"{a.input}: graph must have at least one text node, got 0")
    if a.embedder == "auto" and not load_emb.loaded:  # the file's own vectors; graph files record no model
        g = dataclasses.replace(g, texts=dataclasses.replace(g.texts, embedder=None))
    if load_emb is not None and g.texts.embedder == load_emb.name:
        emb = load_emb  # one model per run
    elif a.method == "streammeco":
        emb = None  # StreamMeCo removes nodes and merges none: no merged vector to make, nothing to warn about
    else:
        emb = resolve_embedder(a.embedder, g.texts.embedder, device=a.device)
    res = compress_graph(g, cfg, merger=merger, embedder=emb, device=a.device, progress=_progress(a),
                         method=a.method)
    write_graph(res.graph, a.output, format=a.out_format)
    print(format_report(res.report))
    how = (f"{res.info['edges_dropped']} of removed nodes dropped" if a.method == "streammeco" else
           f"{res.internal_edges} between merged nodes dropped, the rest folded into the merged nodes with weights "
           "summed")
    print(f"edges {res.info['edges_in']} -> {res.info['edges_out']} ({how}); entities unchanged: "
          f"{len(res.graph.entities)}")
    print(f"wrote {a.output}")
    _write_report(a, {**res.report.to_dict(), **res.info})
    if a.review and a.method == "streammeco":
        print("no review page: --method streammeco prunes nodes and merges none")
    elif a.review:
        review_cli.write_review(a.review, review_cli.page_from_merges(
            g.texts, res.merges, {**res.report.to_dict(), **res.info, "ratio_asked": cfg.merge.ratio},
            command="graph compress",
            paths={"input": a.input, "output": a.output},
            notes=[f"edges {res.info['edges_in']} -> {res.info['edges_out']}; tenants are graph/node type"]))
    return 0


def _m3_compress(a) -> int:
    if a.out_format is not None and not is_m3_agent_path(a.output, a.out_format):
        raise ValueError(f"an M3-Agent graph is written back as an M3-Agent pickle: --out-format must be m3-agent, "
                         f"got {a.out_format!r}")
    if a.method == "streammeco":
        refuse_ignored(a, {"m3_vectors": "auto"}, "applies only with --method memforest (StreamMeCo keeps nodes as "
                                                  "they were)")
    if a.out_format is None and not is_m3_agent_path(a.output, None):
        try:
            fmt = detect_format(a.output, None, flag="--out-format")
        except ValueError:
            fmt = None  # a suffix of no format (.bin): the pickle goes there, as asked
        if fmt is not None:
            raise ValueError(f"OUTPUT must be an M3-Agent pickle (.pkl or .pickle), as an M3-Agent graph is written "
                             f"back as one, got {a.output!r}, whose suffix says {fmt}; name it .pkl (or pass "
                             "--out-format m3-agent to write the pickle there anyway)")
    cfg, merger = _config(a), _merger(a)
    if a.method != "streammeco" and a.m3_vectors != "auto" and cfg.merge.keys in (0, 1):
        raise ValueError(f"--m3-vectors bounds a merged node's text vector and keys: it applies with --keys K >= 2 or "
                         f"all, got --keys {cfg.merge.keys} (one vector per node, whatever --m3-vectors says)")
    g = load_video_graph(a.input)
    # auto: the mean of the merged vectors; StreamMeCo merges nothing, so it needs no model (and no warning)
    emb = None if a.method == "streammeco" else resolve_embedder(a.embedder, None, device=a.device)
    res = compress_video(g, cfg, method=a.method, merger=merger, embedder=emb, device=a.device,
                         progress=_progress(a), vectors=a.m3_vectors)
    save_video_graph(res.graph, a.output)
    i = res.info
    print(format_report(res.report))
    how = (f"{i['removed']} removed by StreamMeCo), edges {i['edges_in']} -> {i['edges_out']} (those of removed "
           "nodes dropped" if a.method == "streammeco" else
           f"{i['merged_nodes']} merged nodes), edges {i['edges_in']} -> {i['edges_out']} ({i['internal_edges']} "
           "between merged nodes dropped, the rest moved to the merged nodes with weights summed")
    print(f"M3-Agent graph: text nodes {i['text_in']} -> {i['text_out']} ({how}); face and voice nodes unchanged")
    if "vectors_per_node" in i:
        bound = "no bound" if i["vector_bound"] is None else f"at most {i['vector_bound']}"
        print(f"text-node vectors {i['text_vectors_in']} -> {i['text_vectors_out']} ({i['vectors_per_node']} per node; "
              f"--m3-vectors {a.m3_vectors}: {bound})")
    print(f"wrote {a.output}")
    _write_report(a, {**res.report.to_dict(), **i})
    return 0


@guarded
def run(args) -> int:
    """Run a parsed ``mem0`` or ``graph`` command."""
    check(args)
    fn = {("mem0", "compress"): _mem0_compress, ("mem0", "compact"): _mem0_compact, ("mem0", "restore"): _mem0_restore,
          ("graph", "compress"): _graph_compress}[(args.cmd, args.sub)]
    return fn(args)


def main(argv: list[str] | None = None) -> int:
    """``memforest mem0 ...`` / ``memforest graph ...`` on their own (the same words as
    ``memforest``)."""
    ap = Parser(prog="memforest")
    ap.add_argument("-v", "--verbose", action="store_true")
    add_parser(ap.add_subparsers(dest="cmd", required=True))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    return run(args) if check_usage(args, check) else 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
