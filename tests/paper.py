"""The paper's configuration for tests that check the method as the paper states it (mean
embeddings of the merged pair, no time or size terms, float32 vectors, no keys):
``CompressConfig()`` is the shipped preset, so such tests start from ``preset("paper")``."""
from __future__ import annotations

import dataclasses

from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig, SpanningConfig

PAPER = CompressConfig.preset("paper")


def paper_partition(**kw) -> PartitionConfig:
    return dataclasses.replace(PAPER.partition, **kw)


def paper_spanning(**kw) -> SpanningConfig:
    return dataclasses.replace(PAPER.spanning, **kw)


def paper_merge(**kw) -> MergeConfig:
    return dataclasses.replace(PAPER.merge, **kw)


def paper_config(*, partition: PartitionConfig | None = None, spanning: SpanningConfig | None = None,
                 merge: MergeConfig | None = None, **kw) -> CompressConfig:
    """The paper preset with the stage configs given replaced (``**kw``: CompressConfig's other fields)."""
    return dataclasses.replace(PAPER, partition=partition or PAPER.partition, spanning=spanning or PAPER.spanning,
                               merge=merge or PAPER.merge, **kw)
