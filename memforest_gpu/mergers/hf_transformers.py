"""Merging with a local ``transformers`` model: batched greedy ``generate``, left padding.

    >>> m = TransformersMerger("/models/Qwen2.5-1.5B-Instruct", device="cuda", batch_size=32)
    >>> m = TransformersMerger("/models/SmolLM2-135M-Instruct.Q4_1.gguf")   # a GGUF file works too
    >>> texts = m.merge(pairs)

``model`` is a local directory or a ``.gguf`` file (transformers dequantises GGUF
weights on load; it needs the ``gguf`` package). Nothing is downloaded unless
``allow_download=True``. Prompts are rendered with the model's chat template and sorted
by length, so each chunk of ``batch_size`` pads little; decoding is greedy, so the same
pairs in the same batches give the same texts.
"""
from __future__ import annotations

import importlib.util
import logging
import os

import torch

from ..config import ConfigError
from ..device import resolve_device
from .llm import LLMMerger, render_chat

__all__ = ["TransformersMerger"]

log = logging.getLogger("memforest_gpu")
_EXTRA = "pip install 'memforest-gpu[transformers]'"


class TransformersMerger(LLMMerger):
    """A local causal LM; see the module docstring. The model loads on :meth:`load` or the
    first ``merge``."""

    name = "transformers"

    def __init__(self, model: str, *, gguf_file: str | None = None, device=None, dtype: str = "auto",
                 batch_size: int = 8, max_tokens: int = 256, slack: int = 12, allow_download: bool = False):
        super().__init__(slack=slack, max_tokens=max_tokens)
        if importlib.util.find_spec("transformers") is None:
            raise ImportError(f"the transformers merger needs the 'transformers' package: {_EXTRA}")
        model = os.fspath(model) if model is not None else None
        if not model:
            raise ConfigError("model", f"must be a local model directory or .gguf file, got {model!r}")
        given = model
        if not allow_download and model.lower().endswith(".gguf") and not os.path.isfile(model):
            raise ConfigError("model", f"must be a local model directory or .gguf file, got {given!r} (no such file)")
        if gguf_file is None and model.lower().endswith(".gguf"):
            model, gguf_file = os.path.dirname(model) or ".", os.path.basename(model)
        if gguf_file is not None and importlib.util.find_spec("gguf") is None:
            raise ImportError(f"loading a GGUF file needs the 'gguf' package: {_EXTRA}")
        if not allow_download and not os.path.isdir(model):
            raise ConfigError("model", "must be a local directory (or .gguf file) when downloads are off, "
                                       f"got {given!r}")
        if gguf_file is not None and not allow_download and not os.path.isfile(os.path.join(model, gguf_file)):
            raise ConfigError("gguf_file", f"must exist in {model!r}, got {gguf_file!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError("batch_size", f"must be an integer >= 1, got {batch_size!r}")
        if dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ConfigError("dtype", f"must be one of ['auto', 'float32', 'float16', 'bfloat16'], got {dtype!r}")
        self.model = model
        self.gguf_file = gguf_file
        self.device = device
        self.dtype = dtype
        self.batch_size = batch_size
        self.allow_download = allow_download
        self.model_ = self.tokenizer_ = None

    def __repr__(self) -> str:
        return f"TransformersMerger({self.model!r}, gguf_file={self.gguf_file!r}, batch_size={self.batch_size})"

    def identity(self) -> dict:
        return {**super().identity(), "gguf_file": self.gguf_file}

    def load(self) -> None:
        if self.model_ is not None:
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dev = resolve_device(self.device)
        if self.dtype == "auto":
            dtype = torch.bfloat16 if dev.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
        else:
            dtype = getattr(torch, self.dtype)
        kw = {"local_files_only": not self.allow_download}
        if self.gguf_file is not None:
            kw["gguf_file"] = self.gguf_file
        tok = AutoTokenizer.from_pretrained(self.model, **kw)
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        if not getattr(tok, "chat_template", None):
            raise ConfigError("model", f"must have a chat template (an instruct/chat model), {self.model!r} has none")
        mdl = AutoModelForCausalLM.from_pretrained(self.model, dtype=dtype, **kw).to(dev).eval()
        self.tokenizer_, self.model_, self.device_ = tok, mdl, dev

    def _generate(self, conversations: list[list[dict]]) -> list[str | None]:
        self.load()
        tok, mdl = self.tokenizer_, self.model_
        prompts = [render_chat(tok, c) for c in conversations]
        lengths = [len(x) for x in tok(prompts, add_special_tokens=False)["input_ids"]]
        order = sorted(range(len(prompts)), key=lambda j: (-lengths[j], j))  # long first: OOM shows early
        out: list[str | None] = [None] * len(prompts)
        eos = mdl.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos if eos is not None else tok.eos_token_id])
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            enc = tok([prompts[j] for j in idx], return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(self.device_) for k, v in enc.items()}
            with torch.inference_mode():
                gen = mdl.generate(**enc, max_new_tokens=self.max_tokens, do_sample=False, num_beams=1,
                                   temperature=None, top_p=None, top_k=None, pad_token_id=tok.pad_token_id)
            new = gen[:, enc["input_ids"].shape[1]:].cpu()  # (b, t) generated part
            for row, j in enumerate(idx):
                ids = new[row].tolist()
                n = next((k + 1 for k, t in enumerate(ids) if t in eos), len(ids))
                out[j] = tok.decode(ids[:n], skip_special_tokens=True)
                self._count_tokens(lengths[j], n)
        return out
