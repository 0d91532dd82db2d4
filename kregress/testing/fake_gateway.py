"""A scripted OpenAI-compatible HTTP server (stdlib only, 127.0.0.1, a thread) for tests and benchmarks.

Each test queues what the next requests get (``server.push(...)``); when the queue is empty the server
answers with ``default`` (a plain success). Every request is recorded: path, the bearer token it
carried (kept in memory only, for asserting which key was used), the JSON body and when it arrived.

    with FakeOpenAI() as srv:
        srv.push(status=429, headers={"Retry-After": "2"})
        srv.push(content='[{"variant_id": ...}]', prompt_tokens=321)
        ... TaotokenResource(base_url=srv.root, ...) ...

``FakeClock`` is a monotonic clock that only moves when the code under test sleeps.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


def count_tokens(text: str) -> int:
    """What the fake server bills for a piece of text: roughly one token per word or punctuation run.

    Deliberately a different counter from the gateway's estimator, so the tests see the gateway
    settle reservations with the usage the server reports, not with its own estimate.
    """
    return len(re.findall(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]", text))


def prompt_tokens_of(body: dict[str, Any]) -> int:
    return sum(count_tokens(str(m.get("content", ""))) + 4 for m in body.get("messages", [])) + 2


@dataclass
class Reply:
    status: int = 200
    content: str | None = '[]'
    body: Any = None  # raw JSON body (or str) to send instead of a chat completion
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    prompt_tokens: int | None = None  # None: counted from the request
    completion_tokens: int | None = None  # None: counted from content
    finish_reason: str = "stop"
    drop: bool = False  # close the connection without answering


@dataclass
class Seen:
    path: str
    method: str
    token: str
    body: dict[str, Any]
    at: float


class FakeOpenAI:
    def __init__(self, models: tuple[str, ...] = ("kregress-test-model",)) -> None:
        self.models = list(models)
        self.queue: list[Reply] = []
        self.requests: list[Seen] = []
        self.default = Reply()
        self.handler: Callable[[Seen], Reply] | None = None  # overrides the queue when set
        self.models_handler: Callable[[Seen], Reply | None] | None = None  # GET /models: a Reply, or None for the model list
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- scripting ---------------------------------------------------------------------------
    def push(self, **kw: Any) -> Reply:
        r = Reply(**kw)
        with self._lock:
            self.queue.append(r)
        return r

    def chat_requests(self) -> list[Seen]:
        return [s for s in self.requests if s.path.endswith("/chat/completions")]

    @property
    def root(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/api"

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> FakeOpenAI:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                raw = payload if isinstance(payload, bytes) else (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                self.send_response(status)
                ctype = "application/json" if not isinstance(payload, str) or payload.lstrip().startswith(("{", "[")) else "text/html"
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(raw)))
                self.send_header("x-request-id", f"req_{len(fake.requests):04d}")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            def _record(self, method: str) -> Seen:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}") if n else {}
                auth = self.headers.get("Authorization", "")
                seen = Seen(self.path, method, auth.removeprefix("Bearer "), body, time.monotonic())
                with fake._lock:
                    fake.requests.append(seen)
                return seen

            def do_GET(self) -> None:
                seen = self._record("GET")
                special = fake.models_handler(seen) if fake.models_handler is not None and seen.path.endswith("/v1/models") else None
                if special is not None:
                    self._send(special.status, special.body, special.headers)
                elif seen.path.endswith("/v1/models"):
                    self._send(200, {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "fake"} for m in fake.models]})
                else:
                    self._send(404, "<html><body>Not Found</body></html>")

            def do_POST(self) -> None:
                seen = self._record("POST")
                if not seen.path.endswith("/v1/chat/completions"):
                    self._send(404, "<html><body>Not Found</body></html>")
                    return
                if fake.handler is not None:
                    reply = fake.handler(seen)
                else:
                    with fake._lock:
                        reply = fake.queue.pop(0) if fake.queue else fake.default
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.drop:
                    self.close_connection = True
                    try:
                        self.connection.shutdown(2)
                    except OSError:
                        pass
                    return
                if reply.body is not None:
                    self._send(reply.status, reply.body, reply.headers)
                    return
                if reply.status != 200:
                    self._send(reply.status, {"error": {"message": f"status {reply.status}", "type": "server_error", "code": None}}, reply.headers)
                    return
                content = reply.content or ""
                pt = prompt_tokens_of(seen.body) if reply.prompt_tokens is None else reply.prompt_tokens
                ct = count_tokens(content) if reply.completion_tokens is None else reply.completion_tokens
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(fake.requests)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": seen.body.get("model", ""),
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": reply.finish_reason}],
                        "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
                    },
                    reply.headers,
                )

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class FakeClock:
    """A monotonic clock that only moves when the code under test sleeps; records every wait."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
