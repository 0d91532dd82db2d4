"""``TaotokenResource``: the gateway's settings as a Dagster resource; ``get_gateway`` makes a Gateway."""

from __future__ import annotations

import random
from typing import Any, Callable, Mapping

import dagster as dg

from resources.ledger import Ledger, LedgerResource
from resources.taotoken.gateway import Gateway
from resources.taotoken.keys import KeyPool
from resources.taotoken.settings import GatewaySettings


class TaotokenResource(GatewaySettings, dg.ConfigurableResource):
    """The model gateway's configuration (the fields of GatewaySettings; no keys: they are read from the environment)."""

    def settings(self) -> GatewaySettings:
        return GatewaySettings(**{f: getattr(self, f) for f in GatewaySettings.model_fields})

    def key_pool(self, environ: Mapping[str, str] | None = None) -> KeyPool:
        return KeyPool.from_env(environ)

    def has_key(self, role: str, environ: Mapping[str, str] | None = None) -> bool:
        return self.key_pool(environ).has(role)

    def get_gateway(
        self,
        ledger: Ledger | None = None,
        *,
        log: Any = None,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> Gateway:
        """A gateway with the keys in the environment now (``environ`` overrides os.environ, for tests)."""
        return Gateway(
            self.settings(),
            keys=KeyPool.from_env(environ),
            ledger=ledger if ledger is not None else LedgerResource().get_ledger(),
            log=log, sleep=sleep, clock=clock, rng=rng,
        )
