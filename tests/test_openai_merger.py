"""The `openai` merger against a real HTTP server on 127.0.0.1 (stdlib, port 0, a thread).

The server (:class:`FakeChatServer`) answers OpenAI-style chat completions with a correct
merge ("On <date>: <text> On <date>: <text>"). Faults are injected per memory: a memory
whose text holds a marker such as ``[500]`` gets the scripted replies of that marker, one
per request, then correct ones.
"""
from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig
from memforest_gpu.engine import compress
from memforest_gpu.mergers import ExtractiveMerger, get_merger
from memforest_gpu.mergers.base import MemoryItem, MergePair
from memforest_gpu.mergers.validate import check_merge
from memforest_gpu.store.memory_store import MemoryStore

DAY = 86400.0
T0 = 1683554160.0  # 8 May 2023
_MEM = re.compile(r'<memory_\d date="([^"]+)">\n(.*?)\n</memory_\d>', re.DOTALL)


def correct_merge(parts: list[tuple[str, str]]) -> str:
    return " ".join(f"On {d}: {t}" for d, t in parts)


class FakeChatServer:
    """``/v1/chat/completions`` on 127.0.0.1:<free port>; use as a context manager.

    faults: marker -> list of actions for the requests whose memories contain the marker:
      "500" (HTTP 500), "slow" (answer after ``slow_s``), "badjson" (not JSON), "empty"
      (empty content), "nodate" (a merge without the dates), "ok".
    delay: seconds every request takes (to observe concurrency).
    block_after: requests after this many wait until ``release()``.
    """

    def __init__(self, faults=None, *, delay: float = 0.0, slow_s: float = 2.0, block_after: int | None = None):
        self.faults = {k: list(v) for k, v in (faults or {}).items()}
        self.delay, self.slow_s, self.block_after = delay, slow_s, block_after
        self.lock = threading.Lock()
        self.requests: list[dict] = []  # every request body, with "_headers" and "_path"
        self.replied: dict[str, tuple] = {}  # correct reply text -> the input texts it merged
        self.inflight = self.max_inflight = self.blocked = 0
        self.gate = threading.Event()
        self.gate.set() if block_after is None else None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                if self.path != "/v1/chat/completions":
                    self.rfile.read(int(self.headers["Content-Length"]))
                    return self._send(404, b'{"error": "no such route"}')
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body["_headers"], body["_path"] = dict(self.headers), self.path
                with server.lock:
                    n = len(server.requests)
                    server.requests.append(body)
                    server.inflight += 1
                    server.max_inflight = max(server.max_inflight, server.inflight)
                self._counted = True
                try:
                    if server.block_after is not None and n >= server.block_after:
                        with server.lock:
                            server.blocked += 1
                        server.gate.wait(60)
                    time.sleep(server.delay)
                    self._answer(body)
                finally:
                    self._done()

            def _done(self):
                """Leave the in-flight count before the reply goes out: once the client reads it,
                it may send its next request, which must not find this one still counted."""
                if getattr(self, "_counted", False):
                    self._counted = False
                    with server.lock:
                        server.inflight -= 1

            def _answer(self, body):
                parts = _MEM.findall(body["messages"][1]["content"])
                action = "ok"
                with server.lock:
                    for marker, todo in server.faults.items():
                        if todo and any(marker in t for _, t in parts):
                            action = todo.pop(0)
                            break
                if action == "500":
                    return self._send(500, b'{"error": "boom"}')
                if action == "badjson":
                    return self._send(200, b'{"choices": [ {"message": ')
                if action == "slow":
                    time.sleep(server.slow_s)
                text = {"empty": "", "nodate": " ".join(t for _, t in parts)}.get(action, correct_merge(parts))
                if action in ("ok", "slow"):
                    with server.lock:
                        server.replied[text] = tuple(t for _, t in parts)
                reply = {"id": "x", "object": "chat.completion", "model": body["model"],
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 100, "completion_tokens": len(text.split())}}
                self._send(200, json.dumps(reply).encode())

            def _send(self, code, data):
                self._done()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256  # many concurrent clients: no SYN retry stalls

            def handle_error(self, request, client_address):  # a client that hung up is not an error here
                pass

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def release(self):
        self.gate.set()

    def __enter__(self):
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def pair(a: str, b: str, days: float = 1.0, ids=("a", "b")) -> MergePair:
    return MergePair(MemoryItem(ids[0], a, T0), MemoryItem(ids[1], b, T0 + days * DAY), "t")


PAIRS = [pair(f"Alice bought {i + 2} apples.", f"Alice ate {i + 10} pears.", ids=(f"a{i}", f"b{i}")) for i in range(8)]


def merger(url, **kw):
    kw.setdefault("backoff", 0.01)
    return get_merger("openai", model="fake-model", base_url=url, **kw)


# --------------------------------------------------------------------------- requests
def test_requests_are_correct_chat_completions(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with FakeChatServer() as srv:
        m = merger(srv.url, max_tokens=77, seed=3)
        out = m.merge(PAIRS[:3])
    assert out == [correct_merge([("8 May 2023", p.older.text), ("9 May 2023", p.newer.text)]) for p in PAIRS[:3]]
    assert len(srv.requests) == 3
    for body in srv.requests:
        assert body["_path"] == "/v1/chat/completions"
        assert body["_headers"]["Authorization"] == "Bearer sk-test"
        assert body["_headers"]["Content-Type"] == "application/json"
        assert body["model"] == "fake-model" and body["max_tokens"] == 77 and body["temperature"] == 0.0
        assert body["seed"] == 3
        assert [msg["role"] for msg in body["messages"]] == ["system", "user"]
        user = body["messages"][1]["content"]
        assert user.index('<memory_1 date="8 May 2023">\nAlice bought') < user.index('<memory_2 date="9 May 2023">')
    st = m.summary()
    assert (st["calls"], st["accepted"], st["fallbacks"], st["prompt_tokens"]) == (1, 3, 0, 300)
    assert st["completion_tokens"] == sum(len(t.split()) for t in out) and st["merges_per_s"] > 0


def test_no_key_no_authorization_header(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OTHER_KEY", "k2")
    with FakeChatServer() as srv:
        merger(srv.url).merge(PAIRS[:1])
        merger(srv.url, api_key_env="OTHER_KEY").merge(PAIRS[:1])
    assert "Authorization" not in srv.requests[0]["_headers"]
    assert srv.requests[1]["_headers"]["Authorization"] == "Bearer k2"


def test_concurrency_is_bounded():
    with FakeChatServer(delay=0.15) as srv:
        t0 = time.perf_counter()
        out = merger(srv.url, max_concurrency=3).merge(PAIRS * 2)  # 16 requests
        took = time.perf_counter() - t0
    assert len(out) == 16 and len(srv.requests) == 16
    assert srv.max_inflight == 3
    assert took < 16 * 0.15  # ran in parallel


# --------------------------------------------------------------------------- faults
def test_http_500_malformed_json_and_timeouts_are_retried():
    faults = {"3 apples": ["500", "500"], "4 apples": ["badjson"], "5 apples": ["slow"]}
    with FakeChatServer(faults, slow_s=1.0) as srv:
        m = merger(srv.url, timeout=0.3, max_retries=2)
        out = m.merge(PAIRS[:4])
    assert all(check_merge(t, p) is None for t, p in zip(out, PAIRS[:4]))
    st = m.summary()
    assert st["http_retries"] == 4 and st["fallbacks"] == 0 and st["retries"] == 0
    assert len(srv.requests) == 8


def test_persistent_faults_fall_back_per_pair():
    faults = {"2 apples": ["500"] * 3, "3 apples": ["slow"] * 3, "4 apples": ["badjson"] * 3}
    with FakeChatServer(faults, slow_s=1.0) as srv:
        m = merger(srv.url, timeout=0.3, max_retries=2)
        out = m.merge(PAIRS[:4])
    ext = ExtractiveMerger()
    assert out[:3] == ext.merge(PAIRS[:3])
    assert check_merge(out[3], PAIRS[3]) is None
    st = m.summary()
    assert st["fallbacks"] == 3 and st["fallback_reasons"] == {"request failed": 3} and st["failed_requests"] == 3
    assert m.fatal is None  # one pair went through: not a broken server


def test_empty_content_and_a_dropped_date_get_one_strict_retry():
    faults = {"2 apples": ["empty"], "3 apples": ["nodate"], "4 apples": ["nodate", "nodate"]}
    with FakeChatServer(faults) as srv:
        m = merger(srv.url)
        out = m.merge(PAIRS[:4])
    assert check_merge(out[0], PAIRS[0]) is None and check_merge(out[1], PAIRS[1]) is None
    assert out[2] == ExtractiveMerger().merge([PAIRS[2]])[0]
    assert check_merge(out[3], PAIRS[3]) is None
    strict = [b for b in srv.requests if "rejected" in b["messages"][0]["content"]]
    assert len(strict) == 3
    reasons = sorted(b["messages"][0]["content"].split("rejected because it ")[1].split(".")[0] for b in strict)
    assert reasons == ["dropped the date 8 May 2023", "dropped the date 8 May 2023", "was empty"]
    st = m.summary()
    assert (st["accepted"], st["retries"], st["retry_accepted"], st["fallbacks"]) == (1, 3, 2, 1)
    assert st["fallback_reasons"] == {"dropped a date": 1}


def test_a_dead_server_is_fatal_but_loses_nothing():
    with FakeChatServer() as srv:
        url = srv.url
    m = merger(url, max_retries=1, timeout=0.5)  # nothing listens there any more
    out = m.merge(PAIRS[:2])
    assert out == ExtractiveMerger().merge(PAIRS[:2])
    assert m.fatal and "127.0.0.1" in m.fatal


def test_http_404_is_not_retried():
    with FakeChatServer() as srv:
        m = merger(srv.url.replace("/v1", "/nope"))
        out = m.merge(PAIRS[:1])
    assert out == ExtractiveMerger().merge(PAIRS[:1])
    assert m.stats["http_retries"] == 0 and "HTTP" in m.fatal


# --------------------------------------------------------------------------- a real compress
def _store(n: int = 48, tenants: int = 2) -> MemoryStore:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((4, 16)).astype(np.float32)
    emb = centres[np.arange(n) % 4] + 0.3 * rng.standard_normal((n, 16)).astype(np.float32)
    texts = [f"Memory {i}: user {i % tenants} mentioned item {100 + i}." for i in range(n)]
    texts[5] += " [500]"
    texts[9] += " [slow]"
    texts[24] += " [nodate]"
    texts[20] += " [empty]"
    return MemoryStore.from_columns(ids=[f"m{i}" for i in range(n)], texts=texts,
                                    timestamps=[T0 + i * 3 * 3600.0 for i in range(n)], embeddings=emb,
                                    tenants=[f"user{i % tenants}" for i in range(n)])


def test_compress_with_faults_keeps_every_original():
    store = _store()
    faults = {"[500]": ["500"] * 9, "[slow]": ["slow"] * 9, "[nodate]": ["nodate"], "[empty]": ["empty"] * 9}
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.1), merge=MergeConfig(ratio=0.5))
    with FakeChatServer(faults, slow_s=0.6) as srv:
        m = merger(srv.url, timeout=0.2, max_retries=1, max_concurrency=8)
        res = compress(store, cfg, merger=m)
    assert len(res.store) == 24
    assert sorted(s for src in res.store.sources for s in src) == sorted(store.ids)
    st = m.summary()
    assert st["pairs"] == 24 and st["fallbacks"] >= 3 and st["retries"] >= 2 and st["retry_accepted"] >= 1
    assert st["http_retries"] >= 2 and set(st["fallback_reasons"]) == {"request failed", "empty"}
    assert not srv.faults["[nodate]"] and len(srv.faults["[500]"]) < 9 and len(srv.faults["[slow]"]) < 9
    assert st["accepted"] + st["retry_accepted"] + st["fallbacks"] == st["pairs"]
    # one request per pair per attempt, retries included; rounds batched (fewer calls than pairs)
    assert st["calls"] < st["pairs"]
    for text, src in zip(res.store.texts, res.store.sources):
        for s in src:  # every original's number is still in the text that stands for it
            assert f"item {100 + int(s[1:])}" in text
