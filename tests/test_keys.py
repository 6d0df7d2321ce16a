"""Keys of merged nodes (store/keys.py, store/merged_keys.py, engine/output.py output_keys): what they hold,
how they are made by every run, and how they travel in files."""
from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pyarrow as pa
import pytest
import torch

from memforest_gpu import compress
from memforest_gpu.config import CompressConfig, MergeConfig
from memforest_gpu.engine.memory import MemoryPlan
from memforest_gpu.store.codes import int8_codes
from memforest_gpu.store.io import read_store, write_store
from memforest_gpu.store.keys import NodeKeys
from memforest_gpu.store.memory_store import MemoryStore
from memforest_gpu.store.merged_keys import centres, derive_keys
from memforest_gpu.store.synthetic import synthetic_store


def keyed(keys=2, text_weight=0.5, ratio=0.6, schedule="matching"):
    """Float32 keys (the preset writes int8 codes: test_int8_keys_... checks those against these)."""
    return CompressConfig(merge=MergeConfig(ratio=ratio, schedule=schedule, keys=keys, text_weight=text_weight,
                                            vectors="float32"))


@pytest.fixture(scope="module")
def store():
    return synthetic_store(400, tenants=4, dim=16, seed=3, device="cpu")


def key_rows(out, i):
    k = out.keys
    return range(int(k.offsets[i]), int(k.offsets[i + 1]))


def check_keys(inp: MemoryStore, out: MemoryStore, max_keys):
    """Every merged node's keys hold each of its sources exactly once, at most ``max_keys`` of
    them; each key is the normalised mean of its sources' input vectors (a source alone: its
    own vector, bit for bit); an original has none."""
    row = {s: j for j, srcs in enumerate(inp.sources) for s in srcs}
    src = out.keys.sources.to_pylist()
    for i, node_src in enumerate(out.sources):
        rows = list(key_rows(out, i))
        if len(node_src) == 1:
            assert rows == [], i
            continue
        assert 1 <= len(rows) <= (max_keys or len(node_src))
        assert sorted(s for r in rows for s in src[r]) == sorted(node_src)
        for r in rows:
            want = inp.embeddings[[row[s] for s in src[r]]].double().sum(0)
            want = (want / want.norm()).float()
            got = out.keys.vectors[r]
            if len(src[r]) == 1:
                assert torch.equal(got, inp.embeddings[row[src[r][0]]])
            else:
                torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("keys", [2, 3, -1])
def test_compress_keeps_keys_with_their_sources(store, keys):
    res = compress(store, keyed(keys=keys), device="cpu")
    out = res.store
    assert out.keys is not None and out.keys.text_weight == 0.5
    assert out.keys.max_keys == (None if keys == -1 else keys)
    check_keys(store, out, None if keys == -1 else keys)
    merged = np.array([len(s) > 1 for s in out.sources])
    assert (out.keys.counts[merged] >= 1).all() and (out.keys.counts[~merged] == 0).all()
    if keys == -1:  # every source is a key
        assert out.keys.counts.sum() == sum(len(s) for s, m in zip(out.sources, merged) if m)


@pytest.mark.parametrize("w", [0.5, 0.8])
def test_one_key_is_folded_into_one_vector_per_node(store, w):
    """keys=1: no key columns; a merged node's vector is normalize(w t + (1 - w) c), t its text's
    vector (the run without keys), c the centre of its sources' input vectors; the rest as before."""
    text = compress(store, keyed(keys=0, text_weight=1.0), device="cpu").store
    one = compress(store, keyed(keys=1, text_weight=w), device="cpu").store
    assert one.keys is None and len(one) == len(text) and list(one.ids) == list(text.ids)
    c = derive_keys(store, text.sources.arrow, max_keys=1, text_weight=w)
    merged = np.flatnonzero(c.counts == 1)
    assert len(merged) and merged.tolist() == [i for i, s in enumerate(text.sources) if len(s) > 1]
    want = torch.nn.functional.normalize(w * text.embeddings[merged] + (1 - w) * c.unit(), dim=1)
    torch.testing.assert_close(one.embeddings[merged], want, atol=1e-6, rtol=0)
    rest = np.setdiff1d(np.arange(len(one)), merged)
    assert torch.equal(one.embeddings[rest], text.embeddings[rest])  # originals keep their own vector
    assert torch.allclose(one.embeddings.norm(dim=1), torch.ones(len(one)), atol=1e-5)


def test_one_key_is_the_weighted_centre_of_every_source(store):
    """max_keys=1 (the preset's fold) runs no k-means: a merged node's one key is the normalised
    mean of its sources' input vectors, a merged input without keys weighing its number of
    sources, checked against the plain sums of check_keys, from originals and from a store
    compressed again."""
    once = compress(store, keyed(keys=0, text_weight=1.0), device="cpu").store
    for inp in (store, once):
        out = compress(inp, keyed(keys=0, text_weight=1.0), device="cpu").store
        assert any(len(s) > 2 for s in out.sources)  # nodes of three and more sources, not only pairs
        keys = derive_keys(inp, out.sources.arrow, max_keys=1, text_weight=0.5)
        row = {s: j for j, srcs in enumerate(inp.sources) for s in srcs}
        at = np.concatenate([[0], np.cumsum(keys.counts)])
        for i, node_src in enumerate(out.sources):
            rows = {row[s] for s in node_src}
            if len(rows) == 1:  # one input node, unchanged: it keeps no key
                assert keys.counts[i] == 0, i
                continue
            assert keys.counts[i] == 1 and sorted(keys.sources[int(at[i])].as_py()) == sorted(node_src)
            want = inp.embeddings[[row[s] for s in node_src]].double().sum(0)  # a row once per source
            torch.testing.assert_close(keys.vectors[int(at[i])], (want / want.norm()).float(), atol=1e-5, rtol=0)


def test_without_keys_the_output_is_as_before(store):
    a = compress(store, keyed(keys=0, text_weight=1.0), device="cpu").store
    b = compress(store, keyed(keys=3), device="cpu").store
    assert a.keys is None
    assert list(a.ids) == list(b.ids) and list(a.texts) == list(b.texts)  # the rule never changes the merges
    assert torch.equal(a.embeddings, b.embeddings)


def test_keys_survive_an_in_place_output(store):
    """A run that may overwrite the input (``MemoryPlan(overwrite_input=True)``) writes the output
    over the input's vectors: keys are made before."""
    ref = compress(store, keyed(keys=-1), device="cpu").store
    scratch = store.take(np.arange(len(store)))  # a copy whose vectors the run may overwrite
    out = compress(scratch, keyed(keys=-1), device="cpu", memory=MemoryPlan(overwrite_input=True)).store
    assert torch.equal(out.keys.vectors, ref.keys.vectors)
    assert out.keys.sources.to_pylist() == ref.keys.sources.to_pylist()


def test_compressing_a_compressed_store_keeps_keys_of_keys(store):
    """Keys of merged nodes merged again: their units are the earlier keys (each of its
    sources once), bounded again by k centres."""
    once = compress(store, keyed(keys=-1, ratio=0.4), device="cpu").store
    twice = compress(once, keyed(keys=2, ratio=0.5), device="cpu").store
    src = twice.keys.sources.to_pylist()
    for i, node_src in enumerate(twice.sources):
        rows = list(key_rows(twice, i))
        if len(node_src) > 1:
            assert sorted(s for r in rows for s in src[r]) == sorted(node_src) and len(rows) <= 2
    # an untouched merged node keeps its keys as they were
    same = {i: j for j, i in enumerate(once.ids)}
    for i, nid in enumerate(twice.ids):
        if nid in same and len(twice.sources[i]) > 1:
            j = same[nid]
            if once.keys.counts[j] <= 2:
                assert torch.equal(twice.keys.vectors[list(key_rows(twice, i))],
                                   once.keys.vectors[list(key_rows(once, j))])


def test_derive_keys_for_any_merging_method(store):
    """The sources alone say which input nodes a node is made of (a baseline's output)."""
    out = compress(store, keyed(keys=0, text_weight=1.0), device="cpu").store
    made = derive_keys(store, out.sources.arrow, max_keys=2, text_weight=0.3)
    ref = compress(store, keyed(keys=2, text_weight=0.3), device="cpu").store.keys
    assert np.array_equal(made.offsets, ref.offsets) and torch.equal(made.vectors, ref.vectors)
    bad = pa.array([["nope"]], type=pa.large_list(pa.large_string()))
    with pytest.raises(ValueError, match="sources of the output must be sources of the input"):
        derive_keys(store, bad, max_keys=2, text_weight=0.5)


def kmeans_reference(X, W, k, steps=10):
    """One set at a time, plain Python loops: farthest-point start from the heaviest, Lloyd."""
    S = len(X)
    sim = X @ X.T
    chosen = [int(np.argmax(W))]
    best = sim[chosen[0]].copy()
    for _ in range(1, k):
        far = int(np.argmin(np.where(W > 0, best, np.inf)))
        chosen.append(far)
        best = np.maximum(best, sim[far])
    C = X[chosen].copy()
    labels = np.zeros(S, dtype=np.int64)
    for _ in range(steps):
        new = np.argmax(X @ C.T, axis=1)
        for c in range(k):
            m = (new == c) & (W > 0)
            if m.any():
                v = (X[m] * W[m, None]).sum(0)
                C[c] = v / np.linalg.norm(v)
        if (new == labels).all():
            break
        labels = new
    return labels


def test_centres_match_a_plain_reference():
    rng = np.random.default_rng(0)
    B, S, D, k = 7, 9, 8, 3
    X = rng.standard_normal((B, S, D))
    X /= np.linalg.norm(X, axis=2, keepdims=True)
    W = rng.integers(1, 4, (B, S)).astype(np.float64)
    W[2, 6:] = 0  # padding
    got = centres(torch.tensor(X, dtype=torch.float64), torch.tensor(W), k).numpy()
    for b in range(B):
        ok = W[b] > 0
        want = kmeans_reference(X[b], W[b], k)
        assert np.array_equal(got[b][ok], want[ok]), b


def test_files_round_trip_keys(store, tmp_path):
    out = compress(store, keyed(keys=2, text_weight=0.4), device="cpu").store
    for ext in ("parquet", "jsonl"):
        p = tmp_path / f"s.{ext}"
        write_store(out, p)
        back = read_store(p)
        assert np.array_equal(back.keys.offsets, out.keys.offsets)
        assert torch.equal(back.keys.vectors, out.keys.vectors)
        assert back.keys.sources.to_pylist() == out.keys.sources.to_pylist()
        assert back.keys.rule == {"text_weight": 0.4, "max_keys": 2}
        t = out.tenant_names()[2]
        one = read_store(p, tenants=t)
        assert torch.equal(one.keys.vectors, out.select_tenant(t).keys.vectors)


def test_a_store_without_keys_reads_as_before(store, tmp_path):
    for ext in ("parquet", "jsonl"):
        write_store(store, tmp_path / f"plain.{ext}")
        assert read_store(tmp_path / f"plain.{ext}").keys is None


def test_bad_keys_in_a_file_are_named(store, tmp_path, caplog):
    out = compress(store, keyed(keys=2), device="cpu").store
    p = tmp_path / "s.jsonl"
    write_store(out, p)
    lines = p.read_text().splitlines()
    j = next(i for i, ln in enumerate(lines) if '"key_sources"' in ln)
    bad = lines[j].replace('"key_sources": [["', '"key_sources": [["stranger", "', 1)
    (tmp_path / "bad.jsonl").write_text("\n".join(lines[:j] + [bad] + lines[j + 1:]) + "\n")
    with pytest.raises(ValueError, match="key sources of node .* must be among its sources, got 'stranger'"):
        read_store(tmp_path / "bad.jsonl")
    no_rule = [ln for ln in lines if "__memforest__" not in ln]
    (tmp_path / "norule.jsonl").write_text("\n".join(no_rule) + "\n")
    with caplog.at_level(logging.WARNING):  # a file that lost its header: the default rule, said in one line
        assert read_store(tmp_path / "norule.jsonl").keys.rule == {"text_weight": 0.5, "max_keys": None}
    assert "the keys' rule is missing" in caplog.text


def _keyed_lines(store, tmp_path):
    out = compress(store, keyed(keys=-1), device="cpu").store
    p = tmp_path / "s.jsonl"
    write_store(out, p)
    lines = p.read_text().splitlines()
    j = next(i for i, ln in enumerate(lines) if '"key_sources"' in ln and len(json.loads(ln)["key_sources"]) >= 2)
    return lines, j, json.loads(lines[j])


def _read_edited(tmp_path, lines, j, rec):
    (tmp_path / "bad.jsonl").write_text("\n".join(lines[:j] + [json.dumps(rec)] + lines[j + 1:]) + "\n")
    return read_store(tmp_path / "bad.jsonl")


def test_keys_hold_each_source_exactly_once(store, tmp_path):
    lines, j, rec = _keyed_lines(store, tmp_path)
    node = rec["id"]
    twice = dict(rec, key_sources=[rec["key_sources"][0] * 2] + rec["key_sources"][1:])
    with pytest.raises(ValueError, match=f"bad.jsonl: key sources of node '{node}' must name each of its sources "
                                         f"once, got '{rec['key_sources'][0][0]}' twice"):
        _read_edited(tmp_path, lines, j, twice)
    left_out = dict(rec, keys=rec["keys"][:-1], key_sources=rec["key_sources"][:-1])
    with pytest.raises(ValueError, match=f"bad.jsonl: keys of node '{node}' must hold each of its "
                                         f"{len(rec['sources'])} sources, got {len(rec['sources']) - 1}"):
        _read_edited(tmp_path, lines, j, left_out)
    # 3,000 keys of which all but the node's own name no source of it
    many = dict(rec, keys=rec["keys"] + [rec["keys"][0]] * 3000, key_sources=rec["key_sources"] + [[]] * 3000)
    with pytest.raises(ValueError, match=f"bad.jsonl: each key of node .{node}. must stand for at least one"):
        _read_edited(tmp_path, lines, j, many)


def test_keys_beyond_the_rules_bound_and_bad_vectors_name_the_node(store, tmp_path):
    lines, j, rec = _keyed_lines(store, tmp_path)
    node = rec["id"]
    hdr = json.loads(lines[0])
    hdr["__memforest__"]["keys"]["max_keys"] = 1
    with pytest.raises(ValueError, match=f"node '{node}' must hold at most max_keys=1 keys"):
        _read_edited(tmp_path, [json.dumps(hdr)] + lines[1:], j, rec)
    short = dict(rec, keys=[rec["keys"][0][:3]] + rec["keys"][1:])
    with pytest.raises(ValueError, match=f"keys must have the store's dimension .* in node '{node}'"):
        _read_edited(tmp_path, lines, j, short)
    nan = dict(rec, keys=[[0.0] * len(rec["keys"][0])] + rec["keys"][1:])
    with pytest.raises(ValueError, match=f"keys must be finite non-zero vectors, .* in node '{node}'"):
        _read_edited(tmp_path, lines, j, nan)


def test_node_keys_checks_its_layout():
    with pytest.raises(ValueError, match="key offsets must rise from 0"):
        NodeKeys(torch.zeros(2, 4), np.array([0, 3]), pa.array([["a"], ["b"]]), 0.5, 2)
    with pytest.raises(ValueError, match="text_weight must be a number in"):
        NodeKeys.empty(3, 4, text_weight=1.5, max_keys=2)
    with pytest.raises(ValueError, match="keys must be an integer >= -1"):
        MergeConfig(keys=-2)


def test_int8_keys_are_made_by_the_engine_and_written_as_they_are(store, tmp_path):
    ref = compress(store, keyed(keys=-1), device="cpu").store
    cfg = keyed(keys=-1)
    cfg = CompressConfig(partition=cfg.partition, merge=dataclasses.replace(cfg.merge, vectors="int8"))
    out = compress(store, cfg, device="cpu").store
    assert out.vector_codes == "int8" and out.keys.vectors.dtype == torch.int8  # a quarter of the memory
    assert out.keys.sources.to_pylist() == ref.keys.sources.to_pylist()
    assert np.array_equal(out.keys.vectors.numpy(), int8_codes(ref.keys.vectors))
    torch.testing.assert_close(out.keys.unit(), ref.keys.vectors, atol=0.02, rtol=0)
    p = tmp_path / "s.parquet"
    write_store(out, p)
    back = read_store(p)
    assert back.vector_codes == "int8"
    torch.testing.assert_close(back.keys.unit(), out.keys.unit(), atol=1e-6, rtol=0)
    assert np.array_equal(int8_codes(back.embeddings), int8_codes(out.embeddings))  # codes survive a round trip


def test_keys_given_as_a_string_name_the_node(store, tmp_path):
    lines, j, rec = _keyed_lines(store, tmp_path)
    with pytest.raises(ValueError, match=f"bad.jsonl: keys of node '{rec['id']}' must be a list, got str"):
        _read_edited(tmp_path, lines, j, dict(rec, keys="abc"))
    with pytest.raises(ValueError, match=f"bad.jsonl: key_sources of node '{rec['id']}' must be a list, got str"):
        _read_edited(tmp_path, lines, j, dict(rec, key_sources="abc"))


def test_int8_codes_do_not_depend_on_the_block_size():
    """Codes are made a small block of rows at a time, in place on one float64 copy: every row's
    codes are its own (ties at .5 round to even, zero rows give zeros), whatever the block."""
    from memforest_gpu.store.codes import int8_codes

    g = np.random.default_rng(0)
    x = g.standard_normal((1000, 24)).astype(np.float32)
    x[7] = 0
    x[9] = np.arange(-12, 12, dtype=np.float32) / 2  # halves: exact ties after scaling
    x64 = x.astype(np.float64)
    want = np.clip(np.rint(x64 * (127.0 / np.maximum(np.abs(x64).max(1, keepdims=True), 1e-300))),
                   -127, 127).astype(np.int8)
    want[7] = 0
    for block in (1, 7, 1000, 1 << 16):
        assert np.array_equal(int8_codes(x, block=block), want), block


def test_int8_codes_of_a_read_only_array_warn_nothing():
    """A read-only array (a view of an Arrow buffer) is coded in place: no copy, no warning."""
    import warnings

    from memforest_gpu.store.codes import int8_codes

    x = np.random.default_rng(2).standard_normal((50, 8)).astype(np.float32)
    want = int8_codes(x.copy())
    x.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(int8_codes(x), want)


def test_int8_codes_on_the_device_equal_the_host_codes():
    """The codes a run reusing its rows keeps in a round (made where the vectors are) are the
    host function's, bit for bit: zero rows, ties at .5, any block."""
    from memforest_gpu.store.codes import int8_codes, int8_codes_on

    g = np.random.default_rng(1)
    x = g.standard_normal((3000, 40)).astype(np.float32)
    x[3] = 0
    x[5] = np.arange(-20, 20, dtype=np.float32) / 2
    x[6] *= 1e-30
    x[7, :2] = [0.07108550518751144, 0.1421710103750229]  # 127 x / peak: 63.49999999999999 (code 63) in
    x[7, 2:] = 0.01  # one division, 63.50000000000001 (code 64) through torch's reciprocal
    for block in (1, 13, 1 << 12):
        assert np.array_equal(int8_codes_on(torch.from_numpy(x), block=block).numpy(), int8_codes(x)), block


def test_saved_codes_go_into_the_keys_of_their_rows_and_leave_the_list():
    """A reusing run's saved int8 codes (blocks of (input rows, codes), in any order, some rows
    no key stands for) are written into the keys of those rows; the other keys are left to be
    coded; each block is taken off the list."""
    from memforest_gpu.store.merged_keys import _put_saved

    rng = np.random.default_rng(0)
    origin = rng.permutation(50)[:40]  # key i stands for input row origin[i]
    codes = torch.as_tensor(rng.integers(-127, 128, (60, 8)), dtype=torch.int8)  # every row's true codes
    rows = rng.permutation(60)[:30]  # saved rows, 10 of them no key's (>= 50 or not in origin)
    saved = [(rows[:12], codes[rows[:12]]), (rows[12:], codes[rows[12:]].numpy())]
    vec = torch.zeros(40, 8, dtype=torch.int8)
    todo = _put_saved(vec, origin, saved)
    assert saved == []
    hit = np.isin(origin, rows)
    assert np.array_equal(todo, ~hit)
    assert torch.equal(vec[torch.from_numpy(np.flatnonzero(hit))], codes[torch.from_numpy(origin[hit])])
    assert not vec[torch.from_numpy(np.flatnonzero(~hit))].any()
