"""The node cap's two policies (MergeConfig.cap_policy): "condense" reaches the ratio on long
memories by cutting merges to the cap; "strict" leaves pairs over the cap unmerged. Also the
LoCoMo long-memory variant (windows of turns) the policies are measured on."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from engine_helpers import check_invariants, run

from memforest_gpu.cli.flags import add_config_arguments, config_from_args
from memforest_gpu.cli.report_text import format_report
from memforest_gpu.config import CompressConfig, MergeConfig, SpanningConfig
from memforest_gpu.engine.merge_call import merge_texts
from memforest_gpu.evaluation.locomo import load_locomo
from memforest_gpu.mergers.base import MemoryItem, MergePair
from memforest_gpu.mergers.embedders import count_words
from memforest_gpu.mergers.extractive import ExtractiveMerger
from memforest_gpu.store.memory_store import MemoryStore

DAY = 86400.0
CAP = 40
NAMES = "Alice Bruno Chen Dana Emil Fatima".split()
WORDS = "garden recipe concert project ticket bicycle painting harbour museum lecture".split()


def long_store(seed=0, n=(30, 24), dim=16) -> MemoryStore:
    """Texts of 3-4 sentences (22-40 words), each over half the cap: under "strict" no two fit."""
    rng = np.random.default_rng(seed)
    ids, texts, ts, ten = [], [], [], []
    for t, size in zip(("ann", "ben"), n):
        for i in range(size):
            w = rng.choice(WORDS, 6)
            sents = [f"{rng.choice(NAMES)} talked about the {w[0]} and the {w[1]} on day {i}.",
                     f"It was about the {w[2]} near the {w[3]} again.",
                     f"They liked the {w[4]} more than the {w[5]} this time."]
            if i % 3 == 0:
                sents.append("Nothing else was said.")
            texts.append(" ".join(sents))
            ids.append(f"{t}{i}")
            ts.append(1.68e9 + DAY * float(i // 4) + 60.0 * i)
            ten.append(t)
    emb = rng.standard_normal((len(ids), dim)).astype(np.float32)
    return MemoryStore.from_columns(ids=ids, texts=texts, timestamps=ts, embeddings=emb, tenants=ten)


def cfg(policy, ratio=0.5, schedule="sequential", **spanning):
    return CompressConfig(spanning=SpanningConfig(**spanning),
                          merge=MergeConfig(ratio=ratio, schedule=schedule, max_node_tokens=CAP, cap_policy=policy))


def test_default_is_condense_and_bad_policy_is_named():
    assert MergeConfig().cap_policy == "condense"
    with pytest.raises(ValueError, match=r"cap_policy must be one of \['condense', 'strict', 'keep'\], got 'loose'"):
        MergeConfig(cap_policy="loose")
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    assert config_from_args(p.parse_args(["--cap-policy", "strict"])).merge.cap_policy == "strict"
    assert config_from_args(p.parse_args([])).merge.cap_policy == "condense"
    with pytest.raises(ValueError, match="^--cap-policy must be one of"):
        config_from_args(p.parse_args(["--cap-policy", "loose"]))


def test_strict_falls_short_on_long_memories():
    st = long_store()
    assert min(count_words(st.texts)) * 2 > CAP
    res = run(st, cfg("strict"))
    check_invariants(st, res, 0.5, capped=True)
    assert res.report.merges == 0 and res.report.shortfall == sum(r["requested"] for r in res.report.tenants)
    assert res.report.condensed == 0 and res.report.condensed_tokens == 0


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
@pytest.mark.parametrize("ratio", [0.3, 0.7])
def test_condense_reaches_the_ratio_within_the_cap(ratio, schedule):
    st = long_store(seed=1)
    res = run(st, cfg("condense", ratio, schedule, size_weight=0.2))
    check_invariants(st, res, ratio)  # not capped: a tenant falls short only when its trees are single nodes
    rep = res.report
    assert rep.shortfall == 0
    assert rep.merges == sum(r["requested"] for r in rep.tenants) > 0
    originals = dict(zip(st.ids, count_words(st.texts)))
    for text, src, n in zip(res.store.texts, res.store.sources, count_words(res.store.texts)):
        assert text.strip()
        if len(src) > 1:
            assert n <= CAP, text  # every merged node fits the cap
        else:
            assert n == originals[src[0]]
    assert 0 < rep.condensed <= rep.merges and rep.condensed_tokens > 0
    assert rep.fallbacks == 0  # condensing the extractive merger's own text is no fallback
    assert f"{rep.condensed} merges condensed to the cap ({rep.condensed_tokens} tokens dropped" in format_report(rep)
    again = run(st, cfg("condense", ratio, schedule, size_weight=0.2))  # deterministic
    assert again.store.texts == res.store.texts and again.store.ids == res.store.ids


def test_condense_tenants_stay_isolated():
    """A tenant's condensed result does not depend on the other tenants."""
    st = long_store(seed=2)
    both = run(st, cfg("condense", 0.5))
    keep = [j for j, t in enumerate(st.tenants) if t == "ben"]
    alone = run(MemoryStore.from_columns(ids=[st.ids[j] for j in keep], texts=[st.texts[j] for j in keep],
                                         timestamps=st.timestamps[keep].tolist(),
                                         embeddings=st.embeddings[keep].numpy(), tenants=["ben"] * len(keep)),
                cfg("condense", 0.5))
    got = sorted((t, tuple(s)) for t, s, ten in zip(both.store.texts, both.store.sources, both.store.tenants)
                 if ten == "ben")
    assert got == sorted((t, tuple(s)) for t, s in zip(alone.store.texts, alone.store.sources))


def _pairs(seed=3, n=6):
    st = long_store(seed=seed, n=(n * 2, 0))
    items = [MemoryItem(i, t, float(ts)) for i, t, ts in zip(st.ids, st.texts, st.timestamps.tolist())]
    return [MergePair(items[2 * k], items[2 * k + 1]) for k in range(n)]


def test_merge_texts_reports_dropped_tokens():
    ex = ExtractiveMerger()
    pairs = _pairs()
    full = count_words(ex.merge(pairs))
    texts, tokens, n_fb, dropped = merge_texts(ex, ex, pairs, counter=count_words, cap=CAP,
                                               cap_policy="condense")
    assert n_fb == 0 and tokens == count_words(texts) and max(tokens) <= CAP
    assert dropped == [f - t for f, t in zip(full, tokens)] and all(d > 0 for d in dropped)
    # strict (the default): the full merges, untouched
    strict = merge_texts(ex, ex, pairs, counter=count_words, cap=CAP, cap_policy="strict")
    assert strict.texts == ex.merge(pairs) and strict.dropped == [0] * len(pairs)
    assert merge_texts(ex, ex, pairs, counter=count_words, cap=CAP) == strict
    with pytest.raises(ValueError, match="cap_policy must be one of"):
        merge_texts(ex, ex, pairs, counter=count_words, cap=CAP, cap_policy="x")


def test_condense_with_another_merger():
    """An LLM-like merger's over-cap or empty texts are replaced by the condensed extractive
    merge (fallbacks); a journal around the extractive merger is not a fallback."""

    class Verbose:
        name = "verbose"

        def merge(self, pairs):
            return ["" if k == 1 else ("short." if k == 2 else (p.older.text + " " + p.newer.text) * 2)
                    for k, p in enumerate(pairs)]

    class Journal:  # the shape of journal.JournaledMerger: unwrap() (the Merger hook) gives the real merger
        name = "extractive"

        def __init__(self):
            self.inner = ExtractiveMerger()

        def merge(self, pairs):
            return self.inner.merge(pairs)

        def unwrap(self):
            return self.inner

    ex = ExtractiveMerger()
    pairs = _pairs(n=4)
    texts, tokens, n_fb, dropped = merge_texts(Verbose(), ex, pairs, counter=count_words, cap=CAP,
                                                      cap_policy="condense")
    assert texts[2] == "short." and dropped[2] == 0
    assert n_fb == 3 and max(tokens) <= CAP
    assert [texts[j] for j in (0, 1, 3)] == ex.condense([pairs[j] for j in (0, 1, 3)], CAP, count_words)[0]
    j = merge_texts(Journal(), ex, pairs, counter=count_words, cap=CAP, cap_policy="condense")
    assert j.fallbacks == 0 and j.texts == ex.condense(pairs, CAP, count_words)[0]


def test_engine_condense_with_a_verbose_merger():
    class Verbose:
        name = "verbose"

        def merge(self, pairs):
            return [(p.older.text + " " + p.newer.text + " ") * 3 for p in pairs]

    st = long_store(seed=4)
    res = run(st, cfg("condense", 0.5), merger=Verbose())
    check_invariants(st, res, 0.5)
    assert res.report.shortfall == 0 and res.report.fallbacks == res.report.merges
    for text, src in zip(res.store.texts, res.store.sources):
        if len(src) > 1:
            assert count_words([text])[0] <= CAP


# --------------------------------------------------------------------------- long-memory variant
def _locomo(path):
    turns1 = [{"speaker": "Ann", "dia_id": f"D1:{i}", "text": f"one {i}."} for i in range(1, 4)]
    turns2 = [{"speaker": "Bo", "dia_id": f"D2:{i}", "text": f"two {i}."} for i in range(1, 3)]
    sample = {"sample_id": "c", "conversation": {
        "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": turns1,
        "session_2_date_time": "9:00 am on 9 May, 2023", "session_2": turns2},
        "qa": [{"question": "q", "answer": "a", "evidence": ["D1:3", "D2:1", "D1:1"], "category": 1}]}
    with open(path, "w") as f:
        json.dump([sample], f)


def test_locomo_windows(tmp_path):
    path = str(tmp_path / "tiny.json")
    _locomo(path)
    one = load_locomo(path)
    b = load_locomo(path, turns_per_node=2)
    assert [n["id"] for n in b.nodes] == ["c:W0", "c:W1", "c:W2"]
    assert [n["metadata"]["turns"] for n in b.nodes] == [["D1:1", "D1:2"], ["D1:3", "D2:1"], ["D2:2"]]
    assert b.nodes[1]["text"] == "Ann: one 3. Bo: two 1."
    ts = {n["id"]: n["timestamp"] for n in one.nodes}
    assert [n["timestamp"] for n in b.nodes] == [ts["c:D1:2"], ts["c:D2:1"], ts["c:D2:2"]]  # the last turn's
    assert b.questions[0].evidence == ("c:W1", "c:W0")  # the windows holding D1:3, D2:1, D1:1
    assert b.name == "tiny_w2" and b.info["turns_per_node"] == 2
    assert load_locomo(path, turns_per_node=1).nodes == one.nodes
    with pytest.raises(ValueError, match="turns_per_node must be an integer >= 1, got 0"):
        load_locomo(path, turns_per_node=0)
