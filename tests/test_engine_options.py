"""Tests for memforest_gpu.engine.compress: the merger protocol and its failures, on_round,
config validation and the ablation switches (invariants: tests/test_engine.py)."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
import pytest
from engine_helpers import (  # noqa: F401 (pytest fixtures: used by name)
    RecordingMerger,
    _one_thread,
    _round_sizes,  # noqa: F401
    build_store,
    cfg_of,
    check_invariants,
    run,
    same_output,
    small_store,
)

from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig, RetrievalConfig, SpanningConfig
from memforest_gpu.engine.memory import MemoryPlan
from memforest_gpu.mergers.extractive import ExtractiveMerger


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_merger_called_once_per_round_with_all_pairs(small_store, schedule):
    m = RecordingMerger()
    res = run(small_store, cfg_of(0.5, schedule), merger=m)
    check_invariants(small_store, res, 0.5)
    assert len(m.calls) == res.report.rounds
    assert [len(c) for c in m.calls] == _round_sizes(res)
    assert res.report.merger == "recording" and res.report.fallbacks == 0
    tenant = dict(zip(small_store.ids, small_store.tenants))
    by_round = defaultdict(list)
    for rec in res.merges:
        by_round[rec.round].append((rec.a, rec.b))
    for r, call in enumerate(m.calls, start=1):
        assert [(p.older.id, p.newer.id) for p in call] == by_round[r]
        for p in call:
            assert p.older.timestamp <= p.newer.timestamp
            assert p.tenant in tenant.values()
    # the merged texts are the merger's
    merged_texts = {f"{p.older.text} + {p.newer.text}" for c in m.calls for p in c}
    for text, src in zip(res.store.texts, res.store.sources):
        if len(src) > 1:
            assert text in merged_texts


def test_merge_pairs_are_older_first_and_single_tenant(small_store):
    m = RecordingMerger()
    res = run(small_store, cfg_of(0.5), merger=m)
    tenant_of = dict(zip(small_store.ids, small_store.tenants))
    for rec in res.merges:
        tenant_of[rec.into] = rec.tenant
    for call in m.calls:
        for p in call:
            assert tenant_of[p.older.id] == tenant_of[p.newer.id] == p.tenant
            assert p.older.timestamp <= p.newer.timestamp


def _raise(pairs):
    raise RuntimeError("LLM backend down")


def _some_empty(pairs):
    return ["" if j % 2 == 0 else f"{p.older.text} | {p.newer.text}" for j, p in enumerate(pairs)]


def _some_bad(pairs):
    return [None if j % 3 == 0 else ("   " if j % 3 == 1 else p.newer.text + " " + p.older.text)
            for j, p in enumerate(pairs)]


def _one_short(pairs):
    return [p.older.text for p in pairs][:-1]


def _one_long(pairs):
    return [p.older.text for p in pairs] + ["extra"]


@pytest.mark.parametrize("fn, whole_batch", [(_raise, True), (_some_empty, False), (_some_bad, False),
                                             (_one_short, True), (_one_long, True)],
                         ids=["raises", "empty", "none-or-blank", "too-few", "too-many"])
@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_merger_robustness(small_store, fn, whole_batch, schedule):
    m = RecordingMerger(fn)
    res = run(small_store, cfg_of(0.5, schedule), merger=m)
    check_invariants(small_store, res, 0.5)
    assert res.report.fallbacks > 0
    assert len(m.calls) == res.report.rounds
    assert [len(c) for c in m.calls] == _round_sizes(res)
    if whole_batch:
        assert res.report.fallbacks == res.report.merges
        # every text then comes from the extractive merger: same output as the default merger
        ref = run(small_store, cfg_of(0.5, schedule))
        assert same_output(res.store, ref.store)
    else:
        expect = sum(len(c) - len([t for t in fn(c) if isinstance(t, str) and t.strip()]) for c in m.calls)
        assert res.report.fallbacks == expect


def test_extractive_merger_errors_are_not_swallowed(small_store):
    class Broken(ExtractiveMerger):
        def merge(self, pairs):
            raise RuntimeError("boom")

    # a custom merger gets an extractive fallback; a failure of the fallback itself surfaces
    with pytest.raises(RuntimeError, match="boom"):
        run(small_store, cfg_of(0.5), merger=Broken())


# --------------------------------------------------------------------------- on_round
@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_on_round(small_store, schedule):
    seen = []
    res = run(small_store, cfg_of(0.5, schedule), on_round=lambda r, merges: seen.append((r, list(merges))))
    assert [r for r, _ in seen] == list(range(1, res.report.rounds + 1))
    assert [m for _, ms in seen for m in ms] == res.merges
    assert all(ms and all(m.round == r for m in ms) for r, ms in seen)


def test_nothing_to_merge():
    st = build_store([1, 1, 1], dim=16, seed=4)
    calls = []
    res = run(st, cfg_of(0.5), on_round=lambda r, m: calls.append(r))
    assert res.report.rounds == 0 and res.report.merges == 0 and calls == []
    assert same_output(res.store, st)
    assert res.report.shortfall == 3


def test_token_cap_below_every_text(small_store):
    """No merge fits (cap policy "strict"): nothing is merged, every tenant reports its whole
    target as shortfall."""
    res = run(small_store, cfg_of(0.5, max_node_tokens=1, cap_policy="strict"))
    check_invariants(small_store, res, 0.5, capped=True)
    assert res.report.merges == 0 and res.report.rounds == 0
    assert all(r["shortfall"] == r["requested"] for r in res.report.tenants)
    assert same_output(res.store, small_store)


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_memory_budget_does_not_change_the_result(small_store, schedule):
    """Small ``tile_elements`` tile the large tensor ops; the result must not move."""
    ref = run(small_store, cfg_of(0.5, schedule))
    tiled = run(small_store, cfg_of(0.5, schedule), memory=MemoryPlan(tile_elements=1 << 10))
    assert same_output(ref.store, tiled.store)


def test_progress_bars(small_store):
    ref = run(small_store, cfg_of(0.5))
    res = run(small_store, cfg_of(0.5), progress=True)
    assert same_output(ref.store, res.store)


# --------------------------------------------------------------------------- config validation
@pytest.mark.parametrize("ratio", [0, 1, 1.5, -0.1, 0.0, 1.0])
def test_bad_ratio(ratio):
    with pytest.raises(ValueError, match="ratio") as e:
        MergeConfig(ratio=ratio)
    assert repr(ratio) in str(e.value)


@pytest.mark.parametrize("ratio", [float("nan"), float("inf"), "0.5", None, True])
def test_ratio_must_be_a_number(ratio):
    with pytest.raises(ValueError, match="ratio"):
        MergeConfig(ratio=ratio)


@pytest.mark.parametrize("make, name, value", [
    (lambda: PartitionConfig(alpha=-0.1), "alpha", -0.1),
    (lambda: PartitionConfig(alpha=1.5), "alpha", 1.5),
    (lambda: PartitionConfig(beta=-0.1), "beta", -0.1),
    (lambda: PartitionConfig(beta=1.1), "beta", 1.1),
    (lambda: PartitionConfig(window=-1), "window", -1),
    (lambda: PartitionConfig(max_iter=0), "max_iter", 0),
    (lambda: PartitionConfig(seed=-1), "seed", -1),
    (lambda: SpanningConfig(eta=2), "eta", 2),
    (lambda: SpanningConfig(eta=-0.5), "eta", -0.5),
    (lambda: RetrievalConfig(gamma=1.5), "gamma", 1.5),
    (lambda: RetrievalConfig(k=0), "k", 0),
    (lambda: RetrievalConfig(L=0), "L", 0),
    (lambda: RetrievalConfig(lam=-0.2), "lam", -0.2),
    (lambda: MergeConfig(max_node_tokens=0), "max_node_tokens", 0),
    (lambda: MergeConfig(seed=-3), "seed", -3),
])
def test_bad_values(make, name, value):
    with pytest.raises(ValueError) as e:
        make()
    msg = str(e.value)
    assert name in msg and repr(value) in msg


def test_unknown_schedule():
    with pytest.raises(ValueError) as e:
        MergeConfig(schedule="parallel")
    msg = str(e.value)
    assert "'parallel'" in msg and "sequential" in msg and "matching" in msg


def test_unknown_degree_norm_and_kind():
    with pytest.raises(ValueError) as e:
        SpanningConfig(degree_norm="sum")
    assert "'sum'" in str(e.value) and "none" in str(e.value) and "max" in str(e.value)
    with pytest.raises(ValueError) as e:
        SpanningConfig(kind="maximum")
    assert "'maximum'" in str(e.value) and "random" in str(e.value)


def test_compress_config_checks_types():
    with pytest.raises(ValueError, match="merge"):
        CompressConfig(merge=SpanningConfig())
    with pytest.raises(ValueError, match="partition"):
        CompressConfig(partition={"alpha": 0.1})


def test_the_spanning_stage_keeps_its_old_names_for_one_release():
    """``TreeConfig`` and ``CompressConfig(tree=...)`` (the names before the spanning stage was
    renamed) still work, with a DeprecationWarning; a record saved with ``"tree"`` reads the same."""
    import memforest_gpu
    from memforest_gpu import config
    from memforest_gpu.config import config_from_record, config_record

    with pytest.warns(DeprecationWarning, match="TreeConfig is renamed SpanningConfig"):
        assert config.TreeConfig is SpanningConfig
    vars(memforest_gpu).pop("TreeConfig", None)  # the package keeps a name once it is used
    with pytest.warns(DeprecationWarning, match="TreeConfig is renamed SpanningConfig"):
        assert memforest_gpu.TreeConfig is SpanningConfig
    with pytest.warns(DeprecationWarning, match=r"CompressConfig\(tree=...\) is renamed"):
        old = CompressConfig(tree=SpanningConfig(kind="min"))
    assert old == CompressConfig(spanning=SpanningConfig(kind="min"))
    with pytest.raises(TypeError, match="both"):
        CompressConfig(tree=SpanningConfig(), spanning=SpanningConfig())
    with pytest.raises(TypeError, match="unexpected keyword argument 'trees'"):
        CompressConfig(trees=SpanningConfig())
    rec = config_record(old)
    assert list(rec) == ["partition", "spanning", "merge"] and config_from_record(rec) == old
    rec["tree"] = rec.pop("spanning")
    assert config_from_record(rec) == old
    assert "tree" not in dir(CompressConfig()) and "TreeConfig" not in memforest_gpu.__all__


def test_configs_are_frozen():
    c = MergeConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.ratio = 0.9  # type: ignore[misc]


# --------------------------------------------------------------------------- ablations
ABLATIONS = {
    "min-spanning": CompressConfig(spanning=SpanningConfig(kind="min")),
    "random-order": CompressConfig(spanning=SpanningConfig(kind="random")),
    "degree-max": CompressConfig(spanning=SpanningConfig(degree_norm="max", eta=0.9)),
    "no-degree": CompressConfig(spanning=SpanningConfig(eta=1.0)),
    "no-semantic": CompressConfig(partition=PartitionConfig(use_semantic=False)),
    "no-temporal": CompressConfig(partition=PartitionConfig(use_temporal=False)),
    "neither": CompressConfig(partition=PartitionConfig(use_semantic=False, use_temporal=False)),
    "one-cluster": CompressConfig(partition=PartitionConfig(alpha=1e-6)),
    "all-clusters": CompressConfig(partition=PartitionConfig(alpha=1.0)),
}


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
@pytest.mark.parametrize("name", list(ABLATIONS))
def test_ablations_keep_invariants(small_store, name, schedule):
    base = ABLATIONS[name]
    cfg = CompressConfig(partition=base.partition, spanning=base.spanning,
                         merge=MergeConfig(ratio=0.6, schedule=schedule))
    res = run(small_store, cfg)
    check_invariants(small_store, res, 0.6)
    if name == "all-clusters":  # every node its own tree: nothing can merge
        assert res.report.merges == 0
    if name == "one-cluster":
        assert res.report.trees == len(small_store.tenant_names())


def test_ablations_change_the_result(small_store):
    ref = sorted(map(sorted, run(small_store, cfg_of(0.5)).store.sources))
    for name in ("min-spanning", "random-order", "no-temporal"):
        base = ABLATIONS[name]
        cfg = CompressConfig(partition=base.partition, spanning=base.spanning, merge=MergeConfig(ratio=0.5))
        assert sorted(map(sorted, run(small_store, cfg).store.sources)) != ref, name


def test_random_order_is_seeded(small_store):
    def go(seed):
        cfg = CompressConfig(spanning=SpanningConfig(kind="random"), merge=MergeConfig(ratio=0.5, seed=seed))
        return run(small_store, cfg).store

    a, b, c = go(0), go(0), go(7)
    assert same_output(a, b)
    assert sorted(map(sorted, a.sources)) != sorted(map(sorted, c.sources))


def test_min_spanning_merges_dissimilar_pairs(small_store):
    """The minimum spanning tree ablation merges far less similar pairs than the maximum one."""
    sim = lambda res: np.mean([m.similarity for m in res.merges])  # noqa: E731
    mx = run(small_store, cfg_of(0.3))
    mn = run(small_store, CompressConfig(spanning=SpanningConfig(kind="min"), merge=MergeConfig(ratio=0.3)))
    assert sim(mn) < sim(mx)
