"""LoCoMo's JSON -> the benchmark format (docs/evaluation.md, "The protocol in brief").

Three node shapes (``nodes=``), the same questions:

- ``"turns"`` (default): one node per dialogue turn, id ``"{sample_id}:{dia_id}"``, text
  ``"{speaker}: {text}"`` plus ``" [shares a photo: {blip_caption}]"`` when captioned;
  timestamp = the session's ``session_N_date_time`` plus the turn's index in the session,
  in seconds, so turns keep their order.
- ``"facts"`` (the shape of a Mem0 store): one node per fact of LoCoMo's ``observation``
  (``session_N_observation`` -> speaker -> ``[fact, evidence turns]``), id
  ``"{sample_id}:s{N}:{i}"``, text = the fact as written, metadata ``speaker``, ``session``
  and ``turns`` (the cleaned turn ids it cites); timestamp = the session's date plus ``i``
  seconds, ``i`` = the fact's index in its session. The order inside a session is the order
  of the turns the facts come from (each fact's first cited turn; ties and facts citing no
  turn keep the observation's order: speakers as listed, then facts as listed), so facts keep
  the conversation's time order and the two speakers' facts interleave as their turns did.
- ``turns_per_node=n > 1`` (turns only) is the long-memory variant: one node per window of
  ``n`` consecutive turns of a conversation (the last window may be shorter; windows may span
  sessions), id ``"{sample_id}:W{i}"``, text the turns' texts joined by spaces, timestamp the
  window's last turn's, ``metadata["turns"]`` its dia_ids.

Questions: categories 1-4 (5 is adversarial, without an answer); evidence ids cleaned
(:func:`clean_evidence`), ids matching no turn dropped, the question kept. A question's
evidence is then the nodes that hold one of its evidence turns: the turn itself, its window,
or every fact citing it. A question none of whose turns any node holds (facts: no fact cites
them) is kept: it counts for AnsR and AnsR-content, not for EvR (its evidence is empty).
``Benchmark.info`` counts them (``questions_without_evidence``, which includes the questions
whose evidence ids all matched no turn) and, for facts, the questions with evidence turns
none of which a fact cites (``questions_evidence_uncited``) and the evidence turns no fact
cites (``evidence_turns_uncited``; a question citing several turns may lose some of them).
"""
from __future__ import annotations

import os
import re

from ..config import ConfigError
from .dataset import Benchmark, Question
from .locomo_checks import check_locomo, parse_locomo_date, read_locomo_json

__all__ = ["load_locomo", "clean_evidence", "parse_locomo_date", "CATEGORIES", "NODE_SHAPES"]

CATEGORIES = ("1", "2", "3", "4")
NODE_SHAPES = ("turns", "facts")
_SESSION = re.compile(r"session_(\d+)")
_EVID = re.compile(r"D:?(\d+):(\d+)")


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


def load_locomo(path: str, *, categories=CATEGORIES, turns_per_node: int = 1, nodes: str = "turns") -> Benchmark:
    """Read LoCoMo's JSON (a list of samples) into a :class:`Benchmark` of the node shape
    ``nodes`` (:data:`NODE_SHAPES`); ``turns_per_node`` consecutive turns per node (turns
    only; 1: one node per turn). See the module docstring."""
    if nodes not in NODE_SHAPES:
        raise ConfigError("nodes", f"must be one of {list(NODE_SHAPES)}, got {nodes!r}")
    if isinstance(turns_per_node, bool) or not isinstance(turns_per_node, int) or turns_per_node < 1:
        raise ConfigError("turns_per_node", f"must be an integer >= 1, got {turns_per_node!r}")
    if nodes == "facts" and turns_per_node != 1:
        raise ConfigError("turns_per_node", f"must be 1 with nodes='facts', got {turns_per_node!r}")
    data = check_locomo(read_locomo_json(path), path, nodes=nodes, categories=categories)  # before any work
    out: list[dict] = []
    questions: list[Question] = []
    dropped = no_evidence = uncited = uncited_q = 0
    cats = {str(c) for c in categories}
    for sample in data:
        sid = str(sample["sample_id"])
        turns = _turn_nodes(sample, sid, path)
        turn_ids = {t["id"][len(sid) + 1:] for t in turns}
        if nodes == "facts":
            made, holders = _fact_nodes(sample, sid, path)
        elif turns_per_node > 1:
            made, holders = _windows(turns, sid, turns_per_node)
        else:
            made, holders = turns, {d: [f"{sid}:{d}"] for d in turn_ids}
        out += made
        for j, qa in enumerate(sample.get("qa", [])):
            cat = str(qa.get("category"))
            if cat not in cats or "answer" not in qa:
                continue
            raw = qa.get("evidence", [])
            kept = [e for e in clean_evidence(raw) if e in turn_ids]
            frags = [f for r in ([raw] if isinstance(raw, str) else raw) for f in re.split(r"[;,\s]+", str(r)) if f]
            dropped += len(frags) - len(kept)
            uncited += sum(e not in holders for e in kept)
            evidence = tuple(dict.fromkeys(n for e in kept for n in holders.get(e, ())))
            no_evidence += not evidence
            uncited_q += bool(kept) and not evidence
            questions.append(Question(f"{sid}:q{j}", sid, str(qa["question"]), str(qa["answer"]), evidence, cat))
    name = os.path.splitext(os.path.basename(path))[0]
    info = {"evidence_ids_dropped": dropped, "questions_without_evidence": no_evidence}
    if turns_per_node > 1:
        name, info["turns_per_node"] = f"{name}_w{turns_per_node}", turns_per_node
    if nodes == "facts":
        name, info["nodes_shape"] = f"{name}_facts", "facts"
        info["questions_evidence_uncited"], info["evidence_turns_uncited"] = uncited_q, uncited
    return Benchmark(name, out, questions, info=info)


def _sessions(conv: dict, sid: str, path: str) -> list[tuple[int, str, float]]:
    """(N, "session_N", its date in epoch seconds) in session-number order."""
    out = []
    for n, key in sorted((int(m.group(1)), k) for k in conv if (m := _SESSION.fullmatch(k))):
        if f"{key}_date_time" not in conv:
            raise ValueError(f"{path}: sample {sid!r} has {key} without {key}_date_time")
        out.append((n, key, parse_locomo_date(conv[f"{key}_date_time"])))
    return out


def _turn_nodes(sample: dict, sid: str, path: str) -> list[dict]:
    """One conversation's turn nodes, in order."""
    out = []
    for n, key, t0 in _sessions(sample["conversation"], sid, path):
        for i, turn in enumerate(sample["conversation"][key]):
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares a photo: {turn['blip_caption']}]"
            out.append({"id": f"{sid}:{turn['dia_id']}", "text": text, "timestamp": t0 + i, "tenant": sid,
                        "metadata": {"session": n, "speaker": turn["speaker"]}})
    return out


def _fact_nodes(sample: dict, sid: str, path: str) -> tuple[list[dict], dict[str, list[str]]]:
    """One conversation's fact nodes (see the module doc) and, per dia_id, the facts citing it."""
    conv, obs = sample["conversation"], sample.get("observation") or {}
    position = {t["dia_id"]: i for _, key, _ in _sessions(conv, sid, path) for i, t in enumerate(conv[key])}
    out: list[dict] = []
    holders: dict[str, list[str]] = {}
    for n, key, t0 in _sessions(conv, sid, path):
        facts = [(fact, speaker, clean_evidence(ev)) for speaker, pairs in (obs.get(f"{key}_observation") or {}).items()
                 for fact, ev in pairs]
        order = sorted(range(len(facts)), key=_turn_order([[position[d] for d in f[2] if d in position]
                                                           for f in facts]))
        for i, j in enumerate(order):
            fact, speaker, turns = facts[j]
            fid = f"{sid}:s{n}:{i}"
            out.append({"id": fid, "text": str(fact), "timestamp": t0 + i, "tenant": sid,
                        "metadata": {"session": n, "speaker": speaker, "turns": turns}})
            for d in turns:
                holders.setdefault(d, []).append(fid)
    return out, holders


def _turn_order(cited: list[list[int]]):
    """Sort key of facts by their first cited turn's position; a fact citing no turn stays
    right after the fact listed before it; ties keep the listed order."""
    keys, last = [], -1
    for c in cited:
        last = min(c) if c else last
        keys.append(last)
    return lambda j: (keys[j], j)


def _windows(turns: list[dict], sid: str, n: int) -> tuple[list[dict], dict[str, list[str]]]:
    """One conversation's turn nodes (in order) -> window nodes of ``n`` consecutive turns,
    and each dia_id's window id."""
    out: list[dict] = []
    where: dict[str, list[str]] = {}
    for i in range(0, len(turns), n):
        group = turns[i:i + n]
        wid = f"{sid}:W{i // n}"
        dia = [t["id"][len(sid) + 1:] for t in group]
        where.update({d: [wid] for d in dia})
        out.append({"id": wid, "text": " ".join(t["text"] for t in group), "timestamp": group[-1]["timestamp"],
                    "tenant": sid, "metadata": {"session": group[-1]["metadata"]["session"], "turns": dia}})
    return out, where
