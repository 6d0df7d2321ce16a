"""The benchmark format ``memforest eval`` reads (docs/evaluation.md, "The protocol in brief").

Two files, so any benchmark can be converted to it:

- nodes (JSONL or Parquet): ``id``, ``text``, ``timestamp``, ``tenant``, optional ``embedding``;
- questions (JSONL): ``id``, ``tenant``, ``question``, ``answer``, ``evidence`` (node ids),
  ``category``; optional ``date`` (epoch seconds, when it is asked), ``options`` (a
  multiple-choice question's choices, ``answer`` among them) and ``abstention`` (true: the
  right answer is that the memories do not tell).

A benchmark path is a folder holding ``nodes.jsonl`` (or ``nodes.parquet``) and
``questions.jsonl``, or a published file converted on the fly: LoCoMo's JSON (:mod:`.locomo`),
LongMemEval's JSON (:mod:`.longmemeval`), PersonaMem's questions CSV with its contexts JSONL
(:mod:`.personamem`); each is read into a :class:`~.dataset.Benchmark`.
"""
from __future__ import annotations

import json
import os

from ..config import ConfigError
from ..runs.errors import OptionError
from ..store.atomic import atomic_open
from ..store.column_checks import DEFAULT_TENANT
from ..store.io import read_store
from ..store.jsonl import iter_jsonl_objects
from .dataset import Benchmark, Question
from .locomo import load_locomo
from .longmemeval import is_longmemeval, load_longmemeval
from .personamem import NODE_SHAPES as PERSONAMEM_SHAPES
from .personamem import load_personamem

__all__ = ["load_benchmark", "write_benchmark", "read_questions", "NODE_SHAPES"]

NODE_FILES = ("nodes.jsonl", "nodes.parquet", "nodes.json")
NODE_SHAPES = ("turns", "facts", "sessions")  # every published file's node shapes (each loader takes some)
QUESTION_FILE = "questions.jsonl"


def _question(rec: dict, j: int, where: str) -> Question:
    for key in ("id", "tenant", "question", "answer", "evidence", "category"):
        if key not in rec:
            raise ValueError(f"{where}: question {j} is missing required field {key!r}")
    ev = rec["evidence"]
    if isinstance(ev, str) or not isinstance(ev, (list, tuple)):
        raise ValueError(f"{where}: evidence of question {rec['id']!r} must be a list of node ids, got {ev!r}")
    opts = rec.get("options") or ()
    if isinstance(opts, str) or not isinstance(opts, (list, tuple)):
        raise ValueError(f"{where}: options of question {rec['id']!r} must be a list of strings, got {opts!r}")
    date = rec.get("date")
    return Question(str(rec["id"]), str(rec["tenant"]), str(rec["question"]), str(rec["answer"]),
                    tuple(str(e) for e in ev), str(rec["category"]), date=None if date is None else float(date),
                    options=tuple(str(o) for o in opts), abstention=bool(rec.get("abstention", False)))


def read_questions(path: str) -> list[Question]:
    """Questions from a JSONL file (one JSON object per line; blank lines skipped)."""
    out = [_question(rec, n, path) for n, (_, rec) in enumerate(iter_jsonl_objects(path), 1)]
    ids = [q.id for q in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: question ids must be unique")
    return out


def load_benchmark(path: str, *, nodes: str | None = None, turns_per_node: int = 1,
                   contexts: str | None = None, skip_missing_contexts: bool = False) -> Benchmark:
    """A benchmark folder (nodes + questions files) or a published file, read as it is:
    LoCoMo's or LongMemEval's ``.json`` (told apart by their keys), PersonaMem's questions
    ``.csv`` (with its ``contexts`` file, default the published name beside it). ``nodes``
    chooses the node shape where the file allows several (LoCoMo: turns | facts; LongMemEval:
    turns | sessions; PersonaMem: turns, one node per message; default turns);
    ``turns_per_node``: LoCoMo turns only; ``skip_missing_contexts``: PersonaMem only, leave out
    (and count) the questions whose context the contexts file lacks."""
    path = os.fspath(path)
    if skip_missing_contexts and not (os.path.isfile(path) and path.endswith(".csv")):
        raise OptionError(f"{{skip_missing_contexts}} is for PersonaMem's questions .csv, got {path!r}")
    if os.path.isfile(path):
        return _load_file(path, nodes, turns_per_node, contexts, skip_missing_contexts)
    if nodes not in (None, "turns") or turns_per_node != 1 or contexts is not None:
        raise OptionError(f"{{nodes}}, {{turns_per_node}} and {{contexts}} need a published benchmark file (LoCoMo or "
                         f"LongMemEval .json, PersonaMem .csv), got {path!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"benchmark not found: {path!r}")
    nodes_path = next((os.path.join(path, f) for f in NODE_FILES if os.path.exists(os.path.join(path, f))), None)
    q_path = os.path.join(path, QUESTION_FILE)
    if nodes_path is None or not os.path.exists(q_path):
        raise ValueError(f"benchmark folder must hold one of {list(NODE_FILES)} and {QUESTION_FILE}: {path!r}")
    fmt = "jsonl" if nodes_path.endswith((".jsonl", ".json")) else "parquet"
    if fmt == "jsonl":
        with open(nodes_path, encoding="utf-8") as f:
            nodes = [json.loads(line) for line in f if line.strip()]
    else:
        st = read_store(nodes_path, embedder=_NoEmbed())
        nodes = st.records(with_embedding=True)
    questions = read_questions(q_path)
    _check(nodes, questions, path)
    return Benchmark(os.path.basename(os.path.normpath(path)), nodes, questions)


def _load_file(path: str, nodes: str | None, turns_per_node: int, contexts: str | None,
               skip_missing_contexts: bool = False) -> Benchmark:
    """A published file, by its suffix and (for .json) its keys."""
    if path.endswith(".json"):
        if contexts is not None:
            raise OptionError(f"{{contexts}} is for PersonaMem's questions .csv, got a .json benchmark {path!r}")
        if is_longmemeval(path):
            if turns_per_node != 1:
                raise OptionError(f"{{turns_per_node}} is for LoCoMo turns, got LongMemEval file {path!r}")
            return load_longmemeval(path, nodes=nodes or "turns")
        return load_locomo(path, turns_per_node=turns_per_node, nodes=nodes or "turns")
    if path.endswith(".csv"):
        if turns_per_node != 1:
            raise OptionError(f"{{turns_per_node}} is for LoCoMo turns, got PersonaMem file {path!r}")
        if nodes not in (None, *PERSONAMEM_SHAPES):
            raise ConfigError("nodes", f"must be one of {list(PERSONAMEM_SHAPES)} for PersonaMem, got {nodes!r}")
        return load_personamem(path, contexts=contexts, skip_missing_contexts=skip_missing_contexts)
    raise ConfigError("benchmark", f"must be a folder with nodes + {QUESTION_FILE}, a LoCoMo or LongMemEval .json file "
                     f"or a PersonaMem questions .csv, got {path!r}")


def _check(nodes: list[dict], questions: list[Question], where: str) -> None:
    tenant_of = {str(n["id"]): str(n.get("tenant", DEFAULT_TENANT)) for n in nodes}
    for q in questions:
        for e in q.evidence:
            if e in tenant_of and tenant_of[e] != q.tenant:
                raise ValueError(f"{where}: evidence {e!r} of question {q.id!r} belongs to tenant "
                                 f"{tenant_of[e]!r}, not the question's tenant {q.tenant!r}")


def write_benchmark(bench: Benchmark, folder: str) -> None:
    """Write ``nodes.jsonl`` and ``questions.jsonl`` into ``folder`` (atomically, each)."""
    os.makedirs(folder, exist_ok=True)
    with atomic_open(os.path.join(folder, "nodes.jsonl")) as f:
        for n in bench.nodes:
            f.write((json.dumps(n, ensure_ascii=False) + "\n").encode("utf-8"))
    with atomic_open(os.path.join(folder, QUESTION_FILE)) as f:
        for q in bench.questions:
            rec = {"id": q.id, "tenant": q.tenant, "question": q.question, "answer": q.answer,
                   "evidence": list(q.evidence), "category": q.category}
            rec.update({k: v for k, v in (("date", q.date), ("options", list(q.options)),
                                          ("abstention", q.abstention)) if v})
            f.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))


class _NoEmbed:
    name = None
    dim = 0

    def embed(self, texts):
        raise ValueError("a Parquet nodes file without embeddings: use nodes.jsonl, or add embeddings")
