"""The response cache: model text by request hash (model, messages, parameters), so a resumed run does not pay twice.

Keys are never stored: the hash covers what changes the answer, not who asked.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from resources.ledger.engine import Engine, cache_t

CACHE_ALIAS = "(cache)"  # the key alias of a usage row answered from the cache


class ResponseCache:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def get(self, request_hash: str) -> dict[str, Any] | None:
        with self.engine.read() as con:
            r = con.execute(sa.select(cache_t).where(cache_t.c.request_hash == request_hash)).first()
            return dict(r._mapping) if r else None

    def put(self, request_hash: str, *, model: str, role: str, content: str, finish_reason: str = "", request_id: str = "",
            prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        values = dict(ts=time.time(), model=model, role=role, content=content, finish_reason=finish_reason, request_id=request_id,
                      prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        with self.engine.write() as con:
            if con.execute(sa.select(cache_t.c.request_hash).where(cache_t.c.request_hash == request_hash)).first():
                con.execute(sa.update(cache_t).where(cache_t.c.request_hash == request_hash).values(**values))
            else:
                con.execute(sa.insert(cache_t).values(request_hash=request_hash, **values))
