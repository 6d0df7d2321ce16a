"""``memforest``: a thin command line over the Python API. Each flag maps to a config field."""
from __future__ import annotations

import argparse
import json
import logging
import sys

from .cli_config import add_config_arguments, config_from_args

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="memforest", description="Compress and search LLM-agent memory stores.")
    ap.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = ap.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("compress", help="compress a store (Parquet or JSONL) into a new file")
    c.add_argument("input")
    c.add_argument("output")
    c.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    add_config_arguments(c)
    c.add_argument("--embedder", default="auto",
                   help="auto (the store's recorded model) | default (all-MiniLM-L6-v2) | none (mean) | PATH")
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
    c.add_argument("--dtype", default=None, help="transformers/vllm: auto | float16 | bfloat16 | float32")
    c.add_argument("--tensor-parallel-size", type=int, default=None, help="vllm: GPUs per model (default 1)")
    c.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vllm: fraction of GPU memory for the model and KV cache "
                        "(default: what is free when the model loads, less 2 GiB)")
    c.add_argument("--format", default=None, help="input format: parquet | jsonl (default: from the suffix)")
    c.add_argument("--out-format", default=None, help="output format (default: from the suffix)")
    c.add_argument("--report", default=None, help="also write the run report as JSON to this path")
    c.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from OUTPUT.journal.jsonl without redoing its merges")
    c.add_argument("--dry-run", action="store_true",
                   help="print the first round's planned merges (pairs, similarity) and write nothing")
    c.add_argument("--quiet", action="store_true", help="no progress bars")

    s = sub.add_parser("search", help="search a store")
    s.add_argument("store")
    s.add_argument("query")
    s.add_argument("-k", type=int, default=10)
    s.add_argument("--agpr", action="store_true", help="anchor-guided propagation re-ranking")
    s.add_argument("--tenant", default=None)
    s.add_argument("--json", action="store_true")
    s.add_argument("--embedder", default="auto", help="auto | default | PATH: the model of the store's vectors")
    s.add_argument("--device", default=None)

    i = sub.add_parser("info", help="counts, tenants, dimension, time span")
    i.add_argument("store")
    i.add_argument("--json", action="store_true")

    d = sub.add_parser("demo", help="compress the bundled sample store and show what changed")
    d.add_argument("--ratio", type=float, default=0.5)
    d.add_argument("--out", default=None, help="also write the sample and its compressed form here")
    d.add_argument("--device", default=None)

    from .adapters.cli import add_parser as add_adapter_commands

    add_adapter_commands(sub)  # mem0 compress|restore, graph compress
    from .evaluation.cli import add_parser as add_eval_command

    add_eval_command(sub)  # eval
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
    from .api import compress_file, plan_file
    from .mergers import get_merger
    from .report import format_report

    cfg = config_from_args(a)
    merger = get_merger(a.merger, **_merger_options(a))  # bad options fail before any work
    if a.dry_run:
        res = plan_file(a.input, cfg, embedder=a.embedder, device=a.device, format=a.format)
        print(_format_plan(res.merges))
        print("dry run: nothing merged, nothing written")
        return 0
    res = compress_file(a.input, a.output, cfg, embedder=a.embedder, merger=merger, device=a.device,
                        progress=not a.quiet and sys.stderr.isatty(), format=a.format, out_format=a.out_format,
                        resume=a.resume)
    print(format_report(res.report))
    stats = merger.summary() if hasattr(merger, "summary") else None
    if stats:
        print(_format_merger_stats(merger.name, stats))
    total = res.report.seconds.get("total", 0.0)
    if res.report.merges and total > 0:
        print(f"throughput: {res.report.merges} merges in {res.report.rounds} rounds, "
              f"{res.report.merges / total:.1f} merges/s overall")
    print(f"wrote {a.output}")
    if a.report:
        from .io import atomic_write_text

        d = res.report.to_dict()
        if stats:
            d["merger_stats"] = stats
        atomic_write_text(a.report, json.dumps(d, indent=2, default=str))
    return 0


def _format_merger_stats(name: str, st: dict) -> str:
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(st["fallback_reasons"].items(), key=lambda kv: -kv[1]))
    line = (f"merger {name}: {st['pairs']} merges in {st['calls']} calls; {st['accepted']} accepted, "
            f"{st['retries']} retried ({st['retry_accepted']} accepted on retry), {st['fallbacks']} fell back to "
            f"the extractive merger" + (f" ({reasons})" if reasons else ""))
    line += f"\nmerger speed: {st['merges_per_s']:.2f} merges/s"
    if st["completion_tokens"]:
        line += (f", {st['completion_tokens_per_s']:.0f} generated tokens/s ({st['tokens_per_s']:.0f} tokens/s "
                 f"prompt + generated; {st['prompt_tokens']} + {st['completion_tokens']} tokens)")
    if st.get("http_retries"):
        line += f"; {st['http_retries']} HTTP retries"
    if st.get("replayed"):
        line += f"\nresumed: {st['replayed']} merges replayed from the journal (not sent to the merger)"
    return line


def _format_plan(merges: list[dict], width: int = 48) -> str:
    if not merges:
        return "first round: no merge planned (nothing to remove at this ratio)"
    sims = sorted(m["similarity"] for m in merges)
    tenants = len({m["tenant"] for m in merges})
    lines = [f"first round: {len(merges)} merges planned over {tenants} tenant(s); similarity "
             f"min {sims[0]:.3f}, median {sims[len(sims) // 2]:.3f}, max {sims[-1]:.3f}",
             f"{'tenant':<16} {'sim':>6}  {'older':<16} {'newer':<16} texts"]

    def short(t):
        t = " ".join(t.split())
        return t if len(t) <= width else t[:width - 3] + "..."

    for m in merges:
        lines.append(f"{m['tenant'][:16]:<16} {m['similarity']:>6.3f}  {m['a'][:16]:<16} {m['b'][:16]:<16} "
                     f"{short(m['a_text'])!r} + {short(m['b_text'])!r}")
    return "\n".join(lines)


def _search(a) -> int:
    from .api import load_store
    from .config import RetrievalConfig
    from .embedders import get_embedder
    from .io import read_store
    from .retrieval import Retriever
    from .timeutil import format_date

    cfg = RetrievalConfig(k=a.k, agpr=a.agpr)
    store = read_store(a.store, device=a.device) if a.embedder == "auto" else load_store(
        a.store, embedder=a.embedder, device=a.device)
    emb = get_embedder("default" if a.embedder == "auto" and store.embedder in (None, "all-MiniLM-L6-v2")
                       else ("auto" if a.embedder == "auto" else a.embedder),
                       device=a.device, store_embedder=store.embedder)
    if emb is None:
        raise ValueError(f"the query needs the model that made the store's vectors ({store.embedder!r}); "
                         "pass --embedder PATH")
    if emb.dim != store.dim:
        raise ValueError(f"embedder dimension must match the store's ({store.dim}), got {emb.dim}")
    hits = Retriever(store).search(emb.embed([a.query]), tenants=a.tenant, config=cfg).hits(store)[0]
    if a.json:
        print(json.dumps(hits, ensure_ascii=False, indent=2))
        return 0
    for r, h in enumerate(hits, 1):
        print(f"{r:>2}. [{format_date(h['timestamp'])}] ({h['score']:.3f}) {h['text']}")
    return 0


def _info(a) -> int:
    from .io import read_store

    info = read_store(a.store, embedder=_NoEmbed()).info()
    if a.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"nodes      {info['nodes']}  (standing for {info['originals']} originals; {info['merged_nodes']} merged)")
    print(f"tenants    {info['tenants']}")
    for t, n in info["nodes_per_tenant"].items():
        print(f"  {t:<24} {n}")
    print(f"dimension  {info['dim']}  (embedder: {info['embedder'] or 'unknown'})")
    print(f"time span  {info['time_first']} .. {info['time_last']}")
    return 0


class _NoEmbed:
    """`info` never embeds: a file without vectors is reported, not embedded."""

    name = None
    dim = 0

    def embed(self, texts):
        raise ValueError("this store has no embeddings; `memforest info` reads stored vectors only "
                         "(compress or search embed on load)")


def _demo(a) -> int:
    from .demo import run_demo

    run_demo(ratio=a.ratio, out_dir=a.out, device=a.device)
    return 0


def _eval(a) -> int:
    from .evaluation.cli import run

    return run(a)


def _adapters(a) -> int:
    from .adapters.cli import run

    return run(a)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        commands = {"compress": _compress, "search": _search, "info": _info, "demo": _demo,
                    "mem0": _adapters, "graph": _adapters, "eval": _eval}
        return commands[args.cmd](args)
    except BrokenPipeError:  # `memforest ... | head`
        return 0
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
        print(f"memforest {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
