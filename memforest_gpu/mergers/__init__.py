"""Mergers: turn two memories into one text. See :mod:`.base` for the protocol.

``get_merger(name, **options)`` builds one by name:

=============  ==========================================================  =====================
name           what                                                        extra to install
=============  ==========================================================  =====================
extractive     sentence union with date tags; no model (the default)       (none)
transformers   a local model directory or .gguf file, batched generate     ``[transformers]``
vllm           vLLM offline batched generation on GPUs                     ``[vllm]``
openai         any OpenAI-compatible chat endpoint (vllm serve, llama.cpp,  (none: stdlib only)
               Ollama, hosted APIs)
=============  ==========================================================  =====================

The LLM mergers validate every merged text, retry failures once with a stricter prompt and
fall back to the extractive merger, so no memory is ever lost (:mod:`.llm`).

:mod:`.embedders` holds the other model a run may call: the embedder that re-embeds merged
text (and counts its tokens for the node cap).
"""
import inspect

from ..config import ConfigError
from .base import MemoryItem, MergePair, Merger
from .extractive import ExtractiveMerger

__all__ = ["MemoryItem", "MergePair", "Merger", "ExtractiveMerger", "get_merger", "merger_class", "MERGERS",
           "MissingOptionError"]

MERGERS = ("extractive", "transformers", "vllm", "openai")


def merger_class(name: str) -> type:
    """The class behind a merger name (imports no model library)."""
    if name == "extractive":
        return ExtractiveMerger
    if name == "transformers":
        from .hf_transformers import TransformersMerger

        return TransformersMerger
    if name == "vllm":
        from .vllm_offline import VLLMMerger

        return VLLMMerger
    if name == "openai":
        from .openai_compat import OpenAIMerger

        return OpenAIMerger
    raise ConfigError("merger", f"must be one of {list(MERGERS)}, got {name!r}")


class MissingOptionError(ValueError):
    """A merger built without options it needs: ``merger`` (its name) and ``missing`` (the
    options' names). The message shows how to pass the first one: ``model=...`` in Python, a
    command names its flag (:meth:`message`)."""

    def __init__(self, merger: str, missing: list[str]):
        self.merger, self.missing = merger, list(missing)
        super().__init__(self.message(f"{self.missing[0]}=..."))

    def message(self, example: str) -> str:
        """The message, with ``example`` showing how to pass the first missing option."""
        return f"merger {self.merger!r} needs {', '.join(self.missing)} (e.g. {example}), got none"


def get_merger(name: str = "extractive", **options) -> Merger:
    """Build a merger by name; unknown names and unknown options list the valid ones.

    >>> get_merger("openai", model="llama3", base_url="http://127.0.0.1:11434/v1",
    ...     max_concurrency=4)
    OpenAIMerger('llama3', url='http://127.0.0.1:11434/v1/chat/completions', max_concurrency=4)
    """
    cls = merger_class(name)
    params = inspect.signature(cls.__init__).parameters
    valid = [p for p in params if p != "self"]
    bad = sorted(set(options) - set(valid))
    if bad:
        raise ValueError(f"options of merger {name!r} must be among {valid}, got unknown {bad}")
    required = [p.name for p in params.values() if p.name != "self" and p.default is inspect.Parameter.empty]
    missing = [p for p in required if p not in options]
    if missing:
        raise MissingOptionError(name, missing)
    return cls(**options)
