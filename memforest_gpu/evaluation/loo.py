"""Leave-one-conversation-out tuning: choose a MemForest configuration without scoring it
on the conversation it was chosen on.

Every candidate (a :class:`~memforest_gpu.config.CompressConfig`) is run once on the whole
benchmark for every ratio and seed (tenants are isolated, so a conversation's output does
not depend on the others), and its per-question scores are kept. For each fold (one held-out
conversation) the candidate with the best **selection score** on the other conversations
is chosen and then scored on the held-out one.

Selection score (fixed before any run): the mean over ratios and seeds of the retention of
``select`` (default AnsR-content at the @B cut, plain top-k), where the retention of a set
of conversations is the mean score over their questions divided by the uncompressed store's
mean over the same questions (as the grid's retention). Ties go to the earlier candidate.

Several node shapes of one benchmark (LoCoMo as turns and as facts: :func:`score_candidates`
with a dict of benchmarks) are scored side by side; a fold holds out a conversation in every
shape, and every retention (selection and held-out) is the mean over shapes of the shape's
retention, so each shape weighs the same whatever its number of questions.

The preset rule (:func:`preset_choice`): the candidate chosen in most folds; a tie goes to
the one whose folds' held-out scores have the higher mean. The leave-one-out estimate of
the procedure is the mean over folds of the chosen candidates' held-out scores.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..config import PRESETS, CompressConfig, ConfigError, config_from_record, config_record
from ..store.atomic import atomic_open
from .harness import EvalConfig, cell_key, run_grid

__all__ = ["Candidate", "candidate_grid", "CandidateScores", "score_candidates", "retention",
           "leave_one_out", "preset_choice", "loo_markdown", "paper_candidate", "save_scores", "load_scores",
           "rule_fields", "keys_fields", "METRICS"]


@dataclass(frozen=True)
class Candidate:
    """A named configuration; ``method`` is how the grid runs it (``memforest:SCHEDULE`` or
    a baseline such as ``tome``, which reads only ratio and seed). ``compare_only``: scored
    beside the others for comparison, never selected (as the paper defaults and ToMe)."""

    name: str
    config: CompressConfig
    method: str = ""
    compare_only: bool = False

    @property
    def label(self) -> str:
        return self.method or f"memforest:{self.config.merge.schedule}"


def candidate_grid(schedules=("sequential", "matching"), alphas=(0.05, 0.01, 0.001), time_weights=(0.0, 0.5),
                   size_weights=(0.0, 0.2), base: CompressConfig | None = None,
                   time_rules: tuple[str, ...] | None = None,
                   keys_rules: tuple[str, ...] | None = None) -> list[Candidate]:
    """The product of the lists on ``base`` (default: the method's, docs/method.md), named
    ``"{schedule} a={alpha} tw={time_weight} sw={size_weight}"``. ``time_rules`` (e.g.
    ``("scaled", "flat", "gated:0.3")``: a rule, and for ``gated`` its ``time_min_cos``) adds
    the time rule as a fifth list and to the names (``tw=0.5/scaled``); with time weight 0 the
    rule does not matter and the candidate appears once, with ``base``'s rule (so it equals
    ``base``'s config where the other fields do). Without it, ``base``'s rule is used.
    ``keys_rules`` (e.g. ``("text", "all:0.5", "3:0.5")``, :func:`keys_fields`) adds what merged
    nodes are searched by as a sixth list, named ``keys=all:0.5`` (``text``: no keys, unnamed)."""
    base = base or CompressConfig()
    out, seen = [], set()
    for s, a, tw, rule, sw, kr in itertools.product(schedules, alphas, time_weights, time_rules or (None,),
                                                    size_weights, keys_rules or (None,)):
        spanning = dataclasses.replace(base.spanning, time_weight=tw, size_weight=sw,
                                       **rule_fields(rule if tw > 0 else None))
        cfg = dataclasses.replace(base, partition=dataclasses.replace(base.partition, alpha=a), spanning=spanning,
                                  merge=dataclasses.replace(base.merge, schedule=s, **keys_fields(kr)))
        name = f"{s} a={a:g} tw={tw:g}{f'/{rule}' if rule and tw > 0 else ''} sw={sw:g}" \
            + (f" keys={kr}" if kr and kr != "text" else "")
        if name not in seen:
            seen.add(name)
            out.append(Candidate(name, cfg))
    return out


def keys_fields(rule: str | None) -> dict:
    """``"all:0.5"`` -> ``{"keys": -1, "text_weight": 0.5}``, ``"3"`` -> keys 3 with text weight 0
    (the best key alone), ``"text"`` -> ``{"keys": 0, "text_weight": 1.0}``; None -> {}."""
    if rule is None:
        return {}
    if rule == "text":
        return {"keys": 0, "text_weight": 1.0}
    k, _, w = rule.partition(":")
    try:
        return {"keys": -1 if k == "all" else int(k), "text_weight": float(w) if w else 0.0}
    except ValueError:
        raise ValueError(f"keys rule must be 'text' or K[:TEXT_WEIGHT] with K an integer or 'all', got {rule!r}") \
            from None


def rule_fields(rule: str | None) -> dict:
    """``"gated:0.3"`` -> ``{"time_rule": "gated", "time_min_cos": 0.3}``; None -> {}."""
    if rule is None:
        return {}
    name, _, cos = rule.partition(":")
    return {"time_rule": name, **({"time_min_cos": float(cos)} if cos else {})}


@dataclass
class CandidateScores:
    """Per-question scores of candidates. ``scores[name][ratio, metric]``: (S, Q) over seeds;
    ``base[metric]``: (Q,) the uncompressed store's; ``tenants``: (Q,) each question's
    conversation; ``shapes``: (Q,) each question's node shape when several shapes are scored
    side by side (their questions concatenated), else None; metric names ``"B:ansr_content"``
    (cut:metric, plain top-k)."""

    scores: dict[str, dict[tuple[float, str], np.ndarray]]
    base: dict[str, np.ndarray]
    tenants: np.ndarray
    ratios: list[float]
    seeds: list[int]
    candidates: list[Candidate]
    shapes: np.ndarray | None = None

    def shape_masks(self) -> list[np.ndarray]:
        """One (Q,) mask per node shape (a single all-true mask without shapes)."""
        if self.shapes is None:
            return [np.ones(len(self.tenants), bool)]
        return [self.shapes == s for s in dict.fromkeys(self.shapes.tolist())]


METRICS = ("B:ansr_content", "B:ansr", "B:evr", "k:evr")


def score_candidates(bench, candidates: list[Candidate], ratios, seeds, *, embedder, merger=None, device=None,
                     eval_config: EvalConfig | None = None, on_candidate=None) -> CandidateScores:
    """Run every candidate over ``ratios`` x ``seeds`` on the whole benchmark (one
    :func:`~.harness.run_grid` each) and keep the per-question scores of :data:`METRICS`.
    ``bench``: a benchmark, or ``{shape: benchmark}`` of the same conversations in several node
    shapes (their questions are concatenated in that order; ``shapes`` records which is which)."""
    benches = bench if isinstance(bench, dict) else {None: bench}
    parts = [_score_one(b, candidates, ratios, seeds, embedder=embedder, merger=merger, device=device,
                        eval_config=eval_config, on_candidate=on_candidate) for b in benches.values()]
    if len(parts) == 1 and None in benches:
        return parts[0]
    scores = {c.name: {key: np.concatenate([p.scores[c.name][key] for p in parts], 1)
                       for key in parts[0].scores[c.name]} for c in candidates}
    base = {m: np.concatenate([p.base[m] for p in parts]) for m in METRICS}
    shapes = np.concatenate([np.full(len(p.tenants), str(s)) for s, p in zip(benches, parts)])
    return CandidateScores(scores, base, np.concatenate([p.tenants for p in parts]), list(ratios), list(seeds),
                           list(candidates), shapes)


def _score_one(bench, candidates, ratios, seeds, *, embedder, merger, device, eval_config, on_candidate):
    ecfg = eval_config or EvalConfig(search_repeats=1)
    scores: dict[str, dict] = {}
    base: dict[str, np.ndarray] = {}
    tenants = None
    for cand in candidates:
        res = run_grid(bench, [cand.label], ratios, seeds, embedder=embedder, merger=merger,
                       base_config=cand.config, eval_config=ecfg, device=device)
        tenants = np.asarray(res.question_tenants)
        for m in METRICS:
            cut, metric = m.split(":")
            base[m] = res.per_question[cell_key("none", 0.0, 0, "plain", cut, metric)].astype(np.float64)
            for r in ratios:
                scores.setdefault(cand.name, {})[r, m] = np.stack(
                    [res.per_question[cell_key(cand.label, r, sd, "plain", cut, metric)] for sd in seeds]
                ).astype(np.float64)
        if on_candidate is not None:
            on_candidate(cand, res)
    return CandidateScores(scores, base, tenants, list(ratios), list(seeds), list(candidates))


def _nanmean(x: np.ndarray) -> float:
    ok = ~np.isnan(x)
    return float(x[ok].mean()) if ok.any() else math.nan


def retention(cs: CandidateScores, name: str, mask: np.ndarray, metric: str = "B:ansr_content",
              ratios=None, shape: str | None = None) -> float:
    """Mean over ``ratios`` (default all) and seeds of the retention of ``metric`` on the
    questions in ``mask``; with several node shapes, the mean over shapes of each shape's
    retention (``shape``: that one only). Shape: mask (Q,) bool -> float (1.0 = as good as
    uncompressed)"""
    masks = cs.shape_masks() if shape is None else [cs.shapes == shape]
    return float(np.mean([_retention(cs, name, mask & s, metric, ratios) for s in masks]))


def _retention(cs: CandidateScores, name: str, mask: np.ndarray, metric: str, ratios) -> float:
    base = _nanmean(cs.base[metric][mask])
    vals = [_nanmean(row[mask]) / base for r in (ratios or cs.ratios) for row in cs.scores[name][r, metric]]
    return float(np.mean(vals)) if base else math.nan


def leave_one_out(cs: CandidateScores, *, select: str = "B:ansr_content", pool: list[str] | None = None,
                  compare: tuple[str, ...] = ()) -> list[dict]:
    """One record per held-out conversation: the candidate (among ``pool``, default every
    candidate) with the best selection score on the other conversations, its training score,
    and the held-out retention (per ratio and mean) of it and of each name in ``compare``,
    for every metric in :data:`METRICS`."""
    pool = pool or [c.name for c in cs.candidates]
    folds = []
    for held in sorted(set(cs.tenants.tolist())):
        train, test = cs.tenants != held, cs.tenants == held
        train_scores = {n: retention(cs, n, train, select) for n in pool}
        chosen = max(pool, key=lambda n: (train_scores[n], -pool.index(n)))
        rec = {"held_out": held, "questions": int(test.sum()), "chosen": chosen, "train_score": train_scores[chosen],
               "held_out_scores": {}}
        for n in dict.fromkeys([chosen, *compare]):
            rec["held_out_scores"][n] = {m: _held_out(cs, n, test, m) for m in METRICS}
        folds.append(rec)
    return folds


def _held_out(cs: CandidateScores, name: str, test: np.ndarray, metric: str, shape: str | None = None) -> dict:
    """Retention on ``test``: its mean over ratios and per ratio; with several shapes also
    each shape's (``"by_shape"``)."""
    out = {"mean": retention(cs, name, test, metric, shape=shape),
           **{f"{r:g}": retention(cs, name, test, metric, [r], shape=shape) for r in cs.ratios}}
    if cs.shapes is not None and shape is None:
        out["by_shape"] = {s: _held_out(cs, name, test, metric, s) for s in dict.fromkeys(cs.shapes.tolist())}
    return out


def preset_choice(folds: list[dict], select: str = "B:ansr_content") -> str:
    """The candidate chosen in most folds; a tie goes to the higher mean held-out score
    (of ``select``) over the folds that chose it."""
    count = Counter(f["chosen"] for f in folds)

    def held(n):
        return float(np.mean([f["held_out_scores"][n][select]["mean"] for f in folds if f["chosen"] == n]))

    return max(count, key=lambda n: (count[n], held(n)))


def _pct(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}"


def _fold_table(cs: CandidateScores, folds: list[dict], metric: str, compare: tuple[str, ...],
                shape: str | None, title: str) -> list[str]:
    """One table: per fold the chosen candidate's held-out retention (of ``shape``, or the
    mean over shapes) beside ``compare``, and the mean over folds."""
    rs = [f"{r:g}" for r in cs.ratios]

    def scores(f, n):
        s = f["held_out_scores"][n][metric]
        return s if shape is None else s["by_shape"][shape]

    L = [f"## {title} ({metric} retention %, ratio " + " / ".join(rs) + " (mean))", "",
         "| held out | questions | chosen | train score | chosen, held out | " + " | ".join(compare) + " |",
         "|---|---|---|---|---|" + "---|" * len(compare)]
    for f in folds:
        def cell(n):
            s = scores(f, n)
            return " / ".join(_pct(s[r]) for r in rs) + f" ({_pct(s['mean'])})"

        L.append(f"| {f['held_out']} | {f['questions']} | {f['chosen']} | {_pct(f['train_score'])} | "
                 f"{cell(f['chosen'])} | " + " | ".join(cell(n) for n in compare) + " |")
    est = {n: np.mean([scores(f, f["chosen"] if n == "chosen" else n)["mean"] for f in folds])
           for n in ("chosen", *compare)}
    L += [f"| **mean over folds** | | | | **{_pct(est['chosen'])}** | " + " | ".join(_pct(est[n]) for n in compare)
          + " |", ""]
    return L


def loo_markdown(cs: CandidateScores, folds: list[dict], *, select: str, compare: tuple[str, ...],
                 choice: str) -> str:
    """The leave-one-out report: per fold the chosen candidate and its held-out retention
    beside ``compare`` on the same conversation (with several shapes: their mean, then each
    shape), the estimate, the preset rule's pick, and every candidate on every conversation."""
    shapes = [] if cs.shapes is None else list(dict.fromkeys(cs.shapes.tolist()))
    over = f" over the shapes {' and '.join(shapes)} (mean of each shape's retention)" if shapes else ""
    L = ["# Leave-one-conversation-out", "",
         f"{len(cs.candidates)} candidates, ratios {cs.ratios}, seeds {cs.seeds}; selection score: mean retention "
         f"of {select} (plain top-k) over ratios and seeds{over} on the training conversations; held-out values: "
         f"retention on the held-out conversation, per ratio " + "/".join(f"{r:g}" for r in cs.ratios)
         + " and their mean. Questions count each shape's questions.", ""]
    for metric in (select, *[m for m in ("B:ansr",) if m != select]):
        L += _fold_table(cs, folds, metric, compare, None, "Held out" + (", mean over shapes" if shapes else ""))
        for sh in shapes:
            L += _fold_table(cs, folds, metric, compare, sh, f"Held out, {sh}")
    L.append(f"Preset rule: the candidate chosen in most folds (tie: higher mean held-out {select} over the folds "
             f"that chose it). Chosen: **{choice}** "
             f"({sum(f['chosen'] == choice for f in folds)} of {len(folds)} folds).")
    L.append("")
    tenants = sorted(set(cs.tenants.tolist()))
    every = np.ones(len(cs.tenants), bool)
    all_in = {c.name: retention(cs, c.name, every, select) for c in cs.candidates}
    L.append(f"## Every candidate, all conversations ({select} retention %, for reference only: not the selection)")
    L.append("")
    L.append("| candidate | all-in | " + " | ".join([*(f"{s} all-in" for s in shapes), *tenants]) + " |")
    L.append("|---|---|" + "---|" * (len(shapes) + len(tenants)))
    for n, v in sorted(all_in.items(), key=lambda kv: -kv[1]):
        per = [_pct(retention(cs, n, every, select, shape=s)) for s in shapes]
        per += [_pct(retention(cs, n, cs.tenants == t, select)) for t in tenants]
        L.append(f"| {n} | {_pct(v)} | " + " | ".join(per) + " |")
    return "\n".join(L) + "\n"


def paper_candidate(vectors: str = "float32") -> Candidate:
    """The paper's values (the ``"paper"`` preset, docs/method.md), sequential schedule;
    ``vectors``: how its stores hold their vectors (the run's, so that a grid candidate with the
    paper's fields is recognised as this one)."""
    p = PRESETS["paper"]
    return Candidate("paper", dataclasses.replace(p, merge=dataclasses.replace(p.merge, vectors=vectors)))


def save_scores(cs: CandidateScores, path: str) -> None:
    """Write ``cs`` to one ``.npz`` (per-question arrays plus the candidates' configs)."""

    arrays = {f"s|{n}|{r!r}|{m}": v for n, d in cs.scores.items() for (r, m), v in d.items()}
    arrays.update({f"b|{m}": v for m, v in cs.base.items()})
    meta = {"ratios": cs.ratios, "seeds": cs.seeds,
            "candidates": [{"name": c.name, "method": c.method, "compare_only": c.compare_only,
                            "config": config_record(c.config)}
                           for c in cs.candidates]}
    if cs.shapes is not None:
        arrays["shapes"] = cs.shapes
    with atomic_open(path) as f:
        np.savez_compressed(f, tenants=cs.tenants, meta=np.array(json.dumps(meta)), **arrays)


def load_scores(paths: list[str]) -> CandidateScores:
    """Read and join :func:`save_scores` files of the same benchmark, ratios and seeds (a
    candidate in several files is taken from the first)."""

    out = None
    for p in paths:
        with np.load(p) as z:
            meta = json.loads(str(z["meta"]))
            cands = [Candidate(c["name"], config_from_record(c["config"]), c["method"], c.get("compare_only", False))
                     for c in meta["candidates"]]
            scores: dict[str, dict] = {}
            for k in z.files:
                if k.startswith("s|"):
                    _, n, r, m = k.split("|")
                    scores.setdefault(n, {})[float(r), m] = z[k]
            cs = CandidateScores(scores, {k[2:]: z[k] for k in z.files if k.startswith("b|")}, z["tenants"],
                                 meta["ratios"], meta["seeds"], cands, z["shapes"] if "shapes" in z.files else None)
        if out is None:
            out = cs
            continue
        same_shapes = (cs.shapes is None) == (out.shapes is None) and (
            cs.shapes is None or np.array_equal(cs.shapes, out.shapes))
        if (cs.ratios, cs.seeds) != (out.ratios, out.seeds) or not np.array_equal(cs.tenants, out.tenants) \
                or not same_shapes:
            raise ValueError(f"score files must share benchmark, node shapes, ratios and seeds, got {p!r} with ratios "
                             f"{cs.ratios} seeds {cs.seeds} against {out.ratios} {out.seeds}")
        for c in cs.candidates:
            if c.name not in out.scores:
                out.candidates.append(c)
                out.scores[c.name] = cs.scores[c.name]
    if out is None:
        raise ConfigError("paths", "must name at least one score file, got none")
    return out
