"""Merging through any OpenAI-compatible chat endpoint: ``vllm serve``, llama.cpp's server,
Ollama, or a hosted API. Standard library only (``urllib`` + a thread pool).

    >>> m = OpenAIMerger("Qwen/Qwen2.5-7B-Instruct", base_url="http://127.0.0.1:8000/v1",
    ...                  max_concurrency=32)
    >>> texts = m.merge(pairs)          # len(pairs) requests, at most 32 in flight

Each pair is one ``POST {base_url}/chat/completions`` request. A request that fails
with HTTP 408/409/425/429/5xx, a timeout, a dropped connection or a reply that is not the
expected JSON is retried up to ``max_retries`` times, waiting ``backoff * 2**attempt``
seconds (or the server's ``Retry-After``, at most 30 s). Other HTTP errors (400, 401,
404 ...) are not retried. A request that still fails makes its pair fall back
(see :class:`~.llm.LLMMerger`). The API key is read from the environment variable
``api_key_env`` (default ``OPENAI_API_KEY``; none is sent when it is unset, as local
servers need none) and never stored in a report or journal.
"""
from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ..config import ConfigError
from .llm import LLMMerger

__all__ = ["OpenAIMerger"]

_RETRY_CODES = frozenset({408, 409, 425, 429})


class OpenAIMerger(LLMMerger):
    """Merges via an OpenAI-compatible ``/chat/completions`` endpoint; see the module docstring."""

    name = "openai"

    def __init__(self, model: str, *, base_url: str = "http://127.0.0.1:8000/v1", api_key_env: str = "OPENAI_API_KEY",
                 max_concurrency: int = 16, timeout: float = 120.0, max_retries: int = 3, backoff: float = 1.0,
                 max_tokens: int = 256, temperature: float = 0.0, seed: int | None = None, slack: int = 12):
        super().__init__(slack=slack, max_tokens=max_tokens)
        if not isinstance(model, str) or not model:
            raise ConfigError("model", f"must be a non-empty model name, got {model!r}")
        url = urllib.parse.urlsplit(str(base_url))
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ConfigError("base_url", "must be an http(s) URL such as 'http://127.0.0.1:8000/v1', "
                                          f"got {base_url!r}")
        for name, v, lo in (("max_concurrency", max_concurrency, 1), ("max_retries", max_retries, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(name, f"must be an integer >= {lo}, got {v!r}")
        for name, v in (("timeout", timeout), ("backoff", backoff), ("temperature", temperature)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (name == "timeout" and v == 0):
                raise ConfigError(name, f"must be a number {'> 0' if name == 'timeout' else '>= 0'}, got {v!r}")
        if api_key_env != "OPENAI_API_KEY" and not os.environ.get(api_key_env):
            raise ValueError(f"api_key_env names the environment variable holding the API key; "
                             f"{api_key_env!r} is not set")
        self.model = model
        path = url.path.rstrip("/")
        if not path.endswith("/chat/completions"):
            path = (path or "/v1") + "/chat/completions"
        self.url = urllib.parse.urlunsplit((url.scheme, url.netloc, path, "", ""))
        self.api_key_env = api_key_env
        self.max_concurrency = max_concurrency
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff = float(backoff)
        self.temperature = float(temperature)
        self.seed = seed
        self.stats["http_retries"] = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OpenAIMerger({self.model!r}, url={self.url!r}, max_concurrency={self.max_concurrency})"

    def identity(self) -> dict:
        return {**super().identity(), "temperature": self.temperature, "seed": self.seed}

    def _generate(self, conversations: list[list[dict]]) -> list[str | None]:
        key = os.environ.get(self.api_key_env)
        workers = min(self.max_concurrency, len(conversations))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memforest-openai") as ex:
            return list(ex.map(lambda c: self._request(c, key), conversations))

    def _request(self, conversation: list[dict], key: str | None) -> str | None:
        """One chat completion with retries: the reply text ('' for empty content), or None."""
        body = {"model": self.model, "messages": conversation, "max_tokens": self.max_tokens,
                "temperature": self.temperature}
        if self.seed is not None:
            body["seed"] = self.seed
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        error = "no attempt"
        for attempt in range(self.max_retries + 1):
            if attempt:
                with self._lock:
                    self.stats["http_retries"] += 1
            wait = None
            try:
                req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    reply = json.loads(resp.read().decode("utf-8"))
                content = reply["choices"][0]["message"]["content"]
                if content is not None and not isinstance(content, str):
                    raise TypeError(f"message content is {type(content).__name__}, not a string")
                usage = reply.get("usage") or {}
                with self._lock:
                    self._count_tokens(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0)
                return content or ""
            except urllib.error.HTTPError as e:
                detail = e.read(300).decode("utf-8", "replace").strip() if e.fp else ""
                error = f"HTTP {e.code} from {self.url}: {detail or e.reason}"
                if not (e.code in _RETRY_CODES or e.code >= 500):
                    break
                wait = _retry_after(e.headers.get("Retry-After") if e.headers else None)
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as e:
                error = f"{type(e).__name__} from {self.url}: {getattr(e, 'reason', e)}"
            except (ValueError, KeyError, IndexError, TypeError) as e:  # JSON or its shape
                error = f"malformed reply from {self.url}: {type(e).__name__}: {e}"
            if attempt < self.max_retries:
                time.sleep(min(30.0, wait if wait is not None else self.backoff * 2 ** attempt))
        self._last_error = error
        return None


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:  # an HTTP date: not worth parsing, use our own backoff
        return None
