"""A benchmark in memory: its nodes (as records) and its questions, whatever file they came
from (:mod:`.benchmark` reads and writes the format; :mod:`.locomo`, :mod:`.longmemeval` and
:mod:`.personamem` convert the published files)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..config import ConfigError
from ..store.column_checks import DEFAULT_TENANT
from ..store.memory_store import MemoryStore

__all__ = ["Question", "Benchmark"]


@dataclass(frozen=True)
class Question:
    """One benchmark question. ``evidence`` holds node ids of the tenant (may be empty).

    Optional, for the LLM answer protocol (:mod:`.qa`): ``date`` (epoch seconds) is when the
    question is asked; ``options`` are the choices of a multiple-choice question (``answer``
    is then one of them); ``abstention`` marks a question whose right answer is that the
    memories do not tell (reported apart, never in "all").
    """

    id: str
    tenant: str
    question: str
    answer: str
    evidence: tuple[str, ...]
    category: str
    date: float | None = None
    options: tuple[str, ...] = ()
    abstention: bool = False

    def __post_init__(self):
        if self.options and self.answer not in self.options:
            raise ValueError(f"answer of multiple-choice question {self.id!r} must be one of its options, "
                             f"got {self.answer!r}")


@dataclass
class Benchmark:
    """Nodes (as records) and questions of one benchmark."""

    name: str
    nodes: list[dict]
    questions: list[Question]
    info: dict = field(default_factory=dict)

    def store(self, embedder=None, *, device=None) -> MemoryStore:
        """The uncompressed store; nodes without an ``embedding`` are embedded with ``embedder``."""
        return MemoryStore.from_records(self.nodes, embedder=embedder, device=device)

    def summary(self) -> dict:
        cats: dict[str, int] = {}
        for q in self.questions:
            cats[q.category] = cats.get(q.category, 0) + 1
        return {"benchmark": self.name, "nodes": len(self.nodes),
                "tenants": len({n.get("tenant", DEFAULT_TENANT) for n in self.nodes}),
                "questions": len(self.questions), "categories": dict(sorted(cats.items())), **self.info}

    def has_entity_links(self) -> bool:
        """True when some node links to entities (``metadata["entities"]``), as graph memories
        do."""
        return any((n.get("metadata") or {}).get("entities") for n in self.nodes)

    def subset(self, *, tenants=None, max_questions: int | None = None) -> Benchmark:
        """The benchmark restricted to ``tenants`` (their nodes and questions; None: all), then
        to ``max_questions`` questions spread evenly over the rest (question ``floor(i * Q / n)``
        for i < n, so every part of the file is sampled; None: all). Tenants left without a
        question keep their nodes."""
        if tenants is not None:
            keep = {str(t) for t in tenants}
            known = {str(n.get("tenant", "default")) for n in self.nodes}
            missing = sorted(keep - known)
            if missing:
                raise ConfigError("tenants", f"must be tenants of benchmark {self.name!r}, got unknown {missing[:5]}")
            nodes = [n for n in self.nodes if str(n.get("tenant", "default")) in keep]
            questions = [q for q in self.questions if q.tenant in keep]
        else:
            nodes, questions = self.nodes, self.questions
        if max_questions is not None:
            if isinstance(max_questions, bool) or not isinstance(max_questions, int) or max_questions < 1:
                raise ConfigError("max_questions", f"must be an integer >= 1, got {max_questions!r}")
            Q = len(questions)
            if max_questions < Q:
                questions = [questions[i * Q // max_questions] for i in range(max_questions)]
        info = {**self.info, **({"tenants_selected": len(set(tenants))} if tenants is not None else {}),
                **({"questions_in_file": len(self.questions)} if len(questions) != len(self.questions) else {})}
        return Benchmark(self.name, nodes, list(questions), info=info)
