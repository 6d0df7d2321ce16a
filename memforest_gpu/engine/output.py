"""The output of a run: the compressed store, its merges, its event trees, what a run returns.

Read top to bottom:

1. what a run returns (:class:`CompressResult`, :class:`DryRunResult`) and one merge
   (:class:`MergeRecord`);
2. the merges as columns over the node table (:class:`MergeLog`: five numbers a merge, a
   record made when read);
3. the output store (:func:`assemble`): the live nodes in order of their earliest original,
   and their keys (:func:`output_keys`);
4. the event trees recorded in the output (:func:`record_event_trees`) so that ``compact``
   can place new memories into the same trees later, and the lookups that follow rows
   through merges (:func:`rows_of_originals`, :func:`first_rows`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..config import MergeConfig, PartitionConfig
from ..kernels.blocks import stream_rows
from ..mergers.base import MergePair
from ..report import CompressReport
from ..store.event_trees import EventTrees, TenantTrees
from ..store.keys import NodeKeys
from ..store.memory_store import MemoryStore
from ..store.merged_keys import derive_keys, fold_keys
from .node_table import NodeTable, gather_rows
from .placement import tree_radius

__all__ = ["CompressReport", "CompressResult", "DryRunResult", "MergeRecord", "MergeLog", "RowNames", "assemble",
           "output_keys", "OutputKeys", "record_event_trees", "with_centres", "rows_of_originals", "first_rows",
           "partition_key", "first_sources"]


@dataclass
class CompressResult:
    store: MemoryStore
    report: CompressReport
    merges: Sequence[MergeRecord]  # every merge, in order (a run's: a MergeLog, engine/output.py)


@dataclass
class DryRunResult:
    """A dry run: the first round's merges (``into=None``) and the merger inputs they would
    make (``pairs``, aligned with ``merges``); ``requested``: the removals each tenant is
    asked for (the whole run's, not only the first round's)."""

    merges: list[MergeRecord]
    pairs: list[MergePair]
    report: CompressReport
    requested: dict = field(default_factory=dict)


# One record per merge: the run's log, the journal's replay key and the dry run share it.
@dataclass(frozen=True, slots=True)
class MergeRecord:
    """``a`` (older) and ``b`` (newer) merged into ``into`` in round ``round`` of tenant
    ``tenant``; ``similarity`` is the cosine of the two inputs. A dry run's records
    (:func:`memforest_gpu.engine.dry_run`) have ``into=None`` and ``text=None``. Slotted: a
    run keeps one per merge (88 bytes each instead of about 350 with an instance dict)."""

    round: int
    tenant: str
    a: str
    b: str
    similarity: float
    into: str | None = None
    text: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------
# A run's merges as columns: :class:`MergeLog`, a sequence of :class:`~.output.MergeRecord`.
#
# A run keeps one entry per merge (500,000 at 1M nodes, ratio 0.5). As Python objects each was a
# record plus fresh strings for the two inputs' ids and a float (about 250 bytes); here it is five
# numbers (round, the older, newer and merged rows of the run's node table, the similarity), and a
# record is made when it is read, from the table's own ids and texts (a block of records at a time
# when iterated). A log keeps only those columns of the table alive (:class:`RowNames`: not the
# input's vectors or texts, nor the table's numeric columns).
# ------------------------------------------------------------------------------

_READ_BLOCK = 4096  # records made at once when a log is iterated


class RowNames:
    """What a merge log reads of a run's node table: every row's id and tenant, merged rows'
    texts. The table's merged rows are appended to the same lists, so a later one reads the
    earlier rows the same."""

    def __init__(self, table: NodeTable):
        self.n, self.o_ids, self.m_ids, self.m_texts = table.n, table.ids.orig.arrow, table.m_ids, table.m_texts
        self.names, self.code = table.store.tenant_table, table.tenant.codes

    def ids_of(self, rows: np.ndarray) -> list[str]:
        return gather_rows(rows, self.n, self.o_ids, self.m_ids)

    def texts_of(self, rows: np.ndarray) -> list[str]:
        """Merged rows' texts (the table's own strings)."""
        return [self.m_texts[j] for j in (np.asarray(rows, dtype=np.int64) - self.n).tolist()]

    def tenant_of(self, rows: np.ndarray) -> list[str]:
        return [self.names[c] for c in self.code[rows].tolist()]


class MergeLog(Sequence):
    """Merges of a run's node table, in order, read as :class:`MergeRecord` s (``names``: the
    table's :class:`RowNames`).

    Shape: round, older, newer, into, similarity (P,): the round number, the older / newer input
    rows, the merged row (the table's rows) and the cosine of the two inputs
    """

    def __init__(self, names: RowNames, round: np.ndarray, older: np.ndarray, newer: np.ndarray, into: np.ndarray,
                 similarity: np.ndarray):
        P = len(older)
        cols = [np.asarray(round, dtype=np.int32), np.asarray(older, dtype=np.int64), np.asarray(newer, dtype=np.int64),
                np.asarray(into, dtype=np.int64), np.asarray(similarity, dtype=np.float64)]
        if any(c.shape != (P,) for c in cols):
            raise ValueError(f"a merge log's columns must all have shape ({P},), got {[c.shape for c in cols]}")
        self.names = names
        self.round, self.older, self.newer, self.into, self.similarity = cols

    @classmethod
    def of_round(cls, table: NodeTable, number: int, older: np.ndarray, newer: np.ndarray, into: np.ndarray,
                 sims) -> MergeLog:
        """One round's merges (all numbered ``number``) in ``table``."""
        return cls(RowNames(table), np.full(len(older), number, dtype=np.int32), older, newer, into,
                   np.asarray(sims, dtype=np.float64))

    @classmethod
    def concat(cls, table: NodeTable, logs: Sequence[MergeLog]) -> MergeLog:
        """The merges of ``logs`` (logs of ``table``, earlier rounds first), one after another."""
        cols = [np.concatenate([getattr(g, c) for g in logs]) if logs else np.zeros(0)
                for c in ("round", "older", "newer", "into", "similarity")]
        return cls(RowNames(table), *cols)

    def __len__(self) -> int:
        return len(self.older)

    def _records(self, sel) -> list[MergeRecord]:
        """The records at ``sel`` (a slice or host int array), their strings read in bulk."""
        t, older, newer, into = self.names, self.older[sel], self.newer[sel], self.into[sel]
        ten, ia, ib = t.tenant_of(older), t.ids_of(older), t.ids_of(newer)
        ids, texts = t.ids_of(into), t.texts_of(into)
        rnd, w = self.round[sel].tolist(), self.similarity[sel].tolist()
        return [MergeRecord(rnd[k], ten[k], ia[k], ib[k], w[k], ids[k], texts[k]) for k in range(len(ia))]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return MergeLog(self.names, self.round[i], self.older[i], self.newer[i], self.into[i], self.similarity[i])
        k = int(i)
        if not -len(self) <= k < len(self):
            raise IndexError(f"merge {i} of a log of {len(self)}")
        return self._records(np.array([k % len(self)]))[0]

    def __iter__(self) -> Iterator[MergeRecord]:
        for r0 in range(0, len(self), _READ_BLOCK):
            yield from self._records(slice(r0, r0 + _READ_BLOCK))

    def __eq__(self, other) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # a sequence compared by value

    def __reduce__(self):
        return list, (list(self),)  # pickled as the records themselves (the table does not travel)

    def __repr__(self) -> str:
        return f"MergeLog({len(self)} merges)"


# ------------------------------------------------------------------------------
# The output store: the live nodes of a run, in order of their earliest original, and their
# keys (:func:`output_keys`, at the end).
# ------------------------------------------------------------------------------

def assemble(table: NodeTable, live: np.ndarray, embeddings: torch.Tensor,
             merged: torch.Tensor | list[torch.Tensor] | None, *, in_place: bool = False, chunk: int = 1 << 16
             ) -> MemoryStore:
    """Rows ``live`` of the table as a store. Row ``i < N`` is an original (vector
    ``embeddings[i]``), row ``N + j`` the j-th merged node (vector ``merged[j]``); the full
    (N + M, D) concatenation is never built. ``merged`` may be a list of blocks (one per
    round, in order): each is read once and released from the list, so neither their
    concatenation nor the dead merged vectors outlive their block.

    ``in_place``: the output's vectors are written into ``embeddings`` itself (overwritten;
    the output's are its first rows), so no second (N_out, D) tensor is made. That is safe
    in one forward pass: a live original's output position is at most its row (the rows
    before it in the output each hold a distinct earlier original), so moving the originals
    ``chunk`` rows at a time in output order never overwrites a row still to be read, and the
    merged vectors are written after every original has moved.

    ``merged=None``: every live row's vector is already in ``embeddings``, at the row of its
    earliest original (a run that reused the dead rows, :meth:`~.node_vectors.NodeVectors.put`); the
    same forward pass moves them all (output position <= that row).

    Shape: live (N + M,) bool host, embeddings (N, D), merged (M, D) or [(P_r, D)] or None ->
           store of live.sum() rows
    """
    N, D = embeddings.shape
    rows = table.output_order(np.flatnonzero(live))
    dev = embeddings.device
    if merged is None:
        if not in_place:
            raise ValueError("merged=None reads every vector from embeddings: in place only")
        src = table.first[rows]  # output order is by it: position i <= src[i]
        assert (np.arange(len(rows)) <= src).all(), "a live row's output position must not pass its row"
        move = np.flatnonzero(np.arange(len(rows)) != src)
        _copy_rows(embeddings, move, embeddings, src[move], chunk)
        return table.to_store(rows, embeddings[:len(rows)])
    out = embeddings[:len(rows)] if in_place else torch.empty(len(rows), D, dtype=embeddings.dtype, device=dev)
    orig = rows < N
    pos_o, pos_m = np.flatnonzero(orig), np.flatnonzero(~orig)
    src_o = rows[orig]
    if in_place:
        assert (pos_o <= src_o).all(), "a live original's output position must not pass its row"
        move = np.flatnonzero(pos_o != src_o)  # originals before the first merge stay where they are
        _copy_rows(out, pos_o[move], embeddings, src_o[move], chunk)  # gathered, then written: sources >= targets
    else:
        _copy_rows(out, pos_o, embeddings, src_o, chunk)
    blocks = merged if isinstance(merged, list) else [merged]
    j_m = rows[~orig] - N  # merged index of each merged output row
    lo = 0
    for b in range(len(blocks)):
        blk = blocks[b]
        hi = lo + int(blk.shape[0])
        sel = np.flatnonzero((j_m >= lo) & (j_m < hi))
        _copy_rows(out, pos_m[sel], blk, j_m[sel] - lo, chunk)
        if isinstance(merged, list):
            blocks[b] = None  # release the block
        lo = hi
    return table.to_store(rows, out)


def _copy_rows(out: torch.Tensor, at: np.ndarray, src: torch.Tensor, rows: np.ndarray, chunk: int) -> None:
    """``out[at] = src[rows]``, at most ``chunk`` rows at a time (no full-size gathered copy; a
    cache-sized block on the CPU), in order: each block is gathered, then written.
    Shape: at, rows (R,) host int, src (S, D) -> writes R rows of out (N, D)"""
    dev = out.device
    chunk = min(chunk, stream_rows(dev, 2 * out.shape[1] * out.element_size(), at_least=1 << 10))
    for c in range(0, len(at), chunk):
        idx = torch.as_tensor(rows[c:c + chunk], dtype=torch.int64, device=src.device)
        out.index_copy_(0, torch.as_tensor(at[c:c + chunk], dtype=torch.int64, device=dev),
                        src.index_select(0, idx).to(device=dev, dtype=out.dtype))


# The output step's keys: what each output node is searched by besides its text's vector
# (:mod:`memforest_gpu.store.keys`), made from the run's input store when ``merge.keys`` asks for
# them (:func:`~memforest_gpu.store.merged_keys.derive_keys`).
class OutputKeys:
    """Keys made before the output is assembled (assembling may overwrite the input's vectors),
    attached to it after; ``fold``: blended into the nodes' own vectors instead, one vector per
    node (:func:`~memforest_gpu.store.merged_keys.fold_keys`)."""

    def __init__(self, keys: NodeKeys | None, vectors: str = "float32", fold: bool = False):
        self.keys = keys
        self.vectors = vectors
        self.fold = fold

    def attach(self, out: MemoryStore) -> MemoryStore:
        if self.keys is not None:
            out.keys = self.keys.to(out.device)
            if self.fold:
                fold_keys(out, out.keys)
        out.vector_codes = self.vectors  # how its file holds the vectors (store/codes.py)
        return out


def output_keys(store: MemoryStore, table, live: np.ndarray, merge: MergeConfig, saved=None) -> OutputKeys:
    """The keys of the live rows of a run's node table (in output order), or none when
    ``merge.keys`` is 0. ``table``: the run's :class:`~.node_table.NodeTable`. ``saved``: the
    int8 codes of input rows whose vectors the run overwrote
    (:meth:`~.node_vectors.NodeVectors.put`)."""
    if merge.keys == 0:
        return OutputKeys(None, merge.vectors)
    out_sources = table.sources_arrow(table.output_order(np.flatnonzero(live)))
    return OutputKeys(derive_keys(store, out_sources, max_keys=merge.max_keys, text_weight=merge.text_weight,
                                  codes=merge.vectors, saved=saved), merge.vectors, fold=merge.folds)


# ------------------------------------------------------------------------------
# Recording a store's event trees (:class:`~memforest_gpu.store.event_trees.EventTrees`) and
# finding
# them again: which row holds an original id, and which input row each output row starts at.
#
# :func:`record_event_trees` is what :func:`~memforest_gpu.engine.compress` writes into its output
# so that ``compact`` can place new memories into the same trees later; :mod:`.compact` uses
# the two lookups to follow trees and centres through merges.
# ------------------------------------------------------------------------------

def partition_key(cfg: PartitionConfig) -> dict:
    """The partition config fields the event trees record (a tenant whose trees were built with
    other values is partitioned again at its next compaction)."""
    return dataclasses.asdict(cfg)


def first_sources(store: MemoryStore, rows: np.ndarray) -> list[str]:
    """The first original id of each of ``rows``: the key the event trees name a centre node by."""

    if len(rows) == 0:
        return []
    return pc.list_element(store.sources.arrow.take(pa.array(np.asarray(rows, dtype=np.int64))), 0).to_pylist()


def rows_of_originals(store: MemoryStore, ids) -> np.ndarray:
    """The row whose ``sources`` hold each id (-1: none); ``ids`` a list or Arrow array of
    strings. Shape: ids (M,) -> (M,) int64"""

    if len(ids) == 0:
        return np.zeros(0, dtype=np.int64)
    ids = ids.cast(pa.large_string()) if isinstance(ids, pa.Array) else pa.array(list(ids), type=pa.large_string())
    # the hash table is over the ids asked (often a few thousand tree centres), not over every
    # source of the store: each source looks itself up among the distinct ids
    enc = pc.dictionary_encode(ids)  # the distinct ids, and each id's place among them, in one pass
    uniq = enc.dictionary
    src = store.sources.arrow
    hit = pc.index_in(src.flatten().cast(pa.large_string()), value_set=uniq).fill_null(-1)
    hit = hit.to_numpy(zero_copy_only=False).astype(np.int64)
    parent = pc.list_parent_indices(src).to_numpy(zero_copy_only=False).astype(np.int64)
    found = np.flatnonzero(hit >= 0)
    u, first = np.unique(hit[found], return_index=True)  # a source held twice: its first row
    row = np.full(len(uniq), -1, dtype=np.int64)
    row[u] = parent[found[first]]
    return row[enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)]


def first_rows(inp: MemoryStore, out: MemoryStore) -> np.ndarray:
    """For each row of ``out`` (a compression of ``inp``), the smallest ``inp`` row it holds.
    Shape: -> (len(out),) int64"""

    src = out.sources.arrow
    if len(out) == 0:
        return np.zeros(0, dtype=np.int64)
    rows = rows_of_originals(inp, src.flatten())
    parent = pc.list_parent_indices(src).to_numpy(zero_copy_only=False).astype(np.int64)
    first = np.full(len(out), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, parent, rows)
    return first


def with_centres(inp: MemoryStore, tree: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """``centre`` with every tree that has none (-1: the keep rule or ``merge_within`` split
    it off its k-means tree, engine/partition.py) given the member nearest its mean, as
    compaction does for a tree whose centre is gone. Call it before an output overwrites the
    input's vectors in place. Shape: tree (N,), centre (T,) -> (T,)"""

    lost = centre < 0
    if not lost.any():
        return centre
    rows = np.nonzero(lost[tree])[0]  # (M,) the members of those trees
    t = torch.as_tensor(tree[rows], dtype=torch.int64)
    x = inp.embeddings[torch.as_tensor(rows)].cpu().float()  # (M, D)
    mean = torch.zeros(len(centre), x.shape[1]).index_put_((t,), x, accumulate=True)  # (T, D): the direction
    score = (x * mean[t]).sum(1).numpy()  # (M,)
    order = np.lexsort((rows, -score, tree[rows]))  # by tree, best score first, lowest row on ties
    first = np.ones(len(order), dtype=bool)
    first[1:] = tree[rows][order][1:] != tree[rows][order][:-1]
    out = centre.copy()
    out[tree[rows][order][first]] = rows[order][first]
    return out


def record_event_trees(out: MemoryStore, inp: MemoryStore, tree: np.ndarray, tree_tenant: np.ndarray,
                  centre: np.ndarray, firsts: np.ndarray, names: list[str], cfg: PartitionConfig) -> MemoryStore:
    """``out`` with the event trees of a full partition of ``inp``: each output row in the tree of
    its first input row, tenant-local ids (trees are tenant-major), each tree's centre by the
    first original id of its centre node, and each tree's radius.

    Shape: tree (N_in,) global tree ids, tree_tenant (T,) sorted codes into ``names``,
    centre (T,) input rows, firsts (N_out,) input rows
    """

    T = len(tree_tenant)
    start = np.searchsorted(tree_tenant, np.arange(len(names)), side="left")  # first tree of each tenant
    local = np.arange(T, dtype=np.int64) - start[tree_tenant]
    gtree = tree[firsts] if len(firsts) else np.zeros(0, dtype=np.int64)
    ids = first_sources(inp, centre)
    dev = out.device
    rad = tree_radius(out.embeddings, torch.as_tensor(gtree, dtype=torch.int64, device=dev),
                      torch.as_tensor(rows_of_originals(out, ids), dtype=torch.int64, device=dev))
    rad = rad.cpu().numpy().astype(np.float32).tolist()
    sizes = np.bincount(inp.tenant_codes_np, minlength=len(names))
    key = partition_key(cfg)
    tenants = {}
    for c in np.unique(tree_tenant).tolist():
        lo = int(start[c])
        hi = int(np.searchsorted(tree_tenant, c, side="right"))
        tenants[names[c]] = TenantTrees(ids[lo:hi], int(sizes[c]), 0, key, rad[lo:hi])
    row_tree = local[gtree]
    out.event_trees = EventTrees(row_tree.astype(np.int64), tenants)
    return out
