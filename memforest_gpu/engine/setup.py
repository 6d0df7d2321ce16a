"""What a run needs before its first round: the inputs checked, then partition, quotas and
trees (or the ones a caller hands in). :func:`~.compression.compress` and
:func:`~memforest_gpu.engine.compression.dry_run` start from the same :class:`RunSetup`."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from ..config import CompressConfig
from ..device import resolve_device
from ..store.memory_store import MemoryStore
from ..timer import StageTimer
from .constraints import check_rules, constrain
from .merge_call import cap_and_counter, count_column
from .node_table import NodeTable
from .partition import Partition, partition_nodes
from .quotas import Quotas, removal_quotas
from .trees import TreeBatch, build_trees

__all__ = ["RunSetup", "setup_run", "STAGES", "progress_bar"]

#: the stages a run's timer books, in order (``report.seconds`` adds ``total``)
STAGES = ("partition", "setup", "plan", "merge", "embed", "apply", "output")


@dataclass
class RunSetup:
    """A run ready for its rounds.

    ``names``: tenant names (codes index them); ``emb`` (N, D): the store's vectors on the
    run's device; ``cap``: the node-token cap (``None``: none) and ``counter`` the function
    that counts a text's tokens against it (or for the size term); ``kept`` (n_tenants,):
    nodes the keep rule holds out of merging (``None``: no rule); ``batch`` is dropped once
    the rounds are over.
    """

    cfg: CompressConfig
    names: list[str]
    part: Partition
    quotas: Quotas
    batch: TreeBatch | None
    table: NodeTable
    emb: torch.Tensor
    cap: int | None
    counter: Callable | None
    timer: StageTimer
    kept: np.ndarray | None = None

    @property
    def plan_cap(self) -> int | None:
        """The cap the planner excludes pairs by: ``strict`` only (``condense`` merges any pair
        and cuts the text to the cap)."""
        return self.cap if self.cfg.merge.cap_policy == "strict" else None


def setup_run(store: MemoryStore, config: CompressConfig | None = None, *, embedder=None, device=None,
              progress: bool = False, partition: Partition | None = None, quotas: Quotas | None = None,
              budget: int = 1 << 24, reuse: bool = False) -> RunSetup:
    """Check the inputs, then partition (unless ``partition`` is given), quotas (unless
    ``quotas`` is given) and trees. ``budget``: elements of the partition's temporaries.
    ``reuse``: the run may overwrite ``store.embeddings`` as it goes (:func:`reuses_rows`)."""
    timer = StageTimer(STAGES)
    cfg = config or CompressConfig()
    _check_inputs(store, cfg, embedder)
    if partition is None:  # a whole compress (a compaction checks its store in compact())
        check_rules(store, cfg.merge.keep_pattern, cfg.merge.merge_within)
    dev = resolve_device(device)
    emb, ts = store.embeddings.to(dev), store.timestamps.to(dev)
    names, codes = store.tenant_index()
    codes = codes.to(dev)
    with timer.stage("partition"):
        if partition is None:
            with progress_bar(progress, len(store), "partition", unit="node") as bar:
                partition = partition_nodes(emb, ts, codes, names, cfg.partition, budget=budget,
                                            progress=bar.update if bar else None, memory_budget=cfg.memory_budget)
        else:
            _check_partition(partition, len(store), len(names))
        partition, kept = constrain(partition, store, cfg.merge.keep_pattern, cfg.merge.merge_within)  # who may merge
    with timer.stage("setup"):
        n_trees = int(partition.tree_tenant.shape[0])
        tree_size = torch.bincount(partition.tree, minlength=n_trees).cpu().numpy().astype(np.int64)
        if quotas is None:
            tenant_size = np.bincount(codes.cpu().numpy(), minlength=len(names))
            quotas = removal_quotas(tree_size, partition.tree_tenant.cpu().numpy(), tenant_size - kept, cfg.merge.ratio)
        elif len(quotas.per_tree) != n_trees or not np.array_equal(quotas.tree_size, tree_size):
            raise ValueError(f"quotas must be for the partition's {n_trees} trees of sizes "
                             f"{tree_size.tolist()[:8]}..., got {len(quotas.per_tree)} trees")
        # the size term and the bounds of engine/drift.py need lengths too
        t = cfg.tree
        counted = t.size_weight > 0 or t.length_last is not None or t.drift_min_cos is not None
        cap, counter = cap_and_counter(cfg.merge.max_node_tokens, embedder, count=counted)
        tokens = torch.as_tensor(count_column(counter, store.texts)).to(dev) if counter is not None else None
        batch = build_trees(partition.tree, tree_size, emb, ts, codes, tokens, dtype=getattr(torch, cfg.storage_dtype),
                            config=cfg.tree, cap=cap if cfg.merge.cap_policy == "strict" else None,
                            merges=int(quotas.per_tree.sum()), reuse=reuse and reuses_rows(cfg, emb, store),
                            save_codes=cfg.merge.keys != 0)
    return RunSetup(cfg, names, partition, quotas, batch, NodeTable(store), emb, cap, counter, timer, kept)


def reuses_rows(cfg: CompressConfig, emb: torch.Tensor, store: MemoryStore) -> bool:
    """Whether a run allowed to overwrite the input's vectors keeps merged vectors in the
    input's own dead rows (:meth:`~.vectors.NodeVectors.put`): when they are stored in the
    input's dtype, and the output's keys need no input vector but as its int8 code (no keys,
    or every source's key as int8 codes), which is kept before its row is overwritten."""
    m = cfg.merge
    same = getattr(torch, cfg.storage_dtype) == emb.dtype
    return same and (m.keys == 0 or (m.max_keys is None and m.vectors == "int8" and store.keys is None))


def _check_inputs(store: MemoryStore, cfg: CompressConfig, embedder) -> None:
    if not isinstance(cfg, CompressConfig):
        raise ValueError(f"config must be a CompressConfig, got {type(cfg).__name__}")
    if not isinstance(store, MemoryStore):
        raise ValueError(f"store must be a MemoryStore, got {type(store).__name__}")
    if embedder is not None and embedder.dim != store.dim:
        raise ValueError(
            f"embedder dimension must match the store's ({store.dim}), got {embedder.dim} from {embedder.name!r}; "
            "use the model that made the store's vectors, or no embedder (mean of the two vectors)")


def _check_partition(part: Partition, n: int, n_tenants: int) -> None:
    if not isinstance(part, Partition):
        raise ValueError(f"partition must be a Partition, got {type(part).__name__}")
    if tuple(part.tree.shape) != (n,):
        raise ValueError(f"partition.tree must have one tree id per node ({n},), got shape {tuple(part.tree.shape)}")
    T = int(part.tree_tenant.shape[0])
    tt = part.tree_tenant.cpu()
    if n and (int(part.tree.min()) < 0 or int(part.tree.max()) >= T):
        raise ValueError(f"partition.tree must hold tree ids in [0, {T}), "
                         f"got {int(part.tree.min())}..{int(part.tree.max())}")
    if T and (bool((tt[1:] < tt[:-1]).any()) or int(tt.min()) < 0 or int(tt.max()) >= n_tenants):
        raise ValueError(f"partition.tree_tenant must be sorted tenant codes in [0, {n_tenants})")


# The progress bars of a run.
@contextmanager
def progress_bar(show: bool, total: int, desc: str, *, unit: str):
    """A tqdm bar of ``total`` ``unit`` while the block runs, or ``None`` when not ``show``."""
    if not show:
        yield None
        return
    bar = tqdm(total=total, desc=desc, unit=unit, leave=False)
    try:
        yield bar
    finally:
        bar.close()
