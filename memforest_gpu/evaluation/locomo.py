"""LoCoMo's JSON -> the benchmark format (EVAL.md, "LoCoMo to memory nodes").

- tenant = ``sample_id``; one node per dialogue turn, id ``"{sample_id}:{dia_id}"``,
  text ``"{speaker}: {text}"`` plus ``" [shares a photo: {blip_caption}]"`` when captioned;
- timestamp = the session's ``session_N_date_time`` plus the turn's index in the session,
  in seconds, so turns keep their order;
- questions of categories 1-4 (5 is adversarial, without an answer); evidence ids cleaned
  (:func:`clean_evidence`), ids matching no turn dropped, the question kept.

``turns_per_node=n > 1`` is the long-memory variant: one node per window of ``n``
consecutive turns of a conversation (the last window may be shorter; windows may span
sessions), id ``"{sample_id}:W{i}"``, text the turns' texts joined by spaces, timestamp
the window's last turn's, ``metadata["turns"]`` its dia_ids; a question's evidence is
the set of windows holding its evidence turns (so evidence recall still works).
"""
from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone

from .dataset import Benchmark, Question

__all__ = ["load_locomo", "clean_evidence", "parse_locomo_date", "CATEGORIES"]

CATEGORIES = ("1", "2", "3", "4")
_SESSION = re.compile(r"session_(\d+)")
_EVID = re.compile(r"D:?(\d+):(\d+)")


def parse_locomo_date(s: str) -> float:
    """``"1:56 pm on 8 May, 2023"`` -> epoch seconds (UTC)."""
    try:
        dt = datetime.strptime(" ".join(s.split()), "%I:%M %p on %d %B, %Y")
    except ValueError:
        raise ValueError(f"session date must look like '1:56 pm on 8 May, 2023', got {s!r}") from None
    return dt.replace(tzinfo=timezone.utc).timestamp()


def clean_evidence(raw) -> list[str]:
    """LoCoMo evidence strings -> dialogue ids ``D<session>:<turn>``.

    Splits ``"D8:6; D9:17"`` and ``"D9:1 D4:4"``, reads ``"D:11:26"`` as ``"D11:26"`` and
    ``"D30:05"`` as ``"D30:5"``; a fragment that is no dialogue id (``"D"``) is dropped.
    """
    items = [raw] if isinstance(raw, str) else list(raw or [])
    out: list[str] = []
    for item in items:
        for frag in re.split(r"[;,\s]+", str(item)):
            m = _EVID.fullmatch(frag.strip())
            if m:
                d = f"D{int(m.group(1))}:{int(m.group(2))}"
                if d not in out:
                    out.append(d)
    return out


def load_locomo(path: str, *, categories=CATEGORIES, turns_per_node: int = 1) -> Benchmark:
    """Read LoCoMo's JSON (a list of samples) into a :class:`Benchmark`; ``turns_per_node``
    consecutive turns per node (1: one node per turn; see the module docstring)."""
    if isinstance(turns_per_node, bool) or not isinstance(turns_per_node, int) or turns_per_node < 1:
        raise ValueError(f"turns_per_node must be an integer >= 1, got {turns_per_node!r}")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(s, dict) and "conversation" in s for s in data):
        raise ValueError(f"{path}: LoCoMo JSON must be a list of samples with a 'conversation', got something else")
    nodes: list[dict] = []
    questions: list[Question] = []
    dropped = 0
    cats = {str(c) for c in categories}
    for sample in data:
        sid = str(sample["sample_id"])
        conv = sample["conversation"]
        sessions = sorted((int(m.group(1)), k) for k in conv if (m := _SESSION.fullmatch(k)))
        turn_ids: set[str] = set()
        first = len(nodes)
        for n, key in sessions:
            date_key = f"{key}_date_time"
            if date_key not in conv:
                raise ValueError(f"{path}: sample {sid!r} has {key} without {date_key}")
            t0 = parse_locomo_date(conv[date_key])
            for i, turn in enumerate(conv[key]):
                text = f"{turn['speaker']}: {turn['text']}"
                if turn.get("blip_caption"):
                    text += f" [shares a photo: {turn['blip_caption']}]"
                nodes.append({"id": f"{sid}:{turn['dia_id']}", "text": text, "timestamp": t0 + i,
                              "tenant": sid, "metadata": {"session": n, "speaker": turn["speaker"]}})
                turn_ids.add(turn["dia_id"])
        window = {}  # dia_id -> its window's node id (turns_per_node > 1)
        if turns_per_node > 1:
            nodes[first:], window = _windows(nodes[first:], sid, turns_per_node)
        for j, qa in enumerate(sample.get("qa", [])):
            cat = str(qa.get("category"))
            if cat not in cats or "answer" not in qa:
                continue
            raw = qa.get("evidence", [])
            ev = clean_evidence(raw)
            kept = [e for e in ev if e in turn_ids]
            frags = [f for r in ([raw] if isinstance(raw, str) else raw) for f in re.split(r"[;,\s]+", str(r)) if f]
            dropped += len(frags) - len(kept)
            evidence = [window[e] if window else f"{sid}:{e}" for e in kept]
            questions.append(Question(f"{sid}:q{j}", sid, str(qa["question"]), str(qa["answer"]),
                                      tuple(dict.fromkeys(evidence)), cat))
    name = os.path.splitext(os.path.basename(path))[0]
    info = {"evidence_ids_dropped": dropped}
    if turns_per_node > 1:
        name, info["turns_per_node"] = f"{name}_w{turns_per_node}", turns_per_node
    return Benchmark(name, nodes, questions, info=info)


def _windows(turns: list[dict], sid: str, n: int) -> tuple[list[dict], dict[str, str]]:
    """One conversation's turn nodes (in order) -> window nodes of ``n`` consecutive turns,
    and each dia_id's window id."""
    out: list[dict] = []
    where: dict[str, str] = {}
    for i in range(0, len(turns), n):
        group = turns[i:i + n]
        wid = f"{sid}:W{i // n}"
        dia = [t["id"][len(sid) + 1:] for t in group]
        where.update(dict.fromkeys(dia, wid))
        out.append({"id": wid, "text": " ".join(t["text"] for t in group), "timestamp": group[-1]["timestamp"],
                    "tenant": sid, "metadata": {"session": group[-1]["metadata"]["session"], "turns": dia}})
    return out, where
