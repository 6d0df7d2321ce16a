"""The vectorised word counter gives exactly the Python word counter's numbers."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from memforest_gpu.engine.merge_call import count_column
from memforest_gpu.mergers.word_count import count_words, count_words_arrow
from memforest_gpu.store.synthetic import synthetic_store

TRICKY = [
    "", " ", "a", "_", "Alice's cat, Miso.", "  two  spaces\tand\ttabs\n", "snake_case_42 x-y",
    "naïve café", "e\u0301t\u00e9", "日本語 テキスト", "emoji 🙂🙂 ok", "١٢٣ ٤", "Ⅻ ½ ²", "\u3000ideo\u3000space",
    "line\u2028sep\u2029para", "\x1c\x1d\x1e\x1f", "nbsp\u00a0here", "\x85next", "zero\u200bwidth", "...!!!",
    "ß STRASSE ǅ", "\U0001d400\U0001d401", "tab\x0bvt\x0cff",
]


def test_every_character_alone():
    """Each code point (no surrogates) as a one-character text: its class decides 0 or 1."""
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    texts = [chr(c) for c in cps]
    got = count_words_arrow(pa.array(texts, pa.large_string()))
    np.testing.assert_array_equal(got, count_words(texts))


def test_tricky_texts_slices_and_types():
    arr = pa.array(TRICKY, pa.string())
    assert count_words_arrow(arr).tolist() == count_words(TRICKY)
    big = pa.array(TRICKY * 7, pa.large_string()).slice(5, 100)  # an offset into the buffers
    assert count_words_arrow(big, block=9).tolist() == count_words(TRICKY * 7)[5:105]
    chunked = pa.chunked_array([pa.array(TRICKY[:4]), pa.array(TRICKY[4:])])
    assert count_words_arrow(chunked).tolist() == count_words(TRICKY)
    assert count_words_arrow(pa.array([], pa.large_string())).tolist() == []


def test_blocks_bounded_by_bytes(monkeypatch):
    """Texts counted a few bytes at a time (one text longer than the bound: alone in its block)."""
    from memforest_gpu.mergers import word_count

    monkeypatch.setattr(word_count, "_BLOCK_BYTES", 16)
    seen, count_block = [], word_count._count_block
    monkeypatch.setattr(word_count, "_count_block", lambda a: seen.append(a) or count_block(a))
    texts = TRICKY + ["a long one " * 40] + TRICKY
    big = pa.array(texts * 3, pa.large_string()).slice(7, 80)
    assert count_words_arrow(big).tolist() == count_words((texts * 3)[7:87])
    assert all(len(a) == 1 or sum(len(t.encode()) for t in a.to_pylist()) <= 16 for a in seen)
    assert sum(len(a) for a in seen) == 80 and len(seen) > 5
    assert count_words_arrow(pa.array(texts, pa.string()), block=5).tolist() == count_words(texts)


def test_random_unicode_texts():
    rng = np.random.default_rng(0)
    pools = [range(0x20, 0x7F), range(0xA0, 0x800), range(0x3000, 0x3100), range(0x1F300, 0x1F400),
             [0x20, 0x09, 0x0A, 0x5F, 0x2028, 0x3000, 0x85, 0x300, 0x301]]
    texts = []
    for _ in range(3000):
        n = int(rng.integers(0, 40))
        pool = pools[int(rng.integers(len(pools)))]
        mix = [pool[int(rng.integers(len(pool)))] if rng.random() < 0.7 else int(rng.choice(list(pools[4])))
               for _ in range(n)]
        texts.append("".join(map(chr, mix)))
    assert count_words_arrow(pa.array(texts), block=257).tolist() == count_words(texts)


def test_count_column_matches_the_counter():
    st = synthetic_store(500, tenants=3, dim=8)
    np.testing.assert_array_equal(count_column(count_words, st.texts), count_words(st.texts))
    halves = lambda texts: [len(t) // 2 for t in texts]  # noqa: E731 - any other counter: by blocks
    np.testing.assert_array_equal(count_column(halves, st.texts, block=64), halves(list(st.texts)))


def test_count_column_blocks_bounded_by_bytes(monkeypatch):
    """A tokenizer gets ``block`` texts at a time, fewer where they pass the byte bound."""
    from memforest_gpu.mergers import word_count

    monkeypatch.setattr(word_count, "_BLOCK_BYTES", 200)
    st = synthetic_store(300, dim=8)
    sizes = []

    def halves(texts):
        sizes.append(sum(len(t.encode()) for t in texts) if len(texts) > 1 else 0)
        return [len(t) // 2 for t in texts]

    np.testing.assert_array_equal(count_column(halves, st.texts, block=64), [len(t) // 2 for t in st.texts])
    assert max(sizes) <= 200 and len(sizes) > 300 * 45 // 200
    plain = list(st.texts)  # not Arrow: fixed blocks
    np.testing.assert_array_equal(count_column(halves, plain, block=64), [len(t) // 2 for t in plain])


def test_bad_input():
    with pytest.raises(ValueError, match="null"):
        count_words_arrow(pa.array(["a", None]))
    with pytest.raises(ValueError, match="string array"):
        count_words_arrow(pa.array([1, 2]))
