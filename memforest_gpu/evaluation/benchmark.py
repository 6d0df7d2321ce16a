"""The benchmark format ``memforest eval`` reads (EVAL.md, "Benchmark format").

Two files, so any benchmark can be converted to it:

- nodes (JSONL or Parquet): ``id``, ``text``, ``timestamp``, ``tenant``, optional ``embedding``;
- questions (JSONL): ``id``, ``tenant``, ``question``, ``answer``, ``evidence`` (node ids),
  ``category``.

A benchmark path is a folder holding ``nodes.jsonl`` (or ``nodes.parquet``) and
``questions.jsonl``, or a LoCoMo JSON file (converted on the fly, see :mod:`.locomo`); either
is read into a :class:`~.dataset.Benchmark`.
"""
from __future__ import annotations

import json
import os

from ..store.atomic import atomic_open
from ..store.checks import DEFAULT_TENANT
from ..store.io import read_store
from ..store.jsonl import iter_jsonl_objects
from .dataset import Benchmark, Question
from .locomo import load_locomo

__all__ = ["load_benchmark", "write_benchmark", "read_questions"]

NODE_FILES = ("nodes.jsonl", "nodes.parquet", "nodes.json")
QUESTION_FILE = "questions.jsonl"


def _question(rec: dict, j: int, where: str) -> Question:
    for key in ("id", "tenant", "question", "answer", "evidence", "category"):
        if key not in rec:
            raise ValueError(f"{where}: question {j} is missing required field {key!r}")
    ev = rec["evidence"]
    if isinstance(ev, str) or not isinstance(ev, (list, tuple)):
        raise ValueError(f"{where}: evidence of question {rec['id']!r} must be a list of node ids, got {ev!r}")
    return Question(str(rec["id"]), str(rec["tenant"]), str(rec["question"]), str(rec["answer"]),
                    tuple(str(e) for e in ev), str(rec["category"]))


def read_questions(path: str) -> list[Question]:
    """Questions from a JSONL file (one JSON object per line; blank lines skipped)."""
    out = [_question(rec, n, path) for n, (_, rec) in enumerate(iter_jsonl_objects(path), 1)]
    ids = [q.id for q in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: question ids must be unique")
    return out


def load_benchmark(path: str) -> Benchmark:
    """A benchmark folder (nodes + questions files) or a LoCoMo JSON file."""
    path = os.fspath(path)
    if os.path.isfile(path):
        if path.endswith(".json"):
            return load_locomo(path)
        raise ValueError(f"benchmark must be a folder with nodes + {QUESTION_FILE} or a LoCoMo .json file, "
                         f"got {path!r}")
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
            f.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))


class _NoEmbed:
    name = None
    dim = 0

    def embed(self, texts):
        raise ValueError("a Parquet nodes file without embeddings: use nodes.jsonl, or add embeddings")
