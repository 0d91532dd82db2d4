"""``kregress doctor``, ``kregress export-config`` and ``kregress lint-config``: the gateway from the coding tools.

    kregress doctor                          # environment (masked), base URL, model id, a key per role
    kregress doctor --ping                   # plus one tiny request per role, its outcome classified
    kregress export-config --tool claude-code --out .claude/settings.json
    kregress export-config --tool codex --out ~/.codex/config.toml
    kregress export-config --tool cc-switch --out taotoken.ccswitch.json
    kregress lint-config .claude/settings.json ~/.codex/config.toml

Problems are reported in the order to fix them: credentials, then request (base URL, path, model id), then
content; then transient ones (rate limits, timeouts). Each comes with its fix. Exit status 1 when anything
is wrong (doctor, lint-config), 2 for unusable arguments. Keys never appear in the output or in an exported
file (only with --include-key, on purpose); they are shown as a length and a 4-hex-digit fingerprint.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from kernel_assets.config_lint import (
    DEFAULT_FILENAMES,
    EXPORTERS,
    TOOLS,
    ExportError,
    ExportOptions,
    check_url,
    is_secret_name,
    lint_file,
    looks_like_key,
    mask_secret,
    mask_url,
)

CATEGORY_ORDER = {"credentials": 0, "request": 1, "content": 2, "transient": 3}
ENV_PREFIXES = ("TAOTOKEN_", "ANTHROPIC_", "OPENAI_")


@dataclass
class Problem:
    category: str  # credentials | request | content | transient
    subject: str
    message: str
    fix: str

    def render(self, n: int) -> str:
        return f"  {n}. [{self.category}] {self.subject}: {self.message}\n     fix: {self.fix}"


def _split_fix(text: str) -> tuple[str, str]:
    """A gateway error 'message ... Fix: what to do' -> (message, fix)."""
    text = re.sub(r"^\[(credentials|request|content|transient)\]\s*", "", str(text))
    if " Fix: " in text:
        msg, fix = text.split(" Fix: ", 1)
        return msg.strip(), fix.strip()
    return text.strip(), ""


# --- doctor ------------------------------------------------------------------------------------------


def _show_value(name: str, value: str) -> str:
    if value == "":
        return "set but empty"
    if is_secret_name(name) or looks_like_key(value):
        return mask_secret(value)
    if value.strip().lower().startswith(("http://", "https://")) or name.endswith(("_URL", "_BASE", "_HOST")):
        return mask_url(value)
    return value if len(value) <= 80 else value[:77] + "..."


def _ping_outcome(exc: BaseException) -> tuple[str, str, str]:
    """(category, what happened, fix) for a failed ping."""
    from resources.ledger import BudgetExceeded
    from resources.taotoken import GatewayError, RetriesExhausted

    if isinstance(exc, RetriesExhausted):
        m = re.search(r"last: (\w+)", str(exc))
        kind = m.group(1) if m else ""
        if exc.status == 429 or kind == "rate_limited":
            return ("transient", "rate limited (HTTP 429): the key works but is over its rate or concurrency limit",
                    "wait and retry (the gateway honours Retry-After), or add keys for this role: TAOTOKEN_KEY_<ROLE>=k1,k2")
        if kind == "timeout" or exc.status == 408:
            return ("transient", "timed out: no answer within --timeout",
                    "check the network path to the gateway (proxy: HTTPS_PROXY / NO_PROXY), then retry with a larger --timeout")
        if kind == "connection":
            return ("transient", "could not connect to the gateway",
                    "check the host and port of TAOTOKEN_BASE_URL, DNS and the proxy (HTTPS_PROXY); the service may be down")
        return ("transient", f"server error{f' (HTTP {exc.status})' if exc.status else ''}", "the gateway is failing; retry later")
    if isinstance(exc, GatewayError):
        msg, fix = _split_fix(str(exc))
        category = exc.category if exc.category in CATEGORY_ORDER else "request"
        return category, msg, fix or "see the message"
    if isinstance(exc, BudgetExceeded):
        return "content", str(exc), "the ping has no budget; this should not happen"
    return "request", f"{type(exc).__name__}: {str(exc)[:200]}", "check TAOTOKEN_BASE_URL and TAOTOKEN_MODEL_ID"


def run_doctor(
    *,
    ping: bool = False,
    timeout_s: float = 20.0,
    roles: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    ledger_url: str = "",
    out: TextIO | None = None,
) -> int:
    """Print the diagnosis; return 0 when everything is right, 1 otherwise."""
    from resources.ledger import Ledger, LedgerConfigError, sqlite_path_from_url
    from resources.taotoken import (
        BASE_URL_ENV,
        DEFAULT_ROOT,
        KNOWN_ENV,
        MODEL_ENV,
        ROLE_KEY_ENV,
        ROLES,
        CallContext,
        KeyPool,
        RequestError,
        TaotokenResource,
        resolve_base_url,
    )

    out = out or sys.stdout
    env = dict(os.environ if environ is None else environ)
    roles = list(roles or ROLES)
    pool = KeyPool.from_env(env)
    problems: list[Problem] = []

    def say(line: str = "") -> None:
        print(pool.scrub(line), file=out)

    # 1. environment, masked
    names = sorted(n for n in env if n.startswith(ENV_PREFIXES))
    say("Environment (TAOTOKEN_*, ANTHROPIC_*, OPENAI_*; keys masked)")
    if not names:
        say("  (none of these variables is set)")
    width = max([len(n) for n in names] + [20])
    for n in names:
        note = ""
        if n.startswith(("ANTHROPIC_", "OPENAI_")):
            note = "   (read by Claude Code)" if n.startswith("ANTHROPIC_") else "   (read by Codex / OpenAI tools)"
        say(f"  {n:<{width}} {_show_value(n, env[n])}{note}")
    for n in names:
        if n.startswith("TAOTOKEN_") and n not in KNOWN_ENV:
            known = ", ".join(sorted(KNOWN_ENV))
            problems.append(Problem("credentials" if "KEY" in n else "request", n,
                                    "is set but the gateway does not read it (a typo?)", f"rename it to one of: {known}"))
    for n, tool in (("ANTHROPIC_BASE_URL", "claude"), ("OPENAI_BASE_URL", "openai"), ("OPENAI_API_BASE", "openai")):
        if env.get(n, "").strip():
            for code, problem, fix in check_url(env[n], tool):
                problems.append(Problem("request", n, f"[{code}] {problem}", fix))

    # 2. base URL and model id
    say()
    say("Gateway")
    base = env.get(BASE_URL_ENV, "").strip() or DEFAULT_ROOT
    url_ok = True
    try:
        root, sdk = resolve_base_url(base)
        say(f"  base URL   ok: API root {root}, SDK base {sdk}{'' if env.get(BASE_URL_ENV, '').strip() else ' (default)'}")
    except RequestError as e:
        url_ok = False
        msg, fix = _split_fix(str(e))
        say(f"  base URL   WRONG: {msg}")
        problems.append(Problem("request", BASE_URL_ENV, msg, fix))
    model = env.get(MODEL_ENV, "").strip()
    if model:
        say(f"  model id   {model}")
    else:
        say("  model id   MISSING")
        problems.append(Problem("request", MODEL_ENV, "no model id is configured (the gateway never guesses one)",
                                f"export {MODEL_ENV}=<a model id served at the gateway's /v1/models>"))

    # 3. keys per role
    say()
    say("Keys per role")
    for role in roles:
        keys = pool.keys(role)
        if keys:
            src = keys[0].env_var
            fallback = " (fallback for every role)" if src != ROLE_KEY_ENV[role] else ""
            say(f"  {role:<8} ok: {', '.join(k.alias for k in keys)} from {src}{fallback}")
        else:
            say(f"  {role:<8} MISSING")
            msg, fix = _split_fix(pool.no_key_message(role))
            problems.append(Problem("credentials", f"role {role}", msg, fix))
    for note in pool.env_notes():
        say(f"  note: {note}")

    # 4. pings
    if ping:
        say()
        say(f"Ping (one tiny request per role, timeout {timeout_s:g}s)")
        if not url_ok or not model:
            say("  skipped: fix the base URL and the model id first (every ping would fail the same way)")
        else:
            try:
                path = sqlite_path_from_url(ledger_url)
                path.parent.mkdir(parents=True, exist_ok=True)
                ledger = Ledger(path)
            except (LedgerConfigError, OSError) as e:
                print(f"error: ledger: {e}", file=sys.stderr)
                return 2
            quiet = logging.getLogger("kregress.doctor")
            if not quiet.handlers:
                quiet.addHandler(logging.NullHandler())
            quiet.propagate = False
            run_id = f"doctor-{int(time.time())}"
            for role in roles:
                if not pool.keys(role):
                    say(f"  {role:<8} skipped: no key")
                    continue
                res = TaotokenResource(base_url=base, model_id=model, max_attempts=1, read_timeout_s=timeout_s,
                                       connect_timeout_s=min(10.0, timeout_s), use_cache=False)
                gw = res.get_gateway(ledger, environ=env, log=quiet)
                t0 = time.perf_counter()
                try:
                    r = gw.chat(role, [{"role": "user", "content": "Reply with the single word: pong"}], max_tokens=8, temperature=0.0,
                                ctx=CallContext(run_id=run_id, task="doctor_ping", sweep=run_id))
                    say(f"  {role:<8} ok in {(time.perf_counter() - t0) * 1000:.0f} ms ({r.key_alias}, request {r.request_id or '-'}, "
                        f"{r.prompt_tokens}+{r.completion_tokens} tokens)")
                except Exception as exc:  # classified below; nothing is retried
                    category, msg, fix = _ping_outcome(exc)
                    say(f"  {role:<8} FAIL ({category}): {msg}")
                    problems.append(Problem(category, f"ping {role}", msg, fix))
                finally:
                    gw.close()

    # 5. summary, in the order to fix things
    say()
    if not problems:
        say("Everything looks right." + ("" if ping else " (run with --ping to try one request per role)"))
        return 0
    problems.sort(key=lambda p: CATEGORY_ORDER.get(p.category, 9))
    say(f"Problems, in the order to fix them (credentials, then request, then content): {len(problems)}")
    for i, p in enumerate(problems, 1):
        say(p.render(i))
    return 1


def cmd_doctor(args: argparse.Namespace) -> int:
    roles = [r.strip() for r in (args.roles or "").split(",") if r.strip()] or None
    from resources.taotoken import ROLES

    bad = [r for r in roles or [] if r not in ROLES]
    if bad:
        print(f"error: --roles: unknown role(s) {', '.join(bad)}; allowed: {', '.join(ROLES)}", file=sys.stderr)
        return 2
    return run_doctor(ping=args.ping, timeout_s=args.timeout, roles=roles, ledger_url=args.ledger_url)


# --- export-config -------------------------------------------------------------------------------------


def run_export(tool: str, opts: ExportOptions, *, out_path: str = "", force: bool = False, environ: Mapping[str, str] | None = None,
               out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        text = EXPORTERS[tool](opts, environ)
    except ExportError as e:
        print(f"error: {e}", file=err)
        return 2
    if out_path:
        p = Path(out_path).expanduser()
        if p.exists() and not force:
            print(f"error: {p} exists; pass --force to overwrite it (or choose another --out)", file=err)
            return 2
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        if opts.include_key:
            os.chmod(p, 0o600)
        print(f"wrote {p} ({tool})", file=err)
    else:
        out.write(text)
    for n in opts.notes:
        print(f"note: {n}", file=err)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    opts = ExportOptions(base_url=args.base_url or "", model=args.model or "", role=args.role, env_key=args.env_key or "",
                         wire_api=args.wire_api, include_key=args.include_key,
                         prod_hosts=tuple(args.prod_host) if args.prod_host else ExportOptions().prod_hosts)
    return run_export(args.tool, opts, out_path=args.out or "", force=args.force)


# --- lint-config ---------------------------------------------------------------------------------------


def run_lint(paths: Sequence[str], *, kind: str | None = None, environ: Mapping[str, str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    findings = []
    for p in paths:
        findings += lint_file(p, environ, kind)
    for f in findings:
        print(f.render(), file=out)
    n_files = len({f.file for f in findings})
    if findings:
        print(f"{len(findings)} finding(s) in {n_files} of {len(paths)} file(s)", file=out)
        return 1
    print(f"{len(paths)} file(s) clean", file=out)
    return 0


def cmd_lint(args: argparse.Namespace) -> int:
    kind = {"auto": None}.get(args.kind, args.kind)
    return run_lint(args.paths, kind=kind)


# --- registration ------------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    d = subparsers.add_parser("doctor", help="check the gateway configuration (and --ping each role)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--ping", action="store_true", help="send one tiny request per role and classify the outcome")
    d.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for each ping (default 20)")
    d.add_argument("--roles", default="", help="comma-separated roles (default: suggest,report,review)")
    d.add_argument("--ledger-url", default="", help="ledger that records the pings (default $DAGSTER_HOME/ledger.sqlite)")
    d.set_defaults(func=cmd_doctor)

    e = subparsers.add_parser("export-config", help="write a Claude Code / Codex / CC Switch configuration for the gateway",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--tool", required=True, choices=TOOLS)
    e.add_argument("--out", help=f"file to write (default: stdout); usual names: {', '.join(f'{t}: {n}' for t, n in DEFAULT_FILENAMES.items())}")
    e.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    e.add_argument("--model", help="model id (default $TAOTOKEN_MODEL_ID)")
    e.add_argument("--base-url", help="gateway API root (default $TAOTOKEN_BASE_URL, else https://taotoken.net/api)")
    e.add_argument("--role", default="review", choices=["suggest", "report", "review"], help="whose key the tool uses (default review)")
    e.add_argument("--env-key", help="codex: the variable Codex reads the key from (default the role's TAOTOKEN_KEY_* variable)")
    e.add_argument("--wire-api", default="responses", choices=["responses", "chat"], help="codex wire API (default responses)")
    e.add_argument("--prod-host", action="append", help="claude-code: a production host pattern curl/WebFetch may not reach (repeatable; default *prod*)")
    e.add_argument("--include-key", action="store_true", help="write the literal key into the file (it is otherwise never written)")
    e.set_defaults(func=cmd_export)

    lc = subparsers.add_parser("lint-config", help="find the classic mistakes in Claude Code / Codex / CC Switch files",
                               description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lc.add_argument("paths", nargs="+", help="settings.json, config.toml or a CC Switch JSON")
    lc.add_argument("--kind", default="auto", choices=["auto", *TOOLS], help="file kind (default: from the name and content)")
    lc.set_defaults(func=cmd_lint)
