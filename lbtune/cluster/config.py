"""The cluster YAML: what replicas run (or which existing ones to use), and on which ports.

A cluster file is validated on load; every error names the file and the field path,
e.g. ``clusters/x.yaml: replicas[2].gpu: Unknown GPU profile 'h200'. Available: ...``.
Presets are resolved by name from the repository's ``lbtune/data/clusters/`` directory, or a path
is given. :func:`lbtune.cluster.resolve.resolve` turns a validated config into concrete
replicas and ports (picking free loopback ports where the file asks for ``auto`` or ``0``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lbtune import targets
from lbtune.agent.config import check_settings
from lbtune.errors import ConfigError, validation_error
from lbtune.records.addresses import check_host, check_url, without_userinfo
from lbtune.resources import clusters_dir
from lbtune.safeyaml import load_yaml_file
from lbtune.sim import profiles
from lbtune.targets.base import ClusterShape

CLUSTERS_DIR = clusters_dir()
DEFAULT_PRESET = "hetero4"
LOOPBACK = "127.0.0.1"


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Model names end up inside HAProxy regexes and quoted strings: keep them plain.
_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]*$")


def _profile_names(kind: Literal["gpu", "model"]) -> list[str]:
    """Names of the simulator's GPU or model profiles."""
    table = profiles.GPU_PROFILES if kind == "gpu" else profiles.MODEL_PROFILES
    return sorted(str(k) for k in table)


def _check_name(value: str, what: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(
            f"Invalid {what} {value!r}: use letters, digits, '-', '_' and '.', "
            "starting with a letter or digit"
        )
    return value


def _check_models(models: list[str]) -> list[str]:
    for m in models:
        if not _MODEL_RE.match(m):
            raise ValueError(f"Invalid model name {m!r}: no spaces or quotes")
    if len(set(models)) != len(models):
        raise ValueError(f"Duplicate model names in {models}")
    return models


class PortsConfig(BaseModel):
    """Loopback ports; ``0`` asks for a free port (``ports: auto`` sets them all to 0)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    balancer: int = Field(default=8000, ge=0, le=65535, description="The balancer's API.")
    stats: int = Field(
        default=8404,
        ge=0,
        le=65535,
        description="The balancer's own stats/metrics page (e.g. HAProxy's stats + /metrics).",
    )
    prometheus: int = Field(default=9490, ge=0, le=65535, description="Prometheus web/API.")
    exporter: int = Field(
        default=9491, ge=0, le=65535, description="Reserved for lbtune's client-side exporter."
    )
    replica_base: int = Field(
        default=8100, ge=0, le=65535, description="First simulated replica; the rest follow."
    )
    agent: int = Field(
        default=9492,
        ge=0,
        le=65535,
        description="The feedback agent's /metrics (only used when agent.enabled).",
    )


class ReplicaGroup(BaseModel):
    """``count`` simulated replicas on one GPU profile, serving the same models."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str
    count: int = Field(default=1, ge=1, le=64)
    models: list[str] = Field(min_length=1)
    name: str | None = Field(
        default=None, description="Name prefix; default the GPU family ('h100' → h100-0, h100-1)."
    )

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        available = _profile_names("gpu")
        if v not in available:
            raise ValueError(f"Unknown GPU profile {v!r}. Available: {', '.join(available)}")
        return v

    @field_validator("models")
    @classmethod
    def _known_models(cls, v: list[str]) -> list[str]:
        available = _profile_names("model")
        for m in v:
            if m not in available:
                raise ValueError(f"Unknown model profile {m!r}. Available: {', '.join(available)}")
        return _check_models(v)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str | None) -> str | None:
        return None if v is None else _check_name(v, "name prefix")

    @model_validator(mode="after")
    def _models_fit(self) -> ReplicaGroup:
        """The weights of every served model fit in 90 % of the GPU (vLLM's default share)."""
        gpu = profiles.GPU_PROFILES.get(self.gpu)
        if gpu is None:
            return self
        weights = sum(
            profiles.MODEL_PROFILES[m].weight_bytes
            for m in self.models
            if m in profiles.MODEL_PROFILES
        )
        budget = 0.9 * gpu.memory_bytes
        if weights > budget:
            raise ValueError(
                f"Models {', '.join(self.models)} need {weights / 2**30:.1f} GiB of weights; "
                f"{self.gpu} has {budget / 2**30:.1f} GiB (90 %) for weights and KV cache"
            )
        return self

    @property
    def prefix(self) -> str:
        return self.name or self.gpu.split("-")[0]


class ExternalReplica(BaseModel):
    """An existing OpenAI-compatible server (e.g. a real vLLM) put behind the balancer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    url: str = Field(description="http://HOST:PORT of the server (no path).")
    models: list[str] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        return _check_name(v, "replica name")

    @field_validator("models")
    @classmethod
    def _valid_models(cls, v: list[str]) -> list[str]:
        return _check_models(v)

    @field_validator("url")
    @classmethod
    def _valid_url(cls, v: str) -> str:
        try:  # its form and no credentials; whether it may be remote: ClusterConfig
            parts = check_url(v, "url", allow_remote=True)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        shown = without_userinfo(v)
        if parts.scheme != "http" or parts.port is None:
            raise ValueError(f"Expected http://HOST:PORT, got {shown!r}")
        if parts.path not in ("", "/") or parts.query:
            raise ValueError(f"Expected no path in {shown!r}: the balancer forwards /v1/... as is")
        return f"http://{parts.netloc}"


class VllmReplicas(BaseModel):
    """``count`` real vLLM CPU servers on lbtune's tiny model (:mod:`lbtune.cluster.vllm`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(default=2, ge=1, le=16)
    model: str = Field(default="tiny-llama", description="The served model name.")
    cpus: list[Annotated[int, Field(ge=0, le=4095)]] = Field(
        default=[1], min_length=1, description="CPUs every server is pinned to (taskset -c)."
    )
    max_num_seqs: int = Field(default=8, ge=1, le=1024)
    max_model_len: int = Field(default=4096, ge=64, le=4096)
    num_gpu_blocks_override: int | None = Field(default=40, ge=1, le=1_000_000)
    enforce_eager: bool = Field(
        default=False,
        description="--enforce-eager: no torch.compile at startup (each server is up ~30 s "
        "sooner on a busy CPU); its steps then run uncompiled.",
    )
    name: str = Field(default="vllm", description="Name prefix: vllm-0, vllm-1, ...")

    @field_validator("model")
    @classmethod
    def _valid_model(cls, v: str) -> str:
        return _check_models([v])[0]

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        return _check_name(v, "name prefix")


AGENT_RESERVED = {
    "prometheus_url": "the cluster's Prometheus",
    "allow_remote": "the cluster's Prometheus is on loopback",
    "state_dir": "the cluster's state dir: the agent steers this cluster's balancer",
    "metrics_port": "ports.agent",
}
"""AgentConfig fields the cluster sets itself (and what sets them)."""


class AgentSection(BaseModel):
    """The feedback agent, run by the cluster when ``enabled`` (see docs/cluster.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=False, description="Start `lbtune agent run` with the cluster.")
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="AgentConfig fields written to <state>/agent.yaml as given (wall-clock s).",
    )

    @field_validator("settings")
    @classmethod
    def _agent_settings(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_settings(v, AGENT_RESERVED)
        return v


class ClusterConfig(BaseModel):
    """A cluster file: simulated replica groups or external replicas, and ports."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    time_scale: float = Field(
        default=1.0, gt=0, le=1000, description="Sim speed-up: 4 = 4x real time."
    )
    seed: int = Field(default=0, ge=0, lt=2**63)
    balancer: str = Field(default="haproxy", description="A balancer of lbtune.targets.TARGETS.")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="The balancer's initial knob values (its space's baseline otherwise).",
    )
    agent: AgentSection = AgentSection()
    ports: PortsConfig = PortsConfig()
    replicas: list[ReplicaGroup] = Field(default_factory=list)
    external: list[ExternalReplica] = Field(default_factory=list)
    vllm: VllmReplicas | None = Field(default=None, description="Real vLLM CPU servers.")
    allow_remote: bool = Field(
        default=False, description="Let 'external' replicas be on other machines (load goes there)."
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        return _check_name(v, "cluster name")

    @field_validator("balancer")
    @classmethod
    def _known_balancer(cls, v: str) -> str:
        if v not in targets.TARGETS:
            raise ValueError(f"Unknown balancer {v!r}. Available: {', '.join(targets.TARGETS)}")
        return v

    @field_validator("ports", mode="before")
    @classmethod
    def _auto_ports(cls, v: Any) -> Any:
        if v == "auto":
            return {k: 0 for k in PortsConfig.model_fields}
        if isinstance(v, str):
            raise ValueError(f"Expected 'auto' or a mapping of ports, got {v!r}")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> ClusterConfig:
        if [bool(self.replicas), bool(self.external), self.vllm is not None].count(True) != 1:
            raise ValueError(
                "Give one of 'replicas' (simulated groups), 'external' (existing servers) "
                "or 'vllm' (real vLLM CPU servers)"
            )
        names = [r.name for r in self.external]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"Duplicate replica names: {', '.join(dupes)}")
        for ext in self.external:
            try:
                check_host(
                    urlsplit(ext.url).hostname or "", f"external {ext.name} url {ext.url}",
                    allow_remote=self.allow_remote, opt_in="allow_remote: true in the cluster file",
                )  # fmt: skip
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        entry = targets.balancer(self.balancer)
        if self.agent.enabled and not entry.live_weights:
            live = [n for n in targets.TARGETS if targets.balancer(n).live_weights]
            raise ValueError(
                f"The feedback agent sets live weights, which {self.balancer} does not take: "
                f"'agent.enabled' needs a balancer with live weights ({', '.join(live)})"
            )
        models = [tuple(g.models) for g in self.replicas for _ in range(g.count)]
        models += [tuple(e.models) for e in self.external]
        if self.vllm is not None:
            models += [(self.vllm.model,)] * self.vllm.count
        shape = ClusterShape(tuple(models), self.agent.enabled, dict(self.params))
        problem = entry.check_cluster(shape)
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def reserved_cpus(self) -> list[int]:
        """The CPUs its servers are pinned to (``vllm.cpus``), sorted; empty when none are."""
        return sorted(set(self.vllm.cpus)) if self.vllm is not None else []


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def available_presets() -> list[str]:
    return sorted(p.stem for p in CLUSTERS_DIR.glob("*.yaml"))


def config_path(ref: str | Path | None) -> Path:
    """The file for a preset name or a path (``None`` → the default preset)."""
    if ref is None:
        ref = DEFAULT_PRESET
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") or len(p.parts) > 1 or p.exists():
        if not p.is_file():
            raise ConfigError(f"{ref}: no such cluster file")
        return p
    preset = CLUSTERS_DIR / f"{ref}.yaml"
    if not preset.is_file():
        raise ConfigError(
            f"Unknown cluster preset {str(ref)!r}. Available: {', '.join(available_presets())} "
            "(or give a path to a YAML file)"
        )
    return preset


def parse_config(data: Any, source: str) -> ClusterConfig:
    """Validate already-parsed YAML; errors name ``source`` and the field path."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, source, ClusterConfig, data) from None


def load_config(ref: str | Path | None = None) -> tuple[ClusterConfig, Path]:
    """Load and validate a preset by name or a cluster file by path."""
    path = config_path(ref)
    source = _display(path)
    return parse_config(load_yaml_file(path, source), source), path
