"""Compression methods by name: ``none``, the baselines, MemForest and its ablations.

A method spec is ``NAME[:SCHEDULE]``:

- ``none`` (the uncompressed store), ``random_prune``, ``kmeans_prune``, ``dart``,
  ``random_merge``, ``tome``; ``streammeco`` (pruning by entity links, for benchmarks whose
  nodes name their entities, ``metadata["entities"]``: :mod:`memforest_gpu.adapters.streammeco`);
- ``memforest`` and its ablations ``memforest-<ablation>`` (:data:`ABLATIONS`), each with
  an optional schedule: ``memforest:matching``, ``memforest-min-spanning:sequential``;
  ``memforest-paper`` runs the method's partition, spanning and node-cap defaults whatever the
  base config. ``memforest-min-tree``, the old name of ``memforest-min-spanning``, is still read
  for one release (:data:`RENAMED_METHODS`).

:func:`compress_with` runs one on a store with a :class:`~memforest_gpu.config.CompressConfig`
(its ``merge.ratio`` and ``merge.seed`` drive every method; MemForest also reads the rest; the
keys of ``merge.keys`` are made for every method's merged nodes, so all are searched by one rule).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..adapters.streammeco import streammeco
from ..config import PRESETS, SCHEDULES, CompressConfig, ConfigError
from ..engine import CompressResult, compress
from ..renamed import renamed_name
from ..store.memory_store import MemoryStore
from ..store.merged_keys import derive_keys, fold_keys
from .baselines import BASELINES, _report

__all__ = ["MethodSpec", "parse_method", "compress_with", "ABLATIONS", "DEFAULT_METHODS", "ABLATION_METHODS",
           "METHOD_NAMES", "GRAPH_BASELINES", "RENAMED_METHODS"]


def _replace(cfg: CompressConfig, stage: str, **kw) -> CompressConfig:
    return dataclasses.replace(cfg, **{stage: dataclasses.replace(getattr(cfg, stage), **kw)})


#: the paper's ablations, as config switches
ABLATIONS: dict[str, Callable[[CompressConfig], CompressConfig]] = {
    "no-semantic": lambda c: _replace(c, "partition", use_semantic=False),  # reassignment by time only
    "no-temporal": lambda c: _replace(c, "partition", use_temporal=False),  # reassignment by meaning only
    "random-order": lambda c: _replace(c, "spanning", kind="random"),  # random merge order, not the spanning tree
    "min-spanning": lambda c: _replace(c, "spanning", kind="min"),  # minimum instead of maximum spanning tree
    "no-degree": lambda c: _replace(c, "spanning", eta=1.0),  # w' = w: no degree term
    "degree-max": lambda c: _replace(c, "spanning", degree_norm="max", eta=0.9),  # the authors' code (their Mem0 eta)
    "no-time-edges": lambda c: _replace(c, "spanning", time_weight=0.0),  # cosine-only edges (the paper's tree)
    "no-size-edges": lambda c: _replace(c, "spanning", size_weight=0.0),  # no size term on the edges (the paper's)
    "dense-graph": lambda c: _replace(c, "spanning", graph="dense"),  # every pair of a tree, not nearest neighbours
    # not ablations: the dense graph above (the reference of the knn graph), and the method's defaults for
    # partition, spanning tree and node cap, whatever the base config says
    "paper": lambda c: dataclasses.replace(c, partition=dataclasses.replace(PRESETS["paper"].partition,
                                                                            seed=c.partition.seed),
                                           spanning=PRESETS["paper"].spanning,
                                           merge=dataclasses.replace(c.merge, max_node_tokens=None)),
}
METHOD_NAMES = ("none", *BASELINES, "streammeco", "memforest", *(f"memforest-{a}" for a in ABLATIONS))
DEFAULT_METHODS = ("random_prune", "kmeans_prune", "dart", "random_merge", "tome", "memforest:sequential",
                   "memforest:matching")
ABLATION_METHODS = tuple(f"memforest-{a}" for a in ABLATIONS if a not in ("paper", "dense-graph"))
GRAPH_BASELINES = ("streammeco",)  # added to the default methods where a benchmark has entity links
#: old method names, read for one release (a saved result or a script may name them): old -> new
RENAMED_METHODS = {"memforest-min-tree": "memforest-min-spanning"}


@dataclass(frozen=True)
class MethodSpec:
    """``name`` as in :data:`METHOD_NAMES`; ``schedule`` ("-" for methods without one)."""

    name: str
    schedule: str = "-"

    @property
    def label(self) -> str:
        return self.name if self.schedule == "-" else f"{self.name}:{self.schedule}"

    @property
    def is_memforest(self) -> bool:
        return self.name.startswith("memforest")

    def config(self, base: CompressConfig, *, ratio: float, seed: int) -> CompressConfig:
        """``base`` with this method's ratio, seed, schedule and ablation applied."""
        cfg = _replace(base, "merge", ratio=ratio, seed=seed)
        if self.is_memforest:
            cfg = _replace(cfg, "merge", schedule=self.schedule)
            cfg = _replace(cfg, "partition", seed=seed)
            abl = self.name[len("memforest-"):] if self.name != "memforest" else None
            if abl:
                cfg = ABLATIONS[abl](cfg)
        return cfg


def parse_method(spec: str) -> MethodSpec:
    """``"memforest:matching"`` -> MethodSpec("memforest", "matching"); unknown names list the
    valid ones."""
    name, _, schedule = spec.strip().partition(":")
    name = renamed_name("method", name, RENAMED_METHODS)
    if name not in METHOD_NAMES:
        raise ConfigError("method", f"must be one of {list(METHOD_NAMES)} (memforest variants take ':SCHEDULE'), "
                         f"got {spec!r}")
    if name.startswith("memforest"):
        schedule = schedule or "sequential"
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule of {name} must be one of {list(SCHEDULES)}, got {schedule!r}")
        return MethodSpec(name, schedule)
    if schedule:
        raise ValueError(f"only memforest methods take a schedule, got {spec!r}")
    return MethodSpec(name)


def compress_with(method: str | MethodSpec, store: MemoryStore, config: CompressConfig | None = None, *,
                  merger=None, embedder=None, device=None, progress: bool = False) -> CompressResult:
    """Compress ``store`` with a named method (see module doc), under ``config``.

    For MemForest specs, ``config`` is taken as is (apply :meth:`MethodSpec.config` first
    for the spec's schedule and ablation); baselines read ``merge.ratio``, ``merge.seed``,
    ``merge.max_node_tokens`` and ``partition.max_iter``.
    """
    spec = parse_method(method) if isinstance(method, str) else method
    cfg = config or CompressConfig()
    if spec.name == "none":
        t0 = time.perf_counter()
        return CompressResult(store, _report(store, store, "none", t0), [])
    if spec.is_memforest:
        return compress(store, cfg, merger=merger, embedder=embedder, device=device, progress=progress)
    if spec.name == "streammeco":
        res = streammeco(store, cfg)
    else:
        res = BASELINES[spec.name](store, cfg, merger=merger, embedder=embedder)
    if cfg.merge.keys != 0:  # the same retrieval rule as MemForest's output: merged nodes keep their keys
        res.store.keys = derive_keys(store, res.store.sources.arrow, max_keys=cfg.merge.max_keys,
                                     text_weight=cfg.merge.text_weight, device=res.store.device,
                                     codes=cfg.merge.vectors)
        if cfg.merge.folds:  # one vector per node, blended in place: the output must own its vectors
            if res.store.embeddings.untyped_storage().data_ptr() == store.embeddings.untyped_storage().data_ptr():
                res.store.embeddings = res.store.embeddings.clone()
            fold_keys(res.store, res.store.keys)
        res.store.vector_codes = cfg.merge.vectors
    return res
