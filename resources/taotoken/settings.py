"""The gateway's settings, defined once: ``TaotokenResource`` (resource.py) is these fields as a Dagster resource."""

from __future__ import annotations

import os

import dagster as dg
from pydantic import Field

from kregress.core.endpoints import BASE_URL_ENV, DEFAULT_ROOT, MODEL_ENV


def _env_base_url() -> str:
    return os.environ.get(BASE_URL_ENV, "").strip() or DEFAULT_ROOT


def _env_model() -> str:
    return os.environ.get(MODEL_ENV, "").strip()


class GatewaySettings(dg.Config):
    """How the gateway calls the API (no keys: they are read from the environment when a gateway is made)."""

    base_url: str = Field(default_factory=_env_base_url, description=f"API root (default ${BASE_URL_ENV}, else {DEFAULT_ROOT}); /v1 is derived")
    model_id: str = Field(default_factory=_env_model, description=f"model id (default ${MODEL_ENV}); required for llm calls, never guessed")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
    max_tokens_suggest: int = Field(default=1536, gt=0)
    max_tokens_report: int = Field(default=1024, gt=0)
    max_tokens_review: int = Field(default=1536, gt=0)
    min_output_tokens: int = Field(default=256, gt=0, description="the least max_tokens worth sending when a budget lowers it; below it the call is refused")
    temperature: float = Field(default=0.2, ge=0)
    retry_horizon_s: float = Field(default=60.0, ge=0, description="most seconds one call waits in total (Retry-After and backoff) before giving up")
    max_attempts: int = Field(default=0, ge=0, description="attempts per call, failovers included; 0: no count limit (retry_horizon_s decides)")
    backoff_base_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=30.0, ge=0)
    credential_cooldown_s: float = Field(default=600.0, ge=0, description="how long other runs on the ledger skip a key the server rejected")
    max_response_chars: int = Field(default=200_000, gt=0)
    verify_model: bool = Field(default=True, description="check the model id against GET /models once per gateway")
    use_cache: bool = Field(default=True, description="serve identical requests from the ledger's response cache")

    def max_tokens_for(self, role: str) -> int:
        return int(getattr(self, f"max_tokens_{role}", 1024))
