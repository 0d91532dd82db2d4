"""``kregress doctor``, ``kregress export-config`` and ``kregress lint-config``: the gateway from the coding tools.

    kregress doctor [--ping] [--tool codex]                 # exit 0 ok, 2 config, 3 credentials, 4 endpoint, 5 network
    kregress export-config --tool claude-code --install     # merges into ~/.claude/settings.json (user level)
    kregress export-config --tool codex --install           # writes ~/.codex/config.toml ($CODEX_HOME)
    kregress export-config --tool cc-switch --out taotoken.ccswitch.sql   # CC Switch 3.x: its import dialog
    kregress export-config --tool cc-switch --format cc-switch-merge-sql --out t.sql && sqlite3 ~/.cc-switch/cc-switch.db < t.sql
    kregress lint-config ~/.claude/settings.json ~/.codex/config.toml ~/.cc-switch/cc-switch.db

Without --out or --install the file goes to stdout and the notes (where the tool reads it, what to export)
to stderr. Keys never appear in an exported file unless --include-key is passed (they come from the
environment); lint and doctor show a key only as its length and a 4-hex-digit fingerprint.
export-config and lint-config exit 2 for unusable arguments, lint-config 1 when it finds something.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Mapping, Sequence, TextIO

from kernel_assets.clients import ccswitch
from kernel_assets.clients.common import TOOLS
from kernel_assets.clients.doctor import DOCTOR_TOOLS, run_doctor
from kernel_assets.clients.export import (
    ExportError,
    ExportOptions,
    claude_settings,
    claude_user_settings,
    codex_user_config,
    export_claude_code,
    export_codex,
    merge_claude_settings,
)
from kernel_assets.clients.lint import KINDS, lint_file
from kregress.core.names import ROLES

DEFAULT_FILENAMES = {"claude-code": "settings.json", "codex": "config.toml", "cc-switch": ccswitch.DEFAULT_FILENAMES["cc-switch-sql"]}


def _project_settings(p: Path, env: Mapping[str, str]) -> bool:
    """Whether ``p`` is a project's .claude/settings*.json (not the user settings)."""
    return p.parent.name == ".claude" and p.name.startswith("settings") and p.resolve() != claude_user_settings(env).resolve()


def run_export(tool: str, opts: ExportOptions, *, out_path: str = "", force: bool = False, install: bool = False, fmt: str = "",
               environ: Mapping[str, str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    env = dict(os.environ if environ is None else environ)
    fmt = fmt or ("cc-switch-sql" if tool == "cc-switch" else "")
    try:
        if tool == "cc-switch":
            if fmt not in ccswitch.FORMATS:
                raise ExportError(f"--format {fmt!r} is for another tool; cc-switch takes: {', '.join(ccswitch.FORMATS)}")
            if install:
                raise ExportError("--install is for claude-code and codex; CC Switch imports the file itself (see the note)")
            text = ccswitch.EXPORTERS[fmt](opts, env)
        elif fmt:
            raise ExportError(f"--format is for --tool cc-switch only ({', '.join(ccswitch.FORMATS)})")
        elif tool == "claude-code":
            text = export_claude_code(opts, env)
        else:
            text = export_codex(opts, env)
        target = Path(out_path).expanduser() if out_path else None
        if install:
            if out_path:
                raise ExportError("pass --install or --out, not both")
            target = claude_user_settings(env) if tool == "claude-code" else codex_user_config(env)
            if tool == "claude-code" and target.exists():
                try:
                    existing = json.loads(target.read_text(encoding="utf-8") or "{}")
                except ValueError as e:
                    raise ExportError(f"{target} is not valid JSON ({e}); fix or move it, then rerun --install") from None
                if not isinstance(existing, dict):
                    raise ExportError(f"{target} does not hold a JSON object; fix or move it, then rerun --install")
                text = json.dumps(merge_claude_settings(existing, claude_settings(ExportOptions(**{**opts.__dict__, "notes": []}), env)), indent=2) + "\n"
                force = True  # merged: the user's other settings are kept
                opts.notes.append(f"merged into {target}: your other settings are kept; env, apiKeyHelper and the permission rules are ours")
    except ExportError as e:
        print(f"error: {e}", file=err)
        return 2
    if target is not None:
        if target.exists() and not force:
            print(f"error: {target} exists; pass --force to overwrite it (or choose another --out)", file=err)
            return 2
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        if opts.include_key:
            os.chmod(target, 0o600)
        print(f"wrote {target} ({tool}{', ' + fmt if fmt else ''})", file=err)
    else:
        out.write(text)
    if tool == "claude-code":
        user = claude_user_settings(env)
        if target is None:
            opts.notes.append(f"Claude Code reads user settings from {user}: `--install` merges this there (or --out {user})")
        elif _project_settings(target, env):
            opts.notes.append(
                f"{target} is project settings: Claude Code ignores its permissions.allow rules until the workspace is trusted; "
                f"run `claude` in {target.resolve().parent.parent} once and accept the trust dialog, or use --install (user settings, no trust needed)")
    elif tool == "codex" and target is None:
        opts.notes.append(f"Codex reads {codex_user_config(env)}: `--install` writes it there")
    for n in opts.notes:
        print(f"note: {n}", file=err)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    opts = ExportOptions(base_url=args.base_url or "", model=args.model or "", role=args.role, env_key=args.env_key or "",
                         wire_api=args.wire_api, include_key=args.include_key,
                         prod_hosts=tuple(args.prod_host) if args.prod_host else ExportOptions().prod_hosts)
    return run_export(args.tool, opts, out_path=args.out or "", force=args.force, install=args.install, fmt=args.format or "")


def run_lint(paths: Sequence[str], *, kind: str | None = None, environ: Mapping[str, str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    findings = []
    for p in paths:
        findings += lint_file(p, environ, kind)
    for f in findings:
        print(f.render(), file=out)
    if findings:
        print(f"{len(findings)} finding(s) in {len({f.file for f in findings})} of {len(paths)} file(s)", file=out)
        return 1
    print(f"{len(paths)} file(s) clean", file=out)
    return 0


def cmd_lint(args: argparse.Namespace) -> int:
    return run_lint(args.paths, kind=None if args.kind == "auto" else args.kind)


def cmd_doctor(args: argparse.Namespace) -> int:
    roles = [r.strip() for r in (args.roles or "").split(",") if r.strip()] or None
    bad = [r for r in roles or [] if r not in ROLES]
    if bad:
        print(f"error: --roles: unknown role(s) {', '.join(bad)}; allowed: {', '.join(ROLES)}", file=sys.stderr)
        return 2
    tools = list(DOCTOR_TOOLS) if "all" in (args.tool or []) else list(dict.fromkeys(args.tool or []))
    return run_doctor(ping=args.ping, timeout_s=args.timeout, roles=roles, tools=tools, tool_role=args.role)


def register(subparsers: argparse._SubParsersAction) -> None:
    from kernel_assets.clients import doctor

    d = subparsers.add_parser("doctor", help="check the gateway set-up and (--ping) each tool's endpoint; exit 0/2/3/4/5",
                              description=doctor.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--ping", action="store_true", help="send one tiny request per role and per tool, classify the outcome")
    d.add_argument("--tool", action="append", choices=[*DOCTOR_TOOLS, "all"],
                   help="check only this tool (repeatable; default: kregress plus the coding tools configured for the gateway)")
    d.add_argument("--role", default="review", choices=list(ROLES), help="whose key the coding tools use (default review)")
    d.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for each ping (default 20)")
    d.add_argument("--roles", default="", help="kregress roles to ping, comma-separated (default: suggest,report,review)")
    d.set_defaults(func=cmd_doctor)

    e = subparsers.add_parser("export-config", help="write a Claude Code / Codex / CC Switch configuration for the gateway",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--tool", required=True, choices=TOOLS)
    e.add_argument("--out", help=f"file to write (default: stdout); usual names: {', '.join(f'{t}: {n}' for t, n in DEFAULT_FILENAMES.items())}")
    e.add_argument("--install", action="store_true", help="write the tool's user-level config: ~/.claude/settings.json (merged) or ~/.codex/config.toml")
    e.add_argument("--force", action="store_true", help="overwrite --out (or the installed file) if it exists")
    e.add_argument("--format", choices=ccswitch.FORMATS, help="cc-switch: sql (its import dialog, default), merge-sql (sqlite3 into an existing db), "
                   "deeplink (needs --include-key), json (pre-3.0 config.json)")
    e.add_argument("--model", help="model id (default $TAOTOKEN_MODEL_ID)")
    e.add_argument("--base-url", help="gateway API root (default $TAOTOKEN_BASE_URL, else https://taotoken.net/api)")
    e.add_argument("--role", default="review", choices=list(ROLES), help="whose key the tool uses (default review)")
    e.add_argument("--env-key", help="codex: the variable Codex reads the key from (default the role's TAOTOKEN_KEY_* variable)")
    e.add_argument("--wire-api", default="responses", help="codex wire API: responses, the only one current Codex loads")
    e.add_argument("--prod-host", action="append", help="claude-code: a production host pattern curl/WebFetch may not reach (repeatable; default *prod*)")
    e.add_argument("--include-key", action="store_true", help="write the literal key from the environment into the file (otherwise never written)")
    e.set_defaults(func=cmd_export)

    lc = subparsers.add_parser("lint-config", help="find the classic mistakes in Claude Code / Codex / CC Switch files",
                               description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lc.add_argument("paths", nargs="+", help="settings.json, config.toml, cc-switch.db, a CC Switch .sql or config.json")
    lc.add_argument("--kind", default="auto", choices=["auto", *KINDS], help="file kind (default: from the name and content)")
    lc.set_defaults(func=cmd_lint)
