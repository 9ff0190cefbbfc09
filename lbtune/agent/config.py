"""The agent's configuration: :class:`AgentConfig`, loaded from YAML/JSON and CLI flags.

Precedence: defaults < the config file < CLI flags. On ``SIGHUP`` the agent re-reads
the file (a playbook writes it and signals); fields given as CLI flags stay pinned.

The score is the source material's formula,
``score = a*(1 - kv_util) + b*(1 - latency_norm) + c*(1 - queue_norm)``, with its
coefficients a = 0.5 (KV-cache headroom), b = 0.3 (latency), c = 0.2 (queue).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lbtune.errors import ConfigError, validation_error, validation_message
from lbtune.records.addresses import check_url
from lbtune.safeyaml import load_yaml_file

__all__ = [
    "AgentConfig",
    "check_settings",
    "load_agent_config",
    "owns_weights",
    "read_agent_file",
    "write_agent_file",
]


class AgentConfig(BaseModel):
    """Every knob of ``lbtune agent`` (the tunable ones are ``agent.*`` knobs of a target's
    space, e.g. HAProxy's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        default=True,
        description="Push weights. False: observe only (read, score, export; push nothing).",
    )
    prometheus_url: str = Field(
        default="http://127.0.0.1:9490", description="Prometheus scraping the replicas."
    )
    allow_remote: bool = Field(
        default=False, description="Let prometheus_url be on another machine (--allow-remote)."
    )
    state_dir: str | None = Field(
        default=None,
        description=(
            "The lbtune state dir (endpoints.json) of the cluster whose balancer the agent "
            "steers; its balancer must take live weights. Default: the running cluster."
        ),
    )
    interval_s: float = Field(default=2.0, gt=0, le=3600, description="Seconds between steps.")
    metrics_port: int | None = Field(
        default=9492,
        ge=0,
        le=65535,
        description="The agent's own /metrics on 127.0.0.1 (0 = any free port, null = off).",
    )
    replica_label: str = Field(
        default="replica",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Prometheus label naming the replica (= the balancer's server name).",
    )
    query_timeout_s: float = Field(default=2.0, gt=0, le=60)
    # score coefficients (source material: 0.5 / 0.3 / 0.2)
    a: float = Field(default=0.5, ge=0, le=1000, description="Weight of KV-cache headroom.")
    b: float = Field(default=0.3, ge=0, le=1000, description="Weight of latency headroom.")
    c: float = Field(default=0.2, ge=0, le=1000, description="Weight of queue headroom.")
    # normalisation
    ttft_ceiling_s: float = Field(
        default=1.0, gt=0, le=3600, description="TTFT at which latency_norm reaches 1."
    )
    ttft_quantile: Literal["p50", "p90"] = Field(
        default="p50", description="Which recent TTFT quantile is the latency input."
    )
    ttft_window_s: float = Field(
        default=10.0,
        ge=2,
        le=86_400,
        description="rate() window of the TTFT histogram (>= 4 scrapes).",
    )
    queue_ceiling: float = Field(
        default=16.0, gt=0, le=1e6, description="Waiting requests at which queue_norm reaches 1."
    )
    # smoothing
    ewma_alpha: float = Field(
        default=0.5, gt=0, le=1, description="EWMA weight of the newest sample (1 = none)."
    )
    z_window: int = Field(default=10, ge=3, le=1000, description="Samples in the z-score window.")
    z_threshold: float = Field(
        default=3.5, gt=0, le=1000, description="|z| above which a sample is a spike and dropped."
    )
    z_min_sigma: float = Field(
        default=0.02,
        ge=0,
        le=1000,
        description="Floor of the window's std-dev (normalised units): tiny noise is no spike.",
    )
    z_max_drops: int = Field(
        default=2,
        ge=0,
        le=1000,
        description="Consecutive drops after which an outlier is a level shift and accepted.",
    )
    # guard rails
    min_weight: int = Field(default=1, ge=1, le=256, description="Lowest weight of a live replica.")
    max_weight: int = Field(
        default=100,
        ge=1,
        le=256,
        description="Weight of the best replica (100 = the untuned cluster's weight).",
    )
    max_step: int = Field(default=32, ge=1, le=256, description="Largest weight change per step.")
    deadband: int = Field(
        default=2,
        ge=0,
        le=256,
        description="Weight changes smaller than this are not made (no churn on noise).",
    )
    drain_kv_threshold: float = Field(
        default=0.95, gt=0, le=1, description="KV usage above which a replica is drained (0)."
    )
    recover_kv_threshold: float = Field(
        default=0.80, ge=0, lt=1, description="KV usage below which a drained replica returns."
    )

    @model_validator(mode="after")
    def _consistent(self) -> AgentConfig:
        try:
            check_url(
                self.prometheus_url, "prometheus_url", allow_remote=self.allow_remote,
                opt_in="--allow-remote (allow_remote: true)",
            )  # fmt: skip
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if self.a + self.b + self.c <= 0:
            raise ValueError("a + b + c must be > 0")
        if self.min_weight > self.max_weight:
            raise ValueError(
                f"min_weight ({self.min_weight}) must be <= max_weight ({self.max_weight})"
            )
        if self.recover_kv_threshold >= self.drain_kv_threshold:
            raise ValueError(
                f"recover_kv_threshold ({self.recover_kv_threshold}) must be below "
                f"drain_kv_threshold ({self.drain_kv_threshold}) (hysteresis)"
            )
        return self


def check_settings(settings: Mapping[str, Any], reserved: Mapping[str, str] | None = None) -> None:
    """Raise ValueError naming the field when ``settings`` (a partial AgentConfig, e.g. a
    cluster YAML's ``agent.settings``) holds a ``reserved`` field (key → what sets it
    instead), an unknown field, or a value AgentConfig rejects."""
    reserved = reserved or {}
    for key in settings:
        if key in reserved:
            raise ValueError(f"{key}: set by the cluster ({reserved[key]})")
        if key not in AgentConfig.model_fields:
            known = ", ".join(k for k in AgentConfig.model_fields if k not in reserved)
            raise ValueError(f"{key}: unknown agent setting. Known: {known}")
    try:
        AgentConfig.model_validate(dict(settings))
    except ValidationError as exc:
        raise ValueError(validation_message(exc, AgentConfig, dict(settings))) from None


def load_agent_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> AgentConfig:
    """``defaults`` (e.g. the running cluster's endpoints), then the YAML/JSON file at
    ``path`` (if any), then ``overrides`` (CLI flags; ``None`` values are ignored).

    Raises :class:`ConfigError` naming the file and the field.
    """
    data: dict[str, Any] = dict(defaults or {})
    where = "agent config"
    if path is not None:
        where = str(path)
        loaded = load_yaml_file(path, where)
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of agent settings")
        # A playbook may nest the settings under `agent:`.
        if set(loaded) == {"agent"} and isinstance(loaded["agent"], dict):
            loaded = loaded["agent"]
        data.update(loaded)
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, where, AgentConfig, data) from None


def read_agent_file(path: str | Path) -> dict[str, Any]:
    """The settings in an agent config file (un-nested from ``agent:``), unvalidated;
    ``{}`` when the file is missing or is not a mapping."""
    try:
        loaded = load_yaml_file(path)
    except ConfigError:
        return {}
    if isinstance(loaded, dict) and set(loaded) == {"agent"} and isinstance(loaded["agent"], dict):
        loaded = loaded["agent"]
    return dict(loaded) if isinstance(loaded, dict) else {}


def write_agent_file(path: str | Path, settings: Mapping[str, Any]) -> None:
    """Check ``settings`` against :class:`AgentConfig` and write them atomically, nested
    under ``agent:`` (what ``lbtune cluster up`` and a target's ``agent.*`` knobs both write).

    Raises :class:`ConfigError` naming the field when a setting is invalid.
    """
    try:
        AgentConfig.model_validate(dict(settings))
    except ValidationError as exc:
        raise validation_error(exc, str(path), AgentConfig, dict(settings)) from None
    target = Path(path)
    tmp = target.with_name(target.name + ".lbtune-tmp")
    tmp.write_text(yaml.safe_dump({"agent": dict(settings)}, sort_keys=False), encoding="utf-8")
    os.replace(tmp, target)


def owns_weights(settings: str | Path | None) -> bool:
    """Whether the agent of this settings file (a cluster's ``Endpoints.agent_config``;
    ``None``: the cluster runs no agent) sets the per-server weights: it runs and is not
    observe-only."""
    if settings is None:
        return False
    return bool(read_agent_file(settings).get("enabled", True))
