"""The paper's configuration for tests that check the method as the paper states it (mean
embeddings of the merged pair, no time or size terms, float32 vectors, no keys):
``CompressConfig()`` is the shipped preset, so such tests start from ``preset("paper")``."""
from __future__ import annotations

import dataclasses

from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig, TreeConfig

PAPER = CompressConfig.preset("paper")


def paper_partition(**kw) -> PartitionConfig:
    return dataclasses.replace(PAPER.partition, **kw)


def paper_tree(**kw) -> TreeConfig:
    return dataclasses.replace(PAPER.tree, **kw)


def paper_merge(**kw) -> MergeConfig:
    return dataclasses.replace(PAPER.merge, **kw)


def paper_config(*, partition: PartitionConfig | None = None, tree: TreeConfig | None = None,
                 merge: MergeConfig | None = None, **kw) -> CompressConfig:
    """The paper preset with the stage configs given replaced (``**kw``: CompressConfig's other fields)."""
    return dataclasses.replace(PAPER, partition=partition or PAPER.partition, tree=tree or PAPER.tree,
                               merge=merge or PAPER.merge, **kw)
