"""kregress export-config / lint-config / doctor: the gateway from Claude Code, Codex and CC Switch.

Exported files must parse (json, tomllib, sqlite3), hold no key unless asked, and lint clean; every classic
mistake planted in such a file must be found with its fix; the doctor must classify each answer of the
scripted server (401, 403, 404, unknown model, 429, timeout), list problems credentials first, then config,
endpoint, transient, and exit with that class's code (3, 2, 4, 5).
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest
import tomllib

from kernel_assets.cli import main as kregress
from kernel_assets.clients.ccswitch import export_json, export_sql
from kernel_assets.clients.cli import run_lint
from kernel_assets.clients.doctor import run_doctor
from kernel_assets.clients.export import ExportError, ExportOptions, api_key_helper, export_claude_code, export_codex
from kernel_assets.clients.lint import lint_text
from kregress.testing.fake_gateway import FakeOpenAI, Reply

KEY = "sk" "-CFGCANARY-review-0123456789abcdef"
KEY2 = "sk" "-CFGCANARY-second-fedcba9876543210"
ENV = {"TAOTOKEN_KEY_REVIEW": KEY, "TAOTOKEN_MODEL_ID": "kregress-test-model", "TAOTOKEN_BASE_URL": "https://taotoken.net/api"}


def export(tool: str, env: dict | None = None, **kw) -> tuple[str, ExportOptions]:
    opts = ExportOptions(**kw)
    fn = {"claude-code": export_claude_code, "codex": export_codex, "cc-switch": export_json, "cc-switch-sql": export_sql}[tool]
    return fn(opts, dict(ENV if env is None else env)), opts


# --- export ------------------------------------------------------------------------------------------------


def test_exported_files_parse_hold_no_key_and_lint_clean(tmp_path):
    claude_text, claude_opts = export("claude-code")
    codex_text, _ = export("codex")
    ccs_text, _ = export("cc-switch")
    sql_text, _ = export("cc-switch-sql")
    for text in (claude_text, codex_text, ccs_text, sql_text):
        assert KEY not in text and "CFGCANARY" not in text

    s = json.loads(claude_text)
    assert s["env"] == {"ANTHROPIC_BASE_URL": "https://taotoken.net/api", "ANTHROPIC_MODEL": "kregress-test-model"}
    assert "ANTHROPIC_AUTH_TOKEN" not in s["env"] and "TAOTOKEN_KEY_REVIEW" in s["apiKeyHelper"]
    allow, deny = s["permissions"]["allow"], s["permissions"]["deny"]
    for rule in ("Read", "Grep", "Bash(git diff:*)", "Bash(pytest:*)", "Bash(kregress:*)"):
        assert rule in allow
    for rule in ("Bash(rm:*)", "Bash(git push:*)", "Bash(kubectl:*)", "Bash(psql:*)", "Bash(mysql:*)", "Bash(docker push:*)", "Bash(curl *prod*)"):
        assert rule in deny
    assert not set(allow) & set(deny)
    assert any("apiKeyHelper" in n for n in claude_opts.notes)

    c = tomllib.loads(codex_text)
    assert (c["model"], c["model_provider"]) == ("kregress-test-model", "taotoken")
    prov = c["model_providers"]["taotoken"]
    assert prov["base_url"] == "https://taotoken.net/api/v1" and prov["env_key"] == "TAOTOKEN_KEY_REVIEW"
    assert prov["wire_api"] == "responses" and "experimental_bearer_token" not in prov

    d = json.loads(ccs_text)
    assert d["version"] == 2
    claude_p = d["claude"]["providers"][d["claude"]["current"]]
    codex_p = d["codex"]["providers"][d["codex"]["current"]]
    assert claude_p["settingsConfig"]["env"]["ANTHROPIC_BASE_URL"] == "https://taotoken.net/api"
    assert codex_p["settingsConfig"]["auth"] == {} and tomllib.loads(codex_p["settingsConfig"]["config"]) == c
    assert claude_p["websiteUrl"] == "https://taotoken.net"

    files = []
    for name, text in (("settings.json", claude_text), ("config.toml", codex_text), ("ccswitch.json", ccs_text), ("taotoken.sql", sql_text)):
        (tmp_path / name).write_text(text)
        files.append(str(tmp_path / name))
    out = io.StringIO()
    assert run_lint(files, environ=ENV, out=out) == 0, out.getvalue()
    assert "4 file(s) clean" in out.getvalue()


def test_api_key_helper_prints_the_first_key_at_run_time_and_fails_loudly_without_one():
    def run(env: dict) -> subprocess.CompletedProcess:
        return subprocess.run(["/bin/sh", "-c", api_key_helper("review")], env={"PATH": os.environ["PATH"], **env},
                              capture_output=True, text=True)

    assert run({"TAOTOKEN_KEY_REVIEW": f"{KEY},{KEY2}"}).stdout == KEY + "\n"
    assert run({"TAOTOKEN_KEY_REVIEW": "", "TAOTOKEN_API_KEY": f"{KEY2} {KEY}"}).stdout == KEY2 + "\n"  # empty -> the fallback, like the gateway
    for env in ({}, {"TAOTOKEN_KEY_REVIEW": "", "TAOTOKEN_API_KEY": " , "}):
        r = run(env)
        assert r.returncode != 0 and r.stdout == "" and "no key: export TAOTOKEN_KEY_REVIEW=<key>" in r.stderr


def test_include_key_writes_it_only_when_asked_and_lint_flags_it(tmp_path, capsys, monkeypatch):
    for var, val in ENV.items():
        monkeypatch.setenv(var, val)
    out = tmp_path / "settings.local.json"
    assert kregress(["export-config", "--tool", "claude-code", "--include-key", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["env"]["ANTHROPIC_AUTH_TOKEN"] == KEY
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert kregress(["export-config", "--tool", "claude-code", "--out", str(out)]) == 2  # exists, no --force
    codex = tmp_path / "config.toml"
    assert kregress(["export-config", "--tool", "codex", "--include-key", "--out", str(codex)]) == 0
    assert tomllib.loads(codex.read_text())["model_providers"]["taotoken"]["experimental_bearer_token"] == KEY
    capsys.readouterr()
    assert kregress(["lint-config", str(out), str(codex)]) == 1
    text = capsys.readouterr().out
    assert text.count("[literal_key]") == 2 and "fix: " in text and KEY not in text and "CFGCANARY" not in text


@pytest.mark.parametrize("tool", ["claude-code", "codex", "cc-switch"])
def test_export_without_a_model_works_as_the_readme_shows_and_guesses_none(tool, tmp_path, monkeypatch, capsys):
    """The README's `kregress export-config --tool ...` lines pass no --model and set no TAOTOKEN_MODEL_ID."""
    for var in list(os.environ):
        if var.startswith("TAOTOKEN_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("TAOTOKEN_KEY_REVIEW", KEY)
    out = tmp_path / "exported"
    assert kregress(["export-config", "--tool", tool, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "note: no model id (--model or TAOTOKEN_MODEL_ID): the file names none" in err and "--model ID" in err
    text = out.read_text()
    assert KEY not in text and "kregress-test-model" not in text
    if tool == "claude-code":
        assert json.loads(text)["env"] == {"ANTHROPIC_BASE_URL": "https://taotoken.net/api"}
    elif tool == "codex":
        cfg = tomllib.loads(text)
        assert "model" not in cfg and cfg["model_provider"] == "taotoken" and "Pin one: model =" in text
        capsys.readouterr()
        assert kregress(["lint-config", str(out)]) == 1  # lint still says what a model-less Codex risks
        assert "[model_missing]" in capsys.readouterr().out
    with_model, _ = export("codex" if tool == "codex" else "claude-code")
    assert "kregress-test-model" in with_model  # a model from the environment is still written


def test_export_refuses_to_guess():
    with pytest.raises(ExportError, match="query string"):
        export("claude-code", base_url="https://taotoken.net/api?utm_source=blog")
    with pytest.raises(ExportError, match="--include-key: no key for role review"):
        export("codex", env={"TAOTOKEN_MODEL_ID": "m"}, include_key=True)


# --- lint: each planted mistake, with its fix ---------------------------------------------------------------

CODEX_OK = """model = "m"
model_provider = "taotoken"
[model_providers.taotoken]
name = "TaoToken"
base_url = "https://taotoken.net/api/v1"
env_key = "TAOTOKEN_KEY_REVIEW"
wire_api = "responses"
"""


def codex(**repl: str) -> str:
    text = CODEX_OK
    for old, new in repl.items():
        text = text.replace({"url": 'base_url = "https://taotoken.net/api/v1"', "env_key": 'env_key = "TAOTOKEN_KEY_REVIEW"',
                             "wire": 'wire_api = "responses"'}[old], new)
    return text


def claude(env: dict, **extra) -> str:
    return json.dumps({"env": {"ANTHROPIC_BASE_URL": "https://taotoken.net/api", "ANTHROPIC_MODEL": "m", **env},
                       "apiKeyHelper": api_key_helper("review"), **extra})


CASES = [
    ("codex", codex(env_key='env_key = "ANTHROPIC_AUTH_TOKEN"'), "wrong_tool_vars", "env_key"),
    ("codex", codex(env_key='env_key = "TAOTOKEN_KEY_REVEIW"'), "env_key_unset", "export TAOTOKEN_KEY_REVEIW"),
    ("codex", codex(env_key=f'experimental_bearer_token = "{KEY}"'), "literal_key", "env_key"),
    ("codex", codex(env_key=f'env_key = "{KEY}"'), "literal_key", "NAME of a variable"),
    ("codex", codex(url='base_url = "https://taotoken.net/api/v1/v1"'), "url_duplicate_v1", "https://taotoken.net/api/v1"),
    ("codex", codex(url='base_url = "https://taotoken.net/api"'), "url_missing_v1", "https://taotoken.net/api/v1"),
    ("codex", codex(url='base_url = "https://taotoken.net/"'), "url_homepage", "https://taotoken.net/api/v1"),
    ("codex", codex(url='base_url = "https://taotoken.net/api/v1?utm_source=newsletter"'), "url_query", "https://taotoken.net/api/v1"),
    ("codex", codex(url='base_url = "https://taotoken.net/api/v1/chat/completions"'), "url_endpoint", "https://taotoken.net/api/v1"),
    ("codex", codex(wire='wire_api = "chat"'), "wire_api_chat", 'wire_api = "responses"'),
    ("codex", codex(env_key='env_key = "DEEPSEEK_API_KEY"'), "wrong_tool_vars", "TAOTOKEN_KEY_REVIEW"),
    ("claude-code", claude({"ANTHROPIC_AUTH_TOKEN": KEY}), "literal_key", "apiKeyHelper"),
    ("claude-code", claude({"ANTHROPIC_AUTH_TOKEN": "${TAOTOKEN_KEY_REVIEW}"}), "placeholder", "environment"),
    ("claude-code", claude({"ANTHROPIC_BASE_URL": "https://taotoken.net/api?utm_source=blog&utm_medium=csdn"}), "url_query", "use https://taotoken.net/api"),
    ("claude-code", claude({"ANTHROPIC_BASE_URL": "https://taotoken.net/api/v1"}), "url_duplicate_v1", "use https://taotoken.net/api"),
    ("claude-code", claude({"ANTHROPIC_BASE_URL": "https://taotoken.net"}), "url_homepage", "use https://taotoken.net/api"),
    ("claude-code", claude({"OPENAI_BASE_URL": "https://taotoken.net/api/v1"}), "wrong_tool_vars", "ANTHROPIC_"),
    ("claude-code", claude({}, permissions={"allow": ["Bash"], "deny": []}), "allow_all_bash", "Bash(git diff:*)"),
    ("claude-code", json.dumps({"env": {"ANTHROPIC_BASE_URL": "https://taotoken.net/api"}}), "no_auth", "apiKeyHelper"),
    ("claude-code", claude({"ANTHROPIC_AUTH_TOKEN": ""}), "empty_key", "apiKeyHelper"),
    ("claude-code", json.dumps({"env": {"ANTHROPIC_BASE_URL": "https://taotoken.net/api"}, "apiKeyHelper": api_key_helper("suggest")}),
     "helper_vars_unset", "export TAOTOKEN_KEY_SUGGEST=<key>"),
]


@pytest.mark.parametrize("kind,text,code,fix", CASES, ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_each_planted_mistake_is_found_with_its_fix(kind, text, code, fix):
    findings = lint_text(text, "planted." + ("toml" if kind == "codex" else "json"), dict(ENV))
    hits = [f for f in findings if f.code == code]
    assert hits, f"{code} not found; got {[f.code for f in findings]}"
    assert fix in hits[0].fix
    rendered = "\n".join(f.render() for f in findings)
    assert KEY not in rendered and "newsletter" not in rendered.replace("parameters: utm_source", "")


def test_empty_key_set_up_is_flagged_naming_only_the_environment_variables():
    text = json.dumps({"env": {"ANTHROPIC_BASE_URL": "https://taotoken.net/api"}, "apiKeyHelper": api_key_helper("review")})
    [hit] = [f for f in lint_text(text, "settings.json", {"TAOTOKEN_MODEL_ID": "m"}) if f.code == "helper_vars_unset"]
    assert "$TAOTOKEN_KEY_REVIEW, $TAOTOKEN_API_KEY," in hit.problem and "$k" not in hit.problem and "empty key" in hit.problem


def test_codex_findings_say_what_codex_does():
    [hit] = [f for f in lint_text(codex(env_key='env_key = "ANTHROPIC_AUTH_TOKEN"'), "c.toml", dict(ENV)) if f.code == "wrong_tool_vars"]
    assert "Codex reads it and sends its value to this provider" in hit.problem and "does not read" not in hit.problem
    [chat] = [f for f in lint_text(codex(wire='wire_api = "chat"'), "c.toml", dict(ENV)) if f.code == "wire_api_chat"]
    assert '`wire_api = "chat"` is no longer supported' in chat.problem


def test_codex_chat_wire_api_is_refused_with_codex_s_own_message(tmp_path, capsys, monkeypatch):
    for var, val in ENV.items():
        monkeypatch.setenv(var, val)
    out = tmp_path / "config.toml"
    assert kregress(["export-config", "--tool", "codex", "--wire-api", "chat", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert '`wire_api = "chat"` is no longer supported' in err and 'set `wire_api = "responses"`' in err and not out.exists()
    assert len(err.strip().splitlines()) == 1  # one line, no traceback
    with pytest.raises(ExportError, match="no longer supported"):
        export("codex", wire_api="chat")


def test_env_key_holding_several_keys_and_cc_switch_nesting():
    two = dict(ENV, TAOTOKEN_KEY_REVIEW=f"{KEY},{KEY2}")
    assert [f.code for f in lint_text(CODEX_OK, "config.toml", two)] == ["env_key_multi"]
    ccs, _ = export("cc-switch")
    doc = json.loads(ccs)
    doc["codex"]["providers"]["taotoken"]["settingsConfig"]["config"] += '\n[model_providers.taotoken.env_http_headers]\nX = "ANTHROPIC_BASE_URL"\n'
    doc["codex"]["current"] = "gone"
    codes = {(f.code, f.where.split(".")[0]) for f in lint_text(json.dumps(doc), "ccs.json", dict(ENV))}
    assert ("wrong_tool_vars", "codex") in codes and ("current_missing", "codex") in codes


def test_clean_files_stay_clean_and_cli_exit_codes(tmp_path, capsys, monkeypatch):
    assert lint_text(CODEX_OK, "config.toml", dict(ENV)) == []
    bad = tmp_path / "config.toml"
    bad.write_text(codex(url='base_url = "https://taotoken.net/api/v1/v1"'))
    good = tmp_path / "good.toml"
    good.write_text(CODEX_OK)
    monkeypatch.setenv("TAOTOKEN_KEY_REVIEW", KEY)
    assert kregress(["lint-config", str(good)]) == 0
    assert kregress(["lint-config", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "url_duplicate_v1" in out and "fix: use https://taotoken.net/api/v1" in out and "1 finding(s) in 1 of 2 file(s)" in out


# --- doctor -----------------------------------------------------------------------------------------------


def doctor(srv: FakeOpenAI, tmp_path: Path, env: dict | None = None, **kw) -> tuple[int, str]:
    e = {"TAOTOKEN_BASE_URL": srv.root, "TAOTOKEN_MODEL_ID": "kregress-test-model", "TAOTOKEN_API_KEY": KEY, "HOME": str(tmp_path)}
    e.update(env or {})
    e = {k: v for k, v in e.items() if v is not None}
    out = io.StringIO()
    rc = run_doctor(environ=e, out=out, **{"ping": True, "timeout_s": 5.0, **kw})
    text = out.getvalue()
    assert KEY not in text and "CFGCANARY" not in text
    return rc, text


@pytest.mark.parametrize(
    "reply,models,category,needle,code",
    [
        (Reply(status=401), None, "credentials", "was rejected", 3),
        (Reply(status=403), None, "credentials", "not allowed", 3),
        (Reply(status=404), None, "endpoint", "the path was not found", 4),
        (Reply(), ("another-model",), "config", "is not served", 2),
        (Reply(status=429, headers={"Retry-After": "1"}), None, "transient", "rate limited (HTTP 429)", 5),
    ],
    ids=["401", "403", "404", "unknown-model", "429"],
)
def test_doctor_ping_classifies_each_status(tmp_path, reply, models, category, needle, code):
    with FakeOpenAI(models=models or ("kregress-test-model",)) as srv:
        srv.default = reply
        rc, text = doctor(srv, tmp_path)
    assert rc == code
    assert text.count(f"FAIL ({category})") == 3  # one ping per role, the same outcome
    assert needle in text and "fix:" in text


def test_doctor_ping_timeout_and_success(tmp_path):
    with FakeOpenAI() as srv:
        srv.default = Reply(content="pong", delay_s=1.6)
        rc, text = doctor(srv, tmp_path, roles=["review"], timeout_s=1.0)
        assert rc == 5 and "FAIL (transient): timed out" in text and "larger --timeout" in text
        time.sleep(0.8)  # let the server finish the abandoned answer before it is reused
        srv.default = Reply(content="pong")
        rc, text = doctor(srv, tmp_path)
        chats = srv.chat_requests()[-3:]
    assert rc == 0 and text.count(" ok in ") == 3 and "Everything looks right." in text
    assert [s.token for s in chats] == [KEY] * 3 and all(s.body["max_tokens"] == 8 for s in chats)


def test_doctor_orders_problems_credentials_then_request_and_masks_values(tmp_path):
    with FakeOpenAI() as srv:
        srv.default = Reply(status=404)
        env = {"TAOTOKEN_API_KEY": None, "TAOTOKEN_KEY_REVIEW": KEY, "OPENAI_API_KEY": KEY2,
               "ANTHROPIC_BASE_URL": "https://taotoken.net/api/v1?utm_source=csdnblog"}
        rc, text = doctor(srv, tmp_path, env=env)
    assert rc == 3
    problems = text.split("Problems, in the order to fix them")[1]
    cats = [line.split("]")[0].split("[")[1] for line in problems.splitlines() if line.strip()[:1].isdigit()]
    assert cats == sorted(cats, key=["credentials", "config", "endpoint", "transient"].index)
    assert cats[:2] == ["credentials", "credentials"] and "endpoint" in cats  # suggest + report keys missing, then the 404
    assert "ANTHROPIC_BASE_URL: [url_query]" in text and "ANTHROPIC_BASE_URL: [url_duplicate_v1]" in text
    assert "csdnblog" not in text and "utm_source=..." in text
    assert KEY2 not in text and "OPENAI_API_KEY is set, but that is another tool's variable" in text
    assert "review   ok: review#" in text


def test_doctor_without_ping_catches_the_configuration(tmp_path):
    out = io.StringIO()
    env = {"TAOTOKEN_BASE_URL": "https://taotoken.net/?utm_source=x", "TAOTOKEN_KEY_REVEIW": KEY, "HOME": str(tmp_path)}
    rc = run_doctor(environ=env, out=out)
    text = out.getvalue()
    assert rc == 3 and KEY not in text
    for needle in ("[config] TAOTOKEN_BASE_URL: ", "query string", "[config] TAOTOKEN_MODEL_ID", "TAOTOKEN_KEY_REVEIW: is set but the gateway does not read it",
                   "[credentials] role review"):
        assert needle in text
    assert "TAOTOKEN_BASE_URL: TAOTOKEN_BASE_URL" not in text and text.count("TAOTOKEN_BASE_URL:") == 1
