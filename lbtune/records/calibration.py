"""Each replica's engine rates as measured by ``lbtune cluster calibrate``: the record.

``calibration.json`` in the cluster's state dir holds one :class:`ReplicaRates` per
replica that was measured (:mod:`lbtune.cluster.calibrate` measures them). The ``llm``
scheduler's ``mode predict`` reads them as facts for replicas whose GPU and model lbtune
has no profile of (:func:`lbtune.targets.haproxy.llm.rate_facts`). Times are wall seconds
as measured; ``time_scale`` is the cluster's (1 for real replicas: the facts are in GPU
seconds, ``wall = gpu / time_scale``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lbtune.errors import ConfigError
from lbtune.records.statedir import StatePaths, write_json_atomic
from lbtune.safety.files import MAX_DOCUMENT_BYTES, read_text

__all__ = ["Calibration", "ReplicaRates", "read_calibration"]


class ReplicaRates(BaseModel):
    """One replica's rates: a lone request's TTFT is ``overhead_s + sqrt(step_s² +
    (prompt_tokens / prefill_tokens_per_s)²)`` and a batch of ``n`` decodes a token every
    ``step_s + step_per_seq_s × (n − 1)`` (the ``llm`` scheduler's model of a replica)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    model: str
    url: str
    prefill_tokens_per_s: float = Field(gt=0)
    step_s: float = Field(gt=0)
    step_per_seq_s: float = Field(ge=0)
    overhead_s: float = Field(ge=0)
    probes: int = Field(ge=1)
    """Requests the measurement sent."""
    fit_error: float = Field(ge=0)
    """The largest relative error of the fitted TTFT over the prefill probes."""
    longest_prompt_tokens: int | None = Field(default=None, ge=1)
    """The longest prefill probe, in the replica's count (None in earlier records)."""


class Calibration(BaseModel):
    """What ``calibration.json`` holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    measured_at: str
    """ISO 8601, UTC."""
    time_scale: float = Field(gt=0)
    replicas: list[ReplicaRates]

    def by_name(self) -> dict[str, ReplicaRates]:
        return {r.name: r for r in self.replicas}

    def write(self, state_dir: str | Path) -> Path:
        """Atomically, to ``<state_dir>/calibration.json``."""
        path = StatePaths(Path(state_dir)).calibration
        write_json_atomic(path, self.model_dump_json(indent=2) + "\n")
        return path


def read_calibration(state_dir: str | Path) -> Calibration | None:
    """The state dir's calibration, ``None`` when there is none; a damaged file is a
    :class:`ConfigError` that says how to redo it."""
    path = StatePaths(Path(state_dir)).calibration
    if not path.exists():
        return None
    try:
        return Calibration.model_validate_json(read_text(path, max_bytes=MAX_DOCUMENT_BYTES))
    except (ValidationError, ValueError) as exc:
        raise ConfigError(
            f"{path}: unreadable ({exc.__class__.__name__}); "
            f"run `lbtune cluster calibrate --state-dir {Path(state_dir)}` again"
        ) from None
