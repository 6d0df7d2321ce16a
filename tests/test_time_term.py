"""The local-time term on tree edges (engine/edges.py time_weighted, issue 22): the bonus for neighbours
in time needs meaning too, so a store whose topics are interleaved at random in time still
merges memories of one topic."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from memforest_gpu.config import SpanningConfig, preset
from memforest_gpu.engine import compress
from memforest_gpu.engine.edges import time_weighted
from memforest_gpu.store.memory_store import MemoryStore


def _spanning(**kw) -> SpanningConfig:
    return SpanningConfig(time_weight=0.5, **kw)


def test_flat_is_the_old_formula_and_weight_zero_is_the_cosine():
    cos = torch.tensor([[-0.2, 0.0, 0.3], [0.9, 0.1, 0.5]], dtype=torch.float64)  # any shape
    gap = torch.tensor([[1, 2, 0], [1, 1, 5]])
    old = 0.5 * cos + 0.5 * (gap <= 1).to(cos.dtype)
    torch.testing.assert_close(time_weighted(cos, gap, _spanning(time_rule="flat")), old, rtol=0, atol=0)
    for rule in ("flat", "scaled", "gated"):
        assert time_weighted(cos, gap, SpanningConfig(time_weight=0.0, time_rule=rule)) is cos


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 4, 4)])
def test_rules_elementwise_on_any_shape(shape):
    g = torch.Generator().manual_seed(0)
    cos = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
    gap = torch.randint(0, 4, shape, generator=g)
    near = gap <= 2
    tw = 0.4
    scaled = time_weighted(cos, gap, SpanningConfig(time_weight=tw, time_window=2, time_rule="scaled"))
    torch.testing.assert_close(scaled, torch.where(near, (1 - tw) * cos + tw * cos.clamp(min=0), (1 - tw) * cos))
    gated = time_weighted(cos, gap, SpanningConfig(time_weight=tw, time_window=2, time_rule="gated", time_min_cos=0.25))
    torch.testing.assert_close(gated, (1 - tw) * cos + tw * (near & (cos >= 0.25)).to(cos.dtype))
    flat = time_weighted(cos, gap, SpanningConfig(time_weight=tw, time_window=2, time_rule="flat"))
    assert scaled.shape == gated.shape == shape and scaled.dtype == cos.dtype
    assert (scaled <= flat).all() and (gated <= flat).all()  # never more than the flat bonus
    assert torch.equal(scaled[~near], flat[~near]) and torch.equal(gated[~near], flat[~near])  # others untouched


def test_an_unrelated_neighbour_gets_no_bonus():
    cos = torch.tensor([0.02, 0.6])  # an unrelated neighbour; a related memory farther away
    gap = torch.tensor([1, 9])
    flat = time_weighted(cos, gap, _spanning(time_rule="flat"))
    assert flat[0] > flat[1]  # the 0/1 bonus: the unrelated neighbour merges first
    for spanning in (_spanning(time_rule="scaled"), _spanning(time_rule="gated", time_min_cos=0.3)):
        w = time_weighted(cos, gap, spanning)
        assert w[1] > w[0]


def test_config_checks_the_rule():
    with pytest.raises(ValueError, match=r"time_rule must be one of \['flat', 'scaled', 'gated'\], got 'soft'"):
        SpanningConfig(time_rule="soft")
    with pytest.raises(ValueError, match=r"time_min_cos must be in \[-1.0, 1.0\], got 2.0"):
        SpanningConfig(time_min_cos=2.0)


# --------------------------------------------------------------------------- a store of interleaved topics
N, TOPICS, DIM = 600, 40, 128


def interleaved_topics(noise: float = 1.0, seed: int = 0) -> tuple[MemoryStore, dict[str, int]]:
    """``N`` memories of ``TOPICS`` topics (equal shares) in random time order: topic centres
    are random unit vectors, a memory its centre plus Gaussian noise (norm ~``noise``),
    normalised. Within a topic the cosine is ~1/(1 + noise^2); across topics ~0. Returns the
    store and each id's topic."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((TOPICS, DIM))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    topic = rng.permutation(np.arange(N) % TOPICS)
    X = centres[topic] + noise * rng.standard_normal((N, DIM)) / np.sqrt(DIM)
    ids = [f"m{i}" for i in range(N)]
    store = MemoryStore.from_columns(ids=ids, texts=[f"Memory {i} is about topic {t}." for i, t in enumerate(topic)],
                                     timestamps=[60.0 * i for i in range(N)],
                                     embeddings=torch.tensor(X, dtype=torch.float32))
    return store, dict(zip(ids, topic.tolist()))


def single_topic_share(config, ratio: float, noise: float = 1.0) -> float:
    """The share of merged nodes (2+ sources) whose sources all hold one topic."""
    store, topic = interleaved_topics(noise)
    cfg = dataclasses.replace(config, merge=dataclasses.replace(config.merge, ratio=ratio))
    merged = [s for s in compress(store, cfg, device="cpu").store.sources if len(s) > 1]
    return sum(len({topic[x] for x in s}) == 1 for s in merged) / len(merged)


@pytest.mark.parametrize("ratio, least", [(0.3, 0.8), (0.5, 0.8), (0.7, 0.7)])
def test_default_preset_merges_one_topic_when_neighbours_in_time_are_unrelated(ratio, least):
    share = single_topic_share(preset("memforest"), ratio)
    assert share >= least, f"ratio {ratio}: {share:.1%} of merged nodes hold a single topic, want >= {least:.0%}"


def test_the_flat_bonus_merges_unrelated_neighbours():
    # the rule before issue 22, on the same store: the 0/1 bonus decides nearly every merge
    p = preset("memforest")
    flat = dataclasses.replace(p, spanning=dataclasses.replace(p.spanning, time_rule="flat"))
    assert single_topic_share(flat, 0.5) < 0.2
