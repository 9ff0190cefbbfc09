"""Where the generator's requests and load shape come from.

Normally the run's recorded plan (``run.json``, :mod:`lbtune.scenario.runplan`: the scenario
document as run), else a scenario (name or YAML path) through :mod:`lbtune.scenario`
(``load_scenario`` → ``build_workload`` / ``plan_load``). For benchmarks and
tests a *fixed* workload needs no scenario file:
``fixed:model=M,prompt=16,output=32,stream=1,api=chat,arrival=poisson`` — every
request the same shape, closed loop with ``users`` or open loop at ``rate``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from lbtune.errors import ConfigError
from lbtune.keyvalue import bad_value, parse_pairs
from lbtune.loadgen.settings import GeneratorSettings
from lbtune.scenario import build_workload, load_scenario, plan_load
from lbtune.scenario.request import RequestSpec
from lbtune.scenario.runplan import read_run_plan

__all__ = [
    "FixedWorkload",
    "SendPlan",
    "SimplePlan",
    "Source",
    "Workload",
    "open_source",
    "resolve",
]

_WORDS = ("alpha", "bravo", "delta", "echo", "gamma", "kilo", "lima", "metro", "nova", "omega")


class Workload(Protocol):
    def request(self, i: int) -> RequestSpec: ...


class SendPlan(Protocol):
    """What a generator reads of its load plan (``LoadPlan``, :class:`SimplePlan`)."""

    @property
    def mode(self) -> Literal["closed", "open"]: ...
    @property
    def arrivals(self) -> tuple[float, ...]: ...
    def users_at(self, t: float) -> int: ...


@dataclass(frozen=True)
class Source:
    """What one generator sends: the requests, their plan, for how long."""

    workload: Workload
    plan: SendPlan
    duration_s: float


@dataclass(frozen=True)
class FixedWorkload:
    """Every request the same shape; prompt text varies with the index."""

    model: str = "llama-3.1-8b-instruct"
    prompt_tokens: int = 16
    output_tokens: int = 32
    stream: bool = True
    api: Literal["chat", "completions"] = "chat"

    def request(self, i: int) -> RequestSpec:
        words = [_WORDS[(i + k) % len(_WORDS)] for k in range(max(1, self.prompt_tokens - 1))]
        text = f"{i} " + " ".join(words)
        if self.api == "chat":
            return RequestSpec(
                index=i,
                api="chat",
                model=self.model,
                max_tokens=self.output_tokens,
                stream=self.stream,
                prompt_tokens=self.prompt_tokens,
                messages=({"role": "user", "content": text},),
            )
        return RequestSpec(
            index=i,
            api="completions",
            model=self.model,
            max_tokens=self.output_tokens,
            stream=self.stream,
            prompt_tokens=self.prompt_tokens,
            prompt=text,
        )


@dataclass(frozen=True)
class SimplePlan:
    """The subset of ``lbtune.scenario``'s LoadPlan the generator reads."""

    mode: Literal["closed", "open"]
    users: int = 1
    arrivals: tuple[float, ...] = field(default_factory=tuple)
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    stages: tuple[Any, ...] = field(default_factory=tuple)

    def users_at(self, t: float) -> int:
        return self.users


def _parse_fixed(spec: str) -> tuple[FixedWorkload, dict[str, str]]:
    known = ("api", "arrival", "model", "output", "prompt", "stream")
    example = "fixed:output=32,prompt=16"
    opts = dict(parse_pairs(spec.split(":", 1)[1], flag=spec, keys=known, example=example))
    api = opts.get("api", "chat")
    if api not in ("chat", "completions"):
        raise bad_value(spec, "api", api, "chat or completions")
    tokens = {"prompt": opts.get("prompt", "16"), "output": opts.get("output", "32")}
    for key, value in tokens.items():
        if not value.isdigit():
            raise bad_value(spec, key, value, "a whole number of tokens (e.g. 32)")
    wl = FixedWorkload(
        model=opts.get("model", "llama-3.1-8b-instruct"),
        prompt_tokens=int(tokens["prompt"]),
        output_tokens=int(tokens["output"]),
        stream=opts.get("stream", "1") not in ("0", "false", "no"),
        api=api,  # type: ignore[arg-type]
    )
    return wl, opts


def arrivals(rate: float, duration_s: float, seed: int, kind: str = "poisson") -> tuple[float, ...]:
    """Send offsets (s) for an open loop at ``rate`` req/s over ``duration_s``."""
    if rate <= 0:
        raise ConfigError(f"rate must be > 0, found {rate}")
    if kind == "constant":
        n = int(rate * duration_s)
        return tuple(i / rate for i in range(n))
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return tuple(out)


def resolve(
    scenario: str,
    seed: int,
    duration_s: float,
    users: int | None,
    rate: float | None,
    tokenizer_path: str | None = None,
    *,
    run_plan: str | None = None,
) -> tuple[Workload, Any]:
    """(workload, plan) for a scenario name/path or a ``fixed:`` spec; with ``run_plan``
    (a ``run.json`` path) from the run's recorded plan alone: its scenario document, seed
    and load plan (the other arguments are then not used)."""
    if run_plan is not None:
        planned = _planned(run_plan, tokenizer_path)
        return planned.workload, planned.plan
    if scenario.startswith("fixed:") or scenario == "fixed":
        wl, opts = _parse_fixed(scenario if ":" in scenario else "fixed:")
        if rate is not None:
            arr = arrivals(rate, duration_s, seed, opts.get("arrival", "poisson"))
            return wl, SimplePlan(mode="open", arrivals=arr)
        return wl, SimplePlan(mode="closed", users=users or 1)
    sc = load_scenario(scenario)
    workload = build_workload(sc, seed, tokenizer_path=tokenizer_path)
    plan = plan_load(sc, duration_s=duration_s, users=users, rate=rate, seed=seed)
    return workload, plan


def open_source(settings: GeneratorSettings) -> Source:
    """What the generators of a run with ``settings`` send: the recorded run plan's
    (``run_plan``: its scenario document, seed, load plan and length), else the
    ``source`` settings' scenario or ``fixed:`` workload."""
    if settings.run_plan is not None:
        return _planned(settings.run_plan, settings.tokenizer_path)
    src = settings.source
    assert src is not None  # the settings hold exactly one of the two
    wl, plan = resolve(
        src.scenario, src.seed, src.duration_s, src.users, src.rate, settings.tokenizer_path
    )
    return Source(wl, plan, src.duration_s)


def _planned(run_plan: str, tokenizer_path: str | None) -> Source:
    """The recorded plan's workload (its tokenizer, else ``tokenizer_path``) and load."""
    rp = read_run_plan(run_plan)
    tok = rp.tokenizer if rp.tokenizer is not None else tokenizer_path
    workload = build_workload(rp.scenario, rp.seed, tokenizer_path=tok)
    return Source(workload, rp.load_plan(), rp.load.duration_s)
