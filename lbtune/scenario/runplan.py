"""The plan of one run, recorded once as ``run.json`` in its run directory.

Everything that defines a run is fixed before it starts and written down: the scenario
document as run (not its file name: the file may change later), the seed, the load plan
(mode, users or rate, stages, length), the measurement window, the SLO, the target and
its parameters where known, and lbtune's version. The generator processes read the
plan from ``run.json``; reports, ``compare`` and the history read the window from it.
Nothing downstream re-reads the scenario file::

    plan = plan_run(StressOptions(scenario="chat", duration_s=30))
    result = run_stress(replace(opts, plan=plan))     # runs exactly that plan
    read_run_plan(result.report.directory).window_start   # absolute, once it ran

The load plan's send times (open loop) are not stored: they are a pure function of the
scenario document, the overrides and the seed (:meth:`RunPlan.load_plan`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from lbtune import __version__
from lbtune.errors import ConfigError, validation_error
from lbtune.records.slo import Slo
from lbtune.safety.files import MAX_REPORT_BYTES, read_bytes
from lbtune.scenario.limits import (
    MAX_ARRIVALS,
    MAX_CV,
    MAX_DURATION_S,
    MAX_RATE,
    MAX_SLO_S,
    MAX_TRACE_TIME_S,
    MAX_USERS,
)
from lbtune.scenario.models import Scenario
from lbtune.scenario.plan import LoadPlan, Stage, plan_load

__all__ = [
    "RUN_PLAN_FILE",
    "LoadSpec",
    "MeasuredWindow",
    "RunPlan",
    "StageSpec",
    "TargetSpec",
    "read_run_plan",
    "write_run_plan",
]

RUN_PLAN_FILE = "run.json"
MAX_UNTIL_SAMPLES = 10**9
"""Most requests ``--until-samples`` may wait for."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_Offset = Annotated[float, Field(ge=0, le=MAX_DURATION_S)]
"""Seconds from a run's start."""
_Clock = Annotated[float, Field(ge=0, le=MAX_TRACE_TIME_S)]
"""A wall-clock time, seconds since the epoch."""
_Users = Annotated[int, Field(ge=0, le=MAX_USERS)]
_Rate = Annotated[float, Field(ge=0, le=MAX_RATE)]
_Slo = Annotated[float, Field(gt=0, le=MAX_SLO_S)]


class StageSpec(_Frozen):
    """One phase of the load, ``[start_s, end_s)`` (see :class:`lbtune.scenario.plan.Stage`)."""

    start_s: _Offset
    end_s: _Offset
    users: _Users | None = None
    rate: _Rate | None = None
    label: str = ""
    ramp_from: Annotated[float, Field(ge=0, le=MAX_USERS)] | None = None


class LoadSpec(_Frozen):
    """The load plan: what the generator offers, over how long."""

    mode: Literal["closed", "open"]
    duration_s: float = Field(
        gt=0, le=MAX_DURATION_S, description="Planned length (with a hold: its bound)."
    )
    shape_duration_s: float = Field(
        gt=0, le=MAX_DURATION_S, description="The scenario shape's length."
    )
    users: _Users | None = Field(default=None, description="--users override.")
    rate: _Rate | None = Field(default=None, description="--rate override.")
    stages: tuple[StageSpec, ...]
    warmup_s: _Offset
    cooldown_s: _Offset
    arrival: Literal["poisson", "constant", "gamma"] | None = None
    cv: Annotated[float, Field(gt=0, le=MAX_CV)] | None = None
    arrivals: int = Field(
        default=0, ge=0, le=MAX_ARRIVALS, description="Open loop: requests planned."
    )
    until_samples: int | None = Field(
        default=None,
        ge=1,
        le=MAX_UNTIL_SAMPLES,
        description="Run on until the window holds this many completed requests.",
    )


class TargetSpec(_Frozen):
    """What the load was sent to; ``params`` is the balancer config, where known."""

    name: str | None = None
    url: str | None = None
    params: dict[str, Any] | None = None


class SloSpec(_Frozen):
    ttft_s: _Slo | None = None
    e2e_s: _Slo | None = None
    max_error_rate: float = Field(default=0.01, ge=0, le=1)


class MeasuredWindow(NamedTuple):
    """The absolute window a run measured (:meth:`RunPlan.measured_window`)."""

    start: float
    end: float
    whole_run: bool = False
    """Stopped before the planned window opened: the whole run, warm-up included."""


class RunPlan(_Frozen):
    """One run, as planned and (once it ran) as it ran."""

    schema_version: Literal[1] = 1
    lbtune_version: str = __version__
    scenario_ref: str = Field(description="The scenario as given: a built-in name or a path.")
    scenario_name: str
    scenario: Scenario = Field(description="The scenario document as run.")
    seed: int = Field(ge=0, lt=2**63)
    tokenizer: str | None = None
    load: LoadSpec
    window_start_s: _Offset = Field(description="Measurement window, offset from start.")
    window_end_s: float = Field(gt=0, le=MAX_DURATION_S)
    slo: SloSpec = Field(default_factory=SloSpec)
    target: TargetSpec = Field(default_factory=TargetSpec)
    started_at: _Clock | None = Field(default=None, description="Wall clock of the run's start.")
    window_start: _Clock | None = Field(default=None, description="Absolute, once it ran.")
    window_end: _Clock | None = Field(default=None, description="Absolute, once it ran.")

    def load_plan(self) -> LoadPlan:
        """The concrete load plan (with open-loop send times), from the recorded document."""
        ld = self.load
        hold = ld.duration_s if ld.duration_s > ld.shape_duration_s else None
        return plan_load(self.scenario, ld.shape_duration_s, ld.users, ld.rate, self.seed, hold)

    def stages(self) -> tuple[Stage, ...]:
        """The recorded stages as :class:`~lbtune.scenario.plan.Stage` (what summaries show)."""
        return tuple(
            Stage(s.start_s, s.end_s, s.users, s.rate, s.label, s.ramp_from)
            for s in self.load.stages
        )

    def slo_value(self) -> Slo:
        return Slo(self.slo.ttft_s, self.slo.e2e_s, self.slo.max_error_rate)

    def window_at(self, started_at: float) -> tuple[float, float]:
        """The planned absolute window of a run started at ``started_at``: the one formula
        of a run's window. The live consumers (``--until-samples``, the pruning windows)
        call it with the start the runner knows at each snapshot; the run's end cuts it
        once (:meth:`measured_window`) and :meth:`as_run` records the result."""
        return started_at + self.window_start_s, started_at + self.window_end_s

    def shape_window(self) -> tuple[float, float]:
        """The window of the shape itself (offsets): the recorded one, without an
        ``--until-samples`` hold (whose cool-down comes at the bound)."""
        ld = self.load
        if ld.duration_s > ld.shape_duration_s:
            return self.window_start_s, ld.shape_duration_s - ld.cooldown_s
        return self.window_start_s, self.window_end_s

    def measured_window(
        self, started_at: float, ended_at: float, stopped_at: float | None = None
    ) -> MeasuredWindow:
        """The window a run started at ``started_at`` measured: the planned one
        (:meth:`window_at`) cut at the run's end and at ``stopped_at`` (``--until-samples``
        reached); a run stopped before its window held a second is measured whole."""
        start, end = self.window_at(started_at)
        end = min(end, ended_at, stopped_at or end)
        if end - start < 1.0:  # stopped before the measurement window opened
            return MeasuredWindow(started_at, max(started_at + 1.0, ended_at), whole_run=True)
        return MeasuredWindow(start, end)

    def measured(self) -> tuple[float, float]:
        """The absolute window this run measured, as recorded (:meth:`as_run`)."""
        if self.window_start is None or self.window_end is None:
            raise ValueError("the plan has not run: no measured window recorded")
        return self.window_start, self.window_end

    def with_target(
        self, name: str | None, url: str | None, params: dict[str, Any] | None = None
    ) -> RunPlan:
        """This plan against a target (unset values keep what the plan had)."""
        t = self.target
        target = TargetSpec(
            name=name if name is not None else t.name,
            url=url if url is not None else t.url,
            params=params if params is not None else t.params,
        )
        return self.model_copy(update={"target": target})

    def as_run(self, started_at: float, window: tuple[float, float]) -> RunPlan:
        """The plan with the run's start and its absolute measurement window."""
        return self.model_copy(
            update={"started_at": started_at, "window_start": window[0], "window_end": window[1]}
        )


_ADAPTER: TypeAdapter[RunPlan] = TypeAdapter(RunPlan)


def write_run_plan(run_dir: str | Path, plan: RunPlan) -> Path:
    """Write ``run_dir/run.json`` (atomically: readers never see half a file)."""
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / RUN_PLAN_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(_ADAPTER.dump_json(plan, by_alias=True, indent=1))
    tmp.replace(path)
    return path


def read_run_plan(run_dir: str | Path) -> RunPlan:
    """The plan recorded in ``run_dir`` (or a ``run.json`` path); a ConfigError if none."""
    p = Path(run_dir)
    path = p if p.suffix == ".json" else p / RUN_PLAN_FILE
    if not path.exists():
        raise ConfigError(
            f"{path.parent}: no {RUN_PLAN_FILE} (a run directory written before lbtune recorded "
            "its run plan); its measurement window is unknown: re-run the measurement"
        )
    try:
        return _ADAPTER.validate_json(read_bytes(path, max_bytes=MAX_REPORT_BYTES))
    except ValidationError as exc:
        raise validation_error(exc, f"{path}: not a valid run plan", RunPlan) from None
