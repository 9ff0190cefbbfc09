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

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from lbtune.errors import ConfigError, validation_error

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
    seed: int = 0
    duration_s: float
    users: int | None = None
    rate: float | None = None


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
    grace_s: float
    request_timeout_s: float
    replica_header: str
    max_in_flight: int
    ui: bool = False
    ui_port: int = 8089
    master_host: str = "127.0.0.1"
    master_port: int
    master_bind_host: str = "127.0.0.1"
    expect_workers: int

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
        return _ADAPTER.validate_json(p.read_bytes())
    except ValidationError as exc:
        where = f"{p}: not valid generator settings"
        raise validation_error(exc, where, GeneratorSettings) from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot be read ({exc})") from None
