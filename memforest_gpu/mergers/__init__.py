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

from .base import MemoryItem, MergePair, Merger
from .extractive import ExtractiveMerger

__all__ = ["MemoryItem", "MergePair", "Merger", "ExtractiveMerger", "get_merger", "merger_class", "MERGERS"]

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
    raise ValueError(f"merger must be one of {list(MERGERS)}, got {name!r}")


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
        raise ValueError(f"merger {name!r} needs {', '.join(missing)} (e.g. --{missing[0].replace('_', '-')} ...), "
                         "got none")
    return cls(**options)
