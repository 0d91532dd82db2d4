"""kregress doctor per tool: each ping goes to the endpoint that tool calls, with the headers it sends.

A small gateway of our own (stdlib http.server on 127.0.0.1) serves /v1/models, /v1/chat/completions,
/v1/responses (OpenAI Responses shape) and /v1/messages (Anthropic Messages shape), each path scriptable;
kregress/testing/fake_gateway.py (chat only) stands for a gateway without the coding tools' endpoints.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kernel_assets.cli import main as kregress
from kernel_assets.clients.cli import run_export
from kernel_assets.clients.doctor import run_doctor
from kernel_assets.clients.export import ExportOptions, export_codex
from kernel_assets.clients.lint import lint_file
from kregress.testing.fake_gateway import FakeOpenAI

KEY = "sk" "-DOCCANARY-review-0123456789abcdef"
MODEL = "kregress-test-model"


class Gateway:
    """Serves the four endpoints; ``status[path]`` scripts an error for one of them; records every request."""

    def __init__(self) -> None:
        self.status: dict[str, int] = {}
        self.seen: list[dict] = []
        gw = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:
                pass

            def _send(self, status: int, body: dict) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _route(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else {}
                path = self.path.split("/api", 1)[-1]
                gw.seen.append({"path": path, "method": method, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                if path in gw.status:
                    self._send(gw.status[path], {"error": {"message": f"scripted {gw.status[path]}", "type": "error"}})
                elif method == "GET" and path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "t", "created": 0}]})
                elif method == "POST" and path == "/v1/chat/completions":
                    self._send(200, {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": MODEL,
                                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "pong"}, "finish_reason": "stop"}],
                                     "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}})
                elif method == "POST" and path == "/v1/responses":
                    self._send(200, {"id": "resp_1", "object": "response", "created_at": 0, "model": MODEL, "status": "completed",
                                     "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                                                 "content": [{"type": "output_text", "text": "pong", "annotations": []}]}],
                                     "parallel_tool_calls": False, "tool_choice": "auto", "tools": [],
                                     "usage": {"input_tokens": 9, "output_tokens": 1, "total_tokens": 10,
                                               "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}})
                elif method == "POST" and path == "/v1/messages":
                    self._send(200, {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL, "stop_reason": "end_turn",
                                     "content": [{"type": "text", "text": "pong"}], "usage": {"input_tokens": 9, "output_tokens": 1}})
                else:
                    self._send(404, {"error": {"message": "not found", "type": "not_found"}})

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.root = f"http://127.0.0.1:{self.server.server_address[1]}/api"

    def paths(self) -> list[str]:
        return [s["path"] for s in self.seen]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway():
    g = Gateway()
    yield g
    g.close()


def env_for(root: str, home: Path, **extra: str) -> dict[str, str]:
    return {"TAOTOKEN_BASE_URL": root, "TAOTOKEN_MODEL_ID": MODEL, "TAOTOKEN_KEY_REVIEW": KEY, "HOME": str(home), **extra}


def doctor(env: dict, **kw) -> tuple[int, str]:
    out = io.StringIO()
    rc = run_doctor(environ=env, out=out, **{"ping": True, "timeout_s": 5.0, "roles": ["review"], **kw})
    text = out.getvalue()
    assert KEY not in text and "DOCCANARY" not in text
    return rc, text


def test_each_tool_pings_its_own_endpoint_with_its_own_headers(gateway, tmp_path):
    rc, text = doctor(env_for(gateway.root, tmp_path), tools=["kregress", "codex", "claude-code"])
    assert rc == 0 and "Everything looks right." in text and text.count(" ok in ") == 3, text
    assert gateway.paths() == ["/v1/models", "/v1/chat/completions", "/v1/responses", "/v1/messages"]
    chat, resp, msg = gateway.seen[1:]
    assert chat["headers"]["authorization"] == f"Bearer {KEY}" and chat["body"]["model"] == MODEL
    assert resp["headers"]["authorization"] == f"Bearer {KEY}" and resp["body"]["input"] and resp["body"]["model"] == MODEL
    assert msg["headers"]["x-api-key"] == KEY and msg["headers"]["authorization"] == f"Bearer {KEY}"
    assert msg["headers"]["anthropic-version"] == "2023-06-01"
    assert msg["body"]["max_tokens"] > 0 and msg["body"]["messages"][0]["role"] == "user" and msg["body"]["model"] == MODEL


def test_a_gateway_without_v1_responses_fails_codex_only(tmp_path):
    with FakeOpenAI(models=(MODEL,)) as srv:  # serves /v1/models and /v1/chat/completions only
        srv.default.content = "pong"
        rc, text = doctor(env_for(srv.root, tmp_path), tools=["kregress", "codex"])
    assert rc == 4
    lines = [line for line in text.splitlines() if "FAIL" in line or " ok in " in line]
    assert len(lines) == 2 and "review   ok in" in lines[0]
    assert lines[1].startswith("  codex    FAIL (endpoint)") and "/v1/responses" in lines[1] and "Codex" in lines[1]
    assert [line for line in text.splitlines() if "/v1/responses" in line and "codex" not in line.lower()] == []


@pytest.mark.parametrize("path,status,category,code", [
    ("/v1/messages", 404, "endpoint", 4), ("/v1/messages", 401, "credentials", 3), ("/v1/responses", 503, "transient", 5),
    ("/v1/responses", 403, "credentials", 3),
])
def test_tool_ping_failures_are_classified_with_exit_codes(gateway, tmp_path, path, status, category, code):
    gateway.status[path] = status
    rc, text = doctor(env_for(gateway.root, tmp_path), tools=["codex", "claude-code"])
    assert rc == code and f"FAIL ({category})" in text and f"exit {code} ({category})" in text


def test_keyless_local_workflow_is_fine_for_sweeps(tmp_path):
    for ping in (False, True):
        rc, text = doctor({"HOME": str(tmp_path)}, ping=ping)
        assert rc == 0 and "Strategy local" in text and "sweeps are fine" in text


def test_unreachable_gateway_is_a_network_problem(tmp_path):
    rc, text = doctor(env_for("http://127.0.0.1:9/api", tmp_path), tools=["kregress"], timeout_s=2.0)
    assert rc == 5 and "FAIL (transient): could not connect" in text


def test_configured_codex_is_found_and_pinged_as_its_config_says(gateway, tmp_path):
    env = env_for(gateway.root, tmp_path)
    cfg = tmp_path / ".codex" / "config.toml"
    cfg.parent.mkdir()
    cfg.write_text(export_codex(ExportOptions(env_key="TAOTOKEN_CODEX_KEY"), env))
    rc, text = doctor(env)  # TAOTOKEN_CODEX_KEY not set: Codex would send no key
    assert rc == 3 and "checked: kregress, codex" in text and "env_key_unset" in text and "codex    skipped: no key" in text
    rc, text = doctor({**env, "TAOTOKEN_CODEX_KEY": KEY})
    assert rc == 0, text
    assert gateway.paths()[-1] == "/v1/responses" and gateway.seen[-1]["headers"]["authorization"] == f"Bearer {KEY}"


def test_install_merges_user_settings_and_doctor_pings_claude_code(gateway, tmp_path):
    env = env_for(gateway.root, tmp_path)
    user = tmp_path / ".claude" / "settings.json"
    user.parent.mkdir()
    user.write_text(json.dumps({"theme": "dark", "env": {"ANTHROPIC_AUTH_TOKEN": "stale"}, "permissions": {"allow": ["Bash(make:*)"]}}))
    err = io.StringIO()
    assert run_export("claude-code", ExportOptions(), install=True, environ=env, out=io.StringIO(), err=err) == 0
    merged = json.loads(user.read_text())
    assert merged["theme"] == "dark" and "ANTHROPIC_AUTH_TOKEN" not in merged["env"] and merged["env"]["ANTHROPIC_BASE_URL"] == gateway.root
    assert merged["permissions"]["allow"][0] == "Bash(make:*)" and "Bash(kregress:*)" in merged["permissions"]["allow"]
    assert "merged into" in err.getvalue()
    assert lint_file(user, env) == []  # user settings: no trust needed
    rc, text = doctor(env)
    assert rc == 0 and "checked: kregress, claude-code" in text and gateway.paths()[-1] == "/v1/messages", text
    assert gateway.seen[-1]["headers"]["x-api-key"] == KEY


def test_project_settings_say_how_to_trust_the_workspace(tmp_path):
    env = {"TAOTOKEN_KEY_REVIEW": KEY, "TAOTOKEN_MODEL_ID": MODEL, "HOME": str(tmp_path / "home")}
    project = tmp_path / "proj"
    target = project / ".claude" / "settings.json"
    err = io.StringIO()
    assert run_export("claude-code", ExportOptions(), out_path=str(target), environ=env, out=io.StringIO(), err=err) == 0
    assert "ignores its permissions.allow rules until the workspace is trusted" in err.getvalue() and "run `claude` in" in err.getvalue()
    [f] = lint_file(target, env)
    assert f.code == "workspace_untrusted" and "13 permissions.allow entries" in f.problem and str(project) in f.fix
    state = tmp_path / "home" / ".claude.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"projects": {str(project.resolve()): {"hasTrustDialogAccepted": True}}}))
    assert lint_file(target, env) == []


def test_doctor_cli_exit_code_and_help(gateway, tmp_path, monkeypatch, capsys):
    for k, v in env_for(gateway.root, tmp_path).items():
        monkeypatch.setenv(k, v)
    gateway.status["/v1/responses"] = 404
    assert kregress(["doctor", "--ping", "--tool", "codex", "--timeout", "5"]) == 4
    assert "FAIL (endpoint)" in capsys.readouterr().out


def test_the_clients_package_imports_no_dagster_triton_torch_resources_or_assets():
    code = ("import sys, kernel_assets.clients.cli, kernel_assets.clients.doctor, kernel_assets.clients.ccswitch; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'triton', 'torch', 'resources', 'kernels') "
            "or (m.startswith('kernel_assets.') and not m.startswith('kernel_assets.clients'))); "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stdout + r.stderr
