"""PersonaMem as published (``questions_32k.csv`` with ``shared_contexts_32k.jsonl``; 128k and
1M alike) -> the benchmark format.

What is read:

- the contexts file: one JSON object per line, ``{shared_context_id: [message, ...]}``, a
  message ``{"role": "system" | "user" | "assistant", "content": "..."}``;
- the questions file, columns ``question_id``, ``question_type``, ``question`` (the GitHub
  release's name) or ``user_question_or_message`` (the Hugging Face release's),
  ``correct_answer`` (``"(c)"``), ``all_options`` (a Python list literal of the options, each
  starting ``"(a) "`` ...), ``shared_context_id`` and ``end_index_in_shared_context``; the other
  columns (topic, distances, lengths, persona_id, ...) are not needed and not read.

A question sees the messages of its context before ``end_index_in_shared_context``
(``messages[:end]``, as PersonaMem's own inference code slices it): later messages may change
the preference asked about. So one tenant per (context, end index), ``"{context id[:12]}@{end}"``,
holding one node per message before the end: id ``"{tenant}:{i}"``, text ``"{role}: {content}"``,
timestamp a fixed day plus ``i`` seconds (PersonaMem's messages carry no dates, so every
node shows the same date), metadata ``role`` and ``index``. Questions sharing a context and an
end index share a tenant; the same message in two tenants is two nodes (its vector is computed
once, the embedding cache is by text). A question with no message before its end is dropped
(counted in ``Benchmark.info["questions_without_messages"]``). ``system`` messages (the
generator's persona profile and block headers, not the conversation) are left out unless
``roles`` names them.

A message must be an object whose ``role`` is ``system``, ``user`` or ``assistant`` and whose
``content`` is a string: anything else refuses the load naming the contexts file, its line,
the context and the message (a message dropped without a word may be the very one a question
asks about). An empty ``content`` makes no node.

Questions: ``options`` = the options without their ``"(a) "`` prefix (the answer prompt
letters them again), ``answer`` = the correct one, ``category`` = the question type under one
name for both releases (:data:`QUESTION_TYPES`: the GitHub release's
``recalling_facts_mentioned_by_the_user`` and the Hugging Face release's
``recall_user_shared_facts`` are both ``recall_user_shared_facts``; a name outside the table
is kept as it is and listed in ``Benchmark.info["question_types_unknown"]``). PersonaMem
marks no evidence message, so ``evidence`` is empty: EvR is not defined for it. AnsR is
computed on the correct option's distinctive tokens (those no other option has;
:func:`~.metrics.option_tokens`): whether the retrieved context still holds what tells the
right option from the others.

A question whose ``shared_context_id`` is not in the contexts file refuses the load (naming the
row), unless ``skip_missing_contexts``: such questions are then left out and counted
(``Benchmark.info["questions_skipped_missing_context"]`` and ``"contexts_missing"``).
"""
from __future__ import annotations

import ast
import csv
import json
import os
import re

from ..runs.errors import OptionError, OptionNotFoundError
from .dataset import Benchmark, Question

__all__ = ["load_personamem", "contexts_path_for", "NODE_SHAPES", "DAY0", "QUESTION_TYPES", "question_type"]

NODE_SHAPES = ("turns",)  # one node per message
DAY0 = 1704067200.0  # 1 January 2024, 00:00 UTC: PersonaMem's messages have no dates
_LETTER = re.compile(r"^\s*\(([a-z])\)\s*", re.IGNORECASE)
_ROLES = ("user", "assistant")
_ALL_ROLES = ("system", "user", "assistant")

#: every published question type name -> the one name it is reported under (the paper's skill, as the
#: Hugging Face release spells it); the GitHub release's names first, then the Hugging Face release's
QUESTION_TYPES = {
    "recalling_facts_mentioned_by_the_user": "recall_user_shared_facts",
    "identifying_new_things_not_mentioned_by_the_user": "suggest_new_ideas",
    "recalling_the_latest_user_preferences": "acknowledge_latest_user_preferences",
    "tracking_the_full_sequence_of_preference_updates": "track_full_preference_evolution",
    "recalling_the_reasons_behind_previous_updates": "revisit_reasons_behind_preference_updates",
    "recommendation_aligned_with_users_latest_preferences": "provide_preference_aligned_recommendations",
    "generalizing_past_reasons_in_memory_to_new_scenarios": "generalize_to_new_scenarios",
    "recall_user_shared_facts": "recall_user_shared_facts",
    "suggest_new_ideas": "suggest_new_ideas",
    "acknowledge_latest_user_preferences": "acknowledge_latest_user_preferences",
    "acknowledge_latest_preferences": "acknowledge_latest_user_preferences",
    "track_full_preference_evolution": "track_full_preference_evolution",
    "revisit_reasons_behind_preference_updates": "revisit_reasons_behind_preference_updates",
    "provide_preference_aligned_recommendations": "provide_preference_aligned_recommendations",
    "generalize_to_new_scenarios": "generalize_to_new_scenarios",
    "generalizing_to_new_scenarios": "generalize_to_new_scenarios",
}


def question_type(name: str) -> str:
    """A published question type's one name (:data:`QUESTION_TYPES`); an unknown name as it is."""
    key = str(name).strip()
    return QUESTION_TYPES.get(key, key)


def contexts_path_for(questions_path: str) -> str:
    """``.../questions_32k.csv`` -> ``.../shared_contexts_32k.jsonl`` (the published pairing)."""
    folder, name = os.path.split(questions_path)
    stem = os.path.splitext(name)[0]
    suffix = stem[len("questions"):] if stem.startswith("questions") else ""
    return os.path.join(folder, f"shared_contexts{suffix}.jsonl")


def _read_contexts(path: str) -> tuple[dict[str, list], dict[str, int]]:
    """The contexts file: {context id: messages} and {context id: its line}."""
    out: dict[str, list] = {}
    lines: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}, line {n} must be one JSON object {{context id: [messages]}}, got bad "
                                     f"JSON ({e.msg}, column {e.colno})") from None
                except RecursionError:
                    raise ValueError(f"{path}, line {n} must be one JSON object {{context id: [messages]}}, got "
                                     "nesting too deep to read") from None
                if not isinstance(obj, dict) or len(obj) != 1:
                    raise ValueError(f"{path}, line {n} must be one object {{context id: [messages]}}, got "
                                     f"{type(obj).__name__} with {len(obj) if isinstance(obj, dict) else 0} keys")
                (cid, msgs), = obj.items()
                if not isinstance(msgs, list):
                    raise ValueError(f"{path}, line {n}: context {cid!r} must be a list of messages, got "
                                     f"{type(msgs).__name__}")
                out[str(cid)] = msgs
                lines[str(cid)] = n
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} must be UTF-8 text, got a byte that is not ({e.reason})") from None
    return out, lines


def _options(raw: str, where: str) -> list[str]:
    try:
        opts = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        raise ValueError(f"{where}: all_options must be a list literal of strings, got {raw[:80]!r}") from None
    if not isinstance(opts, (list, tuple)) or not opts or not all(isinstance(o, str) for o in opts):
        raise ValueError(f"{where}: all_options must be a non-empty list of strings, got {raw[:80]!r}")
    return [_LETTER.sub("", o, count=1).strip() for o in opts]


def _gold(raw: str, n: int, where: str) -> int:
    m = re.fullmatch(r"\s*\(?([a-z])\)?\s*", str(raw), re.IGNORECASE)
    if m is None or ord(m.group(1).lower()) - 97 >= n:
        raise ValueError(f"{where}: correct_answer must be a letter among the {n} options such as '(c)', got {raw!r}")
    return ord(m.group(1).lower()) - 97


def load_personamem(path: str, *, contexts: str | None = None, roles=_ROLES,
                    skip_missing_contexts: bool = False) -> Benchmark:
    """Read a PersonaMem questions CSV and its shared contexts (default: beside it,
    :func:`contexts_path_for`) into a :class:`Benchmark`. See the module docstring."""
    contexts = contexts or contexts_path_for(path)
    if not os.path.exists(contexts):
        raise OptionNotFoundError(f"PersonaMem contexts not found: {contexts!r} (give {{contexts=PATH}})")
    ctx, ctx_line = _read_contexts(contexts)
    skipped: list[str] = []
    unknown_types: set[str] = set()
    roles = tuple(roles)
    nodes: list[dict] = []
    questions: list[Question] = []
    tenants: set[str] = set()
    short: dict[str, str] = {}  # context id -> its first 12 characters (the whole id if two share them)
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        qcol = "user_question_or_message" if "user_question_or_message" in (reader.fieldnames or []) else "question"
        for col in ("question_id", "question_type", qcol, "correct_answer", "all_options", "shared_context_id",
                    "end_index_in_shared_context"):
            if col not in (reader.fieldnames or []):
                raise ValueError(f"{path}: PersonaMem questions must have column {col!r}, got {reader.fieldnames}")
        rows = list(enumerate(reader, 2))
        missing = [row["shared_context_id"] for _, row in rows if row["shared_context_id"] not in ctx]
        if missing and not skip_missing_contexts:
            row_n = next(n for n, row in rows if row["shared_context_id"] not in ctx)
            raise OptionError(f"{path}: row {row_n}: shared_context_id must be a context of {contexts}, got "
                              f"{missing[0]!r} ({len(missing)} of {len(rows)} questions name one of "
                              f"{len(set(missing))} contexts the file lacks; {{skip_missing_contexts}} evaluates "
                              "the others and counts these as skipped)")
        for row_n, row in rows:
            where = f"{path}: row {row_n}"
            cid = row["shared_context_id"]
            if cid not in ctx:
                skipped.append(cid)
                continue
            try:
                end = int(row["end_index_in_shared_context"])
            except (TypeError, ValueError):
                raise ValueError(f"{where}: end_index_in_shared_context must be an integer, got "
                                 f"{row['end_index_in_shared_context']!r}") from None
            if not 0 <= end <= len(ctx[cid]):
                raise ValueError(f"{where}: end_index_in_shared_context must be in [0, {len(ctx[cid])}], got {end}")
            if cid not in short:
                short[cid] = cid if cid[:12] in short.values() else cid[:12]
            tenant = f"{short[cid]}@{end}"
            if tenant not in tenants:
                tenants.add(tenant)
                nodes += _tenant_nodes(ctx[cid][:end], tenant, roles,
                                       f"{contexts}, line {ctx_line[cid]}: context {short[cid]!r}")
            opts = _options(row["all_options"], where)
            gold = opts[_gold(row["correct_answer"], len(opts), where)]
            qtype = question_type(row["question_type"])
            if qtype not in QUESTION_TYPES.values():
                unknown_types.add(qtype)
            questions.append(Question(str(row["question_id"]), tenant, str(row[qcol]), gold, (), qtype,
                                      options=tuple(opts)))
    held = {n["tenant"] for n in nodes}
    kept = [q for q in questions if q.tenant in held]  # a question before any message has nothing to retrieve
    name = os.path.splitext(os.path.basename(path))[0]
    info = {"contexts": len(short), "questions_without_messages": len(questions) - len(kept),
            "nodes_shape": "turns", "roles": list(roles)}
    if skip_missing_contexts:
        info.update(questions_skipped_missing_context=len(skipped), contexts_missing=len(set(skipped)))
    if unknown_types:
        info["question_types_unknown"] = sorted(unknown_types)
    return Benchmark(name, nodes, kept, info=info)


def _tenant_nodes(messages: list, tenant: str, roles: tuple[str, ...], where: str) -> list[dict]:
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"{where}: message {i} must be an object {{role, content}}, got {_shown(msg)}")
        role, content = msg.get("role"), msg.get("content")
        if role not in _ALL_ROLES:
            raise ValueError(f"{where}: message {i}: role must be one of {list(_ALL_ROLES)}, got "
                             f"{'none' if 'role' not in msg else _shown(role)}")
        if not isinstance(content, str):
            raise ValueError(f"{where}: message {i}: content must be a string, got "
                             f"{'none' if 'content' not in msg else _shown(content)}")
        if role not in roles or not content.strip():
            continue
        out.append({"id": f"{tenant}:{i}", "text": f"{role}: {content}", "timestamp": DAY0 + i, "tenant": tenant,
                    "metadata": {"role": role, "index": i}})
    return out


def _shown(value) -> str:
    kind = {str: "a string", list: "a list", dict: "an object", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)
    r = repr(value)
    return f"{kind} {r if len(r) <= 60 else r[:57] + '...'}"
