"""Which nodes may merge: the keep rule and the merge groups (``MergeConfig.keep_pattern``,
``MergeConfig.merge_within``), applied to the partition before the quotas.

- A node whose text matches ``keep_pattern`` never merges: it becomes a tree of its own
  (one node, nothing to remove), so it reaches the output as it came in, with its own sources.
  The ratio applies to the other nodes: a tenant loses ``round(ratio * (n_t - kept_t))``.
- With ``merge_within``, every tree is split by group (equal timestamp, or equal value of a
  metadata key), so two nodes of different groups are never in one tree and never merge.

Both are one relabelling of the partition's trees: no later stage (quotas, trees, plans,
merges) needs to know about them. Trees keep the tenant-major order the engine relies on.
"""
from __future__ import annotations

import io
import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import torch

from ..config import ConfigError
from .partition import Partition

__all__ = ["constrain", "kept_mask", "group_codes", "check_rules"]

log = logging.getLogger("memforest_gpu")


def check_rules(store, keep_pattern: str | None, merge_within: str | None) -> None:
    """Refuse a rule that selects no data, so that a typo cannot silently change a result:
    ``merge_within`` naming a metadata key no node has (the message lists the keys the nodes
    have), and ``keep_pattern`` matching every node (nothing could merge). Where only some
    nodes lack the key, a warning counts them: they form one group of their own."""
    if merge_within is not None and merge_within != "timestamp":
        absent = _metadata_values(store.columns()["metadata"], merge_within).null_count
        if absent == len(store):
            keys = _metadata_keys(store.columns()["metadata"])
            have = f"the nodes' metadata keys are {keys}" if keys else "no node has metadata"
            raise ConfigError("merge_within", f"must be 'timestamp' or a metadata key some node has, got "
                                              f"{merge_within!r}: {have}")
        if absent:
            log.warning("merge_within %r: %d of %d nodes have no value for it; they merge only among themselves",
                        merge_within, absent, len(store))
    if keep_pattern is not None:
        n = int(kept_mask(store.columns()["texts"], keep_pattern).sum())
        if n == len(store):
            raise ConfigError("keep_pattern", f"must leave some node free to merge, got {keep_pattern!r}, which "
                                              f"matches all {n} nodes (nothing could be merged)")


def _metadata_keys(meta, limit: int = 20) -> list[str]:
    """The keys of the nodes' metadata objects (the first ``limit``, sorted)."""
    keys: set[str] = set()
    for m in meta.to_pylist():
        if m:
            keys.update(json.loads(m))
    return sorted(keys)[:limit]


def constrain(part: Partition, store, keep_pattern: str | None, merge_within: str | None
              ) -> tuple[Partition, np.ndarray]:
    """The partition with kept nodes in one-node trees and every tree split by group, and the
    number of kept nodes per tenant. New trees are ordered by (old tree, group, kept node), so
    tenant-major order holds; a new tree keeps its old tree's centre when the centre is in it
    (else -1), and ``kmeans_tree`` becomes ``tree`` (the k-means labels were for the old trees).

    Shape: part.tree (N,) -> Partition with tree (N,), tree_tenant (T',); kept (n_tenants,) int64
    """
    n_ten = len(store.tenant_table)
    kept = np.zeros(n_ten, dtype=np.int64)
    if keep_pattern is None and merge_within is None:
        return part, kept
    dev = part.tree.device
    N = part.tree.shape[0]
    cols = [part.tree]
    if merge_within is not None:
        cols.append(torch.as_tensor(group_codes(store, merge_within), device=dev))
    if keep_pattern is not None:
        keep = kept_mask(store.columns()["texts"], keep_pattern)  # (N,) bool
        kept = np.bincount(store.tenant_codes_np[keep], minlength=n_ten).astype(np.int64)
        solo = np.where(keep, np.arange(1, N + 1), 0)  # kept node i is group i + 1 of its own
        cols.append(torch.as_tensor(solo, dtype=torch.int64, device=dev))
    key = torch.stack(cols, dim=1)  # (N, 2 or 3): old tree first, so trees stay tenant-major
    uniq, tree = torch.unique(key, dim=0, return_inverse=True)  # (T', c), (N,)
    old = uniq[:, 0]
    T = uniq.shape[0]
    c = part.centre[old]  # (T',) the old tree's centre node
    own = torch.full_like(c, -1)
    own[c >= 0] = tree[c[c >= 0]]  # the new tree that centre landed in
    centre = torch.where(own == torch.arange(T, device=dev), c, torch.full_like(c, -1))
    return Partition(tree, part.tree_tenant[old], centre, tree, part.iterations, part.moved), kept


def kept_mask(texts, pattern: str) -> np.ndarray:
    """Which texts match ``pattern`` (RE2, anywhere in the text), with one Arrow kernel.

    Shape: texts (N,) Arrow strings -> (N,) bool
    """

    return pc.match_substring_regex(texts, pattern).to_numpy(zero_copy_only=False).astype(bool)


def group_codes(store, key: str) -> np.ndarray:
    """A group code per node: equal codes for equal timestamps (``key="timestamp"``) or equal
    values of metadata ``key`` (nodes without it, or with null, share one code).

    Shape: -> (N,) int64
    """
    if key == "timestamp":
        return torch.unique(store.timestamps, return_inverse=True)[1].cpu().numpy()

    values = _metadata_values(store.columns()["metadata"], key)  # (N,) one Arrow type, nulls where absent
    codes = pc.dictionary_encode(values).indices.fill_null(-1)
    return codes.to_numpy(zero_copy_only=False).astype(np.int64) + 1  # null (absent) -> 0


def _metadata_values(meta, key: str):
    """Metadata ``key`` of every node, read by Arrow's JSON reader from the JSON texts at once
    (one line per node). The values must have one JSON type: strings, numbers or booleans.

    Shape: meta (N,) Arrow JSON strings -> (N,) Arrow array
    """

    meta = pc.if_else(pc.equal(pc.binary_length(meta), 0), "{}", meta.fill_null("{}")).cast(pa.large_string())
    off = np.frombuffer(meta.buffers()[1], dtype=np.int64)[meta.offset:meta.offset + len(meta) + 1]  # (N + 1,)
    data = np.frombuffer(meta.buffers()[2], dtype=np.uint8)[off[0]:off[-1]]
    lines = np.insert(data, off[1:-1] - off[0], ord("\n")).tobytes()  # json.dumps writes one line
    block = max(1 << 20, int(np.diff(off).max(initial=0)) + 2)
    for typ in (pa.int64(), pa.float64(), pa.string(), pa.bool_()):
        opts = pj.ParseOptions(explicit_schema=pa.schema([(key, typ)]), unexpected_field_behavior="ignore")
        try:
            table = pj.read_json(io.BytesIO(lines), read_options=pj.ReadOptions(block_size=block),
                                 parse_options=opts)
        except pa.ArrowInvalid:
            continue
        if table.num_rows == len(meta):
            return table.column(key).combine_chunks()
    raise ValueError(f"metadata values of merge_within={key!r} must be all strings, all numbers or all booleans "
                     "(or absent, or null), got a mix of types or nested values")
