"""``memforest compress``: a thin command over :func:`~memforest_gpu.api.compress_file` (its
flags and their checks: :mod:`.compress_args`)."""
from __future__ import annotations

import json
import sys

from ..api import compress_file, dry_run_file
from ..mergers import get_merger
from ..printable import printable
from ..report import MergerStats
from ..runs.preflight import preflight
from ..sizes import parse_size
from ..store.atomic import atomic_write_text
from . import review as review_cli
from .compress_args import check, merger_options
from .flags import config_from_args
from .report_text import format_report
from .running import CLI_NAMES, guarded, option_error

__all__ = ["run", "format_dry_run", "format_merger_stats"]


@guarded
def run(a) -> int:
    """``memforest compress``: every check first (nothing is loaded and nothing is written when
    one fails), then the run, its report and the optional review page."""
    check(a)
    cfg = config_from_args(a)
    budget = None if a.memory_budget is None else parse_size(a.memory_budget, flag="--memory-budget")
    preflight(a.input, None if a.dry_run else a.output, format=a.format, out_format=a.out_format, report=a.report,
              others=(review_cli.review_roles(a),), parts=budget is not None, names=CLI_NAMES)
    review_cli.check_review(a.review, [a.input])
    options = merger_options(a)
    try:
        merger = get_merger(a.merger, **options)  # bad options fail before any work
    except ValueError as e:
        raise ValueError(option_error(e, ["merger", *options])) from None
    if a.dry_run:
        res = dry_run_file(a.input, cfg, embedder=a.embedder, device=a.device, format=a.format)
        print(format_dry_run(res))
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
        print(format_merger_stats(merger.name, stats, res.report))
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


def format_merger_stats(name: str, st: MergerStats, report=None) -> str:
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


def format_dry_run(res, width: int = 48) -> str:
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
