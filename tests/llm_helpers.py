"""Shared by the real-model merger tests: a trivially mergeable pair and a spy on what the
model returned and what the validator judged."""
from __future__ import annotations

from memforest_gpu.mergers import llm as llm_module
from memforest_gpu.mergers.base import MemoryItem, MergePair

T0 = 1683554160.0  # 8 May 2023


def trivial_pair() -> MergePair:
    """Two near-identical one-line facts: any working model merges them."""
    return MergePair(MemoryItem("x1", "Bob has two dogs named Rex and Max.", T0),
                     MemoryItem("x2", "Bob has two dogs, Rex and Max.", T0 + 60.0), "t")


def spy_raw_and_judged(monkeypatch, merger) -> tuple[list, list]:
    """Record the merger's raw generations and every text the validator judges."""
    raw, judged = [], []
    real_generate = merger._generate
    monkeypatch.setattr(merger, "_generate", lambda convs: raw.extend(out := real_generate(convs)) or out)
    real_check = llm_module.check_merge
    monkeypatch.setattr(llm_module, "check_merge",
                        lambda text, p, slack=12: judged.append(text) or real_check(text, p, slack))
    return raw, judged
