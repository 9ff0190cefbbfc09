"""Parameter spaces as data: what a target can turn, in which ranges, and its baseline.

A space file (``lbtune/targets/<target>/space.yaml``, or the user's own via
``--space FILE``) maps knob names to specs::

    target: haproxy
    params:
      algorithm: {type: categorical, choices: [roundrobin, leastconn], baseline: roundrobin}
      hash_balance_factor: {type: int, low: 105, high: 300, baseline: 150,
                            when: {algorithm: hash}}
      weight: {type: int, low: 0, high: 256, baseline: 100, per_server: true}

``per_server`` knobs expand to one knob per replica (``weight.h100-0``, ...). ``when``
makes a knob active only while other knobs have the given values (a value or a list of
values). **Activity is a property of the space** (:meth:`ParameterSpace.is_active`,
:meth:`ParameterSpace.split`): a knob is inactive under a parameter set when one of its
``when`` conditions fails (or names a knob that is itself inactive), or when nobody acts
on it in this cluster (:attr:`ParameterSpace.idle`: the target's ``agent.*`` without an
agent, its weights while the agent sets them). The search does not sample an inactive
knob (it keeps its value), the study's JSON and report fold it away, ``lbtune apply
--show`` lists it apart: all three ask the space.
``fixed: true`` keeps a knob at its baseline during a search (it can still be applied).
``references`` names the value a knob takes in the study's reference trials, in the
balancer's own spelling: ``{round-robin: roundrobin, least-conn: leastconn}`` (the
``round-robin`` reference is the baseline with these values; ``least-conn`` exists only
where some knob declares it; see :func:`lbtune.search.study.reference_trials`).

:meth:`ParameterSpace.validate` refuses unknown knobs, wrong types and out-of-range
values with a :class:`~lbtune.errors.ConfigError` that names the knob and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lbtune.errors import ConfigError, validation_error
from lbtune.safeyaml import load_yaml_file
from lbtune.targets.params import ParamSet, ParamValue

if TYPE_CHECKING:
    import optuna

__all__ = ["ParamSpec", "ParameterSpace", "ReferenceRole", "SpaceFile", "load_params_file"]

MAX_MAGNITUDE = 1e12
"""Largest magnitude of a number in a space file (a range, a step, a baseline, a choice)."""
_Int = Annotated[int, Field(ge=-(10**12), le=10**12)]
_Num = Annotated[float, Field(ge=-MAX_MAGNITUDE, le=MAX_MAGNITUDE)]
Scalar = _Int | _Num | str | bool
IDLE_REASON = (
    "fixed in this cluster: nobody acts on it (agent.* without an agent, weights while the "
    "agent sets them)"
)
ReferenceRole = Literal["round-robin", "least-conn"]


class ParamSpec(BaseModel):
    """One knob (or one per-server family of knobs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["int", "float", "categorical", "bool"]
    low: _Num | None = None
    high: _Num | None = None
    step: Annotated[float, Field(gt=0, le=MAX_MAGNITUDE)] | None = None
    log: bool = False
    choices: list[Scalar] | None = None
    baseline: Scalar
    """The untuned value: what the balancer runs before lbtune touches it."""
    when: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
    """Active only while every named knob has the (or one of the) given value(s)."""
    per_server: bool = False
    fixed: bool = False
    live: bool | None = None
    """Documentation only: the target decides what is live (see ``docs/targets.md``)."""
    references: dict[ReferenceRole, Scalar] = Field(default_factory=dict)
    """This knob's value in each reference trial (``round-robin``, ``least-conn``)."""
    help: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> ParamSpec:
        if self.type in ("int", "float"):
            if self.low is None or self.high is None:
                raise ValueError(f"{self.type} knobs need low and high")
            if self.low > self.high:
                raise ValueError(f"low ({self.low:g}) must be <= high ({self.high:g})")
            if self.log and self.low <= 0:
                raise ValueError("log scale needs low > 0")
            if self.log and self.step not in (None, 1):
                raise ValueError("log scale and step cannot be combined")
            if self.type == "int" and any(
                v is not None and v != int(v) for v in (self.low, self.high, self.step)
            ):
                raise ValueError("int knobs need integer low, high and step")
            if self.choices is not None:
                raise ValueError(f"{self.type} knobs take low/high, not choices")
        elif self.type == "categorical":
            if not self.choices:
                raise ValueError("categorical knobs need a non-empty list of choices")
        elif self.low is not None or self.high is not None or self.choices is not None:
            raise ValueError("bool knobs take no low, high or choices")
        checked: list[tuple[str, Scalar]] = [("baseline", self.baseline)]
        for role, value in checked + list(self.references.items()):
            problem = _check_value(self, value)
            if problem:
                raise ValueError(f"{role} {value!r}: {problem}")
        return self

    def allowed(self) -> str:
        """What values are allowed, in words (for error messages)."""
        if self.type == "categorical":
            return "one of " + ", ".join(str(c) for c in self.choices or [])
        if self.type == "bool":
            return "true or false"
        assert self.low is not None and self.high is not None
        kind = "an integer" if self.type == "int" else "a number"
        rng = f"{_fmt(self.low)}..{_fmt(self.high)}"
        step = f" in steps of {_fmt(self.step)}" if self.step else ""
        return f"{kind} in {rng}{step}"


class SpaceFile(BaseModel):
    """The YAML document of a space file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str
    description: str = ""
    params: dict[str, ParamSpec] = Field(min_length=1)


def _fmt(v: float | None) -> str:
    return "" if v is None else (str(int(v)) if float(v).is_integer() else f"{v:g}")


def _coerce(spec: ParamSpec, value: object) -> ParamValue:
    """The value in the knob's canonical Python type; ValueError when it has the wrong type."""
    if spec.type == "bool":
        if isinstance(value, bool):
            return value
        raise ValueError("wrong type")
    if spec.type == "int":
        if isinstance(value, bool):
            raise ValueError("wrong type")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError("wrong type")
    if spec.type == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("wrong type")
        return float(value)
    choices = spec.choices or []
    for c in choices:  # keep the choice's own type ("4" stays "4", 4 stays 4)
        if c == value and type(c) is type(value):
            return c
    raise ValueError("not a choice")


def _check_value(spec: ParamSpec, value: object) -> str | None:
    """None when ``value`` is allowed, else what is wrong."""
    try:
        v = _coerce(spec, value)
    except ValueError:
        return f"got {value!r}; expected {spec.allowed()}"
    if spec.type in ("int", "float"):
        assert spec.low is not None and spec.high is not None and isinstance(v, int | float)
        if not spec.low <= v <= spec.high or (
            spec.step and not math.isclose((v - spec.low) / spec.step % 1, 0, abs_tol=1e-9)
        ):
            return f"{v!r} is out of range; expected {spec.allowed()}"
    return None


class ParameterSpace:
    """The knobs of one target, expanded for a cluster's replicas."""

    def __init__(
        self,
        target: str,
        params: Mapping[str, ParamSpec],
        source: str = "",
        idle: Iterable[str] = (),
    ) -> None:
        self.target = target
        self.params: dict[str, ParamSpec] = dict(params)
        self.source = source
        self.idle: frozenset[str] = frozenset(idle)
        """Knobs nobody acts on in this cluster (fixed, and inactive under any values)."""
        for name, spec in self.params.items():
            for ref in spec.when:
                if ref not in self.params:
                    raise ConfigError(f"{source}: {name}: `when` refers to unknown knob {ref!r}")
        self._order = _dependency_order(self.params)

    @classmethod
    def load(cls, path: str | Path, replicas: Iterable[str] | None = None) -> ParameterSpace:
        """Read and validate a space file; expand ``per_server`` knobs over ``replicas``.

        Without ``replicas`` the per-server knobs are left out.
        """
        where = str(path)
        data = load_yaml_file(path, where)
        try:
            doc = SpaceFile.model_validate(data)
        except ValidationError as exc:
            raise validation_error(exc, where, SpaceFile, data) from None
        return cls.from_file(doc, replicas, where)

    @classmethod
    def from_file(
        cls, doc: SpaceFile, replicas: Iterable[str] | None = None, source: str = ""
    ) -> ParameterSpace:
        names = list(replicas or [])
        expanded: dict[str, ParamSpec] = {}
        for name, spec in doc.params.items():
            if spec.per_server:
                for r in names:
                    expanded[f"{name}.{r}"] = spec
            else:
                expanded[name] = spec
        return cls(doc.target, expanded, source)

    @property
    def names(self) -> list[str]:
        return list(self.params)

    def baseline(self) -> ParamSet:
        """Every knob at its untuned value."""
        return {n: _coerce(s, s.baseline) for n, s in self.params.items()}

    def reference(self, role: ReferenceRole) -> ParamSet | None:
        """The baseline with every knob's ``references[role]`` value; ``None`` when no
        knob names that role, except ``round-robin``, which defaults to the baseline."""
        named = {
            n: _coerce(s, s.references[role])
            for n, s in self.params.items()
            if role in s.references
        }
        if not named and role != "round-robin":
            return None
        return {**self.baseline(), **named}

    def choice_defaults(self) -> list[ParamSet]:
        """The baseline with each choice of each categorical knob, the knobs its ``when``
        names set so that it acts (their first listed value): one config per structural
        choice with every other knob untuned, no two alike."""
        out: list[ParamSet] = []
        for name in self._order:
            spec = self.params[name]
            if spec.type != "categorical" or spec.fixed or name in self.idle:
                continue
            for choice in spec.choices or ():
                params = self.baseline()
                self._make_active(name, params)
                params[name] = _coerce(spec, choice)
                if self.is_active(name, params) and params not in out:
                    out.append(params)
        return out

    def _make_active(self, name: str, params: dict[str, ParamValue]) -> None:
        for ref, wanted in self.params[name].when.items():
            self._make_active(ref, params)
            options = wanted if isinstance(wanted, list) else [wanted]
            if params.get(ref) not in options:
                params[ref] = _coerce(self.params[ref], options[0])

    def is_active(self, name: str, params: Mapping[str, ParamValue]) -> bool:
        """Whether ``name`` acts under ``params`` (baseline where absent): not idle in this
        cluster, and every ``when`` condition holds on a knob that is active itself."""
        return self.why_inactive(name, params) is None

    def why_inactive(self, name: str, params: Mapping[str, ParamValue]) -> str | None:
        """None when ``name`` acts under ``params``; else why not, in words."""
        if name in self.idle:
            return IDLE_REASON
        for ref, wanted in self.params[name].when.items():
            value = params.get(ref, self.params[ref].baseline)
            options = wanted if isinstance(wanted, list) else [wanted]
            if value not in options or not self.is_active(ref, params):
                shown = "/".join(str(o) for o in options)
                return f"acts only when {ref} = {shown}"
        return None

    def split(
        self, params: Mapping[str, ParamValue]
    ) -> tuple[dict[str, ParamValue], dict[str, str]]:
        """``(active, inactive)``: the knobs of ``params`` that act under them, and the rest
        with why (knobs the space does not know are kept as active)."""
        active: dict[str, ParamValue] = {}
        inactive: dict[str, str] = {}
        for name, value in params.items():
            why = self.why_inactive(name, params) if name in self.params else None
            if why is None:
                active[name] = value
            else:
                inactive[name] = why
        return active, inactive

    def validate(self, params: Mapping[str, object], source: str | None = None) -> ParamSet:
        """A checked copy of ``params`` (a subset of the knobs is fine).

        Raises ConfigError ``<source>: <knob>: <what is wrong>; <what is allowed>``.
        """
        where = f"{source}: " if source else ""
        out: ParamSet = {}
        for name, value in params.items():
            spec = self.params.get(name)
            if spec is None:
                raise ConfigError(
                    f"{where}{name}: unknown knob; available: {', '.join(self.params)}"
                )
            problem = _check_value(spec, value)
            if problem:
                raise ConfigError(f"{where}{name}: {problem}")
            out[name] = _coerce(spec, value)
        return out

    def complete(
        self, params: Mapping[str, ParamValue], base: Mapping[str, ParamValue]
    ) -> ParamSet:
        """``base`` (e.g. what is live) overlaid with ``params``; knobs missing in both
        take their baseline."""
        full = self.baseline()
        full.update({k: v for k, v in base.items() if k in self.params})
        full.update(params)
        return full

    def suggest(
        self, trial: optuna.trial.Trial, base: Mapping[str, ParamValue] | None = None
    ) -> ParamSet:
        """Sample every active, non-fixed knob from an Optuna trial; the rest keep their
        value in ``base`` (default the baseline). The knobs a ``when`` names are sampled
        before the knobs that depend on them, so a condition sees the sampled value."""
        out: ParamSet = dict(base) if base is not None else self.baseline()
        for name in self._order:
            spec = self.params[name]
            if spec.fixed or not self.is_active(name, out):
                continue
            out[name] = _suggest_one(trial, name, spec)
        return out


def _dependency_order(params: Mapping[str, ParamSpec]) -> list[str]:
    """The knobs, each after the knobs its ``when`` names (file order otherwise)."""
    depth: dict[str, int] = {}

    def of(name: str, seen: tuple[str, ...]) -> int:
        if name in seen:
            raise ConfigError(f"{name}: `when` conditions form a cycle ({' -> '.join(seen)})")
        if name not in depth:
            refs = params[name].when
            depth[name] = 1 + max((of(r, (*seen, name)) for r in refs), default=-1)
        return depth[name]

    return sorted(params, key=lambda n: of(n, ()))


def _suggest_one(trial: optuna.trial.Trial, name: str, spec: ParamSpec) -> ParamValue:
    if spec.type == "int":
        assert spec.low is not None and spec.high is not None
        return int(
            trial.suggest_int(
                name, int(spec.low), int(spec.high), step=int(spec.step or 1), log=spec.log
            )
        )
    if spec.type == "float":
        assert spec.low is not None and spec.high is not None
        return float(trial.suggest_float(name, spec.low, spec.high, step=spec.step, log=spec.log))
    if spec.type == "bool":
        return bool(trial.suggest_categorical(name, [False, True]))
    value = trial.suggest_categorical(name, list(spec.choices or []))
    if value is None:  # pragma: no cover - choices never hold None
        raise ConfigError(f"{name}: None is not a value")
    return value


_PARAMS_FILE_KEYS = frozenset({"params", "target", "source", "description", "without_effect"})
"""Top-level keys of a parameter file with a ``params:`` block: the block and metadata."""


def load_params_file(path: str | Path) -> dict[str, Any]:
    """A parameter file (``knob: value`` YAML, optionally under ``params:``), unvalidated."""
    where = str(path)
    data = load_yaml_file(path, where)
    if isinstance(data, dict) and isinstance(data.get("params"), dict):
        beside = sorted(str(k) for k in data if k not in _PARAMS_FILE_KEYS)
        if beside:
            meta = ", ".join(sorted(_PARAMS_FILE_KEYS - {"params"}))
            raise ConfigError(
                f"{where}: {beside[0]!r} beside the params: block would be ignored; put knobs "
                f"under params: (beside it only {meta})"
            )
        data = data["params"]
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigError(f"{where}: expected a mapping of knob: value (e.g. weight.h100-0: 50)")
    return data
