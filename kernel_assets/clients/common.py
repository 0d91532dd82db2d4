"""Key and secret helpers shared by export, lint and doctor (the gateway's own rules, from core.endpoints).

Keys are read from the environment only, with the gateway's precedence: the role's ``TAOTOKEN_KEY_<ROLE>``
when it holds a key, else ``TAOTOKEN_API_KEY``. Nothing here prints a key; ``scrub`` removes any key the
environment holds (and anything key-shaped) from a line before it is shown.
"""

from __future__ import annotations

import re
from typing import Mapping

from kregress.core.endpoints import FALLBACK_KEY_ENV, KEY_PATTERN, ROLE_KEY_ENV, fingerprint, split_keys

TOOLS = ("claude-code", "codex", "cc-switch")
PROVIDER_ID = "taotoken"
PROVIDER_NAME = "TaoToken (kregress)"

_PLACEHOLDER = re.compile(r"^\s*(?:<[^>]*>|\$\{?[A-Za-z_]\w*\}?|your[-_ ].*|x{3,}|changeme|replace[-_ ]?me.*|todo)\s*$", re.IGNORECASE)
_SECRET_NAME = re.compile(r"(?:KEY|TOKEN|SECRET|PASSWORD)$", re.IGNORECASE)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


_SHELL_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_SHELL_ASSIGN = re.compile(r"(?:^|;|&&|\|\||\{)\s*([A-Za-z_][A-Za-z0-9_]*)=")  # VAR=... at the start of a statement


def helper_variables(command: str) -> list[str]:
    """The environment variables a shell command (an apiKeyHelper) reads, in order; its own assignments left out."""
    own = set(_SHELL_ASSIGN.findall(command))
    return [n for n in dict.fromkeys(_SHELL_VAR.findall(command)) if n not in own]


def is_secret_name(name: str) -> bool:
    """Whether a variable or field name says it holds a secret (``*_KEY``, ``*_TOKEN``, ``*_KEYS`` ...)."""
    return bool(_SECRET_NAME.search(name)) or name.upper().endswith(("_KEYS", "AUTH_TOKEN"))


def looks_like_key(value: str) -> bool:
    return bool(KEY_PATTERN.search(value or ""))


def is_placeholder(value: str) -> bool:
    return bool(_PLACEHOLDER.match(value or ""))


def environment_secrets(environ: Mapping[str, str]) -> list[str]:
    """Every key held by a variable whose name says it is a secret (to recognise them pasted into a file)."""
    out: list[str] = []
    for name, value in environ.items():
        if name.startswith(("TAOTOKEN_", "ANTHROPIC_", "OPENAI_")) and is_secret_name(name):
            out += [k for k in split_keys(value) if len(k) >= 8]
    return out


def role_keys(role: str, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    """(variable, keys) the gateway uses for ``role``: its own variable when it holds a key, else the fallback."""
    own = ROLE_KEY_ENV[role]
    keys = split_keys(environ.get(own, ""))
    if keys:
        return own, keys
    return (FALLBACK_KEY_ENV, split_keys(environ.get(FALLBACK_KEY_ENV, ""))) if split_keys(environ.get(FALLBACK_KEY_ENV, "")) else (own, [])


def key_alias(role: str, key: str) -> str:
    """How a key is named in output: role and 4 hex digits of its SHA-256 (the gateway's alias)."""
    return f"{role}#{fingerprint(key)}"


def env_state(name: str, environ: Mapping[str, str]) -> str:
    if name not in environ:
        return f"{name} is not set"
    n = len(split_keys(environ.get(name, "")))
    return f"{name} is set but empty" if not n else f"{name} is set ({n} key{'s' if n != 1 else ''})"


def scrub(text: str, environ: Mapping[str, str]) -> str:
    """The line with every key of the environment replaced by its fingerprint, and anything key-shaped masked."""
    for k in sorted(environment_secrets(environ), key=len, reverse=True):
        text = text.replace(k, f"<#{fingerprint(k)}>")
    for name in (FALLBACK_KEY_ENV, *ROLE_KEY_ENV.values()):
        for k in split_keys(environ.get(name, "")):
            text = text.replace(k, f"<#{fingerprint(k)}>")
    return KEY_PATTERN.sub("<redacted>", text)
