"""The LLM protocol of the Mem0 and MemForest papers: an LLM answers each question from the
top-k retrieved memories, an LLM judge marks the answer CORRECT or WRONG against the gold
answer; beside it token F1 and BLEU-1 (:mod:`.qa_score`).

    >>> qa = QAProtocol(QAConfig(answer_model="transformers:/m/SmolLM2.gguf",
    ...                          judge_model="transformers:/m/SmolLM2.gguf"),
    cache_dir="out/.cache")
    >>> scores = qa.score(questions, contexts)   # contexts[i]: question i's rendered top-k memories
    >>> scores["j"]                              # (Q,) 1 correct, 0 wrong, NaN not scored

Per call, every question's answer prompt (:mod:`.qa_prompts`) goes to the answerer in ONE
batched back-end call (the back end batches or runs them concurrently, as the mergers do);
prompts already answered (the reply cache, :mod:`.qa_cache`, keyed by model, prompt version and
the exact messages) are not sent again, nor are duplicates. Failed or empty replies go again in
one second call. Then every answer goes to the judge the same way; a verdict without a label
gets one strict retry. A multiple-choice question (``Question.options``) is scored by the letter
the answer picks, without the judge.

Per question (arrays of shape (Q,)):

- ``j``: 1 CORRECT, 0 WRONG; NaN when not scored: the answer failed (request failed twice,
  empty, or a multiple-choice reply naming no single option), the judge failed (request failed
  or no label after the retry), or there is no judge. Never guessed: failures are counted, not
  scored as wrong or right.
- ``f1``, ``bleu1``: against the gold answer (multiple choice: the chosen option's text); NaN
  when the answer failed.
- ``answer_failed``, ``judge_failed``: 1 / 0 (``judge_failed`` NaN where nothing is judged:
  multiple choice, a failed answer, no judge);
  ``refused``: 1 when the answer declines ("I don't know", :func:`.qa_score.is_refusal`), 0
  otherwise, NaN when the answer failed. A refusal is judged like any answer (it is the right
  answer to an abstention question) and counted here, so it is never silently wrong.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..config import ConfigError
from .dataset import Question
from .qa_cache import ReplyCache, reply_key
from .qa_client import make_models
from .qa_prompts import ANSWER_VERSION, JUDGE_VERSION, answer_messages, choice_messages, judge_messages
from .qa_score import bleu1, is_refusal, parse_choice, parse_verdict, token_f1

__all__ = ["QAConfig", "QAProtocol", "QA_METRICS"]

QA_METRICS = ("j", "f1", "bleu1", "answer_failed", "judge_failed", "refused")
_LABEL = re.compile(r"^\s*(?:final\s+)?answer\s*:\s*", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class QAConfig:
    """Which models answer and judge, and how (see :mod:`.qa_client` for the specs)."""

    answer_model: str  # NAME (OpenAI-compatible server) | openai:NAME | vllm:PATH | transformers:PATH
    judge_model: str | None = None  # the same forms; None: no judge (multiple choice still scored)
    base_url: str | None = None  # the OpenAI-compatible server (default http://127.0.0.1:8000/v1)
    answer_max_tokens: int = 64  # tokens an answer may take
    judge_max_tokens: int = 16  # tokens a verdict may take
    options: dict = field(default_factory=dict)  # back-end options (max_concurrency, batch_size, device, ...)

    def __post_init__(self):
        for name in ("answer_max_tokens", "judge_max_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(name, f"must be an integer >= 1, got {v!r}")
        if not isinstance(self.answer_model, str) or not self.answer_model.strip():
            raise ConfigError("answer_model", f"must be a model spec, got {self.answer_model!r}")


def _clean(reply: str | None) -> str | None:
    """A reply without surrounding space and a leading "Answer:" label; None if empty."""
    if reply is None:
        return None
    out = _LABEL.sub("", reply.strip(), count=1).strip()
    return out or None


class QAProtocol:
    """Answers and verdicts for batches of (question, retrieved context); see the module docstring.
    ``stats``: calls, tokens, cache hits and failure reasons of the whole run."""

    def __init__(self, config: QAConfig, *, cache_dir=None, models=None):
        self.config = config
        self.answerer, self.judge = models if models is not None else make_models(
            config.answer_model, config.judge_model, base_url=config.base_url,
            answer_max_tokens=config.answer_max_tokens, judge_max_tokens=config.judge_max_tokens,
            options=config.options)
        self.cache = ReplyCache(cache_dir)
        self.failures: Counter = Counter()
        self.counts = Counter()

    def _ask(self, model, kind: str, version: str, chats: list[list[dict]],
             retry_chats: list[list[dict]] | None = None) -> list[str | None]:
        """Replies to ``chats`` from the cache or from ONE call for the missing ones (duplicates
        asked once); the failed ones (no reply, empty, a verdict without a label) go again in one
        more call, as ``retry_chats`` words them (default: unchanged). Only good replies are
        cached."""
        keys = [reply_key(model.identity, kind, version, c) for c in chats]
        cached = [self.cache.get(k) for k in keys]
        self.counts[f"{kind}_cached"] += sum(c is not None for c in cached)
        todo = list(dict.fromkeys(k for k, c in zip(keys, cached) if c is None))
        first = dict(zip(keys, chats))
        second = dict(zip(keys, retry_chats or chats))
        for attempt in range(2):
            if not todo:
                break
            send = [(first if attempt == 0 else second)[k] for k in todo]
            self.counts[f"{kind}_requests"] += len(send)
            again = []
            for k, r in zip(todo, model.generate(send)):
                if _clean(r) is not None and (kind != "judge" or parse_verdict(r) is not None):
                    self.cache.put(k, r)
                else:
                    again.append(k)
            todo = again
        return [self.cache.get(k, count=False) for k in keys]

    def score(self, questions: Sequence[Question], contexts: Sequence[Sequence[str]]) -> dict[str, np.ndarray]:
        """Per-question metrics (:data:`QA_METRICS`) of answering each question from its context.

        Shape: questions (Q,), contexts (Q,) lists of rendered memories -> {metric: (Q,) float64}
        """
        if len(questions) != len(contexts):
            raise ValueError(f"contexts must have one entry per question ({len(questions)}), got {len(contexts)}")
        Q = len(questions)
        self.counts["answers_asked"] += Q
        out = {m: np.full(Q, np.nan) for m in QA_METRICS}
        chats = [choice_messages(ctx, q.question, q.options, q.date) if q.options
                 else answer_messages(ctx, q.question, q.date) for q, ctx in zip(questions, contexts)]
        answers = [_clean(r) for r in self._ask(self.answerer, "answer", ANSWER_VERSION, chats)]
        to_judge: list[int] = []
        for i, (q, a) in enumerate(zip(questions, answers)):
            pick = parse_choice(a, len(q.options), q.options) if q.options and a is not None else None
            if a is None or (q.options and pick is None):
                self.failures["no option picked" if a is not None else "answer failed"] += 1
                out["answer_failed"][i] = 1.0
                continue
            out["answer_failed"][i] = 0.0
            out["refused"][i] = float(is_refusal(a))
            if q.options:  # scored by the letter; F1 and BLEU-1 on the chosen option's text
                out["j"][i] = float(q.options[pick] == q.answer)
                a = q.options[pick]
            else:
                to_judge.append(i)
            out["f1"][i], out["bleu1"][i] = token_f1(a, q.answer), bleu1(a, q.answer)
        if self.judge is not None and to_judge:
            self.counts["verdicts_asked"] += len(to_judge)
            self._verdicts([questions[i] for i in to_judge], [answers[i] for i in to_judge], to_judge, out)
        self.cache.flush()
        return out

    def _verdicts(self, qs: list[Question], answers: list[str], rows: list[int], out: dict) -> None:
        chats = [judge_messages(q.question, q.answer, a, abstention=q.abstention) for q, a in zip(qs, answers)]
        strict = [judge_messages(q.question, q.answer, a, abstention=q.abstention, strict=True)
                  for q, a in zip(qs, answers)]
        for i, reply in zip(rows, self._ask(self.judge, "judge", JUDGE_VERSION, chats, strict)):
            v = parse_verdict(reply)
            if v is None:
                self.failures["judge failed"] += 1
                out["judge_failed"][i] = 1.0
            else:
                out["judge_failed"][i] = 0.0
                out["j"][i] = float(v == "CORRECT")

    def answers_failed(self) -> tuple[int, int]:
        """(answers whose request failed, answers asked) over the run so far."""
        return self.failures.get("answer failed", 0), self.counts.get("answers_asked", 0)

    def verdicts_failed(self) -> tuple[int, int]:
        """(verdicts that failed: no reply, or no label after the strict retry; verdicts asked)
        over the run so far."""
        return self.failures.get("judge failed", 0), self.counts.get("verdicts_asked", 0)

    def summary(self) -> dict:
        """Run totals: calls and tokens per model, cache hits, requests, failures by reason."""
        return {"answer_model": self.answerer.summary(),
                "judge_model": self.judge.summary() if self.judge is not None else None,
                "answer_prompt": ANSWER_VERSION, "judge_prompt": JUDGE_VERSION,
                **dict(self.counts), "failures": dict(self.failures)}
