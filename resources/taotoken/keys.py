"""API keys per role, their aliases, cooldowns and the diagnosis of a missing or rejected key.

Keys come from the environment only (``TAOTOKEN_KEY_<ROLE>``, ``TAOTOKEN_API_KEY`` as the fallback).
Everything outside this module sees a key's alias (``suggest#3f9a``: role + 4 hex digits of its SHA-256).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from kregress.core.endpoints import (
    FALLBACK_KEY_ENV,
    KEY_PATTERN,
    KNOWN_ENV,
    OTHER_TOOLS_ENV,
    ROLE_KEY_ENV,
    CredentialsError,
    GatewayError,
    fingerprint,
    split_keys,
)
from kregress.core.names import ROLES

CREDENTIALS = "credentials"  # the cooldown reason of a key the server rejected


class ApiKey:
    """One API key. ``repr``/``str`` show only the alias; the secret is read with ``reveal()``."""

    __slots__ = ("role", "alias", "env_var", "_secret")

    def __init__(self, role: str, secret: str, env_var: str, alias: str) -> None:
        self.role = role
        self.alias = alias
        self.env_var = env_var
        self._secret = secret

    def reveal(self) -> str:
        return self._secret

    def __repr__(self) -> str:
        return f"<ApiKey {self.alias} from {self.env_var}>"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError(f"{self!r} cannot be pickled: keys stay in the process that read them from the environment")


class KeyPool:
    """Keys per role with per-key cooldowns; picks the least recently used key that is not cooling down.

    A key the server rejected (401/403, no quota) is out for the pool's lifetime (``reject``); a key another
    process saw rejected arrives as a cooldown with reason ``credentials`` (``cool(..., reason=)``) and is
    never waited for. When every key of a role is out, ``pick`` raises CredentialsError.
    """

    def __init__(self, keys: dict[str, list[ApiKey]], environ: Mapping[str, str] | None = None) -> None:
        self._keys = {r: list(keys.get(r, [])) for r in ROLES}
        self._env_names = {k: bool(v) for k, v in (environ or {}).items() if k.startswith("TAOTOKEN_") or k in OTHER_TOOLS_ENV}
        self._env_keycount = {
            name: len(split_keys((environ or {}).get(name, ""))) for name in [FALLBACK_KEY_ENV, *ROLE_KEY_ENV.values()]
        }
        self._cool_until: dict[str, float] = {}
        self._cool_reason: dict[str, str] = {}
        self._rejected: dict[str, GatewayError] = {}
        self._last_used: dict[str, float] = {}
        self._use_counter = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KeyPool:
        env = dict(os.environ if environ is None else environ)
        fallback = split_keys(env.get(FALLBACK_KEY_ENV, ""))
        keys: dict[str, list[ApiKey]] = {}
        for role in ROLES:
            var = ROLE_KEY_ENV[role]
            secrets, source = split_keys(env.get(var, "")), var
            if not secrets:
                secrets, source = fallback, FALLBACK_KEY_ENV
            seen: set[str] = set()
            out = []
            for s in secrets:
                alias = f"{role}#{fingerprint(s)}"
                n = 2
                while alias in seen:
                    alias = f"{role}#{fingerprint(s)}-{n}"
                    n += 1
                seen.add(alias)
                out.append(ApiKey(role, s, source, alias))
            keys[role] = out
        return cls(keys, env)

    # -- queries -----------------------------------------------------------------------------
    def keys(self, role: str) -> list[ApiKey]:
        return list(self._keys.get(role, []))

    def has(self, role: str) -> bool:
        return bool(self._keys.get(role))

    def aliases(self, role: str | None = None) -> list[str]:
        roles = [role] if role else list(ROLES)
        return [k.alias for r in roles for k in self._keys.get(r, [])]

    def __repr__(self) -> str:
        inner = ", ".join(f"{r}: [{', '.join(self.aliases(r))}]" for r in ROLES)
        return f"KeyPool({inner})"

    def scrub_exact(self, text: str) -> str:
        """Replace every key this pool holds with ``<alias>`` (used on model output: nothing else is touched)."""
        text = str(text)
        for r in ROLES:
            for k in self._keys[r]:
                if k.reveal() and k.reveal() in text:
                    text = text.replace(k.reveal(), f"<{k.alias}>")
        return text

    def scrub(self, text: str) -> str:
        """Replace every key this pool holds (and anything shaped like a bearer token) with an alias / mask."""
        return KEY_PATTERN.sub("<redacted>", self.scrub_exact(text))

    # -- scheduling --------------------------------------------------------------------------
    def pick(self, role: str, now: float) -> tuple[ApiKey, float]:
        """(key, seconds to wait before using it): a free key if any, else the one that cools down first.

        Rejected keys are skipped; keys another process saw rejected are used only while they are the
        last ones left and never waited for.
        """
        keys = self._keys.get(role) or []
        if not keys:
            raise CredentialsError(self.no_key_message(role), role=role)
        alive = [k for k in keys if k.alias not in self._rejected]
        if not alive:
            raise self.all_rejected(role)
        free = [k for k in alive if self._cool_until.get(k.alias, 0.0) <= now]
        if free:
            key = min(free, key=lambda k: self._last_used.get(k.alias, -1.0))
            wait = 0.0
        else:
            waitable = [k for k in alive if self._cool_reason.get(k.alias) != CREDENTIALS]
            if waitable:
                key = min(waitable, key=lambda k: self._cool_until[k.alias])
                wait = self._cool_until[key.alias] - now
            else:  # only keys another run saw rejected: try one now (our own answer decides), never wait for it
                key = min(alive, key=lambda k: self._last_used.get(k.alias, -1.0))
                wait = 0.0
        self._use_counter += 1
        self._last_used[key.alias] = self._use_counter
        return key, wait

    def cool(self, key: ApiKey | str, until: float, reason: str = "") -> None:
        alias = key if isinstance(key, str) else key.alias
        if until > self._cool_until.get(alias, 0.0):
            self._cool_until[alias] = until
            self._cool_reason[alias] = reason

    def cooldown_remaining(self, alias: str, now: float) -> float:
        return max(0.0, self._cool_until.get(alias, 0.0) - now)

    def reject(self, key: ApiKey, err: GatewayError) -> list[ApiKey]:
        """Take ``key`` out (the server rejected it); returns the role's keys still usable."""
        self._rejected[key.alias] = err
        return [k for k in self._keys.get(key.role, []) if k.alias not in self._rejected]

    def rejected(self, role: str) -> dict[str, GatewayError]:
        return {a: e for a, e in self._rejected.items() if a in self.aliases(role)}

    def all_rejected(self, role: str) -> CredentialsError:
        errs = self.rejected(role)
        last = list(errs.values())[-1]
        if len(errs) == 1:
            return last if isinstance(last, CredentialsError) else CredentialsError(str(last), role=role, key_alias=last.key_alias, status=last.status)
        each = ", ".join(f"{a}: HTTP {e.status or '?'}" for a, e in errs.items())
        return CredentialsError(
            f"[credentials] all {len(errs)} keys of role {role} were rejected ({each}); last: {last.what}. Fix: {last.fix}",
            role=role, key_alias=last.key_alias, status=last.status,
        )

    # -- diagnosis ---------------------------------------------------------------------------
    def _env_state(self, name: str) -> str:
        if name not in self._env_names:
            return f"{name} is not set"
        if not self._env_names[name] or not self._env_keycount.get(name):
            return f"{name} is set but empty"
        n = self._env_keycount[name]
        return f"{name} is set ({n} key{'s' if n != 1 else ''})"

    def env_notes(self) -> list[str]:
        notes = []
        other = [n for n in OTHER_TOOLS_ENV if self._env_names.get(n)]
        if other:
            notes.append(
                f"{', '.join(other)} {'is' if len(other) == 1 else 'are'} set, but that is another tool's variable; "
                f"the gateway reads only TAOTOKEN_KEY_<ROLE> and {FALLBACK_KEY_ENV}"
            )
        unknown = sorted(n for n in self._env_names if n.startswith("TAOTOKEN_") and n not in KNOWN_ENV)
        for n in unknown:
            notes.append(f"{n} is set but the gateway does not read it (known: {', '.join(sorted(KNOWN_ENV))})")
        return notes

    def credentials_hint(self, role: str) -> str:
        var = ROLE_KEY_ENV.get(role, "TAOTOKEN_KEY_<ROLE>")
        parts = [self._env_state(var), self._env_state(FALLBACK_KEY_ENV) + " (fallback for all roles)"]
        used = self._keys.get(role) or []
        if used:
            parts.append(f"role {role} uses {used[0].env_var}")
        return "; ".join(parts) + "".join(f". Note: {n}" for n in self.env_notes())

    def no_key_message(self, role: str) -> str:
        var = ROLE_KEY_ENV.get(role, "TAOTOKEN_KEY_<ROLE>")
        return (
            f"[credentials] no TAOTOKEN key for role {role}: {self.credentials_hint(role)}. "
            f"Fix: export {var}=<key>[,<key2>] (or {FALLBACK_KEY_ENV} for every role)."
        )
