"""Merging with vLLM in-process: every prompt of a round in one ``LLM.generate`` call.

    >>> m = VLLMMerger("/models/Qwen2.5-7B-Instruct", dtype="bfloat16", tensor_parallel_size=1,
    ...                gpu_memory_utilization=0.85, max_tokens=256)
    >>> texts = m.merge(pairs)          # one generate() for all pairs, one for the retries

The engine object (``vllm.LLM``) is built once, on :meth:`load` or the first ``merge``;
sampling is greedy (``temperature=0``) with a fixed ``seed``. Prompts are rendered with
the model's own chat template (``llm.get_tokenizer().apply_chat_template``) and passed
as token ids (so no second BOS is added). vLLM
schedules the whole batch itself (continuous batching), so a round of any size is one
call. Leave ``gpu_memory_utilization`` room for the engine's own tensors (the similarity
matrices of the trees live on the same GPU when ``--device cuda``).
"""
from __future__ import annotations

import importlib.util

from .llm import LLMMerger, render_chat

__all__ = ["VLLMMerger"]

_EXTRA = "pip install 'memforest-gpu[vllm]' (Linux with a CUDA GPU)"


class VLLMMerger(LLMMerger):
    """vLLM offline batched generation; see the module docstring. ``engine_options`` are
    passed to ``vllm.LLM`` unchanged (e.g. ``{"enforce_eager": True, "quantization": "awq"}``)."""

    name = "vllm"

    def __init__(self, model: str, *, dtype: str = "auto", tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.85, max_tokens: int = 256, max_model_len: int | None = None,
                 seed: int = 0, slack: int = 12, engine_options: dict | None = None):
        super().__init__(slack=slack, max_tokens=max_tokens)
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(f"the vllm merger needs the 'vllm' package: {_EXTRA}")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a model directory or name, got {model!r}")
        if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int) \
                or tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {tensor_parallel_size!r}")
        if isinstance(gpu_memory_utilization, bool) or not isinstance(gpu_memory_utilization, (int, float)) \
                or not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
        self.model = model
        self.dtype = dtype
        self.tensor_parallel_size = tensor_parallel_size
        self.gpu_memory_utilization = float(gpu_memory_utilization)
        self.max_model_len = max_model_len
        self.seed = seed
        self.engine_options = dict(engine_options or {})
        self.llm_ = None

    def __repr__(self) -> str:
        return f"VLLMMerger({self.model!r}, dtype={self.dtype!r}, tensor_parallel_size={self.tensor_parallel_size})"

    def identity(self) -> dict:
        return {**super().identity(), "dtype": self.dtype, "seed": self.seed}

    def load(self) -> None:
        if self.llm_ is not None:
            return
        import vllm

        kw = dict(dtype=self.dtype, tensor_parallel_size=self.tensor_parallel_size,
                  gpu_memory_utilization=self.gpu_memory_utilization, seed=self.seed)
        if self.max_model_len is not None:
            kw["max_model_len"] = self.max_model_len
        kw.update(self.engine_options)
        self.llm_ = vllm.LLM(model=self.model, **kw)
        self.sampling_ = vllm.SamplingParams(temperature=0.0, max_tokens=self.max_tokens, seed=self.seed)

    def _generate(self, conversations: list[list[dict]]) -> list[str | None]:
        self.load()
        tok = self.llm_.get_tokenizer()
        # token ids, not text: vLLM would add a second BOS to a template that writes one
        ids = tok([render_chat(tok, c) for c in conversations], add_special_tokens=False)["input_ids"]
        outs = self.llm_.generate([{"prompt_token_ids": list(x)} for x in ids], self.sampling_, use_tqdm=False)
        texts: list[str | None] = []
        for o in outs:  # vLLM returns outputs in the order of the prompts
            c = o.outputs[0] if o.outputs else None
            texts.append(c.text if c is not None else None)
            self._count_tokens(len(o.prompt_token_ids or ()), len(c.token_ids) if c is not None else 0)
        return texts
