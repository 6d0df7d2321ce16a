"""The extractive merger writes the same texts, byte for byte, as the frozen reference
(tests/extractive_reference.py, the merger before its per-merge work was cut): merges and
condensed merges (the ``centroid`` salience, the reference's) of the dev file's turns and facts,
merges of merges, tricky texts, several near-duplicate thresholds and caps."""
from __future__ import annotations

import random

import pytest
from extractive_corpus import dev_items, merge_levels, pairs_of, synthetic_items, tricky_items
from extractive_reference import ExtractiveMerger as Reference

from memforest_gpu.mergers.base import MergePair
from memforest_gpu.mergers.extractive import ExtractiveMerger, dedup_sentences
from memforest_gpu.mergers.word_count import count_words
from memforest_gpu.sentences import split_sentences

THRESHOLDS = (0.9, 1.0, 0.75, 0.5, 0.2)
CAPS = (1, 2, 5, 13, 40)


def chars(texts):
    """A counter other than words: characters over four, rounded up."""
    return [-(-len(t) // 4) for t in texts]


def corpus(seed: int) -> list[MergePair]:
    rng = random.Random(seed)
    turns, facts, tricky = dev_items("turns"), dev_items("facts"), tricky_items(rng, 300)
    pairs = pairs_of(turns, rng, 600) + pairs_of(facts, rng, 400) + pairs_of(tricky, rng, 400)
    pairs += pairs_of(turns[:300] + facts[:300] + tricky, rng, 400)  # turns with facts with tricky texts
    pairs += pairs_of(synthetic_items(200), rng, 200)
    return pairs


def deep(seed: int, items, levels: int = 6) -> list[MergePair]:
    """Every level's pairs of merges of merges (the reference writes the texts fed back)."""
    ref = Reference(processes=0)
    return [p for level in merge_levels(ref.merge, items, random.Random(seed), levels) for p in level]


def assert_same(ref: list[str], new: list[str], pairs) -> None:
    bad = [(p, a, b) for p, a, b in zip(pairs, ref, new) if a != b]
    assert len(ref) == len(new) and not bad, f"{len(bad)} texts differ; first: {bad[:1]}"


@pytest.fixture(scope="module")
def all_pairs() -> list[MergePair]:
    rng = random.Random(7)
    tricky = tricky_items(rng, 256)
    pairs = corpus(0)
    pairs += deep(1, dev_items("turns")[:512])
    pairs += deep(2, dev_items("facts")[:256] + tricky[:128])
    pairs += deep(3, tricky)
    pairs += deep(4, synthetic_items(256))
    return pairs


@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_merge_same_texts(all_pairs, threshold):
    ref = Reference(processes=0, near_duplicate=threshold).merge(all_pairs)
    new = ExtractiveMerger(processes=0, near_duplicate=threshold).merge(all_pairs)
    assert_same(ref, new, all_pairs)
    again = ExtractiveMerger(processes=0, near_duplicate=threshold).merge(all_pairs)  # warm caches
    assert_same(ref, again, all_pairs)


def test_merge_same_texts_in_worker_processes(all_pairs):
    pairs = all_pairs[:3000]
    ref = Reference(processes=0).merge(pairs)
    assert_same(ref, ExtractiveMerger(processes=1, parallel_above=64).merge(pairs), pairs)


@pytest.mark.parametrize("counter", [count_words, chars])
@pytest.mark.parametrize("cap", CAPS)
def test_condense_same_texts(all_pairs, cap, counter):
    pairs = all_pairs[::3]
    ref = Reference(processes=0).condense(pairs, cap, counter)
    new = ExtractiveMerger(processes=0, salience="centroid").condense(pairs, cap, counter)
    assert_same(ref[0], new[0], pairs)
    assert ref[1] == new[1]


def test_condense_same_texts_other_threshold(all_pairs):
    pairs = all_pairs[1::4]
    for threshold, cap in ((0.5, 4), (1.0, 10), (0.75, 30)):
        ref = Reference(processes=0, near_duplicate=threshold).condense(pairs, cap, count_words)
        assert ref == ExtractiveMerger(processes=0, near_duplicate=threshold, salience="centroid").condense(
            pairs, cap, count_words)


def test_helpers_same(all_pairs):
    import extractive_reference as R

    texts = [t for p in all_pairs[::5] for t in (p.older.text, p.newer.text)]
    assert [split_sentences(t) for t in texts] == [R.split_sentences(t) for t in texts]
    groups = [split_sentences(t) for t in texts]
    for threshold in THRESHOLDS:
        for k in range(0, len(groups) - 3, 3):
            assert dedup_sentences(groups[k:k + 3], threshold) == R.dedup_sentences(groups[k:k + 3], threshold)


def test_a_written_text_reads_back_as_remembered(all_pairs):
    """A merged text parsed from how it was written (sentences.remember_written) has the parse
    reading it gives; and the shortcut is taken for most merges of this corpus."""
    from memforest_gpu import sentences
    from memforest_gpu.mergers import extractive

    taken = 0
    for q in extractive._quads(all_pairs):
        labels, groups, tagged = extractive._merged(q, 0.9)
        text = extractive._write_infos(labels, groups, tagged)
        if not text or not sentences.written_reads_back(labels, groups, tagged):
            continue
        assert sentences._from_written(labels, groups, tagged) == sentences.read(text), text
        taken += 1
    assert taken > len(all_pairs) // 2
