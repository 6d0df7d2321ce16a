"""Which nodes may merge (engine/partition.py): the keep rule (``MergeConfig.keep_pattern``:
matching nodes never merge, the ratio applies to the others) and merge groups
(``MergeConfig.merge_within``: nodes merge only with nodes of the same timestamp or metadata
value), on the partition and end to end, with the report's kept counts and shortfall."""
import argparse
import math

import numpy as np
import pytest
import torch
from engine_helpers import CPU, build_store
from extras import need

from memforest_gpu import CompressConfig, MemoryStore, compress
from memforest_gpu.config import MergeConfig
from memforest_gpu.engine import dry_run
from memforest_gpu.engine.partition import constrain, group_codes, kept_mask, partition_nodes


def _store(n=90, tenants=("a", "b"), seed=0, dim=16):
    """Every 9th node an identity line; timestamps in runs of 5 (clips); metadata 'scene' on
    most nodes (absent on every 7th)."""
    rng = np.random.default_rng(seed)
    texts = [f"Equivalence: <face_{i}>, <voice_{i + 1}>." if i % 9 == 0 else f"event {i} of topic {i % 4}"
             for i in range(n)]
    topics = rng.standard_normal((4, dim))
    emb = topics[np.arange(n) % 4] + 0.3 * rng.standard_normal((n, dim))
    return MemoryStore.from_columns(
        ids=[f"n{i}" for i in range(n)], texts=texts, timestamps=[i // 5 for i in range(n)], embeddings=emb,
        tenants=[tenants[i * len(tenants) // n] for i in range(n)],
        metadata=[{} if i % 7 == 0 else {"scene": f"s{i // 20}"} for i in range(n)])


def _cfg(ratio=0.5, **kw):
    return CompressConfig(merge=MergeConfig(ratio=ratio, **kw))


def _row(store, i):
    return store.ids[i], store.texts[i], store.sources[i], store.embeddings[i]


def test_kept_nodes_never_merge_and_the_ratio_applies_to_the_others():
    st = _store()
    res = compress(st, _cfg(keep_pattern="(?i)^equivalence"), device=CPU)
    out = {i: j for j, i in enumerate(res.store.ids)}
    kept = [j for j, t in enumerate(st.texts) if t.startswith("Equivalence")]
    for j in kept:  # in the output as it came in, with its own sources
        i, text, src, e = _row(st, j)
        k = out[i]
        assert (res.store.texts[k], res.store.sources[k]) == (text, src) and torch.equal(res.store.embeddings[k], e)
    assert all(len(s) == 1 for s, t in zip(res.store.sources, res.store.texts) if "Equivalence" in t)
    assert res.report.kept == len(kept)
    for row in res.report.tenants:
        n_kept = sum(1 for j in kept if st.tenants[j] == row["tenant"])
        assert row["kept"] == n_kept
        assert row["requested"] == math.floor(0.5 * (row["nodes_in"] - n_kept) + 0.5)
        assert row["removed"] == row["requested"] and row["shortfall"] == 0
    assert not ({m.a for m in res.merges} | {m.b for m in res.merges}) & {st.ids[j] for j in kept}


@pytest.mark.parametrize("key", ["timestamp", "scene"])
def test_nodes_merge_only_within_their_group(key):
    st = _store()
    res = compress(st, _cfg(ratio=0.6, merge_within=key), device=CPU)
    value = dict(zip(st.ids, st.timestamps.tolist() if key == "timestamp" else
                     [m.get("scene") for m in st.metadata]))
    assert res.report.merges > 0
    for src in res.store.sources:
        assert len({value[x] for x in src}) == 1, src
    merged = [j for j, s in enumerate(res.store.sources) if len(s) > 1]
    if key == "timestamp":  # a merged node keeps its group's timestamp
        assert all(res.store.timestamps[j].item() == value[res.store.sources[j][0]] for j in merged)


def test_groups_too_small_are_a_reported_shortfall():
    st = _store(n=40, tenants=("a",))
    ts = torch.arange(40, dtype=torch.float64)  # every node its own clip: nothing may merge
    one = MemoryStore(st.ids, st.texts, st.embeddings, ts, st.tenants, st.sources, st.metadata)
    res = compress(one, _cfg(merge_within="timestamp"), device=CPU)
    (row,) = res.report.tenants
    assert res.report.merges == 0 and row["removed"] == 0 and row["shortfall"] == row["requested"] == 20
    pairs = compress(st, _cfg(merge_within="timestamp"), device=CPU)  # clips of 5: 4 removable in each
    assert pairs.report.tenants[0]["shortfall"] == 0 and pairs.report.nodes_out == 20


def test_constrain_relabels_the_partition():
    st = _store()
    names, codes = st.tenant_index()
    part = partition_nodes(st.embeddings, st.timestamps, codes, names, CompressConfig().partition)
    same, none = constrain(part, st, None, None)
    assert same is part and none.tolist() == [0, 0]
    new, kept = constrain(part, st, "(?i)^equivalence", "timestamp")
    tree, tt = new.tree.numpy(), new.tree_tenant.numpy()
    assert (np.diff(tt) >= 0).all() and np.array_equal(tt[tree], codes.numpy())  # tenant-major, no tenant mixed
    keep = np.array([t.startswith("Equivalence") for t in st.texts])
    assert kept.tolist() == np.bincount(codes.numpy()[keep], minlength=2).tolist()
    ts, old = st.timestamps.numpy(), part.tree.numpy()
    for t in range(len(tt)):
        members = np.flatnonzero(tree == t)
        assert len(set(old[members])) == 1 and len(set(ts[members])) == 1  # inside one old tree and one clip
        assert len(members) == 1 or not keep[members].any()  # a kept node is alone
        c = int(new.centre[t])
        assert c == -1 or tree[c] == t
    assert torch.equal(new.kmeans_tree, new.tree)


def test_dry_run_pairs_follow_the_rules():
    st = _store()
    res = dry_run(st, _cfg(keep_pattern="(?i)^equivalence", merge_within="timestamp"), device=CPU)
    ts = dict(zip(st.ids, st.timestamps.tolist()))
    text = dict(zip(st.ids, st.texts))
    assert res.merges
    for r in res.merges:
        assert ts[r.a] == ts[r.b] and not text[r.a].startswith("Equiv") and not text[r.b].startswith("Equiv")


def test_group_codes_and_kept_mask():
    import pyarrow as pa

    assert kept_mask(pa.array(["Equivalence: x", "equivalence", "x Equivalence", ""]), "(?i)^equivalence").tolist() \
        == [True, True, False, False]
    st = MemoryStore.from_columns(ids=list("abcdef"), texts=list("uvwxyz"), timestamps=[3, 1, 3, 2, 1, 3],
                                  embeddings=np.eye(6), metadata=[{"k": 1}, {"k": 1.0}, {"k": None}, {}, {"k": 2},
                                                                  {"j": {"k": 1}}])
    c = group_codes(st, "timestamp")
    assert c[0] == c[2] == c[5] and c[1] == c[4] and len(set(c.tolist())) == 3
    k = group_codes(st.take([1, 2, 3, 4, 5, 0]), "k")  # a taken (sliced) metadata column reads the same
    assert k[0] == k[5] and k[1] == k[2] == k[4] and len(set(k.tolist())) == 3  # null, absent, nested: one group
    bad = MemoryStore.from_columns(ids=list("ab"), texts=list("uv"), timestamps=[0, 0], embeddings=np.eye(2),
                                   metadata=[{"k": 1}, {"k": "1"}])
    with pytest.raises(ValueError, match="metadata values of merge_within='k' must be all strings, all numbers or all "
                                         "booleans"):
        group_codes(bad, "k")


def test_config_checks_and_flags():
    from memforest_gpu.cli.flags import add_config_arguments, config_from_args

    for bad, msg in (("(", "keep_pattern must be a regular expression in RE2 syntax, got '\\('"),
                     ("a(?=b)", "RE2 syntax"), ("", "keep_pattern must be a non-empty regular expression, got ''")):
        with pytest.raises(ValueError, match=msg):
            MergeConfig(keep_pattern=bad)
    with pytest.raises(ValueError, match="merge_within must be 'timestamp' or a metadata key, got ''"):
        MergeConfig(merge_within="")
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    cfg = config_from_args(p.parse_args(["--keep-pattern", "^Name:", "--merge-within", "session"]))
    assert (cfg.merge.keep_pattern, cfg.merge.merge_within) == ("^Name:", "session")
    assert config_from_args(p.parse_args([])).merge.keep_pattern is None
    with pytest.raises(ValueError, match="--keep-pattern must be a regular expression"):
        config_from_args(p.parse_args(["--keep-pattern", "("]))


def test_distributed_run_keeps_ruled_tenants_whole():
    need("torch.distributed")
    from memforest_gpu.distributed import compress_distributed

    st = build_store([60, 20, 20], dim=16)
    texts = [("Equivalence: " + t) if j % 6 == 0 else t for j, t in enumerate(st.texts)]
    st = MemoryStore(st.ids, texts, st.embeddings, st.timestamps, st.tenants, st.sources, st.metadata)
    cfg = _cfg(keep_pattern="^Equivalence")
    res = compress_distributed(st, cfg, split_above=30)
    assert res.split == []
    one = compress(st, cfg, device=CPU)
    assert res.store.ids == one.store.ids and res.store.sources == one.store.sources
    assert [r["kept"] for r in res.report.tenants] == [r["kept"] for r in one.report.tenants]
    assert [r["requested"] for r in res.report.tenants] == [r["requested"] for r in one.report.tenants]
    assert res.report.kept == one.report.kept > 0 and res.report.shortfall == 0


def test_split_trees_are_recorded_with_a_centre_that_compaction_can_find():
    # the keep rule and the groups split k-means trees; each piece is recorded in the output's
    # event trees with a member as its centre, so a later `compact` can place memories into it
    from memforest_gpu.engine.output import rows_of_originals

    st = _store()
    res = compress(st, _cfg(ratio=0.5, keep_pattern="(?i)^equivalence", merge_within="timestamp"), device=CPU)
    f = res.store.event_trees
    assert f is not None and f.tree.shape == (len(res.store),)
    for name, tf in f.tenants.items():
        rows = rows_of_originals(res.store, tf.centres)
        assert (rows >= 0).all(), (name, tf.centres)
        codes = res.store.tenant_codes_np[rows]
        assert set(np.asarray(res.store.tenant_index()[0])[codes].tolist()) == {name}
        assert (f.tree[rows] == np.arange(len(tf.centres))).all()  # each centre sits in its own tree
