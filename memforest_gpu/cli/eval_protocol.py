"""What the ``memforest eval`` flags of the published benchmarks' parts and of the LLM protocol
build (each flag maps to one field; the flags: :mod:`.eval_args`), and what the run says of
the protocol's answers and verdicts."""
from __future__ import annotations

import os
import sys

from ..evaluation.qa import QAConfig, QAProtocol
from ..evaluation.qa_client import parse_spec
from .flags import parse_options

__all__ = ["qa_from_args", "subset_from_args", "answers_said", "verdicts_said", "say_skipped"]


def qa_from_args(a):
    """The :class:`~memforest_gpu.evaluation.qa.QAProtocol` of the flags (None without
    ``--answer-model``); replies cached under ``--cache`` (default OUT/.cache)."""
    if getattr(a, "answer_model", None) is None:
        if getattr(a, "judge_model", None) is not None:
            raise ValueError(f"--judge-model needs --answer-model (the judge grades its answers), got only "
                             f"--judge-model {a.judge_model!r}")
        return None

    for flag, spec in (("--answer-model", a.answer_model), ("--judge-model", a.judge_model)):
        if spec is not None:
            try:
                kind, model = parse_spec(spec)
            except ValueError as e:
                raise ValueError(f"{flag}{str(e)[len('model'):]}") from None
            allow = parse_options(a.llm_option, "--llm-option").get("allow_download")
            if kind in ("vllm", "transformers") and not allow and not a.base_url and not os.path.exists(model):
                raise ValueError(f"{flag} must be {kind}:PATH, a local model directory or .gguf file, got {spec!r} "
                                 "(no such file or folder)")
    cfg = QAConfig(answer_model=a.answer_model, judge_model=a.judge_model, base_url=a.base_url,
                   answer_max_tokens=a.answer_max_tokens, judge_max_tokens=a.judge_max_tokens,
                   options=parse_options(a.llm_option, "--llm-option"))
    try:
        return QAProtocol(cfg, cache_dir=a.cache or os.path.join(a.out, ".cache"))
    except ValueError as e:
        msg = str(e)
        if msg.startswith("options of merger "):  # the back end's options are given with --llm-option
            msg = "--llm-option: " + msg.replace("options of merger", "options of the back end", 1)
        raise ValueError(msg) from None


def subset_from_args(bench, a):
    """``bench`` restricted to ``--tenants`` and ``--max-questions``."""
    tenants = [t.strip() for t in a.tenants.split(",") if t.strip()] if getattr(a, "tenants", None) else None
    if tenants is None and getattr(a, "max_questions", None) is None:
        return bench
    return bench.subset(tenants=tenants, max_questions=a.max_questions)


def answers_said(qa, a) -> bool:
    """After the grid: False (with one error line) when every answer request failed, so the
    run has nothing to report; else True, with one line saying how many failed when some did."""
    failed, asked = qa.answers_failed()
    last = qa.answerer.summary().get("last_error")
    if asked and failed == asked:
        print(f"memforest eval: error: every answer request failed ({failed} of {asked} answers from "
              f"--answer-model {a.answer_model!r}" + (f"; last error: {last}" if last else "")
              + "): check --answer-model and --base-url; no results written", file=sys.stderr)
        return False
    if failed:
        print(f"memforest eval: {failed} of {asked} answers failed (not scored, left out of J; counted in results.md)"
              + (f"; last error: {last}" if last else ""), file=sys.stderr)
    return True


def verdicts_said(qa, a) -> bool:
    """After the grid: False (with one error line) when every verdict of the judge failed; else
    True, with one line saying how many failed when some did.

    Every verdict failed (a judge that never writes CORRECT / WRONG, a label cut off by
    ``--judge-max-tokens``, a dead ``--base-url``): the run still writes its results, since the
    answers, their F1 and BLEU-1 and the retrieval metrics are sound and cost the answerer's
    calls, but ``memforest eval`` exits with status 1: ``--judge-model`` asked for J, the
    protocol's headline figure, and a script or CI job that reads the exit status must not take
    an empty J column for a result. The verdicts are never cached when they fail, so a re-run
    with a working judge sends only them."""
    failed, asked = qa.verdicts_failed()
    last = qa.judge.summary().get("last_error") if qa.judge is not None else None
    tail = f"; last error: {last}" if last else ""
    if asked and failed == asked:
        print(f"memforest eval: error: every verdict failed ({failed} of {asked} from --judge-model "
              f"{a.judge_model!r}{tail}): J of the open questions is empty; check --judge-model, --judge-max-tokens "
              "and --base-url; results written without it (F1 and BLEU-1 stand)", file=sys.stderr)
        return False
    if failed:
        print(f"memforest eval: {failed} of {asked} verdicts failed (not scored, left out of J; counted in "
              f"results.md){tail}", file=sys.stderr)
    return True


def say_skipped(bench) -> None:
    """One line on stderr when ``--skip-missing-contexts`` left questions out."""
    skipped = bench.info.get("questions_skipped_missing_context")
    if skipped:
        print(f"memforest eval: {skipped} question(s) skipped (--skip-missing-contexts): their shared_context_id is "
              f"one of {bench.info['contexts_missing']} context(s) the contexts file lacks", file=sys.stderr)
