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

import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from lbtune import __version__
from lbtune.errors import ConfigError, validation_error
from lbtune.keyvalue import bad_value, parse_pairs
from lbtune.metrics.summary import Slo
from lbtune.scenario.loader import load_scenario
from lbtune.scenario.models import Scenario
from lbtune.scenario.plan import LoadPlan, Stage, default_duration, plan_load

__all__ = [
    "RUN_PLAN_FILE",
    "LoadSpec",
    "RunPlan",
    "RunRequest",
    "StageSpec",
    "TargetSpec",
    "parse_slo",
    "plan_run",
    "read_run_plan",
    "write_run_plan",
]

RUN_PLAN_FILE = "run.json"
DEFAULT_MAX_DURATION_S = 600.0
"""``--until-samples`` without ``--max-duration``: the longest such a run may last."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StageSpec(_Frozen):
    """One phase of the load, ``[start_s, end_s)`` (see :class:`lbtune.scenario.plan.Stage`)."""

    start_s: float
    end_s: float
    users: int | None = None
    rate: float | None = None
    label: str = ""
    ramp_from: float | None = None


class LoadSpec(_Frozen):
    """The load plan: what the generator offers, over how long."""

    mode: Literal["closed", "open"]
    duration_s: float = Field(gt=0, description="Planned length (with a hold: its bound).")
    shape_duration_s: float = Field(gt=0, description="The scenario shape's length.")
    users: int | None = Field(default=None, description="--users override.")
    rate: float | None = Field(default=None, description="--rate override.")
    stages: tuple[StageSpec, ...]
    warmup_s: float = Field(ge=0)
    cooldown_s: float = Field(ge=0)
    arrival: Literal["poisson", "constant", "gamma"] | None = None
    cv: float | None = None
    arrivals: int = Field(default=0, ge=0, description="Open loop: requests planned.")
    until_samples: int | None = Field(
        default=None, description="Run on until the window holds this many completed requests."
    )


class TargetSpec(_Frozen):
    """What the load was sent to; ``params`` is the balancer config, where known."""

    name: str | None = None
    url: str | None = None
    params: dict[str, Any] | None = None


class SloSpec(_Frozen):
    ttft_s: float | None = None
    e2e_s: float | None = None
    max_error_rate: float = 0.01


class RunPlan(_Frozen):
    """One run, as planned and (once it ran) as it ran."""

    schema_version: Literal[1] = 1
    lbtune_version: str = __version__
    scenario_ref: str = Field(description="The scenario as given: a built-in name or a path.")
    scenario_name: str
    scenario: Scenario = Field(description="The scenario document as run.")
    seed: int
    tokenizer: str | None = None
    load: LoadSpec
    window_start_s: float = Field(ge=0, description="Measurement window, offset from start.")
    window_end_s: float = Field(gt=0)
    slo: SloSpec = Field(default_factory=SloSpec)
    target: TargetSpec = Field(default_factory=TargetSpec)
    started_at: float | None = Field(default=None, description="Wall clock of the run's start.")
    window_start: float | None = Field(default=None, description="Absolute, once it ran.")
    window_end: float | None = Field(default=None, description="Absolute, once it ran.")

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
        """The planned absolute window of a run started at ``started_at``."""
        return started_at + self.window_start_s, started_at + self.window_end_s

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


def _stage_spec(s: Stage) -> StageSpec:
    return StageSpec(
        start_s=s.start_s,
        end_s=s.end_s,
        users=s.users,
        rate=s.rate,
        label=s.label,
        ramp_from=s.ramp_from,
    )


class RunRequest(Protocol):
    """What :func:`plan_run` reads of a run's options (:class:`lbtune.stress.StressOptions`)."""

    @property
    def plan(self) -> RunPlan | None: ...
    @property
    def scenario(self) -> str: ...
    @property
    def duration_s(self) -> float | None: ...
    @property
    def max_duration_s(self) -> float | None: ...
    @property
    def until_samples(self) -> int | None: ...
    @property
    def users(self) -> int | None: ...
    @property
    def rate(self) -> float | None: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def slo(self) -> str | None: ...
    @property
    def tokenizer(self) -> str | None: ...
    @property
    def target_url(self) -> str | None: ...


def plan_run(opts: RunRequest) -> RunPlan:
    """The plan of a run with ``opts``: reads the scenario once, nothing else."""
    if opts.plan is not None:
        return opts.plan
    scenario = load_scenario(opts.scenario)
    until = opts.until_samples
    if until is not None and until < 1:
        raise ConfigError(f"--until-samples: must be >= 1, got {until}")
    hold: float | None = None
    shape_s = default_duration(scenario) if opts.duration_s is None else float(opts.duration_s)
    if until is not None:
        hold = max(shape_s, opts.max_duration_s or DEFAULT_MAX_DURATION_S)
    elif opts.max_duration_s is not None:
        raise ConfigError("--max-duration bounds --until-samples; give both, or use --duration")
    seed = scenario.seed if opts.seed is None else opts.seed
    lp = plan_load(scenario, shape_s, opts.users, opts.rate, seed, hold)
    base = Slo(
        ttft_s=scenario.slo.ttft if scenario.slo else None,
        e2e_s=scenario.slo.e2e if scenario.slo else None,
    )
    slo = parse_slo(opts.slo, base)
    lo, hi = lp.measure_window
    load = LoadSpec(
        mode=lp.mode,
        duration_s=lp.duration_s,
        shape_duration_s=shape_s,
        users=opts.users,
        rate=opts.rate,
        stages=tuple(_stage_spec(s) for s in lp.stages),
        warmup_s=lp.warmup_s,
        cooldown_s=lp.cooldown_s,
        arrival=lp.arrival,
        cv=lp.cv,
        arrivals=len(lp.arrivals),
        until_samples=until,
    )
    return RunPlan(
        scenario_ref=str(opts.scenario),
        scenario_name=scenario.name,
        scenario=scenario,
        seed=seed,
        tokenizer=opts.tokenizer,
        load=load,
        window_start_s=lo,
        window_end_s=hi,
        slo=SloSpec(ttft_s=slo.ttft_s, e2e_s=slo.e2e_s, max_error_rate=slo.max_error_rate),
        target=TargetSpec(url=None if opts.target_url is None else opts.target_url.rstrip("/")),
    )


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
    if not path.is_file():
        raise ConfigError(
            f"{path.parent}: no {RUN_PLAN_FILE} (a run directory written before lbtune recorded "
            "its run plan); its measurement window is unknown: re-run the measurement"
        )
    try:
        return _ADAPTER.validate_json(path.read_bytes())
    except ValidationError as exc:
        raise validation_error(exc, f"{path}: not a valid run plan", RunPlan) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc})") from None


# -- SLO overrides --------------------------------------------------------------

_SLO_KEYS = {"ttft": "ttft_s", "e2e": "e2e_s", "errors": "max_error_rate"}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")


def parse_slo(text: str | None, base: Slo) -> Slo:
    """Apply ``ttft=350ms,e2e=800ms,errors=1%`` overrides to ``base``."""
    if not text:
        return base
    changes: dict[str, float] = {}
    example = "--slo ttft=350ms,e2e=800ms,errors=1%"
    for key, value in parse_pairs(text, flag="--slo", keys=_SLO_KEYS, example=example):
        if key == "errors":
            pct = value.endswith("%")
            try:
                number = float(value.rstrip("%"))
            except ValueError:
                raise bad_value("--slo", key, value, "a fraction or a percentage") from None
            rate = number / 100 if pct else number
            if not 0 <= rate <= 1:
                raise bad_value("--slo", key, value, "0..100 % (0..1)", "is out of range")
            changes[_SLO_KEYS[key]] = rate
            continue
        m = _DURATION.match(value)
        if not m:
            raise bad_value("--slo", key, value, "a duration like 350ms or 2s")
        number = float(m.group(1))
        changes[_SLO_KEYS[key]] = number / 1000 if m.group(2) == "ms" else number
    return replace(base, **changes)
