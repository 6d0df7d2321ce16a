"""``memforest eval``: a thin layer over :func:`~memforest_gpu.evaluation.harness.run_grid`; each
flag maps to a config field.

Registered in the main CLI with ``add_parser(sub)``, ``"eval"`` dispatched to ``run``;
standalone: ``python -m memforest_gpu.cli.eval --benchmark ... --out ...``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from dataclasses import replace

import torch

from ..config import DEFAULT_PRESET, PRESETS, preset
from ..evaluation.benchmark import NODE_SHAPES, load_benchmark, write_benchmark
from ..evaluation.cache import CachedEmbedder
from ..evaluation.harness import EvalConfig, run_grid
from ..evaluation.loo import (
    METRICS,
    Candidate,
    candidate_grid,
    leave_one_out,
    load_scores,
    loo_markdown,
    paper_candidate,
    preset_choice,
    rule_fields,
    save_scores,
    score_candidates,
)
from ..evaluation.methods import ABLATION_METHODS, DEFAULT_METHODS, GRAPH_BASELINES, parse_method
from ..evaluation.report import load_result, write_outputs
from ..evaluation.stream_report import run_cli
from ..mergers import get_merger
from ..mergers.embedders import SentenceTransformerEmbedder
from ..runs.errors import OPTION_WORDS
from ..store.atomic import atomic_write_text
from ..timer import StageTimer
from . import eval_protocol as protocol
from .eval_checks import RATIOS, add_stream_arguments, check_eval_args
from .flags import FIELDS, add_keys_arguments, as_flag_error, check_text_weight, error_message, option_error
from .parser import Parser

__all__ = ["add_parser", "run", "main"]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _preset_names() -> list[str]:
    return list(PRESETS)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--benchmark", required=True,
                   help="benchmark folder (nodes.jsonl|parquet + questions.jsonl), a LoCoMo or LongMemEval .json "
                        "file or a PersonaMem questions .csv, read as published")
    p.add_argument("--out", default=None,
                   help="output folder: results.json, per_question.npz, results.md, retention.png")
    p.add_argument("--nodes", default="turns",
                   help="turns (one node per dialogue turn or message) | facts (LoCoMo: one node per fact of its "
                        "observation field, the shape of a Mem0 store) | sessions (LongMemEval: one node per "
                        "session); --leave-one-out also takes turns,facts (both shapes, selected on their mean)")
    p.add_argument("--turns-per-node", type=int, default=1,
                   help="LoCoMo .json only, turns only: consecutive turns per node (4: the long-memory variant)")
    p.add_argument("--methods", default="default",
                   help="comma list of NAME[:SCHEDULE]; 'default' (baselines + memforest, both schedules), "
                        "'ablations', or 'all'")
    p.add_argument("--ratios", default=RATIOS, help="fractions of nodes removed")
    p.add_argument("--seeds", default="0,1,2", help="seeds, one run per method, ratio and seed")
    p.add_argument("--cache", default=None, help="embedding cache folder (default: OUT/.cache)")
    p.add_argument("--embedder", default="default", help="default (all-MiniLM-L6-v2) | model PATH")
    p.add_argument("--merger", default="extractive", help="extractive")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    g = p.add_argument_group("retrieval and cuts")
    g.add_argument("-k", "--k", type=int, default=10, help="nodes at the @k cut")
    g.add_argument("--budget", type=int, default=256, help="whitespace tokens at the @B cut")
    g.add_argument("--fill", default="plain", choices=("plain", "ranked", "focused", "pooled"),
                   help="@B context: plain (whole nodes: the protocol) | pooled (memforest search --budget's) | ...")
    g.add_argument("--L", type=int, default=4, help="AGPR candidate multiplier")
    g.add_argument("--lam", type=float, default=0.2, help="AGPR anchor fraction")
    g.add_argument("--gamma", type=float, default=0.9, help="AGPR similarity weight")
    g = p.add_argument_group("MemForest config: the --preset with these fields changed (as in memforest compress); "
                             "ablations override their own field")
    g.add_argument("--preset", default=None, choices=_preset_names(),
                   help="named configuration the flags below start from (default: memforest, the same as "
                        "memforest compress; paper: the paper's values); a bare 'memforest' method takes its schedule")
    g.add_argument("--alpha", type=float, default=None, help="clusters per node")
    g.add_argument("--beta", type=float, default=None, help="semantic weight in the reassignment")
    g.add_argument("--window", type=int, default=None, help="temporal window, in positions")
    g.add_argument("--max-iter", type=int, default=None, help="at most this many Lloyd steps")
    g.add_argument("--eta", type=float, default=None, help="similarity weight in the degree-adjusted score")
    g.add_argument("--degree-norm", default=None, help="none | max")
    g.add_argument("--time-weight", type=float, default=None,
                   help="weight of local time on tree edges (0: cosine only, the paper)")
    g.add_argument("--time-window", type=int, default=None, help="positions that count as neighbours on edges")
    g.add_argument("--time-rule", default=None, help="scaled | gated | flat: what a neighbour's bonus needs")
    g.add_argument("--time-min-cos", type=float, default=None, help="gated: the cosine a neighbour needs")
    g.add_argument("--size-weight", type=float, default=None,
                   help="penalty on tree edges per merged length in units of size_unit tokens (0: the paper)")
    g.add_argument("--graph", default=None, help="knn | dense: the trees' candidate graph (default: knn)")
    g.add_argument("--knn", type=int, default=None, help="neighbours per node in the knn graph (default: 16)")
    g.add_argument("--max-node-tokens", type=int, default=None, help="node length cap (default: embedder's)")
    g.add_argument("--cap-policy", default=None, help="condense | strict: a merge over the node cap")
    add_keys_arguments(g)
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--reference", default=None,
                   help="the method every other one is compared with (cluster bootstrap; default: memforest with "
                        "the preset's schedule when it runs, else memforest:sequential)")
    p.add_argument("--export", default=None, help="only write the benchmark in the nodes + questions format here")
    p.add_argument("--report-only", action="store_true", help="redo tables and plot from OUT's results")
    protocol.add_protocol_arguments(p)
    _add_loo_arguments(p)
    add_stream_arguments(p)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: the grid's tensor ops are small; 0 = torch's default)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_loo_arguments(p: argparse.ArgumentParser) -> None:
    """``--leave-one-out`` and its ``--loo-*`` flags."""
    g = p.add_argument_group("leave-one-conversation-out tuning (evaluation/loo.py)")
    g.add_argument("--leave-one-out", action="store_true",
                   help="choose a MemForest config per fold on the other conversations, score it on the held-out "
                        "one; writes OUT/loo.md and OUT/loo.json")
    g.add_argument("--loo-schedules", default="sequential,matching", help="candidate schedules")
    g.add_argument("--loo-alphas", default="0.05,0.01,0.001", help="candidate alphas")
    g.add_argument("--loo-time-weights", default="0,0.5", help="candidate time weights")
    g.add_argument("--loo-time-rules", default="scaled,gated:0.2,gated:0.3,gated:0.4",
                   help="candidate time rules (gated:COS sets its time_min_cos); with time weight 0 the rule does "
                        "not matter and the candidate is run once")
    g.add_argument("--loo-compare-rules", default="flat",
                   help="time rules scored on the preset's config (the other flags) for comparison only, never "
                        "selected (flat: the 0/1 neighbour bonus); '' for none")
    g.add_argument("--loo-size-weights", default="0,0.2", help="candidate size weights")
    g.add_argument("--loo-keys", default=None,
                   help="candidate retrieval rules of merged nodes: text (its text's vector alone) or K:TEXT_WEIGHT "
                        "(K keys, or all, blended with the text), e.g. text,all:0.5,3:0.5 (default: the base config's)")
    g.add_argument("--loo-from", default=None,
                   help="comma list of loo_scores.npz files of earlier --leave-one-out runs: join their candidates "
                        "and redo the selection without running anything")
    g.add_argument("--loo-select", default="B:ansr_content",
                   help="selection metric CUT:METRIC, plain top-k retention (B:ansr_content | B:ansr | k:evr | B:evr)")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``eval`` sub-command to a ``memforest`` sub-parser set."""
    p = subparsers.add_parser("eval", help="measure compression quality on a benchmark (docs/evaluation.md)",
                              description="Run methods x ratios x seeds on a benchmark and write results.")
    _add_arguments(p)
    return p


def _methods(spec: str, schedule: str = "sequential") -> list[str]:
    """Method labels of ``--methods``; a MemForest name without ``:SCHEDULE`` takes ``schedule``."""

    out: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if part in ("default", "all", "ablations"):
            out += list(DEFAULT_METHODS) * (part != "ablations") + list(ABLATION_METHODS) * (part != "default")
        else:
            name = part if ":" in part or not part.startswith("memforest") else f"{part}:{schedule}"
            out.append(parse_method(name).label)
    return list(dict.fromkeys(parse_method(m).label for m in out))


def _config(a):
    """The MemForest config: ``--preset`` (default: the command line's, as ``memforest compress``)
    with every config flag given replacing its own field."""

    try:
        c = preset(a.preset or DEFAULT_PRESET)
        changes: dict[str, dict] = {"partition": {}, "tree": {}, "merge": {}}
        for dest, (stage, name) in FIELDS.items():
            if dest not in ("ratio", "schedule") and getattr(a, dest, None) is not None:
                changes[stage][name] = getattr(a, dest)
        cfg = replace(c, **{stage: replace(getattr(c, stage), **kw) for stage, kw in changes.items()})
    except ValueError as e:
        raise ValueError(as_flag_error(e, a)) from None
    check_text_weight(a, cfg)
    return cfg


def _shapes(a) -> list[str]:
    """The node shapes of ``--nodes`` (several only with ``--leave-one-out``)."""

    shapes = [x.strip() for x in a.nodes.split(",") if x.strip()]
    if not shapes or any(x not in NODE_SHAPES for x in shapes) or len(set(shapes)) != len(shapes):
        raise ValueError(f"--nodes must be one of {list(NODE_SHAPES)} or, with --leave-one-out, a comma list of "
                         f"them, got {a.nodes!r}")
    if len(shapes) > 1 and not getattr(a, "leave_one_out", False):
        raise ValueError(f"--nodes takes several shapes only with --leave-one-out, got {a.nodes!r}")
    return shapes


def _load(a, shape: str | None = None):
    """The benchmark of ``--benchmark`` (a folder as it is; a published file in the node shape
    ``shape``, default ``--nodes``), restricted to ``--tenants`` and ``--max-questions``."""

    bench = load_benchmark(a.benchmark, nodes=shape or _shapes(a)[0], turns_per_node=getattr(a, "turns_per_node", 1),
                           contexts=getattr(a, "contexts", None),
                           skip_missing_contexts=getattr(a, "skip_missing_contexts", False))
    protocol.say_skipped(bench)
    return protocol.subset_from_args(bench, a)


def _reference(a, methods: list[str], cfg) -> str | None:
    """``--reference``, else MemForest with the preset's schedule when it runs (else the
    report's default)."""
    if a.reference:
        return a.reference
    mine = f"memforest:{cfg.merge.schedule}"
    return mine if mine in methods else None


def run(a) -> int:
    """Run ``memforest eval`` from parsed arguments; returns the exit status. An error that names
    an option (a ``ConfigError``'s field: ``k must be ...``) names its flag (``-k must be ...``)."""
    try:
        return _run(a)
    except ValueError as e:
        raise ValueError(option_error(e, vars(a))) from None


def _run(a) -> int:
    check_eval_args(a)  # paths, number lists, flags the mode would ignore
    if a.export:
        bench_dir = a.benchmark if os.path.isdir(a.benchmark) else os.path.dirname(os.path.abspath(a.benchmark))
        if os.path.realpath(a.export) == os.path.realpath(bench_dir):
            raise ValueError(f"--export must not be the benchmark's own folder (it would overwrite its files), "
                             f"got {a.export!r}")
        bench = _load(a)
        write_benchmark(bench, a.export)
        print(f"wrote {a.export}/nodes.jsonl and questions.jsonl: {json.dumps(bench.summary())}")
        return 0
    if not a.out:
        raise ValueError("--out is required (unless --export)")

    if a.report_only:
        paths = write_outputs(load_result(a.out), a.out, bootstrap=a.bootstrap, reference=a.reference)
        print("\n".join(f"wrote {p}" for p in paths.values()))
        return 0

    EvalConfig(k=a.k, budget=a.budget, L=a.L, lam=a.lam, gamma=a.gamma, fill=a.fill)  # -k, --L, ... before any work
    protocol.check_protocol_flags(a)
    if a.leave_one_out:
        return _run_loo(a)
    cfg = _config(a)
    if a.stream:
        spec = "memforest:matching,tome,kmeans_prune" if a.methods == "default" else a.methods
        return run_cli(a, cfg, _methods(spec, cfg.merge.schedule))
    methods = _methods(a.methods, cfg.merge.schedule)
    ratios, seeds = _floats(a.ratios), _ints(a.seeds)
    ecfg = EvalConfig(k=a.k, budget=a.budget, L=a.L, lam=a.lam, gamma=a.gamma, fill=a.fill)
    if not ratios or not seeds:
        raise ValueError(f"ratios and seeds must be non-empty, got {a.ratios!r} and {a.seeds!r}")
    for r in ratios:
        if not 0 < r < 1:
            raise ValueError(f"ratio must be in (0, 1), got {r!r}")
    bench = _load(a)
    methods += [m for m in GRAPH_BASELINES if a.methods == "default" and bench.has_entity_links()]
    if a.reference and a.reference not in methods:  # a typo would leave every comparison out
        raise ValueError(f"--reference must be one of the methods run ({', '.join(methods)}), got {a.reference!r}")
    qa = protocol.qa_from_args(a)
    inner = SentenceTransformerEmbedder(None if a.embedder == "default" else a.embedder, device=a.device)
    emb = CachedEmbedder(inner, a.cache or os.path.join(a.out, ".cache"))
    if a.threads:
        torch.set_num_threads(a.threads)
    timer = StageTimer()
    res = run_grid(bench, methods, ratios, seeds, embedder=emb, merger=get_merger(a.merger), base_config=cfg,
                   eval_config=ecfg, device=a.device, progress=not a.quiet and sys.stderr.isatty(), qa=qa)
    emb.flush()
    if qa is not None and not protocol.answers_said(qa, a):  # every answer failed: nothing to write
        return 1
    judged = qa is None or protocol.verdicts_said(qa, a)  # every verdict failed: written, but exit 1
    res.meta["preset"] = a.preset or DEFAULT_PRESET
    paths = write_outputs(res, a.out, bootstrap=a.bootstrap, reference=_reference(a, methods, cfg))
    print(f"{len(methods)} methods x {len(ratios)} ratios x {len(seeds)} seeds in {timer.elapsed():.0f}s "
          f"(embedding cache: {emb.hits} hits, {emb.misses} new)")
    print("\n".join(f"wrote {p}" for p in paths.values()))
    return 0 if judged else 1


def _run_loo(a) -> int:
    """``--leave-one-out``: candidates from the ``--loo-*`` lists on the base config (the other
    MemForest flags), compared per fold with the method's defaults and ToMe."""

    if a.loo_select not in METRICS:
        raise ValueError(f"--loo-select must be one of {list(METRICS)}, got {a.loo_select!r}")
    if a.loo_from:
        cs = load_scores([x for x in a.loo_from.split(",") if x])
        return _loo_report(a, cs, [c.name for c in cs.candidates
                                   if not c.method and not c.compare_only and c.name != "paper"], None)
    os.makedirs(a.out, exist_ok=True)
    ratios, seeds = _floats(a.ratios), _ints(a.seeds)
    rules = tuple(x.strip() for x in a.loo_time_rules.split(",") if x.strip())
    keys = tuple(x.strip() for x in a.loo_keys.split(",") if x.strip()) if a.loo_keys else None
    cands = candidate_grid(a.loo_schedules.split(","), _floats(a.loo_alphas), _floats(a.loo_time_weights),
                           _floats(a.loo_size_weights), base=_config(a), time_rules=rules, keys_rules=keys)
    paper, tome = paper_candidate(_config(a).merge.vectors), Candidate("tome", _config(a), method="tome")
    extra = [c for c in (paper, tome) if c.config not in [x.config for x in cands] or c.method]
    extra += [c for c in _compare_rules(a) if c.config not in [x.config for x in cands]]
    shapes = _shapes(a)
    bench = _load(a) if len(shapes) == 1 else {sh: _load(a, sh) for sh in shapes}
    emb = CachedEmbedder(SentenceTransformerEmbedder(None if a.embedder == "default" else a.embedder,
                                                     device=a.device), a.cache or os.path.join(a.out, ".cache"))
    if a.threads:
        torch.set_num_threads(a.threads)
    timer = StageTimer()
    ecfg = EvalConfig(k=a.k, budget=a.budget, L=a.L, lam=a.lam, gamma=a.gamma, search_repeats=1)
    done = [0]

    def tick(c, res):
        done[0] += 1
        emb.flush()
        if not a.quiet:
            print(f"[{done[0]}/{(len(cands) + len(extra)) * len(shapes)}] {c.name} on {res.meta.get('benchmark')} "
                  f"({timer.elapsed():.0f}s)", file=sys.stderr, flush=True)

    cs = score_candidates(bench, cands + extra, ratios, seeds, embedder=emb, merger=get_merger(a.merger),
                          device=a.device, eval_config=ecfg, on_candidate=tick)
    save_scores(cs, os.path.join(a.out, "loo_scores.npz"))
    return _loo_report(a, cs, [c.name for c in cands], timer)


def _compare_rules(a) -> list:
    """``--loo-compare-rules``: the preset's config (with the other flags) under each rule,
    comparison only."""

    c = _config(a)
    out = []
    for rule in (x.strip() for x in (a.loo_compare_rules or "").split(",") if x.strip()):
        cfg = dataclasses.replace(c, tree=dataclasses.replace(c.tree, **rule_fields(rule)))
        name = (f"{cfg.merge.schedule} a={cfg.partition.alpha:g} tw={cfg.tree.time_weight:g}/{rule} "
                f"sw={cfg.tree.size_weight:g} (compare)")
        out.append(Candidate(name, cfg, compare_only=True))
    return out


def _loo_report(a, cs, names: list[str], timer: StageTimer | None) -> int:
    """Select per fold among ``names``, write loo.md / loo.json, print the preset rule's pick."""

    paper = paper_candidate(_config(a).merge.vectors)
    ratios, seeds = cs.ratios, cs.seeds
    paper_name = next((c.name for c in cs.candidates if c.config == paper.config and not c.method), paper.name)
    compare = tuple(dict.fromkeys([paper_name, "tome", *(c.name for c in cs.candidates if c.compare_only)]))
    folds = leave_one_out(cs, select=a.loo_select, pool=names, compare=compare)
    choice = preset_choice(folds, a.loo_select)
    os.makedirs(a.out, exist_ok=True)
    md = loo_markdown(cs, folds, select=a.loo_select, compare=compare, choice=choice)
    atomic_write_text(os.path.join(a.out, "loo.md"), md)
    shapes = None if cs.shapes is None else list(dict.fromkeys(cs.shapes.tolist()))
    atomic_write_text(os.path.join(a.out, "loo.json"), json.dumps(
        {"select": a.loo_select, "ratios": ratios, "seeds": seeds, "shapes": shapes, "choice": choice,
         "compare": list(compare),
         "candidates": {c.name: {"method": c.label, "config": dataclasses_dict(c.config)} for c in cs.candidates},
         "folds": folds, "seconds": timer.elapsed() if timer else None}, indent=1))
    print(f"{len(cs.candidates)} candidates x {len(ratios)} ratios x {len(seeds)} seeds"
          + (f" in {timer.elapsed():.0f}s" if timer else "") + f"; preset rule picks {choice!r}")
    print(f"wrote {os.path.join(a.out, 'loo.md')}\nwrote {os.path.join(a.out, 'loo.json')}")
    return 0


def dataclasses_dict(c) -> dict:
    return {k: dataclasses.asdict(getattr(c, k)) for k in ("partition", "tree", "merge")}


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="memforest eval", description="Measure compression quality (docs/evaluation.md).")
    ap.add_argument("-v", "--verbose", action="store_true")
    _add_arguments(ap)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        with OPTION_WORDS.as_command():  # warnings name the options as flags
            return run(a)
    except (ValueError, OSError, ImportError) as e:
        print(f"memforest eval: error: {error_message(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memforest eval: interrupted; the vectors of finished cells are in the embedding cache, a rerun "
              "reuses them", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
