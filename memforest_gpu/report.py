"""What a compression reports: one :class:`TenantRow` per tenant, the run's
:class:`CompressReport`, and the merger's counters as :class:`MergerStats`.

A run made of parts (the tenant groups of a ``--memory-budget`` run, the ranks of a
distributed run) combines its parts' reports with :meth:`CompressReport.combine`, the one
place that says how each figure adds up:

- per tenant: counts add up (a tenant whose trees were spread over ranks has one row per
  rank), the ratio is computed again;
- per run: counts add up (the sizes' rows and bytes too), rounds are the most any part ran
  (tenants never interact, so the whole run's rounds are its slowest tenant's), k-means
  iterations are the most per size class (see :func:`combine_iterations`), and the run's
  fields (schedule, merger, embedder, node cap) are the parts' own.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["TenantRow", "CompressReport", "MergerStats", "combine_iterations", "combine_sizes"]


@dataclass(frozen=True)
class TenantRow:
    """One tenant of a run: nodes in and out, the removals asked for and made."""

    tenant: str
    nodes_in: int
    nodes_out: int
    requested: int  # removals asked for (round(ratio * nodes), less what the keep rule holds)
    removed: int  # nodes_in - nodes_out
    ratio: float  # removed / nodes_in (0 for an empty tenant)
    shortfall: int  # requested - removed when the merges could not be made
    trees: int  # the tenant's EventTrees
    kept: int = 0  # nodes the keep rule held out of merging

    @classmethod
    def of(cls, tenant: str, *, nodes_in: int, nodes_out: int, requested: int, shortfall: int, trees: int,
           kept: int = 0) -> TenantRow:
        """A row whose ``removed`` and ``ratio`` follow from the counts."""
        removed = nodes_in - nodes_out
        return cls(tenant, nodes_in, nodes_out, requested, removed, removed / nodes_in if nodes_in else 0.0,
                   shortfall, trees, kept)

    @classmethod
    def from_dict(cls, d: dict) -> TenantRow:
        """A row from its :meth:`to_dict` form (a part's report read back from JSON)."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __getitem__(self, name: str):
        """``row["nodes_in"]``: read access for code written against the rows' dict form."""
        if name not in _ROW_FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default=None):
        return getattr(self, name) if name in _ROW_FIELDS else default

    def __add__(self, other: TenantRow) -> TenantRow:
        """The same tenant's rows of two parts (its trees done on two ranks) as one."""
        if other.tenant != self.tenant:
            raise ValueError(f"rows must be of one tenant to add up, got {self.tenant!r} and {other.tenant!r}")
        return TenantRow.of(self.tenant, nodes_in=self.nodes_in + other.nodes_in,
                            nodes_out=self.nodes_out + other.nodes_out, requested=self.requested + other.requested,
                            shortfall=self.shortfall + other.shortfall, trees=self.trees + other.trees,
                            kept=self.kept + other.kept)


_ROW_FIELDS = frozenset(f.name for f in dataclasses.fields(TenantRow))


@dataclass
class CompressReport:
    """What a compression did. ``tenants`` has one :class:`TenantRow` per tenant (a dict
    given for a row is read as one)."""

    tenants: list[TenantRow]
    nodes_in: int
    nodes_out: int
    trees: int
    rounds: int
    merges: int
    schedule: str
    merger: str
    embedder: str
    max_node_tokens: int | None
    seconds: dict = field(default_factory=dict)
    fallbacks: int = 0
    moved_by_reassignment: int = 0
    kmeans_iterations: dict = field(default_factory=dict)
    condensed: int = 0  # merges cut to the node cap (cap_policy "condense")
    condensed_tokens: int = 0  # tokens those merges dropped, in all
    kept: int = 0  # nodes the keep rule (MergeConfig.keep_pattern) held out of merging
    # the input's and the output's size in the output's encoding (store/size.py: vector rows a search
    # scores, vectors held, bytes of texts and vectors); empty for a dry run
    size_in: dict = field(default_factory=dict)
    size_out: dict = field(default_factory=dict)

    def __post_init__(self):
        self.tenants = [r if isinstance(r, TenantRow) else TenantRow.from_dict(r) for r in self.tenants]

    @property
    def ratio_reached(self) -> float:
        return 1.0 - self.nodes_out / self.nodes_in if self.nodes_in else 0.0

    @property
    def shortfall(self) -> int:
        return sum(t.shortfall for t in self.tenants)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["tenants"] = [t.to_dict() for t in self.tenants]
        d["ratio_reached"] = self.ratio_reached
        d["shortfall"] = self.shortfall
        return d

    @classmethod
    def from_dict(cls, d: dict) -> CompressReport:
        """A report from its :meth:`to_dict` form; other keys (the derived figures) are ignored."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    @classmethod
    def combine(cls, parts: Sequence[CompressReport], *, order: Iterable[str] | None = None,
                seconds: dict | None = None) -> CompressReport:
        """One report from the reports of a run's parts (disjoint tenants, or disjoint trees of
        a tenant); see the module docstring for how each figure adds up.

        ``order``: the tenants in the order the rows should have (the whole run's: first
        appearance in the input); tenants it does not name follow in the parts' order.
        ``seconds``: the run's seconds; by default each stage's seconds of every part, added
        up (a ``total`` included).
        """
        if not parts:
            raise ValueError("parts must hold at least one report, got none")
        rows: dict[str, TenantRow] = {}
        for p in parts:
            for r in p.tenants:
                rows[r.tenant] = rows[r.tenant] + r if r.tenant in rows else r
        rank = {t: j for j, t in enumerate(order or ())}
        tenants = sorted(rows.values(), key=lambda r: rank.get(r.tenant, len(rank)))  # stable: parts' order after
        if seconds is None:
            seconds = {}
            for p in parts:
                for k, v in p.seconds.items():
                    seconds[k] = seconds.get(k, 0.0) + v
        first = parts[0]
        return cls(
            tenants=tenants, nodes_in=sum(p.nodes_in for p in parts), nodes_out=sum(p.nodes_out for p in parts),
            trees=sum(p.trees for p in parts), rounds=max(p.rounds for p in parts),
            merges=sum(p.merges for p in parts), schedule=first.schedule, merger=first.merger,
            embedder=first.embedder, max_node_tokens=first.max_node_tokens, seconds=dict(seconds),
            fallbacks=sum(p.fallbacks for p in parts),
            moved_by_reassignment=sum(p.moved_by_reassignment for p in parts),
            kmeans_iterations=combine_iterations([p.kmeans_iterations for p in parts]),
            condensed=sum(p.condensed for p in parts), condensed_tokens=sum(p.condensed_tokens for p in parts),
            kept=sum(p.kept for p in parts), size_in=combine_sizes([p.size_in for p in parts]),
            size_out=combine_sizes([p.size_out for p in parts]))


def combine_sizes(parts: Sequence[dict]) -> dict:
    """The size of a run's whole store from its parts' (disjoint nodes): counts and bytes add
    up, in the parts' one encoding; a part without a size (a distributed run's partition, which
    holds no node) adds nothing; empty when no part has one."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    out = {k: sum(p[k] for p in parts) for k in parts[0] if k != "encoding"}
    return {**out, "encoding": parts[0]["encoding"]}


_BUCKET = re.compile(r"n<=(\d+)")


def combine_iterations(parts: Sequence[dict]) -> dict:
    """The k-means iterations of a whole run from its parts'.

    The engine runs the k-means of tenants of similar size together, in buckets of a size
    class (a power of two), keyed ``"n<=M"`` with M the bucket's largest tenant, for as many
    iterations as its slowest tenant needs. The whole run's bucket of a class holds every
    part's tenants of that class, so its key is the largest M and its count the most
    iterations; other keys (a two-level tenant's, ``"K=1 closed form"``) keep the most.
    Buckets come in the engine's order: other keys first, then largest classes first.
    """
    buckets: dict[int, tuple[int, int]] = {}  # size class -> (largest M, most iterations)
    other: dict[str, int] = {}
    for d in parts:
        for k, v in d.items():
            m = _BUCKET.fullmatch(k)
            if m is None:
                other[k] = max(other.get(k, v), v)
                continue
            size = int(m.group(1))
            c = math.ceil(math.log2(max(size, 1)))
            big, it = buckets.get(c, (size, v))
            buckets[c] = (max(big, size), max(it, v))
    closed = {k: other.pop(k) for k in list(other) if k.startswith("K=1")}
    return {**other, **{f"n<={big}": it for _, (big, it) in sorted(buckets.items(), reverse=True)}, **closed}


@dataclass(frozen=True)
class MergerStats:
    """An LLM merger's counters for a run report (its ``summary()``): requests, accepted and
    retried texts, fallbacks and why, tokens and speed; ``replayed``: merges a resumed run
    took from its journal (never sent to the merger)."""

    calls: int = 0
    pairs: int = 0
    accepted: int = 0
    retries: int = 0
    retry_accepted: int = 0
    fallbacks: int = 0
    failed_requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    fallback_reasons: dict = field(default_factory=dict)
    http_retries: int | None = None  # OpenAI-compatible servers only
    replayed: int | None = None  # only when the run kept a journal
    merges_per_s: float = 0.0
    completion_tokens_per_s: float = 0.0
    tokens_per_s: float = 0.0

    @classmethod
    def of(cls, merger, *, replayed: int | None = None) -> MergerStats | None:
        """The stats of ``merger`` (``None`` for a merger that keeps none, as the extractive
        one); ``replayed``: the journal's count, when the run kept one."""
        summary = getattr(merger, "summary", None)
        d = summary() if callable(summary) else None
        if not d:
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        st = cls(**{k: v for k, v in d.items() if k in names})
        return dataclasses.replace(st, replayed=replayed) if replayed is not None else st

    def to_dict(self) -> dict:
        """The report's ``merger_stats``: the counters in the merger's order, the optional
        ones only when present, then the rates."""
        d = dataclasses.asdict(self)
        rates = {k: d.pop(k) for k in ("merges_per_s", "completion_tokens_per_s", "tokens_per_s")}
        return {**{k: v for k, v in d.items() if v is not None}, **rates}
