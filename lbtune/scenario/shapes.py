"""Load shapes as users type them: closed-loop users or open-loop arrival rates.

Each shape reduces to a list of :class:`Segment` (a phase with a start and end
level, constant or linear) in one unit, users or requests/s; :mod:`.plan` turns
that into a :class:`~lbtune.scenario.plan.LoadPlan`. The *reference level* is the
level a ``--users``/``--rate`` override replaces (the whole shape is scaled by
the same factor, so its form is kept): ``constant.users``, ``rate.rate``,
``ramp.to``, the highest of ``steps``, and ``spike.base``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from lbtune.scenario.limits import MAX_CV, MAX_DURATION_S, MAX_RATE, MAX_USERS

Mode = Literal["closed", "open"]
_USERS: JsonDict = {"unit": "users"}
_RATE: JsonDict = {"unit": "req/s"}
Arrival = Literal["poisson", "constant", "gamma"]


@dataclass(frozen=True)
class Segment:
    """One phase: level goes linearly from ``level0`` to ``level1`` over [start, end)."""

    start: float
    end: float
    level0: float
    level1: float
    label: str


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def mode(self) -> Mode:
        raise NotImplementedError

    def reference(self) -> float:
        raise NotImplementedError

    def min_duration(self) -> float:
        """Shortest test the shape fits in (its timed phases)."""
        return 0.0

    def segments(self, duration: float) -> list[Segment]:
        raise NotImplementedError


class _OpenLoop(_Shape):
    arrival: Arrival | None = Field(
        default=None, description="Open loop: inter-arrival law (default poisson)."
    )
    cv: float | None = Field(
        default=None,
        gt=0,
        le=MAX_CV,
        description="Gamma arrivals: coefficient of variation (>1 = bursty).",
    )

    @model_validator(mode="after")
    def _check_arrival(self) -> Self:
        if self.mode() == "closed" and (self.arrival is not None or self.cv is not None):
            raise ValueError(
                "arrival/cv apply only to open-loop load (a rate, rate steps, or mode: open)"
            )
        if self.arrival == "gamma" and self.cv is None:
            raise ValueError("arrival gamma needs cv (coefficient of variation, e.g. 2)")
        if self.cv is not None and self.arrival != "gamma":
            raise ValueError("cv applies only to arrival: gamma")
        return self


class ConstantShape(_Shape):
    """Closed loop: a fixed number of users, each sending its next request on completion."""

    type: Literal["constant"]
    users: int = Field(ge=1, le=MAX_USERS, json_schema_extra={"unit": "users"})

    def mode(self) -> Mode:
        return "closed"

    def reference(self) -> float:
        return float(self.users)

    def segments(self, duration: float) -> list[Segment]:
        return [Segment(0.0, duration, self.users, self.users, "steady")]


class RateShape(_OpenLoop):
    """Open loop: requests arrive at ``rate`` per second whatever the latency."""

    type: Literal["rate"]
    rate: float = Field(
        gt=0, le=MAX_RATE, description="Requests per second.", json_schema_extra={"unit": "req/s"}
    )

    def mode(self) -> Mode:
        return "open"

    def reference(self) -> float:
        return self.rate

    def segments(self, duration: float) -> list[Segment]:
        return [Segment(0.0, duration, self.rate, self.rate, "steady")]


class RampShape(_OpenLoop):
    """Linear ramp from ``from`` to ``to`` over ``over`` seconds, then hold."""

    type: Literal["ramp"]
    from_: float = Field(default=0.0, ge=0, le=MAX_USERS, alias="from")
    to: float = Field(gt=0, le=MAX_USERS)
    over: float = Field(gt=0, le=MAX_DURATION_S, description="Seconds the ramp lasts.")
    mode_: Mode = Field(default="closed", alias="mode")

    def mode(self) -> Mode:
        return self.mode_

    def reference(self) -> float:
        return self.to

    def min_duration(self) -> float:
        return self.over

    def segments(self, duration: float) -> list[Segment]:
        segs = [Segment(0.0, min(self.over, duration), self.from_, self.to, "ramp")]
        if duration > self.over:
            segs.append(Segment(self.over, duration, self.to, self.to, "hold"))
        return segs


class Step(BaseModel):
    """One step: ``users`` (closed loop) or ``rate`` (open loop) for ``duration`` seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    users: int | None = Field(default=None, ge=1, le=MAX_USERS, json_schema_extra=_USERS)
    rate: float | None = Field(default=None, gt=0, le=MAX_RATE, json_schema_extra=_RATE)
    duration: float = Field(gt=0, le=MAX_DURATION_S)
    label: str | None = None

    @model_validator(mode="after")
    def _one_level(self) -> Self:
        if (self.users is None) == (self.rate is None):
            raise ValueError("a step needs exactly one of users or rate")
        return self

    def level(self) -> float:
        return float(self.users if self.users is not None else self.rate or 0.0)


class StepsShape(_OpenLoop):
    """Consecutive steps of users or of rates; the last one holds until the end."""

    type: Literal["steps"]
    steps: list[Step] = Field(min_length=1)

    @model_validator(mode="after")
    def _same_unit(self) -> Self:
        kinds = {s.users is None for s in self.steps}
        if len(kinds) > 1:
            raise ValueError("steps must all give users or all give rate, not a mix")
        return self

    def mode(self) -> Mode:
        return "closed" if self.steps[0].users is not None else "open"

    def reference(self) -> float:
        return max(s.level() for s in self.steps)

    def min_duration(self) -> float:
        return sum(s.duration for s in self.steps)

    def segments(self, duration: float) -> list[Segment]:
        segs: list[Segment] = []
        t = 0.0
        for k, s in enumerate(self.steps, start=1):
            if t >= duration:
                break
            last = k == len(self.steps)
            end = duration if last else min(t + s.duration, duration)
            segs.append(Segment(t, end, s.level(), s.level(), s.label or f"step{k}"))
            t = end
        return segs


class SpikeShape(_OpenLoop):
    """``base`` load, ``peak`` from ``at`` for ``for`` seconds, then ``base`` again."""

    type: Literal["spike"]
    base: float = Field(gt=0, le=MAX_USERS)
    peak: float = Field(gt=0, le=MAX_USERS)
    at: float = Field(ge=0, le=MAX_DURATION_S, description="Spike start (seconds from test start).")
    for_: float = Field(
        gt=0, le=MAX_DURATION_S, alias="for", description="Spike length in seconds."
    )
    mode_: Mode = Field(default="closed", alias="mode")

    @model_validator(mode="after")
    def _peak_above_base(self) -> Self:
        if self.peak <= self.base:
            raise ValueError(f"peak ({self.peak:g}) must be above base ({self.base:g})")
        return self

    def mode(self) -> Mode:
        return self.mode_

    def reference(self) -> float:
        return self.base

    def min_duration(self) -> float:
        return self.at + self.for_

    def segments(self, duration: float) -> list[Segment]:
        segs: list[Segment] = []
        if self.at > 0:
            segs.append(Segment(0.0, self.at, self.base, self.base, "steady"))
        end = self.at + self.for_
        segs.append(Segment(self.at, end, self.peak, self.peak, "spike"))
        if duration > end:
            segs.append(Segment(end, duration, self.base, self.base, "recovery"))
        return segs


LoadShape = Annotated[
    ConstantShape | RateShape | RampShape | StepsShape | SpikeShape,
    Field(discriminator="type"),
]
"""A load shape (discriminated on ``type``)."""
