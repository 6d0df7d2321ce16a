"""A validation pass over a LoCoMo JSON file before it is converted (:mod:`.locomo`): every
field the conversion reads is checked first, so a bad file fails with one line naming the
file, the sample and the field (``data.json: sample 2 ('conv-3'): conversation.session_1[4].text
must be a string, got 7``), never with a traceback halfway through.
"""
from __future__ import annotations

import re
from datetime import UTC, datetime

from ..jsonfile import read_json

__all__ = ["read_locomo_json", "check_locomo", "parse_locomo_date"]

_SESSION = re.compile(r"session_(\d+)")
_OBSERVATION = re.compile(r"session_(\d+)_observation")


def read_locomo_json(path: str):
    """The parsed JSON of ``path``; a file that is not JSON (or not UTF-8) names the file and
    where it breaks."""
    return read_json(path, "LoCoMo JSON")


def _show(value, n: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= n else r[:n - 3] + "..."


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


class _Sample:
    """The messages of one sample: ``fail(field, rule, value)`` raises naming file and sample."""

    def __init__(self, path: str, index: int, sid):
        self.where = f"{path}: sample {index}" + (f" ({sid!r})" if sid is not None else "")

    def fail(self, field: str, rule: str, value) -> None:
        raise ValueError(f"{self.where}: {field} must be {rule}, got {_kind(value)} {_show(value)}"
                         if value is not None else f"{self.where}: {field} must be {rule}, got null")

    def missing(self, field: str, rule: str, keys) -> None:
        raise ValueError(f"{self.where}: {field} must be {rule}, got none (the object's keys: "
                         f"{_show(sorted(map(str, keys)), 120)})")


def check_locomo(data, path: str, *, nodes: str = "turns", categories=("1", "2", "3", "4")) -> list:
    """``data`` as a list of samples, after checking every field the conversion to ``nodes``
    reads (see the module docstring); raises ``ValueError`` at the first bad one."""
    samples = [data] if isinstance(data, dict) else data
    if not isinstance(samples, list) or not samples:
        raise ValueError(f"{path} must hold a LoCoMo sample (an object) or a non-empty list of them, got "
                         f"{_kind(data)} {_show(data)}")
    seen: dict = {}
    cats = {str(c) for c in categories}
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            _Sample(path, i, None).fail("a sample", "an object with 'sample_id' and 'conversation'", sample)
        sid = sample.get("sample_id")
        s = _Sample(path, i, sid)
        if "sample_id" not in sample:
            s.missing("sample_id", "a string or an integer", sample)
        if isinstance(sid, bool) or not isinstance(sid, (str, int)) or str(sid) == "":
            s.fail("sample_id", "a non-empty string or an integer", sid)
        if str(sid) in seen:
            s.fail("sample_id", f"unique (sample {seen[str(sid)]} has it too)", sid)
        seen[str(sid)] = i
        _check_conversation(s, sample)
        if nodes == "facts":
            _check_observation(s, sample)
        _check_qa(s, sample, cats)
    return samples


def _check_conversation(s: _Sample, sample: dict) -> None:
    if "conversation" not in sample:
        s.missing("conversation", "an object of sessions", sample)
    conv = sample["conversation"]
    if not isinstance(conv, dict):
        s.fail("conversation", "an object of sessions (session_1, session_1_date_time, ...)", conv)
    dia: set = set()
    for key in sorted((k for k in conv if _SESSION.fullmatch(k)), key=lambda k: int(k[8:])):
        turns = conv[key]
        if not isinstance(turns, list):
            s.fail(f"conversation.{key}", "a list of turns", turns)
        if f"{key}_date_time" not in conv:
            s.missing(f"conversation.{key}_date_time", "a date like '1:56 pm on 8 May, 2023'", conv)
        date = conv[f"{key}_date_time"]
        if not isinstance(date, str) or not _date_ok(date):
            s.fail(f"conversation.{key}_date_time", "a date like '1:56 pm on 8 May, 2023'", date)
        for j, turn in enumerate(turns):
            field = f"conversation.{key}[{j}]"
            if not isinstance(turn, dict):
                s.fail(field, "a turn (an object with speaker, text, dia_id)", turn)
            for name in ("speaker", "text", "dia_id"):
                if name not in turn:
                    s.missing(f"{field}.{name}", "a string", turn)
                if not isinstance(turn[name], str) or (name != "text" and not turn[name]):
                    s.fail(f"{field}.{name}", "a string" if name == "text" else "a non-empty string", turn[name])
            cap = turn.get("blip_caption")
            if cap is not None and not isinstance(cap, str):
                s.fail(f"{field}.blip_caption", "a string or absent", cap)
            if turn["dia_id"] in dia:
                s.fail(f"{field}.dia_id", "unique in its sample", turn["dia_id"])
            dia.add(turn["dia_id"])


def parse_locomo_date(s: str) -> float:
    """``"1:56 pm on 8 May, 2023"`` -> epoch seconds (UTC)."""
    try:
        dt = datetime.strptime(" ".join(s.split()), "%I:%M %p on %d %B, %Y")
    except ValueError:
        raise ValueError(f"session date must look like '1:56 pm on 8 May, 2023', got {s!r}") from None
    return dt.replace(tzinfo=UTC).timestamp()


def _date_ok(text: str) -> bool:
    try:
        parse_locomo_date(text)
    except ValueError:
        return False
    return True


def _evidence_ok(ev, *, null: bool = True) -> bool:
    """A dialogue id string or a list of them (items are read as text, so numbers pass)."""
    return (null and ev is None) or isinstance(ev, str) or (isinstance(ev, list) and all(
        isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in ev))


def _check_observation(s: _Sample, sample: dict) -> None:
    obs = sample.get("observation")
    if obs is None:
        return
    if not isinstance(obs, dict):
        s.fail("observation", "an object (session_N_observation -> speaker -> [[fact, evidence], ...])", obs)
    for key, by_speaker in obs.items():
        if not _OBSERVATION.fullmatch(key) or by_speaker is None:
            continue
        if not isinstance(by_speaker, dict):
            s.fail(f"observation.{key}", "an object (speaker -> [[fact, evidence], ...])", by_speaker)
        for speaker, pairs in by_speaker.items():
            field = f"observation.{key}.{speaker}"
            if not isinstance(pairs, list):
                s.fail(field, "a list of [fact, evidence] pairs", pairs)
            for j, pair in enumerate(pairs):
                if not isinstance(pair, list) or len(pair) != 2:
                    s.fail(f"{field}[{j}]", "a [fact, evidence] pair", pair)
                if not isinstance(pair[0], str) or not pair[0].strip():
                    s.fail(f"{field}[{j}][0]", "a non-empty string (the fact)", pair[0])
                if not _evidence_ok(pair[1]):
                    s.fail(f"{field}[{j}][1]", "a dialogue id string or a list of them", pair[1])


def _check_qa(s: _Sample, sample: dict, cats: set) -> None:
    qa = sample.get("qa", [])
    if not isinstance(qa, list):
        s.fail("qa", "a list of questions", qa)
    for j, q in enumerate(qa):
        if not isinstance(q, dict):
            s.fail(f"qa[{j}]", "an object (question, answer, evidence, category)", q)
        if str(q.get("category")) not in cats or "answer" not in q:
            continue  # not asked (another category, or no answer): not read
        if "question" not in q:
            s.missing(f"qa[{j}].question", "a string", q)
        if not isinstance(q["question"], (str, int, float)) or isinstance(q["question"], bool):
            s.fail(f"qa[{j}].question", "a string", q["question"])
        if "evidence" in q and not _evidence_ok(q["evidence"], null=False):
            s.fail(f"qa[{j}].evidence", "a dialogue id string or a list of them", q["evidence"])
