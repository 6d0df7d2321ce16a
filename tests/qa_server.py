"""A loopback OpenAI-compatible server that plays the LLM protocol's answerer and judge
deterministically (stdlib HTTP server on 127.0.0.1, port 0, a thread), with injected faults.

- answer prompt: replies the gold answer of the question (``answers[question]``) when every one
  of its tokens is among the tokens of the ``<memories>`` block, else "I don't know";
- choice prompt: replies ``(x)`` for the option sharing the most tokens with the memories
  (ties: the first);
- judge prompt: CORRECT when the graded answer holds every token of the gold answer (abstention
  rules: when it says it does not know), else WRONG.

Faults: ``faults[(kind, marker)]`` is a list of actions for the requests of ``kind`` ("answer",
"choice" or "judge") whose user message contains ``marker``, one per request, then normal
replies: "500" (HTTP 500), "badjson" (a truncated body), "empty" (empty content), "nolabel" (a
verdict without a label), "garbage" (a reply naming no option).
"""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_TOK = re.compile(r"[a-z0-9]+")
_MEM = re.compile(r"<memories>\n(.*?)\n</memories>", re.DOTALL)


def toks(text: str) -> set[str]:
    return set(_TOK.findall(text.lower())) - {"a", "an", "the"}


class FakeQAServer:
    """``/v1/chat/completions`` on 127.0.0.1:<free port>; use as a context manager."""

    def __init__(self, answers: dict[str, str] | None = None, faults: dict | None = None):
        self.answers = dict(answers or {})
        self.faults = {k: list(v) for k, v in (faults or {}).items()}
        self.lock = threading.Lock()
        self.requests: list[tuple[str, dict]] = []  # (kind, body)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                kind = server.kind(body["messages"][0]["content"])
                with server.lock:
                    server.requests.append((kind, body))
                    action = server.action(kind, body["messages"][1]["content"])
                if action == "500":
                    return self._send(500, b'{"error": "boom"}')
                if action == "badjson":
                    return self._send(200, b'{"choices": [ {"message": ')
                text = {"empty": "", "nolabel": "Hard to say.", "garbage": "hmm"}.get(action) \
                    or server.reply(kind, body["messages"])
                reply = {"id": "x", "object": "chat.completion", "model": body["model"],
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": sum(len(m["content"].split()) for m in body["messages"]),
                                   "completion_tokens": len(text.split())}}
                self._send(200, json.dumps(reply).encode())

            def _send(self, code, data):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    @staticmethod
    def kind(system: str) -> str:
        if system.startswith("You grade"):
            return "judge"
        return "choice" if system.startswith("You choose") else "answer"

    def action(self, kind: str, user: str) -> str:
        for (k, marker), todo in self.faults.items():
            if k == kind and todo and marker in user:
                return todo.pop(0)
        return "ok"

    def reply(self, kind: str, messages: list[dict]) -> str:
        system, user = messages[0]["content"], messages[1]["content"]
        if kind == "judge":
            gold = re.search(r"Gold answer: (.*)\n", user).group(1)
            answer = re.search(r"Answer to grade: (.*)\n", user).group(1)
            if "cannot be answered" in system:
                return "CORRECT" if "know" in answer.lower() else "WRONG"
            return "CORRECT" if toks(gold) <= toks(answer) else "WRONG"
        memories = toks(_MEM.search(user).group(1))
        if kind == "choice":
            opts = re.findall(r"^\(([a-z])\) (.*)$", user.split("Options:\n", 1)[1], re.MULTILINE)
            best = max(range(len(opts)), key=lambda i: (len(toks(opts[i][1]) & memories), -i))
            return f"({opts[best][0]})"
        question = re.search(r"Question: (.*)\nAnswer:", user).group(1)
        gold = self.answers.get(question)
        return gold if gold is not None and toks(gold) <= memories else "I don't know."

    def count(self, kind: str | None = None) -> int:
        return sum(1 for k, _ in self.requests if kind is None or k == kind)

    def __enter__(self):
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
