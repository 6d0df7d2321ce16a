"""A benchmark in memory: its nodes (as records) and its questions, whatever file they came
from (:mod:`.benchmark` reads and writes the format, :mod:`.locomo` converts LoCoMo)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..store.checks import DEFAULT_TENANT
from ..store.memory_store import MemoryStore

__all__ = ["Question", "Benchmark"]


@dataclass(frozen=True)
class Question:
    """One benchmark question. ``evidence`` holds node ids of the tenant (may be empty)."""

    id: str
    tenant: str
    question: str
    answer: str
    evidence: tuple[str, ...]
    category: str


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
