"""LLM mergers: one batched generation per round, validated, retried once, never lossy.

:class:`LLMMerger` orchestrates; a backend subclass implements one method::

    _generate(conversations: list[list[dict]]) -> list[str | None]

(one chat per pair in, one reply per chat out, ``None`` for a request that failed).
Per ``merge(pairs)`` call:

1. build the prompt of every pair (:func:`.prompt.build_messages`), ONE ``_generate`` call;
2. clean and validate every reply (:func:`.validate.check_merge`);
3. the rejected ones go again in ONE ``_generate`` call with the strict prompt, which names
   the problem;
4. what is still rejected, or whose request failed, is merged by the extractive merger
   (one call). Nothing is ever dropped: every pair gets a non-empty text.

``stats`` counts calls, pairs, retries, fallbacks (with reasons), tokens and seconds.
If every request of a call failed (server down, bad key, model missing), ``fatal`` holds
the error: the pairs still fall back, and :func:`memforest_gpu.api.compress_file` stops
the run after that round so that no more of the store is merged without the model.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence

from ..config import ConfigError
from .base import MergePair
from .extractive import ExtractiveMerger
from .prompt import PROMPT_VERSION, build_messages
from .validate import check_merge, clean_output

__all__ = ["LLMMerger", "render_chat"]

log = logging.getLogger("memforest_gpu")


class LLMMerger:
    """Base class of the LLM mergers; see the module docstring. Subclasses set ``name``
    and implement ``_generate``; ``load()`` (optional) loads a model once, up front."""

    name = "llm"

    def __init__(self, *, slack: int = 12, max_tokens: int = 256):
        if isinstance(slack, bool) or not isinstance(slack, int) or slack < 0:
            raise ConfigError("slack", f"must be an integer >= 0, got {slack!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigError("max_tokens", f"must be an integer >= 1, got {max_tokens!r}")
        self.slack = slack
        self.max_tokens = max_tokens
        self.fallback = ExtractiveMerger()
        self.fatal: str | None = None  # set when every request of a call failed
        self._last_error: str | None = None
        self.stats = {"calls": 0, "pairs": 0, "accepted": 0, "retries": 0, "retry_accepted": 0, "fallbacks": 0,
                      "failed_requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0,
                      "fallback_reasons": Counter()}

    # ---- subclass API
    def _generate(self, conversations: list[list[dict]]) -> list[str | None]:  # pragma: no cover - abstract
        raise NotImplementedError

    def load(self) -> None:
        """Load the model / check the setup now (idempotent). Default: nothing to do."""

    def identity(self) -> dict:
        """What determines the texts this merger writes (the journal's fingerprint)."""
        return {"name": self.name, "model": getattr(self, "model", None), "max_tokens": self.max_tokens,
                "slack": self.slack, "prompt": PROMPT_VERSION}

    def _count_tokens(self, prompt: int, completion: int) -> None:
        self.stats["prompt_tokens"] += int(prompt)
        self.stats["completion_tokens"] += int(completion)

    # ---- the protocol
    def merge(self, pairs: Sequence[MergePair]) -> list[str]:
        """One merged, non-empty text per pair, in order (see the module docstring)."""
        pairs = list(pairs)
        if not pairs:
            return []
        t0 = time.perf_counter()
        self.fatal = self._last_error = None
        st = self.stats
        st["pairs"] += len(pairs)
        texts: list[str | None] = [None] * len(pairs)
        reasons: dict[int, str] = {}
        todo = list(range(len(pairs)))
        for attempt in range(2):
            convs = [build_messages(pairs[j], strict=attempt > 0, problem=reasons.get(j, "")) for j in todo]
            replies = self._call(convs)
            if attempt == 0 and replies and all(r is None for r in replies):
                self.fatal = getattr(self, "_last_error", None) or "every request failed"
            again = []
            for j, raw in zip(todo, replies):
                if raw is None:
                    reasons[j] = "request failed"
                    continue
                out = clean_output(raw)
                why = check_merge(out, pairs[j], self.slack)
                if why is None:
                    texts[j] = out
                    st["accepted" if attempt == 0 else "retry_accepted"] += 1
                else:
                    reasons[j] = why
                    again.append(j)
            if attempt == 0:
                st["retries"] += len(again)
            todo = again
            if not todo:
                break
        rest = [j for j, t in enumerate(texts) if t is None]
        if rest:
            for j, t in zip(rest, self.fallback.merge([pairs[j] for j in rest])):
                texts[j] = t
                st["fallback_reasons"][_reason_kind(reasons.get(j, "request failed"))] += 1
            st["fallbacks"] += len(rest)
            log.info("%s: %d of %d merges fell back to the extractive merger", self.name, len(rest), len(pairs))
        st["seconds"] += time.perf_counter() - t0
        return texts  # type: ignore[return-value]

    def _call(self, convs: list[list[dict]]) -> list[str | None]:
        """One backend call; an exception fails every request of it (they fall back)."""
        self.stats["calls"] += 1
        try:
            out = list(self._generate(convs))
        except Exception as e:  # noqa: BLE001 - a backend error must never lose memories
            log.warning("%s: generation failed for %d prompts: %s", self.name, len(convs), e)
            self._last_error = f"{type(e).__name__}: {e}"
            out = [None] * len(convs)
        if len(out) != len(convs):
            raise RuntimeError(f"{self.name}: backend returned {len(out)} replies for {len(convs)} prompts")
        self.stats["failed_requests"] += sum(r is None for r in out)
        return out

    def summary(self) -> dict:
        """Flat numbers for a report: stats plus merges/s and tokens/s."""
        st = dict(self.stats)
        st["fallback_reasons"] = dict(st["fallback_reasons"])
        sec = st["seconds"]
        st["merges_per_s"] = st["pairs"] / sec if sec > 0 else 0.0
        st["completion_tokens_per_s"] = st["completion_tokens"] / sec if sec > 0 else 0.0
        st["tokens_per_s"] = (st["prompt_tokens"] + st["completion_tokens"]) / sec if sec > 0 else 0.0
        return st


def _reason_kind(reason: str) -> str:
    """'dropped the number 5' -> 'dropped a number': a reason without its values."""
    for key, kind in (("number", "dropped a number"), ("date", "dropped a date"), ("too long", "too long"),
                      ("empty", "empty"), ("refusal", "refusal"), ("tags", "echoed the prompt"),
                      ("request failed", "request failed")):
        if key in reason:
            return kind
    return reason


def render_chat(tokenizer, conversation: list[dict]) -> str:
    """The model's chat template applied to one conversation, ready for generation.

    A template that rejects a system turn (some do) gets the rules in the user turn."""
    try:
        return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - jinja TemplateError: "System role not supported"
        if conversation and conversation[0]["role"] == "system":
            merged = [{"role": "user", "content": conversation[0]["content"] + "\n\n" + conversation[1]["content"]}]
            return tokenizer.apply_chat_template(merged, tokenize=False, add_generation_prompt=True)
        raise

