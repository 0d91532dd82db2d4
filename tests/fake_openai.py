"""A scripted OpenAI-compatible HTTP server for the gateway tests (stdlib only, 127.0.0.1, a thread).

Each test queues what the next requests get (``server.push(...)``); when the queue is empty the server
answers with ``default`` (a plain success). Every request is recorded: path, the bearer token it
carried (kept in memory only, for asserting which key was used), the JSON body and when it arrived.

    with FakeOpenAI() as srv:
        srv.push(status=429, headers={"Retry-After": "2"})
        srv.push(content='[{"variant_id": ...}]', prompt_tokens=321)
        ... TaotokenResource(base_url=srv.root, ...) ...
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


# --- helpers shared by the gateway tests (no conftest: these are imported) ---------------------------


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


def make_gateway(srv: FakeOpenAI, ledger: Any, env: dict[str, str], clock: FakeClock | None = None, **overrides: Any) -> Any:
    """A real gateway (real openai SDK) pointed at the fake server, with an injected clock and sleep."""
    import random

    from resources.taotoken import TaotokenResource

    fields = {"base_url": srv.root, "model_id": srv.models[0], "backoff_base_s": 1.0, "read_timeout_s": 5.0, "connect_timeout_s": 2.0}
    fields.update({k: v for k, v in overrides.items() if k not in ("log",)})
    res = TaotokenResource(**fields)
    clock = clock or FakeClock()
    return res.get_gateway(ledger, environ=env, sleep=clock.sleep, clock=clock, rng=random.Random(7), log=overrides.get("log"))


def run_spawned(target: Callable[..., None], arglists: list[tuple[Any, ...]], timeout_s: float = 120.0) -> list[Any]:
    """Run ``target(*args, queue)`` in one spawned process per ``args``; returns what each put on the queue."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, q)) for args in arglists]
    for p in procs:
        p.start()
    results = [q.get(timeout=timeout_s) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0, p.exitcode
    return results


def budget_race_worker(root: str, ledger_target: str, wid: int, total: int, out: Any) -> None:
    """One process of a shared-budget race: up to 40 suggest calls against ``total`` tokens of the sweep
    "shared" in the ledger at ``ledger_target`` (a SQLite path or a PostgreSQL URL). Puts
    ``(wid, ok, refused)`` on ``out``, or the error text, so the parent never hangs."""
    import random

    from kregress.core.spec import Budget
    from resources.ledger import BudgetExceeded, Ledger
    from resources.taotoken import CallContext, TaotokenResource

    try:
        g = TaotokenResource(base_url=root, model_id="kregress-test-model", verify_model=False).get_gateway(
            Ledger(ledger_target), environ={"TAOTOKEN_API_KEY": "sk" "-budget-test-key-000000000000"},
            sleep=FakeClock().sleep, rng=random.Random(wid))
        budget = Budget(max_input_tokens_per_round=10**6, max_output_tokens_per_round=10**6, max_total_tokens=total)
        ok = refused = 0
        for i in range(40):
            msgs = [{"role": "user", "content": f"worker {wid} call {i}: propose variants for the gemm sweep"}]
            try:
                g.chat("suggest", msgs, max_tokens=100, budget=budget, ctx=CallContext(sweep="shared", round=1))
                ok += 1
            except BudgetExceeded:
                refused += 1
                if refused >= 3:
                    break
        out.put((wid, ok, refused))
    except Exception as e:  # noqa: BLE001 - report, do not hang the parent
        out.put(f"{type(e).__name__}: {e}")


def overshoot_worker(root: str, ledger_target: str, wid: int, out: Any) -> None:
    """One process of the over-reporting race: its own sweep ``over-<wid>``, 3 rounds of up to 5 suggest calls
    each, against a server that bills more than the gateway reserved. Puts ``(wid, sent, refused, reasons)``."""
    import random

    from kregress.core.spec import Budget
    from resources.ledger import BudgetExceeded, Ledger
    from resources.taotoken import CallContext, TaotokenResource

    try:
        g = TaotokenResource(base_url=root, model_id="kregress-test-model", verify_model=False, min_output_tokens=16).get_gateway(
            Ledger(ledger_target), environ={"TAOTOKEN_API_KEY": "sk" "-overshoot-test-key-0000000000"},
            sleep=FakeClock().sleep, rng=random.Random(wid))
        budget = Budget(max_input_tokens_per_round=1000, max_output_tokens_per_round=1000, max_total_tokens=100_000)
        sent = refused = 0
        reasons: list[str] = []
        for rnd in (1, 2, 3):
            for i in range(5):
                msgs = [{"role": "user", "content": f"worker {wid} round {rnd} call {i}: propose variants for the gemm sweep"}]
                try:
                    g.chat("suggest", msgs, max_tokens=100, budget=budget, ctx=CallContext(sweep=f"over-{wid}", round=rnd))
                    sent += 1
                except BudgetExceeded as e:
                    refused += 1
                    reasons.append(e.reason)
        out.put((wid, sent, refused, reasons))
    except Exception as e:  # noqa: BLE001 - report, do not hang the parent
        out.put(f"{type(e).__name__}: {e}")


def cooldown_worker(root: str, ledger_target: str, keys: str, out: Any) -> None:
    """A second run: one suggest call with ``keys``; puts the alias that answered (or the error text)."""
    from resources.ledger import Ledger
    from resources.taotoken import TaotokenResource

    try:
        g = TaotokenResource(base_url=root, model_id="kregress-test-model", verify_model=False).get_gateway(
            Ledger(ledger_target), environ={"TAOTOKEN_KEY_SUGGEST": keys}, sleep=FakeClock().sleep)
        res = g.chat("suggest", [{"role": "user", "content": "second run"}], use_cache=False)
        out.put(res.key_alias)
    except Exception as e:  # noqa: BLE001 - report, do not hang the parent
        out.put(f"{type(e).__name__}: {e}")
