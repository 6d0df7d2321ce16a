"""``memforest``: a thin command line over the Python API. Each flag maps to a config field."""
from __future__ import annotations

import argparse
import json
import logging
import re
import sys

import torch

from ..api import compress_file, dry_run_file, read_store, search_file
from ..mergers import get_merger
from ..printable import printable
from ..report import MergerStats
from ..retrieval.context import MIN_BUDGET
from ..runs.errors import OPTION_WORDS
from ..runs.paths import check_paths, writes
from ..runs.preflight import preflight
from ..sizes import parse_size
from ..store.atomic import atomic_write_text
from ..store.io import detect_format
from ..store.size import bytes_per_vector, store_size
from ..store.timeutil import format_date
from . import adapters as adapters_cli
from . import compact as compact_cli
from . import eval as eval_cli
from . import review as review_cli
from .demo import run_demo
from .flags import (
    CLI_NAMES,
    add_config_arguments,
    check_embedder_flag,
    config_from_args,
    error_message,
    interrupted_message,
    option_error,
)
from .parser import HelpFormatter, Parser  # noqa: F401 (HelpFormatter: re-exported)
from .report import format_report, kb

__all__ = ["main", "build_parser", "printable"]


def _add_search_parser(sub) -> None:
    """``memforest search``: hits, or with ``--budget`` the context (retrieval/context.py)."""
    s = sub.add_parser("search", help="search a store", description="Search a memory store with a text query.")
    s.add_argument("store", help="the store to search (.parquet or .jsonl)")
    s.add_argument("query", help="the query text")
    s.add_argument("-k", type=int, default=None, help="hits to show (default 10; with --budget: hits read, 40)")
    s.add_argument("--agpr", action="store_true", help="anchor-guided propagation re-ranking")
    s.add_argument("--tenant", default=None,
                   help="search only this tenant's memories (needed when the store has several tenants)")
    s.add_argument("--json", action="store_true", help="print the hits as JSON")
    s.add_argument("--budget", type=int, default=None, metavar="B",
                   help="show the context instead: pieces filling B whitespace tokens (256: the evaluation's @B)")
    s.add_argument("--fill", default=None, choices=("pooled", "ranked", "focused", "plain"),
                   help="with --budget: pooled (the part of a merged node that matched first, the last pieces by "
                        "their best sentences; the default for a store with merged nodes) | ranked (parts, the last "
                        "cut) | focused (the last piece by its best sentences) | plain (whole nodes in rank order)")
    s.add_argument("--embedder", default="auto",
                   help="auto: the store's recorded model (all-MiniLM-L6-v2 for a store without vectors) | "
                        "default (all-MiniLM-L6-v2) | PATH: the model of the store's vectors")
    s.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="memforest", description="Compress and search LLM-agent memory stores.")
    ap.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    c = sub.add_parser("compress", help="compress a store (Parquet or JSONL) into a new file",
                       description="Compress a memory store (Parquet or JSONL) into a new file; the input is "
                                   "never modified.")
    c.add_argument("input", help="the store to compress (.parquet, .pq, .jsonl, .ndjson or .json)")
    c.add_argument("output", help="the compressed store to write (a new path; its suffix sets the format)")
    c.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    add_config_arguments(c)
    c.add_argument("--embedder", default="auto",
                   help="auto: embed a store without vectors with all-MiniLM-L6-v2, re-embed with a store's "
                        "recorded model, else merged vectors are the mean of their inputs | default "
                        "(all-MiniLM-L6-v2) | none (mean) | PATH (a local sentence-transformers model)")
    c.add_argument("--merger", default="extractive",
                   help="who writes merged text: extractive (no model) | transformers (local model dir or .gguf) | "
                        "vllm (in-process, GPU) | openai (any OpenAI-compatible server)")
    c.add_argument("--model", default=None, help="LLM mergers: model directory, .gguf file, or served model name")
    c.add_argument("--base-url", default=None, help="openai: endpoint, e.g. http://127.0.0.1:8000/v1")
    c.add_argument("--api-key-env", default=None, help="openai: environment variable holding the API key "
                                                       "(default OPENAI_API_KEY; none sent when unset)")
    c.add_argument("--max-concurrency", type=int, default=None, help="openai: requests in flight (default 16)")
    c.add_argument("--timeout", type=float, default=None, help="openai: seconds per request (default 120)")
    c.add_argument("--max-retries", type=int, default=None, help="openai: retries per request (default 3)")
    c.add_argument("--max-tokens", type=int, default=None, help="LLM mergers: tokens per merged text (default 256)")
    c.add_argument("--batch-size", type=int, default=None, help="transformers: prompts per generate (default 8)")
    c.add_argument("--dtype", default=None,
                   help="transformers/vllm: auto | float16 | bfloat16 | float32 (default: auto)")
    c.add_argument("--tensor-parallel-size", type=int, default=None, help="vllm: GPUs per model (default 1)")
    c.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vllm: fraction of GPU memory for the model and KV cache "
                        "(default: what is free when the model loads, less 2 GiB)")
    c.add_argument("--format", default=None, help="input format: parquet | jsonl (default: from the suffix)")
    c.add_argument("--out-format", default=None, help="output format: parquet | jsonl (default: from the suffix)")
    c.add_argument("--report", default=None, help="also write the run report as JSON to this path (default: none)")
    c.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from OUTPUT.journal.jsonl without redoing its merges")
    c.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="compress tenant groups that fit SIZE (e.g. 4G, 512M) one at a time, for stores bigger "
                        "than memory; same output as without it (default: the whole store at once)")
    c.add_argument("--dry-run", action="store_true",
                   help="print the first round's planned merges (pairs, similarity) and write nothing")
    c.add_argument("--quiet", action="store_true",
                   help="no progress bars (they are shown only when stderr is a terminal)")
    review_cli.add_review_argument(c)

    _add_search_parser(sub)

    i = sub.add_parser("info", help="counts, tenants, dimension, time span",
                       description="Counts, tenants, dimension and time span of a store (embeds nothing).")
    i.add_argument("store", help="the store to describe (.parquet or .jsonl)")
    i.add_argument("--json", action="store_true", help="print the numbers as JSON")

    d = sub.add_parser("demo", help="compress the bundled sample store and show what changed",
                       description="Compress the bundled sample store and show what changed.")
    d.add_argument("--ratio", type=float, default=0.5, help="fraction of each user's memories to remove")
    d.add_argument("--out", default=None, help="also write the sample and its compressed form in this folder")
    d.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")

    compact_cli.add_parser(sub)  # compact
    adapters_cli.add_parser(sub)  # mem0 compress|restore, graph compress
    eval_cli.add_parser(sub)  # eval
    review_cli.add_parser(sub)  # review
    return ap


_MERGER_FLAGS = {  # option name -> the mergers that take it (the flag is its dashed form)
    "model": ("transformers", "vllm", "openai"), "base_url": ("openai",), "api_key_env": ("openai",),
    "max_concurrency": ("openai",), "timeout": ("openai",), "max_retries": ("openai",),
    "max_tokens": ("transformers", "vllm", "openai"), "batch_size": ("transformers",),
    "dtype": ("transformers", "vllm"), "tensor_parallel_size": ("vllm",), "gpu_memory_utilization": ("vllm",),
}


def _merger_options(a) -> dict:
    opts = {}
    for name, mergers in _MERGER_FLAGS.items():
        value = getattr(a, name)
        if value is None:
            continue
        if a.merger not in mergers:
            raise ValueError(f"--{name.replace('_', '-')} applies to the {' / '.join(mergers)} merger(s), "
                             f"got --merger {a.merger}")
        opts[name] = value
    if a.merger == "transformers" and a.device is not None:
        opts["device"] = a.device
    return opts


def _compress(a) -> int:
    # every cheap check first: nothing is loaded and nothing is written when one fails
    cfg = config_from_args(a)
    budget = None
    if a.memory_budget is not None:
        budget = parse_size(a.memory_budget, flag="--memory-budget")
        if a.dry_run:
            raise ValueError("--memory-budget cannot be combined with --dry-run (a dry run plans the first round "
                             "of the whole store): drop one of them")
    if a.dry_run and a.report:
        raise ValueError("--report applies to a run that compresses, got --dry-run (a dry run prints its plan and "
                         "writes nothing): drop one of them")
    preflight(a.input, None if a.dry_run else a.output, format=a.format, out_format=a.out_format, report=a.report,
              others=(review_cli.review_roles(a),), parts=budget is not None, names=CLI_NAMES)
    review_cli.check_review(a.review, [a.input])
    check_embedder_flag(a.embedder)
    options = _merger_options(a)
    try:
        merger = get_merger(a.merger, **options)  # bad options fail before any work
    except ValueError as e:
        raise ValueError(option_error(e, ["merger", *options])) from None
    if a.dry_run:
        res = dry_run_file(a.input, cfg, embedder=a.embedder, device=a.device, format=a.format)
        print(_format_dry_run(res))
        if a.review:
            before = review_cli.load_columns(a.input, format=a.format)
            review_cli.write_review(a.review, review_cli.page_from_plan(
                before, res.merges, {**res.report.to_dict(), "requested": res.requested,
                                     "ratio_asked": cfg.merge.ratio}, command="compress --dry-run",
                paths={"input": a.input}))
        print("dry run: nothing merged, nothing written" + (" but the review page" if a.review else ""))
        return 0
    res = compress_file(a.input, a.output, cfg, memory_budget=budget, embedder=a.embedder, merger=merger,
                        device=a.device, progress=not a.quiet and sys.stderr.isatty(), format=a.format,
                        out_format=a.out_format, resume=a.resume,
                        echo=None if a.quiet or budget is None else (
                            lambda line: print(line, file=sys.stderr, flush=True)))
    print(format_report(res.report, keep_pattern=a.keep_pattern))
    stats = MergerStats.of(merger)
    if stats is not None:
        print(_format_merger_stats(merger.name, stats, res.report))
    total = res.report.seconds.get("total", 0.0)
    if res.report.merges and total > 0:
        print(f"throughput: {res.report.merges} merges in {res.report.rounds} rounds, "
              f"{res.report.merges / total:.1f} merges/s overall")
    print(f"wrote {a.output}")
    d = res.report.to_dict()
    d["ratio_asked"] = cfg.merge.ratio  # --ratio (each tenant's removals are rounded from it)
    if stats is not None:
        d["merger_stats"] = stats.to_dict()
    if a.report:
        atomic_write_text(a.report, json.dumps(d, indent=2, default=str))
    if a.review:
        paths = {"input": a.input, "output": a.output, **({"report": a.report} if a.report else {})}
        if getattr(res, "merges", None) is not None:  # the merge log (a --memory-budget run keeps none)
            page = review_cli.page_from_merges(review_cli.load_columns(a.input, format=a.format), res.merges, d,
                                               command="compress", paths=paths, after=res.store)
        else:
            page = review_cli.page_from_files(a.input, a.output, d, command="compress", format=a.format,
                                              out_format=a.out_format, paths=paths)
        review_cli.write_review(a.review, page)
    return 0


def _format_merger_stats(name: str, st: MergerStats, report=None) -> str:
    """The merger's counters, reconciled with the engine's: the merges that kept the merger's
    text and those that fell back add up to the run's merges."""
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(st.fallback_reasons.items(), key=lambda kv: -kv[1]))
    line = (f"merger {name}: {st.pairs} merges in {st.calls} calls; {st.accepted} accepted, "
            f"{st.retries} retried ({st.retry_accepted} accepted on retry), {st.fallbacks} fell back to "
            f"the extractive merger" + (f" ({reasons})" if reasons else ""))
    if report is not None and report.merges:
        replaced = report.fallbacks  # texts the engine replaced after the merger (over the cap, unusable)
        fell = min(report.merges, st.fallbacks + replaced)
        line += (f"\nin all: {report.merges - fell} of {report.merges} merges kept the {name} merger's text, "
                 f"{fell} used the extractive merger"
                 + (f" ({replaced} replaced after the merger: over the node cap or unusable)" if replaced else ""))
    line += f"\nmerger speed: {st.merges_per_s:.2f} merges/s"
    if st.completion_tokens:
        line += (f", {st.completion_tokens_per_s:.0f} generated tokens/s ({st.tokens_per_s:.0f} tokens/s "
                 f"prompt + generated; {st.prompt_tokens} + {st.completion_tokens} tokens)")
    if st.http_retries:
        line += f"; {st.http_retries} HTTP retries"
    if st.replayed:
        line += f"\nresumed: {st.replayed} merges replayed from the journal (not sent to the merger)"
    return line


def _format_dry_run(res, width: int = 48) -> str:
    merges = res.merges
    if not merges:
        return "first round: no merge planned (nothing to remove at this ratio)"
    sims = sorted(m.similarity for m in merges)
    tenants = len({m.tenant for m in merges})
    lines = [f"first round: {len(merges)} merges planned over {tenants} tenant(s); similarity "
             f"min {sims[0]:.3f}, median {sims[len(sims) // 2]:.3f}, max {sims[-1]:.3f}",
             f"{'tenant':<16} {'sim':>6}  {'older':<16} {'newer':<16} texts"]

    def short(t):
        t = " ".join(t.split())
        return t if len(t) <= width else t[:width - 3] + "..."

    for m, p in zip(merges, res.pairs):
        lines.append(f"{printable(m.tenant)[:16]:<16} {m.similarity:>6.3f}  {printable(m.a)[:16]:<16} "
                     f"{printable(m.b)[:16]:<16} "
                     f"{short(p.older.text)!r} + {short(p.newer.text)!r}")
    return "\n".join(lines)


def _search(a) -> int:
    check_embedder_flag(a.embedder, allowed=("auto", "default"))
    if not a.query.strip():
        raise ValueError(f"QUERY must be a text to search for, got {a.query!r}")
    bad = re.search("[\ud800-\udfff]", a.query)  # bytes that are not UTF-8 arrive as lone surrogates
    if bad:
        raise ValueError(f"QUERY must be UTF-8 text, got {a.query!r} (a byte that is not UTF-8 at character "
                         f"{bad.start()})")
    if a.k is not None and a.k < 1:
        raise ValueError(f"-k must be an integer >= 1, got {a.k}")
    if a.budget is not None and a.budget < MIN_BUDGET:
        raise ValueError(f"--budget must be an integer >= {MIN_BUDGET} (whitespace tokens; a piece's date tag takes "
                         f"3), got {a.budget}")
    if a.fill is not None and a.budget is None:
        raise ValueError(f"--fill {a.fill} needs --budget B (the whitespace tokens of context to fill)")
    hits = search_file(a.store, [a.query], k=a.k, agpr=a.agpr, tenant=a.tenant, embedder=a.embedder,
                       device=a.device, budget=a.budget, fill=a.fill)[0]
    if a.json:
        print(json.dumps(hits, ensure_ascii=False, indent=2))  # JSON escapes the C0 control characters itself
        return 0
    if a.budget is not None:  # pieces: their text holds their date tag
        for r, p in enumerate(hits, 1):
            print(f"{r:>2}. ({p['score']:.3f}) {printable(p['text'])}{' [cut]' if p['cut'] else ''}  "
                  f"<- {printable(p['id'])}")
        return 0
    for r, h in enumerate(hits, 1):
        print(f"{r:>2}. [{format_date(h['timestamp'])}] ({h['score']:.3f}) {printable(h['text'])}")
    return 0


def _info(a) -> int:
    detect_format(a.store, None, flag=None)  # no --format to suggest here
    probe = _NoVectors()
    st = read_store(a.store, embedder=probe)
    info = st.info()
    if probe.used:  # the file holds no vectors: counts only
        info["dim"], info["embedder"] = None, None
    info["has_embeddings"] = not probe.used
    if not probe.used:  # rows and bytes, and the vectors the uncompressed store takes in the same encoding
        size = store_size(st)
        info["size"] = size.to_dict()
        info["uncompressed_vector_bytes"] = size.originals * bytes_per_vector(st.dim, size.encoding)
    if a.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"nodes      {info['nodes']}  (standing for {info['originals']} originals; {info['merged_nodes']} merged)")
    print(f"tenants    {info['tenants']}")
    for t, n in info["nodes_per_tenant"].items():
        print(f"  {printable(t):<24} {n}")
    if probe.used:
        print("dimension  none  (no embeddings stored: compress and search embed it with all-MiniLM-L6-v2, "
              "or --embedder PATH)")
    else:
        print(f"dimension  {info['dim']}  (embedder: {info['embedder'] or 'not recorded'})")
    if info["keys_rule"] is not None:
        rule = info["keys_rule"]
        print(f"keys       {info['keys']}  (merged nodes searched by {rule['text_weight']:g} x text + "
              f"{1 - rule['text_weight']:g} x best of at most {rule['max_keys'] or 'all'} keys)")
    if "size" in info:
        z, full = info["size"], info["uncompressed_vector_bytes"]
        print(f"size       {z['rows']} vector rows searched ({z['rows'] / max(z['originals'], 1):.2f} per memory), "
              f"{z['vectors']} vectors held; texts {kb(z['text_bytes'])} + vectors {kb(z['vector_bytes'])} "
              f"({z['encoding']})")
        if z["originals"] != z["nodes"] or z["vectors"] != z["nodes"]:
            print(f"           uncompressed, in {z['encoding']}: {z['originals']} vectors, {kb(full)} (these "
                  f"vectors are {z['vector_bytes'] / max(full, 1):.0%} of that); the originals' texts are not kept "
                  "apart in the file (compress reports both sizes)")
    print(f"time span  {info['time_first']} .. {info['time_last']}")
    return 0


class _NoVectors:
    """`info` never embeds: a file without vectors gets a placeholder unit vector per node
    (never shown; ``used`` tells) so that its counts can still be reported."""

    name = None
    dim = 1

    def __init__(self):
        self.used = False

    def embed(self, texts):
        self.used = True
        return torch.ones(len(texts), 1)


def _demo(a) -> int:
    check_paths(writes("--out", a.out, folder=True))  # before the sample is embedded and compressed
    run_demo(ratio=a.ratio, out_dir=a.out, device=a.device)
    return 0


def main(argv: list[str] | None = None) -> int:
    with OPTION_WORDS.as_command():  # warnings name the options as flags
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    name = " ".join(x for x in (args.cmd, getattr(args, "sub", None)) if x)
    try:
        commands = {"compress": _compress, "compact": compact_cli.run, "search": _search, "info": _info,
                    "demo": _demo, "mem0": adapters_cli.run, "graph": adapters_cli.run, "eval": eval_cli.run,
                    "review": review_cli.run}
        return commands[args.cmd](args)
    except BrokenPipeError:  # `memforest ... | head`
        return 0
    except KeyboardInterrupt as e:  # Ctrl-C: one line (what is kept, how to resume), no traceback
        print(f"memforest {name}: {interrupted_message(e)}", file=sys.stderr)
        return 130
    except (ValueError, OSError, ImportError, RuntimeError) as e:
        print(f"memforest {name}: error: {error_message(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
