"""``memforest eval``: a thin layer over :func:`~memforest_gpu.evaluation.harness.run_grid`; each
flag maps to a config field (the flags and their checks: :mod:`.eval_args`).

Standalone: ``python -m memforest_gpu.cli.eval --benchmark ... --out ...``.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from dataclasses import replace

import torch

from ..config import DEFAULT_PRESET, config_record, preset
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
from ..evaluation.methods import ABLATION_METHODS, DEFAULT_METHODS, GRAPH_BASELINES, RENAMED_METHODS, parse_method
from ..evaluation.result_files import load_result, write_outputs
from ..evaluation.stream_report import run_cli
from ..mergers import get_merger
from ..mergers.embedders import SentenceTransformerEmbedder
from ..store.atomic import atomic_write_text
from ..timer import StageTimer
from . import eval_protocol as protocol
from .eval_args import add_arguments, check
from .eval_checks import check_eval_paths
from .flags import FIELDS, as_flag_error, check_text_weight
from .parser import Parser, check_usage
from .running import guarded, option_error

__all__ = ["run", "main"]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


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
            old = name.partition(":")[0]
            if old in RENAMED_METHODS:  # a hidden old name: it runs, and says its new one
                print(f"memforest: {old} is renamed {RENAMED_METHODS[old]}; {old} goes in the next release",
                      file=sys.stderr)
            out.append(parse_method(name).label)
    return list(dict.fromkeys(parse_method(m).label for m in out))


def _config(a):
    """The MemForest config: ``--preset`` (default: the command line's, as ``memforest compress``)
    with every config flag given replacing its own field."""

    try:
        c = preset(a.preset or DEFAULT_PRESET)
        changes: dict[str, dict] = {"partition": {}, "spanning": {}, "merge": {}}
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


@guarded
def run(a) -> int:
    """Run ``memforest eval`` from parsed arguments; returns the exit status. An error that names
    an option (a ``ConfigError``'s field: ``k must be ...``) names its flag (``-k must be ...``);
    Ctrl-C says that the finished cells' vectors are kept."""
    try:
        return _run(a)
    except ValueError as e:
        raise ValueError(option_error(e, vars(a))) from None
    except KeyboardInterrupt:
        raise KeyboardInterrupt("interrupted; the vectors of finished cells are in the embedding cache, a rerun "
                                "reuses them") from None


def _run(a) -> int:
    check(a)
    check_eval_paths(a)
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

    # -k, --L, ... checked before any work
    EvalConfig(k=a.k, max_tokens=a.max_tokens, L=a.L, lam=a.lam, gamma=a.gamma, fill=a.fill)
    if a.leave_one_out:
        return _run_loo(a)
    cfg = _config(a)
    if a.stream:
        spec = "memforest:matching,tome,kmeans_prune" if a.methods == "default" else a.methods
        return run_cli(a, cfg, _methods(spec, cfg.merge.schedule))
    methods = _methods(a.methods, cfg.merge.schedule)
    ratios, seeds = _floats(a.ratios), _ints(a.seeds)
    ecfg = EvalConfig(k=a.k, max_tokens=a.max_tokens, L=a.L, lam=a.lam, gamma=a.gamma, fill=a.fill)
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
    ecfg = EvalConfig(k=a.k, max_tokens=a.max_tokens, L=a.L, lam=a.lam, gamma=a.gamma, search_repeats=1)
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
        cfg = dataclasses.replace(c, spanning=dataclasses.replace(c.spanning, **rule_fields(rule)))
        name = (f"{cfg.merge.schedule} a={cfg.partition.alpha:g} tw={cfg.spanning.time_weight:g}/{rule} "
                f"sw={cfg.spanning.size_weight:g} (compare)")
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
         "candidates": {c.name: {"method": c.label, "config": config_record(c.config)} for c in cs.candidates},
         "folds": folds, "seconds": timer.elapsed() if timer else None}, indent=1))
    print(f"{len(cs.candidates)} candidates x {len(ratios)} ratios x {len(seeds)} seeds"
          + (f" in {timer.elapsed():.0f}s" if timer else "") + f"; preset rule picks {choice!r}")
    print(f"wrote {os.path.join(a.out, 'loo.md')}\nwrote {os.path.join(a.out, 'loo.json')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``memforest eval`` on its own (its flags without the word ``eval``)."""
    ap = Parser(prog="memforest eval", description="Measure compression quality (docs/evaluation.md).")
    ap.add_argument("-v", "--verbose", action="store_true")
    add_arguments(ap)
    ap.set_defaults(cmd="eval")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    return run(a) if check_usage(a, check) else 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
