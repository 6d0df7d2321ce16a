"""The LLM protocol's part of ``results.md``: judge accuracy J, token F1 and BLEU-1 per method,
ratio, retriever and category, their retention against the uncompressed store, the failure
and refusal rates, the bootstrap calls on J, and what the run cost (calls, tokens, cache hits).

Called by :func:`~.result_files.markdown` with the aggregated records (``agg``: {(label, ratio,
retriever, cut, metric, category): (mean, std, n_seeds)}) and the comparison records.
"""
from __future__ import annotations

from collections import defaultdict

__all__ = ["qa_section", "has_qa", "cat_label", "failed_answers_line", "failed_verdicts_line"]


def cat_label(c: str) -> str:
    """A category as a column name: ``"c2"`` for LoCoMo's numbered ones, the name otherwise."""
    return f"c{c}" if str(c).isdigit() else str(c)


def has_qa(agg: dict) -> bool:
    """True when the run scored the LLM protocol."""
    return any(key[4] in ("j", "f1") for key in agg)


def _cell(agg, key, scale=100.0) -> str:
    v = agg.get(key)
    if v is None:
        return "–"
    m, s, n = v
    return f"{scale * m:.1f}" + (f" ± {scale * s:.1f}" if n > 1 else "")


def failed_answers_line(meta: dict) -> str | None:
    """``**3 of 40 answers failed** ...`` when some answer requests failed (None otherwise)."""
    qa = meta.get("qa") or {}
    failed, asked = (qa.get("failures") or {}).get("answer failed", 0), qa.get("answers_asked", 0)
    if not failed:
        return None
    last = (qa.get("answer_model") or {}).get("last_error")
    return (f"**{failed} of {asked} answers failed** (their requests got no reply: not scored, left out of J"
            + (f"; last error: {last}" if last else "") + ").")


def failed_verdicts_line(meta: dict) -> str | None:
    """``**3 of 40 verdicts failed** ...`` when some of the judge's verdicts failed, a louder line
    when every one did (J of the open questions is then empty); None when none failed."""
    qa = meta.get("qa") or {}
    failed, asked = (qa.get("failures") or {}).get("judge failed", 0), qa.get("verdicts_asked", 0)
    if not failed:
        return None
    judge = qa.get("judge_model") or {}
    last = judge.get("last_error")
    why = ("no CORRECT / WRONG label in the reply after one strict retry, or the request failed"
           + (f"; last error: {last}" if last else ""))
    if failed == asked:
        return (f"**Every verdict failed ({failed} of {asked})**: the judge `{judge.get('spec')}` gave no usable "
                f"verdict ({why}), so J holds only multiple-choice questions, if any; F1 and B1 stand. Check "
                "`--judge-model`, `--judge-max-tokens` and `--base-url`.")
    return f"**{failed} of {asked} verdicts failed** ({why}: not scored, left out of J)."


def _cost(meta: dict) -> list[str]:
    qa = meta.get("qa") or {}
    if not qa:
        return []
    L = []
    for role, who in (("answer_model", "answerer"), ("judge_model", "judge")):
        m = qa.get(role)
        if m:
            L.append(f"- {who} `{m['spec']}`: {m['calls']} back-end calls, "
                     f"{m['prompt_tokens']:,} prompt + {m['completion_tokens']:,} completion tokens, "
                     f"{m['failed_requests']} failed requests")
    L.append(f"- prompts: answer {qa.get('answer_prompt')}, judge {qa.get('judge_prompt')}; requests sent: "
             f"{qa.get('answer_requests', 0)} answers, {qa.get('judge_requests', 0)} verdicts; from the reply "
             f"cache: {qa.get('answer_cached', 0)} answers, {qa.get('judge_cached', 0)} verdicts")
    fails = qa.get("failures") or {}
    L.append("- not scored (counted, never guessed): " + (", ".join(f"{n} {why}" for why, n in sorted(fails.items()))
                                                         if fails else "none"))
    return L


def _table(agg, labels, ratios, cats, k) -> list[str]:
    head = ["Method"] + [f"J {cat_label(c)}" for c in cats] + ["J all", "%", f"F1@{k}", "%", f"B1@{k}", "%",
                                                     "ans. failed %", "judge failed %", "refused %"]
    L = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(name, label, ratio, retriever):
        key = (label, ratio, retriever, "k")
        cells = [_cell(agg, (*key, "j", c)) for c in cats]
        for metric in ("j", "f1", "bleu1"):
            cells += [_cell(agg, (*key, metric, "all")), _cell(agg, (*key, f"{metric}_retention", "all"))]
        cells += [_cell(agg, (*key, m, "all")) for m in ("answer_failed", "judge_failed", "refused")]
        L.append(f"| {name} | " + " | ".join(cells) + " |")

    row("uncompressed", "none", 0.0, "plain")
    row("+ AGPR", "none", 0.0, "agpr")
    for ratio in ratios:
        L.append(f"| **ratio {ratio:g} (↓{100 * ratio:.0f}%)** |" + " |" * (len(head) - 1))
        for label in labels:
            row(f"+ {label}", label, ratio, "plain")
        for label in labels:
            row(f"+ {label} + AGPR", label, ratio, "agpr")
    return L


def _differences(comp: list[dict], reference: str) -> list[str]:
    """J and F1 differences from the reference, from the records of
    :func:`~.result_files.comparisons`."""
    suffix = {"": "point", "_ci_lo": "lo", "_ci_hi": "hi", "_call": "call"}
    by = defaultdict(dict)
    for r in comp:
        for m in ("j", "f1"):
            for end, what in suffix.items():
                if r["metric"] == f"{m}_retention_diff_vs_{reference}{end}":
                    label = r["method"] if r["schedule"] == "-" else f"{r['method']}:{r['schedule']}"
                    by[label, r["ratio"], r["retriever"]][m, what] = r["value"]
    if not by:
        return []
    L = [f"Differences from {reference} (retention points, 95% cluster-bootstrap interval):", "",
         "| method | ratio | retriever | Δ J | call | Δ F1 | call |", "|---|---|---|---|---|---|---|"]
    for (label, ratio, retriever), d in by.items():
        cells = []
        for m in ("j", "f1"):
            if (m, "point") not in d:
                cells += ["–", "–"]
                continue
            cells.append(f"{d[m, 'point']:+.1f} [{d[m, 'lo']:+.1f}, {d[m, 'hi']:+.1f}]")
            cells.append({0: "n.s.", -1: "reference ahead", 1: "reference behind"}[d[m, "call"]])
        L.append(f"| {label} | {ratio:g} | {retriever} | " + " | ".join(cells) + " |")
    return L


def qa_section(meta: dict, agg: dict, comp: list[dict], cats: list[str], reference: str) -> list[str]:
    """The markdown lines of the LLM protocol (empty when the run has none)."""
    if not has_qa(agg):
        return []
    k = meta.get("eval", {}).get("k", 10)
    apart = meta.get("categories_apart") or []
    L = ["", f"## LLM protocol: answers from the top {k} memories, judged", "",
         "J = the judge's CORRECT / (CORRECT + WRONG) (multiple choice: the letter against the gold one), over the "
         "questions scored; F1 / B1 = token F1 / BLEU-1 of the answer against the gold answer; % = retention "
         "against the uncompressed store with plain top-k. Failed answers and verdicts are left out of J and "
         "counted in the failed columns (share of questions); refused = answers that decline (judged like "
         "any answer)." + (f" Categories {', '.join(apart)} (abstention: the right answer is to decline) are "
                            f"reported apart, not in 'all'." if apart else ""), ""]
    for line in (failed_answers_line(meta), failed_verdicts_line(meta)):
        L += [line, ""] if line else []
    L += _cost(meta) + [""]
    L += _table(agg, meta.get("methods", []), meta.get("ratios", []), cats, k)
    diffs = _differences(comp, reference)
    return L + ([""] + diffs if diffs else [])
