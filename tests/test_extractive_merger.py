"""ExtractiveMerger: dedup, dates as tags, re-merge, splitting, and a length bound."""
from __future__ import annotations

import random
import re

import pytest

from memforest_gpu.mergers.base import MemoryItem, MergePair, Merger
from memforest_gpu.mergers.extractive import ExtractiveMerger
from memforest_gpu.sentences import normalize, split_sentences

DAY = 86400.0
T0 = 1683554160.0  # 8 May 2023, 13:56 UTC
TAG = re.compile(r"\[(\d{1,2}) ([A-Z][a-z]+) (\d{4})\]")


def item(text: str, days: float = 0.0, id: str = "x") -> MemoryItem:
    return MemoryItem(id, text, T0 + days * DAY)


def merge1(older: MemoryItem, newer: MemoryItem, **kw) -> str:
    (out,) = ExtractiveMerger(**kw).merge([MergePair(older, newer)])
    return out


def tags(text: str) -> list[str]:
    return [" ".join(m.groups()) for m in TAG.finditer(text)]


def test_protocol_and_name():
    m = ExtractiveMerger()
    assert isinstance(m, Merger)
    assert m.name == "extractive"


def test_identical_inputs_give_one_copy():
    text = "Caroline went to the LGBTQ support group. She felt accepted."
    assert merge1(item(text), item(text, 0.1)) == text


def test_identical_inputs_on_different_days_keep_the_first_date():
    text = "Caroline went to the support group."
    assert merge1(item(text), item(text, 1)) == "[8 May 2023] " + text


def test_near_duplicate_dropped():
    a = "Melanie painted a lake at sunrise last weekend with her kids."
    b = "Melanie painted a lake at sunrise last weekend with her kids!"  # same tokens
    c = "melanie painted a lake at sunrise last weekend with her two kids"  # Jaccard 11/12
    assert merge1(item(a), item(b)) == a
    assert merge1(item(a), item(c), near_duplicate=0.9) == a
    assert merge1(item(a), item(c), near_duplicate=1.0) == f"{a} {c}"


def test_contained_sentence_dropped_but_short_one_kept():
    a = "Caroline went to the support group on Friday."
    assert merge1(item(a), item("Caroline went to the support group.")) == a
    # fewer than 3 tokens: only exact repeats are dropped
    assert merge1(item(a), item("Caroline went.")) == f"{a} Caroline went."


def test_different_numbers_kept():
    out = merge1(item("I have 2 kids."), item("I have 3 kids."))
    assert out == "I have 2 kids. I have 3 kids."
    # even above the Jaccard threshold, a new number is never dropped
    long = "we bought " + " ".join(f"w{i}" for i in range(30))
    out = merge1(item(long + " and 2 cats."), item(long + " and 3 cats."), near_duplicate=0.5)
    assert "2 cats" in out and "3 cats" in out


def test_negation_is_not_a_duplicate():
    out = merge1(item("I do not like cats."), item("I like cats."))
    assert out == "I do not like cats. I like cats."


def test_same_day_inputs_have_no_tags():
    out = merge1(item("Caroline: hi there."), item("Melanie: hello back.", 0.3))
    assert out == "Caroline: hi there. Melanie: hello back."
    # existing tags equal to the common date are stripped
    out = merge1(item("[8 May 2023] Caroline: hi there."), item("Melanie: hello back.", 0.3))
    assert out == "Caroline: hi there. Melanie: hello back."


def test_different_days_are_tagged_newest_first():
    out = merge1(item("Caroline: I went to the support group."), item("Melanie: I painted a lake.", 1))
    assert out == ("[9 May 2023] Melanie: I painted a lake. "
                   "[8 May 2023] Caroline: I went to the support group.")


def test_older_item_with_later_tag_is_sorted_by_date():
    older = item("[8 May 2023] Caroline went hiking. [10 June 2023] Caroline adopted a dog.")
    newer = item("Melanie ran a marathon.", 2)  # 10 May 2023
    out = merge1(older, newer)
    assert out == ("[10 June 2023] Caroline adopted a dog. [10 May 2023] Melanie ran a marathon. "
                   "[8 May 2023] Caroline went hiking.")
    # by date, not alphabetical: "10 June" < "2 December", and years count
    out = merge1(item("[2 December 2022] Old news here."), item("Fresh news here.", 0))
    assert tags(out) == ["8 May 2023", "2 December 2022"]


def test_same_date_segments_coalesce():
    older = item("[8 May 2023] First thing. [9 May 2023] Second thing.")
    newer = item("[8 May 2023] Third thing. [9 May 2023] Fourth thing.", 1)
    assert merge1(older, newer) == ("[9 May 2023] Second thing. Fourth thing. "
                                    "[8 May 2023] First thing. Third thing.")


def test_repeat_on_later_date_dropped():
    older = item("Caroline went hiking. She saw a bear.")
    newer = item("She saw a bear. Melanie baked bread.", 1)
    assert merge1(older, newer) == ("[9 May 2023] Melanie baked bread. "
                                    "[8 May 2023] Caroline went hiking. She saw a bear.")


def test_knowledge_update_keeps_the_newer_value_first():
    """A changed value of one fact survives a merge, and the newer one is read first, however
    the merge is nested (docs/method.md, the extractive merger)."""
    old = item("Caroline: I live in Denver. Caroline: I work as a nurse these days.", 0, "old")
    other = item("Melanie: I painted a lake.", 10, "other")
    new = item("Caroline: I moved, I now live in Austin. Caroline: I switched jobs, I now work as a pilot.", 40, "new")
    out = merge1(old, new)
    for v in ("Denver", "Austin", "nurse", "pilot"):
        assert v in out
    assert out.index("Austin") < out.index("Denver") and out.index("pilot") < out.index("nurse")
    m = ExtractiveMerger()
    (o_other,) = m.merge([MergePair(old, other)])
    (nested,) = m.merge([MergePair(MemoryItem("oo", o_other, other.timestamp), new)])
    assert nested.index("Austin") < nested.index("Melanie") < nested.index("Denver")
    (other_new,) = m.merge([MergePair(other, new)])
    (nested,) = m.merge([MergePair(old, MemoryItem("on", other_new, new.timestamp))])
    assert nested.index("Austin") < nested.index("Denver") and nested.index("pilot") < nested.index("nurse")


def test_remerge_keeps_three_dates():
    a = item("Caroline went to the support group.", 0, "a")
    b = item("Melanie painted a lake. She has 2 kids.", 1, "b")
    c = item("Caroline moved to Sweden 4 years ago.", 3, "c")
    m = ExtractiveMerger()
    (ab,) = m.merge([MergePair(a, b)])
    (abc,) = m.merge([MergePair(MemoryItem("ab", ab, b.timestamp), c)])
    assert tags(abc) == ["11 May 2023", "9 May 2023", "8 May 2023"]
    assert abc == ("[11 May 2023] Caroline moved to Sweden 4 years ago. "
                   "[9 May 2023] Melanie painted a lake. She has 2 kids. "
                   "[8 May 2023] Caroline went to the support group.")
    # and the other way round: an older single memory merged with a later merge
    (c_ab,) = m.merge([MergePair(MemoryItem("c", c.text, T0 - DAY), MemoryItem("ab", ab, b.timestamp))])
    assert tags(c_ab) == ["9 May 2023", "8 May 2023", "7 May 2023"]


def test_abbreviations_and_decimals_not_split():
    text = ("Dr. Smith met Mr. Jones at 3.5 km e.g. near the lake on 8. May 2023. "
            "They walked! \"Really?\" she asked.\nNew line here")
    assert split_sentences(text) == [
        "Dr. Smith met Mr. Jones at 3.5 km e.g. near the lake on 8. May 2023.",
        "They walked!", "\"Really?\" she asked.", "New line here"]
    assert split_sentences("J. K. Rowling wrote it. Ref No. 5 is done.") == [
        "J. K. Rowling wrote it.", "Ref No. 5 is done."]
    assert normalize("Mr. Smith's 2 DOGS!") == ("mr", "smith", "s", "2", "dogs")


def test_non_tag_brackets_and_invalid_dates_are_text():
    out = merge1(item("See [31 February 2023] and [note] here."), item("Other text.", 1))
    assert out == "[9 May 2023] Other text. [8 May 2023] See [31 February 2023] and [note] here."


def test_batch_order_preserved_and_empty():
    m = ExtractiveMerger()
    assert m.merge([]) == []
    pairs = [MergePair(item(f"Older fact {i}."), item(f"Newer fact {i}.", 0.1), "t") for i in range(5)]
    assert m.merge(pairs) == [f"Older fact {i}. Newer fact {i}." for i in range(5)]


def test_never_empty():
    assert merge1(item("[9 May 2023]"), item("   ")) == "[9 May 2023]"
    assert merge1(item(" "), item("\n")) == "[8 May 2023]"


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.01, 2, float("nan"), "0.5", True, None])
def test_invalid_near_duplicate(bad):
    with pytest.raises(ValueError, match=r"near_duplicate must be in \(0, 1\], got"):
        ExtractiveMerger(near_duplicate=bad)


def test_keyword_only():
    with pytest.raises(TypeError):
        ExtractiveMerger(0.5)  # type: ignore[misc]


WORDS = ("caroline melanie went painted lake group support kids dog sweden hiking bread "
         "bear friday school music the a to and with her his at on").split()
ABBREV = ("Dr.", "Mr.", "e.g.", "approx.", "3.5", "St.")


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 9))]
    if rng.random() < 0.4:
        words.insert(rng.randrange(len(words) + 1), str(rng.randint(0, 20)))
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), rng.choice(ABBREV))
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice(".!?")


def _body(text: str) -> str:
    return TAG.sub(" ", text)


def test_random_pairs_length_bound_and_no_lost_numbers():
    rng = random.Random(1234)
    m = ExtractiveMerger(near_duplicate=0.6)
    pool = [_sentence(rng) for _ in range(40)]
    memories: list[MemoryItem] = []
    for trial in range(400):
        def fresh() -> MemoryItem:
            if memories and rng.random() < 0.3:  # re-merge an earlier output
                return rng.choice(memories)
            text = ("\n" if rng.random() < 0.2 else " ").join(
                rng.choice(pool) for _ in range(rng.randint(1, 5)))
            return MemoryItem(str(trial), text, T0 + rng.randint(0, 4) * DAY + rng.random() * 3600)
        a, b = fresh(), fresh()
        older, newer = (a, b) if a.timestamp <= b.timestamp else (b, a)
        (out,) = m.merge([MergePair(older, newer)])
        assert out and out == out.strip()
        n_in = len(older.text.split()) + len(newer.text.split())
        added = max(0, len(tags(out)) - len(tags(older.text)) - len(tags(newer.text)))
        assert len(out.split()) <= n_in + 3 * added
        # no number (or any token) of the inputs' sentences is lost by the Jaccard rule
        in_nums = {t for t in normalize(_body(older.text) + " " + _body(newer.text)) if t.isdigit()}
        assert in_nums <= set(normalize(_body(out)))
        # tags are newest first and only from the inputs' dates
        dates = [(int(y), n, int(d)) for d, n, y in TAG.findall(out)]
        months = {n: i for i, n in enumerate(("January February March April May June July "
                                               "August September October November December").split())}
        keys = [(y, months[n], d) for y, n, d in dates]
        assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys)
        memories.append(MemoryItem(f"m{trial}", out, newer.timestamp))
    assert len(memories) == 400


def test_deterministic():
    pairs = [MergePair(item("A b c. D e f."), item("D e f. G h i.", 1))]
    assert ExtractiveMerger().merge(pairs) == ExtractiveMerger().merge(pairs)


def test_swapped_numbers_are_not_duplicates():
    """Same words, numbers in other places: a different fact, both kept."""
    out = ExtractiveMerger().merge([MergePair(MemoryItem("a", "Alice paid 10 dollars to Bob on day 3.", 0.0),
                                              MemoryItem("b", "Alice paid 3 dollars to Bob on day 10.", 60.0))])[0]
    assert "10 dollars" in out and "3 dollars" in out


# --------------------------------------------------------------------------- condensing to a cap
def words(texts):
    return [len(t.split()) for t in texts]


def condense1(older, newer, cap, counter=words, salience="coverage"):
    (out,), (dropped,) = ExtractiveMerger(salience=salience).condense([MergePair(older, newer)], cap, counter)
    return out, dropped


def test_condense_keeps_a_merge_that_fits():
    a, b = item("Ann paints."), item("Bo sings.", 1)
    assert condense1(a, b, 100) == (merge1(a, b), 0)


def test_condense_keeps_dates_numbers_and_names_first_in_original_order():
    older = item("We chatted for a while about nothing much at all today. Caroline moved to Boston in 2019. "
                 "It was a pleasant and calm afternoon overall.")
    newer = item("The weather stayed quite mild and pleasant all afternoon. Her sister Maria visits in June. "
                 "Nothing else happened.")
    full = merge1(older, newer)
    for salience in ("coverage", "centroid"):
        out, dropped = condense1(older, newer, 14, salience=salience)
        assert out == "Caroline moved to Boston in 2019. Her sister Maria visits in June."
    # a sentence that does not fit is skipped; a shorter one after it may still fit
    assert condense1(older, newer, 15, salience="centroid")[0] == out + " Nothing else happened."
    assert dropped == len(full.split()) - len(out.split()) > 0


def test_centroid_salience_fills_with_sentences_closest_to_the_pair():
    """salience="centroid", after the tier of names and numbers: the sentences whose words the two
    inputs share."""
    older = item("the garden roses need water daily. a cat slept somewhere.")
    newer = item("the garden roses bloomed early. dinner was late.")
    out, _ = condense1(older, newer, 11, salience="centroid")
    assert out == "the garden roses need water daily. the garden roses bloomed early."


def test_coverage_salience_keeps_what_is_not_said_yet():
    """The default: a sentence repeating what is kept waits; what the other input adds comes
    first, wherever it sits in the text."""
    older = item("the garden roses need water daily. a cat slept somewhere.")
    newer = item("the garden roses bloomed early. dinner was late.")
    out, _ = condense1(older, newer, 11)
    assert out == "the garden roses need water daily. a cat slept somewhere."
    chat = item("we talked about the garden. the garden was lovely. we loved the garden so much. "
                "the garden again and the garden more.")
    fact = item("the garden was fine. oh and we adopted a puppy called Rex.", 1)
    out, _ = condense1(chat, fact, 18)
    assert "a puppy called Rex." in out and "[" in out  # the late new fact, with its date tag


def test_coverage_keeps_both_values_of_a_knowledge_update():
    old = item("Caroline: I drive a Honda Civic. Caroline: that sounds lovely! Caroline: so fun to hear.")
    new = item("Caroline: how nice. Caroline: I sold my old car, I now drive a Subaru Outback. "
               "Caroline: great talking.", 40)
    out, dropped = condense1(old, new, 30)
    assert "Honda Civic" in out and "Subaru Outback" in out and dropped > 0
    assert out.index("Subaru Outback") < out.index("Honda Civic")  # the newer value first, each with its date


def test_condense_keeps_the_tags_of_kept_segments():
    older = item("Ann met Bo at the lake. we talked and talked and talked for hours.")
    newer = item("lunch was fine and nothing happened. Bo left for Rome.", 3)
    out, _ = condense1(older, newer, 16, salience="centroid")  # a tag counts 3 words here
    assert out == "[11 May 2023] Bo left for Rome. [8 May 2023] Ann met Bo at the lake."
    out, _ = condense1(older, newer, 16)  # coverage: Bo is covered by the later sentence first
    assert out == "[11 May 2023] lunch was fine and nothing happened. Bo left for Rome."
    out2, _ = condense1(older, newer, 9)  # room for one tagged sentence and nothing else
    assert out2 in ("[8 May 2023] Ann met Bo at the lake.", "[11 May 2023] Bo left for Rome.")


def test_condense_never_empty_and_never_over_the_cap():
    long_one = item(" ".join(f"w{i}" for i in range(50)) + ".")
    out, dropped = condense1(long_one, item("x y z w v u t s r q.", 0), 7)
    assert out == "w0 w1 w2 w3 w4 w5 w6" and dropped > 0
    out, _ = condense1(long_one, item("more words here and there.", 0), 1)
    assert out == "w0"
    rng = random.Random(5)
    vocab = "Ann bo 3 cat May dog eel fig gnu hat ink jam".split()
    for _ in range(200):
        a = item(". ".join(" ".join(rng.choices(vocab, k=rng.randint(1, 8))) for _ in range(rng.randint(1, 5))),
                 rng.choice([0, 0, 2]))
        b = item(". ".join(" ".join(rng.choices(vocab, k=rng.randint(1, 8))) for _ in range(rng.randint(1, 5))),
                 rng.choice([0, 3]))
        cap = rng.randint(1, 30)
        out, dropped = condense1(a, b, cap)
        assert out.strip() and dropped >= 0
        assert len(out.split()) <= max(cap, 1 + 3 * bool(TAG.match(out))), (out, cap)  # a tag + 1 word at least
        if len(merge1(a, b).split()) <= cap:
            assert out == merge1(a, b)


def test_condense_rejects_a_bad_cap():
    with pytest.raises(ValueError, match="cap must be an integer >= 1, got 0"):
        ExtractiveMerger().condense([], 0, words)


def test_has_info():
    from memforest_gpu.mergers.extractive import has_info

    assert has_info("Caroline: we went to Paris.")
    assert has_info("it was on a Tuesday") and has_info("we paid 30 euros") and has_info("back in may")
    assert not has_info("Caroline: that sounds lovely!") and not has_info("I think so.")


def test_merging_in_worker_processes_gives_the_same_texts():
    """A batch cut into parts merged by worker processes gives the texts of one process."""
    pairs = [MergePair(MemoryItem(f"a{i}", f"Alice paid {i} dollars. She was happy.", 1683554160.0 + i),
                       MemoryItem(f"b{i}", f"[9 May 2023] Alice paid {i} dollars. Bob came at {i % 7}.", 1683640560.0))
             for i in range(301)]
    alone = ExtractiveMerger(processes=0).merge(pairs)
    spread = ExtractiveMerger(processes=2, parallel_above=10).merge(pairs)
    assert spread == alone and len(alone) == 301
    with pytest.raises(ValueError, match="processes must be an integer >= 0 or None, got -1"):
        ExtractiveMerger(processes=-1)


def test_a_run_empties_the_mergers_memos_after_its_last_round():
    """The memos of texts and sentences read and written are held through the rounds only
    (1M nodes: ~100 MB); the run's texts are the same as with cold memos."""
    from memforest_gpu import CompressConfig, MergeConfig, compress, sentences
    from memforest_gpu.store.synthetic import synthetic_store

    store = synthetic_store(600, dim=16, seed=3)
    seen = []
    real = sentences.forget

    def counted():
        seen.append((sentences.sentence_info.cache_info().currsize, len(sentences._STATUS.new)))
        real()

    sentences.forget = counted
    try:
        a = compress(store, CompressConfig(merge=MergeConfig(ratio=0.5)))
    finally:
        sentences.forget = real
    assert seen and seen[0][0] > 0  # the memos held sentences until then
    assert sentences.sentence_info.cache_info().currsize == 0
    assert not sentences._STATUS.new and not sentences._WRITTEN.new
    b = compress(store, CompressConfig(merge=MergeConfig(ratio=0.5)))
    assert a.store.texts == b.store.texts
