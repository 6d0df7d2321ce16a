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

Questions: ``options`` = the options without their ``"(a) "`` prefix (the answer prompt
letters them again), ``answer`` = the correct one, ``category`` = ``question_type``. PersonaMem
marks no evidence message, so ``evidence`` is empty: EvR is not defined for it. AnsR is
computed on the correct option's distinctive tokens (those no other option has;
:func:`~.metrics.option_tokens`): whether the retrieved context still holds what tells the
right option from the others.
"""
from __future__ import annotations

import ast
import csv
import json
import os
import re

from .dataset import Benchmark, Question

__all__ = ["load_personamem", "contexts_path_for", "NODE_SHAPES", "DAY0"]

NODE_SHAPES = ("turns",)  # one node per message
DAY0 = 1704067200.0  # 1 January 2024, 00:00 UTC: PersonaMem's messages have no dates
_LETTER = re.compile(r"^\s*\(([a-z])\)\s*", re.IGNORECASE)
_ROLES = ("user", "assistant")


def contexts_path_for(questions_path: str) -> str:
    """``.../questions_32k.csv`` -> ``.../shared_contexts_32k.jsonl`` (the published pairing)."""
    folder, name = os.path.split(questions_path)
    stem = os.path.splitext(name)[0]
    suffix = stem[len("questions"):] if stem.startswith("questions") else ""
    return os.path.join(folder, f"shared_contexts{suffix}.jsonl")


def _read_contexts(path: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            if not isinstance(obj, dict) or len(obj) != 1:
                raise ValueError(f"{path}: line {n} must be one object {{context id: [messages]}}, got "
                                 f"{type(obj).__name__} with {len(obj) if isinstance(obj, dict) else 0} keys")
            (cid, msgs), = obj.items()
            if not isinstance(msgs, list):
                raise ValueError(f"{path}: context {cid!r} must be a list of messages, got {type(msgs).__name__}")
            out[str(cid)] = msgs
    return out


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


def load_personamem(path: str, *, contexts: str | None = None, roles=_ROLES) -> Benchmark:
    """Read a PersonaMem questions CSV and its shared contexts (default: beside it,
    :func:`contexts_path_for`) into a :class:`Benchmark`. See the module docstring."""
    contexts = contexts or contexts_path_for(path)
    if not os.path.exists(contexts):
        raise FileNotFoundError(f"PersonaMem contexts not found: {contexts!r} (give --contexts PATH)")
    ctx = _read_contexts(contexts)
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
        for row_n, row in enumerate(reader, 2):
            where = f"{path}: row {row_n}"
            cid = row["shared_context_id"]
            if cid not in ctx:
                raise ValueError(f"{where}: shared_context_id must be a context of {contexts}, got {cid!r}")
            end = int(row["end_index_in_shared_context"])
            if not 0 <= end <= len(ctx[cid]):
                raise ValueError(f"{where}: end_index_in_shared_context must be in [0, {len(ctx[cid])}], got {end}")
            if cid not in short:
                short[cid] = cid if cid[:12] in short.values() else cid[:12]
            tenant = f"{short[cid]}@{end}"
            if tenant not in tenants:
                tenants.add(tenant)
                nodes += _tenant_nodes(ctx[cid][:end], tenant, roles)
            opts = _options(row["all_options"], where)
            gold = opts[_gold(row["correct_answer"], len(opts), where)]
            questions.append(Question(str(row["question_id"]), tenant, str(row[qcol]), gold, (),
                                      str(row["question_type"]), options=tuple(opts)))
    held = {n["tenant"] for n in nodes}
    kept = [q for q in questions if q.tenant in held]  # a question before any message has nothing to retrieve
    name = os.path.splitext(os.path.basename(path))[0]
    return Benchmark(name, nodes, kept, info={"contexts": len(short),
                                              "questions_without_messages": len(questions) - len(kept),
                                                   "nodes_shape": "turns", "roles": list(roles)})


def _tenant_nodes(messages: list[dict], tenant: str, roles: tuple[str, ...]) -> list[dict]:
    out = []
    for i, msg in enumerate(messages):
        role = str(msg.get("role", ""))
        content = msg.get("content")
        if role not in roles or not isinstance(content, str) or not content.strip():
            continue
        out.append({"id": f"{tenant}:{i}", "text": f"{role}: {content}", "timestamp": DAY0 + i, "tenant": tenant,
                    "metadata": {"role": role, "index": i}})
    return out
