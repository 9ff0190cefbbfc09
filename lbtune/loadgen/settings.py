"""What a generator process is told beside the run's plan: its settings file, typed.

:func:`lbtune.loadgen.runner.run_load` writes ``load-config.json`` in the records
directory and starts each generator process (``python -m lbtune.loadgen.worker
--config <that file>``), which reads it back with :func:`read_settings`. What to send
comes from the run's recorded plan (``run.json``, :mod:`lbtune.scenario.runplan`) when
there is one, else from a :class:`SourceSettings` (a scenario name or path, or a
``fixed:`` workload: benchmarks and tests). Both sides hold a model, never a dict read
by string keys, and an unknown key is an error that names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from lbtune.errors import validation_error
from lbtune.safety.files import MAX_DOCUMENT_BYTES, read_bytes
from lbtune.scenario.limits import MAX_DURATION_S, MAX_RATE, MAX_SLO_S, MAX_USERS

__all__ = [
    "SETTINGS_FILE",
    "GeneratorSettings",
    "SourceSettings",
    "read_settings",
    "write_settings",
]

SETTINGS_FILE = "load-config.json"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceSettings(_Frozen):
    """Where the requests come from without a recorded plan (see :mod:`.source`)."""

    scenario: str = Field(description="Scenario name, YAML path, or a fixed:... workload.")
    seed: int = Field(default=0, ge=0, lt=2**63)
    duration_s: float = Field(gt=0, le=MAX_DURATION_S)
    users: int | None = Field(default=None, ge=1, le=MAX_USERS)
    rate: float | None = Field(default=None, gt=0, le=MAX_RATE)


class GeneratorSettings(_Frozen):
    """One run's settings, the same for every generator process of it (each one's role,
    name and index are its command line)."""

    target_url: str
    records_dir: str
    run_plan: str | None = Field(
        default=None, description="The run's run.json: what to send, over how long."
    )
    source: SourceSettings | None = Field(
        default=None, description="What to send when there is no run plan."
    )
    tokenizer_path: str | None = Field(
        default=None, description="A tokenizer.json, where the run plan records none."
    )
    grace_s: float = Field(ge=0, le=3600)
    request_timeout_s: float = Field(gt=0, le=MAX_SLO_S)
    replica_header: str
    max_in_flight: int = Field(ge=1, le=1_000_000)
    ui: bool = False
    ui_port: int = Field(default=8089, ge=0, le=65535)
    master_host: str = "127.0.0.1"
    master_port: int = Field(ge=0, le=65535)
    master_bind_host: str = "127.0.0.1"
    expect_workers: int = Field(ge=1, le=10_000)
    cpus: tuple[Annotated[int, Field(ge=0, le=4095)], ...] | None = Field(
        default=None,
        min_length=1,
        description="The CPUs every generator process is started on (off a cluster's pinned "
        "servers); None: where the runner runs.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> GeneratorSettings:
        if (self.run_plan is None) == (self.source is None):
            raise ValueError("give exactly one of run_plan and source")
        return self


_ADAPTER: TypeAdapter[GeneratorSettings] = TypeAdapter(GeneratorSettings)


def write_settings(path: Path, settings: GeneratorSettings) -> Path:
    path.write_bytes(_ADAPTER.dump_json(settings, indent=2))
    return path


def read_settings(path: str | Path) -> GeneratorSettings:
    """The settings in ``path``; a one-line ConfigError naming the field when invalid."""
    p = Path(path)
    try:
        return _ADAPTER.validate_json(read_bytes(p, max_bytes=MAX_DOCUMENT_BYTES))
    except ValidationError as exc:
        where = f"{p}: not valid generator settings"
        raise validation_error(exc, where, GeneratorSettings) from None
