"""Key cooldowns shared by every process on one ledger: key alias -> wall-clock time until which it rests.

Rate limits and rejected credentials cool a key; a gateway reads the cooldowns the others wrote (``owner``
tags who wrote each, so a gateway skips its own: it keeps those in memory). Aliases only, never keys.
"""

from __future__ import annotations

import time
import uuid
from typing import Sequence

import sqlalchemy as sa

from resources.ledger.engine import Engine, cooldowns_t

_c = cooldowns_t.c
_ACTIVE = sa.select(_c.key_alias, _c.cool_until, _c.reason, _c.owner).where(
    _c.key_alias.in_(sa.bindparam("aliases", expanding=True)), _c.cool_until > sa.bindparam("now"))


def new_owner() -> str:
    """A tag for the cooldowns one gateway writes (it reads back only the others')."""
    return uuid.uuid4().hex[:12]


class CooldownStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def cool(self, alias: str, until_wall: float, *, reason: str = "", owner: str = "") -> None:
        """Record that ``alias`` should not be used before ``until_wall`` (time.time()); a later time wins."""
        with self.engine.write() as con:
            old = con.execute(sa.select(_c.cool_until).where(_c.key_alias == alias)).scalar_one_or_none()
            if old is None:
                con.execute(sa.insert(cooldowns_t).values(key_alias=alias, cool_until=until_wall, reason=reason, owner=owner, ts=time.time()))
            elif until_wall > old:
                con.execute(sa.update(cooldowns_t).where(_c.key_alias == alias).values(
                    cool_until=until_wall, reason=reason, owner=owner, ts=time.time()))

    def active(self, aliases: Sequence[str], *, now_wall: float | None = None) -> dict[str, tuple[float, str, str]]:
        """alias -> (cool_until wall time, reason, owner) for the given aliases still cooling down."""
        now_wall = time.time() if now_wall is None else now_wall
        if not aliases:
            return {}
        with self.engine.read() as con:
            rows = con.execute(_ACTIVE, {"aliases": list(aliases), "now": now_wall})
            return {r.key_alias: (float(r.cool_until), r.reason, r.owner) for r in rows}
