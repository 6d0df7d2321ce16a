"""LongMemEval as published (``longmemeval_s.json``, ``_m``, ``_oracle``) -> the benchmark format.

The file is a list of items, each its own chat history and one question::

    {"question_id": "lme_q01", "question_type": "single-session-user", "question": "...",
     "answer": "...", "question_date": "2023/05/30 (Tue) 23:40",
     "haystack_session_ids": ["filler_a", ...], "haystack_dates": ["2023/05/20 (Sat)
     02:21", ...],
     "haystack_sessions": [[{"role": "user", "content": "...", "has_answer": true}, ...], ...],
     "answer_session_ids": ["answer_q01"]}

- One tenant per item (``tenant = question_id``): every item is its own history, so the same
  session appearing in two items' haystacks is two nodes, never shared.
- ``nodes="turns"`` (default): one node per turn, id ``"{question_id}:S{j}:{t}"`` (``j`` the
  session's position in the haystack, ``t`` the turn's), text ``"{role}: {content}"``,
  timestamp = the session's date plus ``t`` seconds (turns keep their order), metadata
  ``session`` (its id) and ``role``. ``nodes="sessions"``: one node per session, id
  ``"{question_id}:S{j}"``, its turns' texts joined by newlines, timestamp the session's date.
- Evidence: the turns marked ``has_answer`` (sessions: the sessions holding one); an item with
  no marked turn takes the sessions of ``answer_session_ids`` (every turn of them, with turns).
  ``Benchmark.info`` counts the questions whose evidence came from the session ids
  (``questions_evidence_from_sessions``) and those with none (``questions_without_evidence``).
- ``category`` = ``question_type``; a question whose id ends in ``_abs`` is an abstention
  question (``Question.abstention``, category ``"abstention"``): its right answer is that the
  history does not tell, so it is reported apart and never counted in "all".
- ``question_date`` -> ``Question.date`` (the answer prompt's "today").

Dates are read as ``YYYY/MM/DD (Day) HH:MM``, UTC. The oracle file lists sessions unsorted:
order comes from the timestamps, never from the list.
"""
from __future__ import annotations

import os
import re
from datetime import UTC, datetime

from ..config import ConfigError
from ..jsonfile import read_json
from .dataset import Benchmark, Question

__all__ = ["load_longmemeval", "parse_lme_date", "NODE_SHAPES", "ABSTENTION", "is_longmemeval"]

NODE_SHAPES = ("turns", "sessions")
ABSTENTION = "abstention"
_DATE = re.compile(r"(\d{4})/(\d{1,2})/(\d{1,2})\s*(?:\([A-Za-z]+\))?\s*(\d{1,2}):(\d{2})")
_KEYS = ("question_id", "question_type", "question", "answer", "haystack_dates", "haystack_sessions",
         "haystack_session_ids")


def parse_lme_date(s: str) -> float:
    """``"2023/05/20 (Sat) 02:21"`` -> epoch seconds (UTC)."""
    m = _DATE.fullmatch(str(s).strip())
    if m is None:
        raise ValueError(f"date must look like '2023/05/20 (Sat) 02:21', got {s!r}")
    y, mo, d, h, mi = (int(x) for x in m.groups())
    return datetime(y, mo, d, h, mi, tzinfo=UTC).timestamp()


def is_longmemeval(path: str) -> bool:
    """True when a ``.json`` file is LongMemEval: its name is a release's
    (``longmemeval_*.json``), or its first item has LongMemEval's keys."""
    if os.path.basename(path).lower().startswith("longmemeval"):
        return True
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(1 << 16)
    return '"haystack_sessions"' in head or ('"question_type"' in head and '"question_id"' in head)


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _shown(value) -> str:
    r = repr(value)
    return f"{_kind(value)} {r if len(r) <= 60 else r[:57] + '...'}" if value is not None else "null"


def _read(path: str):
    return read_json(path, "LongMemEval JSON")


def load_longmemeval(path: str, *, nodes: str = "turns") -> Benchmark:
    """Read a LongMemEval file into a :class:`Benchmark` of the node shape ``nodes``
    (:data:`NODE_SHAPES`). See the module docstring."""
    if nodes not in NODE_SHAPES:
        raise ConfigError("nodes", f"must be one of {list(NODE_SHAPES)} for LongMemEval, got {nodes!r}")
    data = _read(path)
    if not isinstance(data, list) or not data:
        got = f"an object with keys {sorted(data)[:6]}" if isinstance(data, dict) else _shown(data)
        raise ValueError(f"{path} must hold a non-empty list of LongMemEval items (objects with question_id, "
                         f"question, answer and haystack_sessions), got {got}")
    for n, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError(f"{path}: item {n} must be an object, got {_shown(item)}")
    out: list[dict] = []
    questions: list[Question] = []
    counts = {"questions_evidence_from_sessions": 0, "questions_without_evidence": 0, "abstention_questions": 0}
    seen: set[str] = set()
    for n, item in enumerate(data):
        missing = [k for k in _KEYS if k not in item]
        if missing:
            raise ValueError(f"{path}: item {n} is missing required field {missing[0]!r}")
        qid = str(item["question_id"])
        if qid in seen:
            raise ValueError(f"{path}: question_id must be unique, got {qid!r} twice")
        seen.add(qid)
        where = f"{path}: item {n} ({qid!r})"
        for key in ("question", "question_type"):
            if not isinstance(item[key], str):
                raise ValueError(f"{where}: {key} must be a string, got {_shown(item[key])}")
        if isinstance(item["answer"], bool) or not isinstance(item["answer"], (str, int, float)):
            raise ValueError(f"{where}: answer must be a string or a number, got {_shown(item['answer'])}")
        made, evidence, how = _item_nodes(item, qid, nodes, where)
        out += made
        counts["questions_evidence_from_sessions"] += how == "sessions"
        counts["questions_without_evidence"] += not evidence
        abst = qid.endswith("_abs")
        counts["abstention_questions"] += abst
        date = item.get("question_date")
        try:
            when = None if date in (None, "") else parse_lme_date(date)
        except ValueError as e:
            raise ValueError(f"{where}: question_{e}") from None
        questions.append(Question(qid, qid, str(item["question"]), str(item["answer"]), tuple(evidence),
                                  ABSTENTION if abst else str(item["question_type"]), date=when, abstention=abst))
    name = os.path.splitext(os.path.basename(path))[0] + ("_sessions" if nodes == "sessions" else "")
    return Benchmark(name, out, questions, info={**counts, "nodes_shape": nodes})


def _item_nodes(item: dict, qid: str, shape: str, where: str) -> tuple[list[dict], list[str], str]:
    """One item's nodes, its evidence node ids and where they came from ("turns",
    "sessions" or "none")."""
    sessions, dates, sids = item["haystack_sessions"], item["haystack_dates"], item["haystack_session_ids"]
    if not (len(sessions) == len(dates) == len(sids)):
        raise ValueError(f"{where}: haystack_sessions, haystack_dates and haystack_session_ids must have one "
                         f"entry per session, got {len(sessions)}, {len(dates)} and {len(sids)}")
    answer_sessions = {str(s) for s in item.get("answer_session_ids") or []}
    nodes: list[dict] = []
    marked: list[str] = []
    by_session: list[str] = []
    for j, (turns, date, sid) in enumerate(zip(sessions, dates, sids)):
        if not isinstance(turns, list):
            raise ValueError(f"{where}: session {j} must be a list of turns, got {type(turns).__name__}")
        try:
            t0 = parse_lme_date(date)
        except ValueError as e:
            raise ValueError(f"{where}: session {j}: {e}") from None
        texts = []
        for t, turn in enumerate(turns):
            if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
                raise ValueError(f"{where}: turn {t} of session {j} must have 'role' and 'content', got {turn!r}")
            for key in ("role", "content"):
                if not isinstance(turn[key], str):
                    raise ValueError(f"{where}: turn {t} of session {j}: {key} must be a string, got "
                                     f"{_shown(turn[key])}")
            texts.append(f"{turn['role']}: {turn['content']}")
            if shape == "turns":
                nid = f"{qid}:S{j}:{t}"
                nodes.append({"id": nid, "text": texts[-1], "timestamp": t0 + t, "tenant": qid,
                              "metadata": {"session": str(sid), "role": str(turn["role"])}})
                if turn.get("has_answer"):
                    marked.append(nid)
                if str(sid) in answer_sessions:
                    by_session.append(nid)
        if shape == "sessions":
            nid = f"{qid}:S{j}"
            nodes.append({"id": nid, "text": "\n".join(texts), "timestamp": t0, "tenant": qid,
                          "metadata": {"session": str(sid), "turns": len(texts)}})
            if any(isinstance(x, dict) and x.get("has_answer") for x in turns):
                marked.append(nid)
            if str(sid) in answer_sessions:
                by_session.append(nid)
    if marked:
        return nodes, marked, "turns"
    return nodes, by_session, "sessions" if by_session else "none"
