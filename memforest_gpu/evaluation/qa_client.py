"""The models of the LLM protocol, on the mergers' back ends (no HTTP or model code of its own).

A model spec names a back end and a model:

- ``NAME`` or ``openai:NAME``: any OpenAI-compatible chat endpoint at ``base_url`` (``vllm
  serve``, llama.cpp's server, Ollama, a hosted API), through
  :class:`~memforest_gpu.mergers.openai_compat.OpenAIMerger`
  (its thread pool, retries on 429 / 5xx / timeouts, API key from ``OPENAI_API_KEY``);
- ``vllm:PATH``: a local vLLM engine, one ``generate`` for a whole batch
  (:class:`~memforest_gpu.mergers.vllm_offline.VLLMMerger`);
- ``transformers:PATH``: a local model directory or ``.gguf`` file, batched greedy
  ``generate`` (:class:`~memforest_gpu.mergers.hf_transformers.TransformersMerger`).

``options`` go to the back end as the mergers take them (``max_concurrency``, ``batch_size``,
``device``, ``dtype``, ``timeout`` ...; unknown ones are listed). Decoding is greedy everywhere.
When the judge's spec is the answerer's and the back end is local, the judge shares the
answerer's model (one copy in memory) with its own token limit. Local models load on their first
generation, so a run answered from the cache loads none.
"""
from __future__ import annotations

import copy
from collections import Counter

from ..config import ConfigError
from ..mergers import get_merger

__all__ = ["QAModel", "make_models", "parse_spec", "BACKENDS"]

BACKENDS = ("openai", "vllm", "transformers")


def parse_spec(spec: str) -> tuple[str, str]:
    """``"vllm:/m"`` -> ("vllm", "/m"); ``"gpt-4o-mini"`` -> ("openai", "gpt-4o-mini")."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("model", f"must be NAME (an OpenAI-compatible server's model), openai:NAME, vllm:PATH or "
                         f"transformers:PATH, got {spec!r}")
    kind, sep, rest = spec.partition(":")
    if sep and kind in BACKENDS:
        if not rest.strip():
            where = "a served model's name" if kind == "openai" else "a model directory or .gguf file"
            raise ConfigError("model", f"must be {kind}:{'NAME' if kind == 'openai' else 'PATH'} ({where}), got "
                             f"{spec!r}")
        return kind, rest
    return "openai", spec


class QAModel:
    """One model of the protocol: ``generate(chats) -> replies`` (None for a failed request)
    and ``identity`` (what decides its replies: part of every cache key)."""

    def __init__(self, backend, role: str, spec: str):
        self.backend = backend
        self.role = role
        self.spec = spec

    @property
    def identity(self) -> dict:
        b = self.backend
        return {"backend": b.name, "model": getattr(b, "model", None), "gguf_file": getattr(b, "gguf_file", None),
                "max_tokens": b.max_tokens, "temperature": getattr(b, "temperature", 0.0),
                "seed": getattr(b, "seed", None)}

    def generate(self, chats: list[list[dict]]) -> list[str | None]:
        """One batched back-end call; a back-end exception fails every request of it."""
        if not chats:
            return []
        return self.backend._call(chats)  # the mergers' one call: counts calls, catches, never raises per request

    def summary(self) -> dict:
        st = self.backend.stats
        return {"spec": self.spec, "calls": st["calls"], "failed_requests": st["failed_requests"],
                "prompt_tokens": st["prompt_tokens"], "completion_tokens": st["completion_tokens"],
                "http_retries": st.get("http_retries", 0),
                "last_error": getattr(self.backend, "_last_error", None)}


def _backend(spec: str, *, base_url: str | None, max_tokens: int, options: dict):
    kind, model = parse_spec(spec)
    kw = dict(options)
    if kind == "openai":
        if base_url:
            kw["base_url"] = base_url
    elif base_url:
        raise ValueError(f"base_url is for OpenAI-compatible servers, got one with the local model {spec!r}")
    return get_merger(kind, model=model, max_tokens=max_tokens, **kw)


def _share(backend, max_tokens: int):
    """A second handle on a local model with its own token limit and counters. Nothing is
    loaded here: the twin loads the model through ``backend`` when it first generates and then
    reads its loaded state (``model_``, ``tokenizer_``, ``llm_`` ...), so a run answered from the
    cache loads nothing and a run that generates holds one copy."""
    twin = copy.copy(backend)
    twin.max_tokens = max_tokens
    twin.stats = {k: (Counter() if isinstance(v, Counter) else type(v)()) for k, v in backend.stats.items()}

    def load():
        backend.load()
        for k, v in vars(backend).items():
            if k.endswith("_") and not k.startswith("_"):
                setattr(twin, k, v)
        if getattr(backend, "sampling_", None) is not None:  # vLLM: the sampling parameters hold the limit
            twin.sampling_ = type(backend.sampling_)(temperature=0.0, max_tokens=max_tokens, seed=backend.seed)

    twin.load = load
    return twin


def make_models(answer: str, judge: str | None, *, base_url: str | None = None, answer_max_tokens: int = 64,
                judge_max_tokens: int = 16, options: dict | None = None) -> tuple[QAModel, QAModel | None]:
    """The answerer and the judge (None without a judge spec); see the module docstring."""
    for name, v in (("answer_max_tokens", answer_max_tokens), ("judge_max_tokens", judge_max_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(name, f"must be an integer >= 1, got {v!r}")
    options = dict(options or {})
    a = QAModel(_backend(answer, base_url=base_url, max_tokens=answer_max_tokens, options=options), "answer", answer)
    if judge is None:
        return a, None
    if judge == answer and parse_spec(answer)[0] != "openai":
        return a, QAModel(_share(a.backend, judge_max_tokens), "judge", judge)
    return a, QAModel(_backend(judge, base_url=base_url, max_tokens=judge_max_tokens, options=options), "judge", judge)
