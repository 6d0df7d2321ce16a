"""Frozen, keyword-only configuration dataclasses, one per stage (defaults: docs/method.md)."""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from dataclasses import dataclass, field

from .kernels.choices import SEEDINGS
from .renamed import renamed_keyword

__all__ = [
    "ConfigError",
    "PartitionConfig",
    "SpanningConfig",
    "MergeConfig",
    "RetrievalConfig",
    "CompressConfig",
    "CompactConfig",
    "SCHEDULES",
    "DEGREE_NORMS",
    "SPANNING_KINDS",
    "TIME_RULES",
    "GRAPHS",
    "KMEANS_METHODS",
    "SEEDINGS",
    "CAP_POLICIES",
    "VECTOR_CODES",
    "MIN_CONTEXT_TOKENS",
    "FILLS",
    "PRESETS",
    "DEFAULT_PRESET",
    "preset",
    "STAGES",
    "config_record",
    "config_from_record",
]

SCHEDULES = ("sequential", "matching")
DEGREE_NORMS = ("none", "max")
SPANNING_KINDS = ("max", "min", "random")
TIME_RULES = ("flat", "scaled", "gated")
GRAPHS = ("knn", "dense")
KMEANS_METHODS = ("exact", "two-level")
CAP_POLICIES = ("condense", "strict", "keep")
VECTOR_CODES = ("float32", "int8")  # how a store file holds its vectors (store/codes.py)
MIN_CONTEXT_TOKENS = 4  # the least context a search fills (max_tokens), in whitespace tokens: a date tag (3) and a word
# How a search fills its context (memforest_gpu/retrieval/context.py): the fills the product ships,
# defined here once. The evaluation's study-only fills extend this tuple in
# memforest_gpu/evaluation/context_fill.py (STUDY_FILLS, EVAL_FILLS); the command line offers these.
FILLS = ("ranked", "plain", "focused", "pooled")


class ConfigError(ValueError):
    """A configuration value refused: ``field`` names it, ``message`` says what it must be
    (``ConfigError("alpha", "must be in [0.0, 1.0], got 2")`` reads ``alpha must be in [0.0,
    1.0], got 2``). A ``ValueError``, so callers that catch those keep working; the command
    line names the field by its flag with :meth:`named`, never by rewriting the text."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field} {message}")
        self.field = field
        self.message = message

    def named(self, name: str) -> str:
        """The message with the field called ``name`` (``--max-node-tokens must be ...``)."""
        return f"{name} {self.message}"


def _check_range(name: str, value: float, lo: float, hi: float, *, lo_open=False, hi_open=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(name, f"must be a finite number, got {value!r}")
    bad_lo = value <= lo if lo_open else value < lo
    bad_hi = value >= hi if hi_open else value > hi
    if bad_lo or bad_hi:
        rule = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        raise ConfigError(name, f"must be in {rule}, got {value!r}")


def _check_int(name: str, value: int, lo: int):
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(name, f"must be an integer >= {lo}, got {value!r}")


def _check_choice(name: str, value: str, valid: tuple[str, ...]):
    if value not in valid:
        raise ConfigError(name, f"must be one of {list(valid)}, got {value!r}")


def _check_regex(name: str, value: str):
    """A non-empty regular expression that Arrow's RE2 compiles (the engine matches with it).
    Arrow is imported here, for a pattern, so that importing the configs stays light."""
    if not isinstance(value, str) or not value:
        raise ConfigError(name, f"must be a non-empty regular expression, got {value!r}")
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        pc.match_substring_regex(pa.array([""]), value)
    except pa.ArrowInvalid as e:
        raise ConfigError(name, f"must be a regular expression in RE2 syntax, got {value!r}: {e}") from None


@dataclass(frozen=True, kw_only=True)
class PartitionConfig:
    """EventTree partitioning: k-means + semantic/temporal reassignment (docs/method.md
    section 1)."""

    # clusters per node: K = max(1, min(N, floor(alpha * N))); 0 = one tree per tenant. 0.001: about 1,000
    # nodes per event tree (the paper: 0.05)
    alpha: float = 0.001
    beta: float = 0.8  # weight of the semantic term; 1 - beta weights the temporal window
    window: int = 5  # temporal window, in positions (rank by (timestamp, index))
    max_iter: int = 30  # at most this many Lloyd steps
    seed: int = 0  # the k-means seeding's random stream (each tenant draws from (seed, its name))
    # "batched": D^2 sampling in growing batches (O(log K) steps, no device read);
    # "k-means||": 5 oversampling rounds, then the seeds drawn from the candidates (6 passes over the points);
    # "k-means++": one centre per step (K steps), the method's wording, slower on large K
    seeding: str = "batched"
    use_semantic: bool = True  # ablation: False drops the cos term from the reassignment
    use_temporal: bool = True  # ablation: False drops the window term from the reassignment
    kmeans: str = "exact"  # "two-level": coarse cells, then k-means inside each (sub-quadratic)
    two_level_min_nodes: int = 20000  # tenants smaller than this always use exact k-means

    def __post_init__(self):
        _check_choice("kmeans", self.kmeans, KMEANS_METHODS)
        _check_choice("seeding", self.seeding, SEEDINGS)
        _check_int("two_level_min_nodes", self.two_level_min_nodes, 1)
        _check_range("alpha", self.alpha, 0.0, 1.0)
        _check_range("beta", self.beta, 0.0, 1.0)
        _check_int("window", self.window, 0)
        _check_int("max_iter", self.max_iter, 1)
        _check_int("seed", self.seed, 0)


@dataclass(frozen=True, kw_only=True)
class SpanningConfig:
    """The spanning tree of each event tree: the edge weight it is built on (the degree-adjusted
    score, the time, size, drift and length terms), the candidate graph that holds the edges,
    and its kind (docs/method.md section 2)."""

    eta: float = 0.99  # w' = eta * w - (1 - eta) * (deg_i + deg_j)
    degree_norm: str = "none"  # "max": divide deg_i + deg_j by its largest value in the tree
    kind: str = "max"  # ablations: "min" (minimum spanning tree), "random" (random merge order)
    # local time on the tree's edges too: w = (1 - time_weight) * cos + time_weight * [gap <= time_window] * g(cos),
    # gap = positions between two nodes' spans (1 for neighbouring turns); 0 = the paper (cosine only)
    time_weight: float = 0.5
    time_window: int = 1  # in positions, as the partition's window
    # g, what a neighbour's bonus needs (engine/edges.py time_weighted): "gated" g = [cos >= time_min_cos] (the bonus
    # only for neighbours that are related) | "scaled" g = max(cos, 0) (time multiplies meaning) | "flat" g = 1
    # (a 0/1 bonus whatever the neighbours say)
    time_rule: str = "gated"
    time_min_cos: float = 0.3  # "gated" only: the cosine a neighbour needs for the bonus
    # size on the edges (ToMe's size weighting, for a fixed context budget): each edge loses
    # size_weight * (tok_i + tok_j + date tags) / size_unit, the estimated length of the merged
    # node in units of size_unit tokens, so short nodes (chit-chat, near duplicates) merge first
    # and long ones late; 0 = the paper
    size_weight: float = 0.2
    size_unit: int = 256  # tokens; its own field, so the node-token cap never changes the term
    # the graph each tree's spanning tree is built on (engine/trees.py): "knn" keeps per node
    # its `knn` best neighbours by edge weight plus its next node in time (memory and work grow with
    # N; trees of at most knn + 1 nodes, or in a bucket of at most knn_above slots, keep the dense
    # graph) | "dense" keeps every pair, a padded (m, m) matrix per tree (the reference). The
    # ablation kinds "min" and "random" always keep the dense graph.
    graph: str = "knn"
    knn: int = 16  # neighbours kept per node by the "knn" graph; >= (largest tree - 1) is exact
    knn_cells_above: int = 8192  # trees of more nodes search neighbours in cells (approximate, sub-quadratic)
    # buckets of trees padded to at most this many slots keep the dense graph even under "knn": a
    # small tree's matrix costs about what its knn graph does (N * 64 cosines at most) and its
    # rounds are several times cheaper (docs/knn-graph.md); 0: the knn graph for every tree of
    # more than knn + 1 nodes, and the knn planner for every tree
    knn_above: int = 64
    # one-vector stores (engine/edges.py): a pair whose estimated merged vector would fall below this
    # cosine to either input is merged only when its tree has no other pair left; None = no bound
    drift_min_cos: float | None = None
    # long memories (engine/edges.py): a pair whose estimated merged length passes this many tokens is
    # merged only when its tree has no other pair left (the ratio is still reached); None = no bound
    length_last: int | None = None

    def __post_init__(self):
        _check_range("eta", self.eta, 0.0, 1.0)
        if self.drift_min_cos is not None:
            _check_range("drift_min_cos", self.drift_min_cos, -1.0, 1.0)
        if self.length_last is not None:
            _check_int("length_last", self.length_last, 1)
        _check_choice("degree_norm", self.degree_norm, DEGREE_NORMS)
        _check_choice("kind", self.kind, SPANNING_KINDS)
        _check_range("time_weight", self.time_weight, 0.0, 1.0)
        _check_int("time_window", self.time_window, 1)
        _check_choice("time_rule", self.time_rule, TIME_RULES)
        _check_range("time_min_cos", self.time_min_cos, -1.0, 1.0)
        _check_range("size_weight", self.size_weight, 0.0, 1.0)
        _check_int("size_unit", self.size_unit, 1)
        _check_choice("graph", self.graph, GRAPHS)
        _check_int("knn", self.knn, 1)
        _check_int("knn_cells_above", self.knn_cells_above, 2)
        _check_int("knn_above", self.knn_above, 0)


@dataclass(frozen=True, kw_only=True)
class MergeConfig:
    """Progressive merging (docs/method.md section 3)."""

    ratio: float = 0.5  # fraction of each tenant's nodes to remove, in (0, 1)
    schedule: str = "matching"  # "matching" (disjoint pairs per round) | "sequential" (the paper: one pair)
    max_node_tokens: int | None = None  # None: the embedder's limit (no cap when it has none)
    seed: int = 0  # drives only the "random" spanning kind (ablation): its random edge weights
    # over the cap: "condense" (extractive text keeps its most informative sentences up to the
    # cap; no pair is excluded for its length) | "strict" (pairs whose merge would pass the cap
    # are not merged: the ratio may fall short) | "keep" (no cap on the text: the embedder reads
    # what fits its window, the keys find the rest; docs/long-memories.md)
    cap_policy: str = "condense"
    # nodes whose text matches this regular expression (RE2 syntax, found anywhere in the text:
    # anchor it with ^) never merge: they stay as they are, with their own sources, and the ratio
    # applies to the other nodes; None: no node is kept (the graph commands default to M3-Agent's
    # identity lines, GRAPH_KEEP_PATTERN)
    keep_pattern: str | None = None
    # nodes merge only with nodes of the same group: "timestamp" (equal timestamps, e.g. an
    # M3-Agent clip) or a metadata key (equal values; nodes without the key are one group);
    # None: any two nodes of a tenant may merge
    merge_within: str | None = None
    # what a merged node is searched by (docs/merged-keys.md). 0: its text's vector alone (the paper).
    # 1: one vector, the blend normalize(text_weight * t + (1 - text_weight) * c) of its text's vector t and
    # the centre c of its sources' vectors, held as its vector: one vector per node, whatever it merged.
    # K >= 2 / -1 (every source): its text's vector and K key vectors (its sources' own, or K centres of
    # them), scored text_weight * cos(text) + (1 - text_weight) * its best key's cos in every search (the
    # store keeps the keys and the weight; -1 regroups without losing a vector, so the store keeps as many
    # vectors as its input)
    keys: int = 1
    text_weight: float = 0.8
    # how the output store's file holds its vectors (text vectors and keys): "float32", or "int8" codes
    # (a quarter of the bytes; store/codes.py); the search decodes them once on load
    vectors: str = "int8"

    @property
    def max_keys(self) -> int | None:
        """The bound on keys per node (``None``: every source); meaningful when ``keys != 0``."""
        return None if self.keys == -1 else self.keys

    @property
    def folds(self) -> bool:
        """One vector per node: a merged node's key is blended into its vector (``keys == 1``)."""
        return self.keys == 1

    def __post_init__(self):
        _check_range("ratio", self.ratio, 0.0, 1.0, lo_open=True, hi_open=True)
        _check_choice("schedule", self.schedule, SCHEDULES)
        _check_choice("cap_policy", self.cap_policy, CAP_POLICIES)
        if self.max_node_tokens is not None:
            _check_int("max_node_tokens", self.max_node_tokens, 1)
        _check_int("seed", self.seed, 0)
        if self.keep_pattern is not None:
            _check_regex("keep_pattern", self.keep_pattern)
        _check_int("keys", self.keys, -1)
        _check_range("text_weight", self.text_weight, 0.0, 1.0)
        _check_choice("vectors", self.vectors, VECTOR_CODES)
        if self.merge_within is not None and (not isinstance(self.merge_within, str) or not self.merge_within):
            raise ConfigError("merge_within", f"must be 'timestamp' or a metadata key, got {self.merge_within!r}")


@dataclass(frozen=True, kw_only=True)
class RetrievalConfig:
    """Plain top-k or Anchor-Guided Propagation Retrieval (docs/method.md section 4)."""

    k: int = 10  # results per query
    agpr: bool = False  # re-rank the L*k candidates with AGPR
    L: int = 4  # candidate multiplier
    lam: float = 0.2  # anchors = max(1, floor(lam * k + 0.5))
    gamma: float = 0.9  # v = gamma * s + (1 - gamma) * p

    def __post_init__(self):
        _check_int("k", self.k, 1)
        _check_int("L", self.L, 1)
        _check_range("lam", self.lam, 0.0, 1.0)
        _check_range("gamma", self.gamma, 0.0, 1.0)


@dataclass(frozen=True, kw_only=True)
class CompressConfig:
    """Everything `compress` needs, one frozen config per stage."""

    partition: PartitionConfig = field(default_factory=PartitionConfig)
    spanning: SpanningConfig = field(default_factory=SpanningConfig)
    merge: MergeConfig = field(default_factory=MergeConfig)
    # dtype of the vectors the trees read: "float32" | "float16" | "bfloat16" (a half copy of the
    # store's vectors and half-size merged vectors; similarities still accumulated in float64,
    # so only the stored values round)
    storage_dtype: str = "float32"
    # bytes the run may hold (``--memory-budget``); the partition's gathered blocks take a share of it
    # (kernels/blocks.py gather_bytes; None: a share of the machine's memory). Results never depend on it.
    memory_budget: int | None = None

    def __post_init__(self):
        _check_choice("storage_dtype", self.storage_dtype, ("float32", "float16", "bfloat16"))
        if self.memory_budget is not None:
            _check_int("memory_budget", self.memory_budget, 1)
        for name, cls in STAGES.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(name, f"must be a {cls.__name__}, got {getattr(self, name)!r}")

    @classmethod
    def preset(cls, name: str) -> CompressConfig:
        """The named preset (:data:`PRESETS`): ``"memforest"`` (the same as ``CompressConfig()``,
        every command's default) or ``"paper"`` (the method's values as the paper gives them)."""
        return preset(name)


_fields_init = CompressConfig.__init__


@functools.wraps(_fields_init)
def _compress_config_init(self, **fields):
    # ``tree=``, the old keyword of ``spanning=`` (when the stage's config was ``TreeConfig``), for one release
    if "tree" in fields:
        fields["spanning"] = renamed_keyword("CompressConfig", {"tree": fields.pop("tree")}, "tree", "spanning",
                                             fields.get("spanning"))
    _fields_init(self, **fields)


CompressConfig.__init__ = _compress_config_init

#: the stage configs of a :class:`CompressConfig`, by field
STAGES = {"partition": PartitionConfig, "spanning": SpanningConfig, "merge": MergeConfig}


def config_record(cfg: CompressConfig) -> dict:
    """The stage configs of ``cfg`` as the evaluation's records save them:
    ``{stage: {field: value}}``."""
    return {k: dataclasses.asdict(getattr(cfg, k)) for k in STAGES}


def config_from_record(record: dict) -> CompressConfig:
    """The :class:`CompressConfig` of a :func:`config_record` (a record saved before the spanning
    stage was renamed holds it as ``"tree"``; it reads the same)."""
    stages = dict(record)
    if "spanning" not in stages and "tree" in stages:
        stages["spanning"] = stages.pop("tree")
    return CompressConfig(**{k: cls(**stages[k]) for k, cls in STAGES.items()})


@dataclass(frozen=True, kw_only=True)
class CompactConfig:
    """Keeping every tenant within its node limit as memories arrive (``compact``,
    docs/compaction.md): the limits of a compaction."""

    # the nodes a tenant may hold; one number for every tenant, or {tenant: number}
    # (tenants a mapping leaves out have no limit and are never compacted)
    max_nodes: int | dict
    low_water: float = 0.8  # a tenant over max_nodes is compacted to floor(low_water * max_nodes) (hysteresis)
    # a tenant is partitioned again in full when the nodes placed into its trees since its last
    # full partition reach repartition_growth x its size then (1.0: it has doubled)
    repartition_growth: float = 1.0
    repartition: bool = False  # partition every compacted tenant again in full, whatever its state
    # re-planned: the trees that received memories, and every tree more than slack x its size above its
    # fair share of what the tenant keeps (docs/compaction.md); 0 spreads every removal by excess alone
    slack: float = 0.05

    def __post_init__(self):
        limits = self.max_nodes.values() if isinstance(self.max_nodes, dict) else [self.max_nodes]
        for v in limits:
            _check_int("max_nodes", v, 1)
        _check_range("low_water", self.low_water, 0.0, 1.0, lo_open=True)
        _check_range("repartition_growth", self.repartition_growth, 0.0, math.inf, lo_open=True, hi_open=True)
        _check_range("slack", self.slack, 0.0, 1.0)

    def max_nodes_of(self, tenant: str) -> int | None:
        """The nodes ``tenant`` may hold (``None``: no limit)."""
        return self.max_nodes.get(tenant) if isinstance(self.max_nodes, dict) else self.max_nodes

    def keep(self, tenant: str) -> int | None:
        """What a compacted tenant keeps: floor(low_water * max_nodes), at least 1."""
        t = self.target(tenant)
        return None if t is None else max(1, t)

    def target(self, tenant: str) -> int | None:
        """The documented target of a compacted tenant, floor(low_water * max_nodes); it may be 0,
        below what a tenant keeps (a node), and the difference is then reported as shortfall."""
        b = self.max_nodes_of(tenant)
        return None if b is None else math.floor(self.low_water * b + 1e-9)


#: Named configurations. ``CompressConfig()`` (and every stage config's defaults) is the shipped
#: ``"memforest"`` preset, chosen by leave-one-conversation-out on the LoCoMo dev file
#: (docs/presets.md); ``"paper"`` is the method's values as the MemForest paper gives them
#: (docs/method.md): one tree per ~20 nodes, the spanning tree on cosines alone, one pair per tree
#: a round, a merged node searched by its text's vector, float32 files.
PRESETS: dict[str, CompressConfig] = {
    "memforest": CompressConfig(),
    "paper": CompressConfig(
        partition=PartitionConfig(alpha=0.05),
        spanning=SpanningConfig(time_weight=0.0, size_weight=0.0),
        merge=MergeConfig(schedule="sequential", keys=0, text_weight=1.0, vectors="float32"),
    ),
}
DEFAULT_PRESET = "memforest"  # what the command line uses when no --preset is given


def preset(name: str) -> CompressConfig:
    """The :class:`CompressConfig` of a named preset; an unknown name lists the valid ones."""
    if name not in PRESETS:
        raise ConfigError("preset", f"must be one of {list(PRESETS)}, got {name!r}")
    return PRESETS[name]


def __getattr__(name: str):
    """``TreeConfig``, the old name of :class:`SpanningConfig` (docs named it), for one release."""
    if name == "TreeConfig":
        warnings.warn("memforest_gpu.config.TreeConfig is renamed SpanningConfig; TreeConfig goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return SpanningConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
