"""The validated scenario model: what ``lbtune/data/scenarios/*.yaml`` may contain.

Users type these files, so every model forbids unknown fields and every error
names its field path (see :mod:`lbtune.scenario.loader`). The traffic fields
(``api``, ``models``, ``prompt_tokens``, ``output_tokens``, ``prefix``,
``sessions``, ``stream``, ``priority``) describe the default traffic; optional
``classes`` mix several kinds of traffic, each class inheriting every traffic
field it does not set.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from lbtune.scenario.distributions import Distribution, _Dist
from lbtune.scenario.limits import (
    AGENT_SESSION_CACHE,
    BYTES_PER_TOKEN,
    MAX_ARRIVALS,
    MAX_CACHED_BYTES,
    MAX_DURATION_S,
    MAX_FIT_REQUESTS,
    MAX_FIT_VALUE,
    MAX_PRIORITY,
    MAX_PROMPT_TOKENS,
    MAX_RATE,
    MAX_SLO_S,
    MAX_SUBAGENTS,
    MAX_TOKENS,
    MAX_USERS,
    MAX_WEIGHT,
    SESSION_CACHE,
    SYSTEM_PROMPT_CACHE,
)
from lbtune.scenario.sessionplan import MAX_SESSION_CALLS
from lbtune.scenario.shapes import LoadShape
from lbtune.scenario.traces.spec import TraceSource

DEFAULT_TRACE_MODEL = "llama-3.1-8b-instruct"
"""A trace scenario without ``models`` sends to the embedded cluster's model."""

ApiName = Literal["chat", "completions"]
_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _printable_name(value: Any) -> Any:
    """A name shown on a terminal: no control character (an ANSI escape, a newline)."""
    if isinstance(value, str) and _CONTROL.search(value):
        raise ValueError(f"{value!r} holds a control character; use plain text")
    return value


Name = Annotated[str, BeforeValidator(_printable_name)]
"""A user's name for something lbtune prints (a scenario, a class, a model)."""


def _seconds(value: Any) -> Any:
    """Accept 0.35, "0.35", "350ms" or "2s" as seconds."""
    if isinstance(value, str):
        m = _DURATION_RE.match(value)
        if not m:
            raise ValueError(f"expected seconds or a duration like '350ms' or '2s', got {value!r}")
        number = float(m.group(1))
        return number / 1000 if m.group(2) == "ms" else number
    return value


Seconds = Annotated[float, BeforeValidator(_seconds), Field(gt=0, le=MAX_SLO_S)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Slo(_Strict):
    """Service-level objectives, in seconds (``"350ms"`` strings are accepted)."""

    ttft: Seconds | None = Field(default=None, description="Time to first token.")
    e2e: Seconds | None = Field(default=None, description="End-to-end latency.")
    itl: Seconds | None = Field(default=None, description="Inter-token latency.")
    tpot: Seconds | None = Field(default=None, description="Time per output token.")


class PrefixGroups(_Strict):
    """``groups`` system prompts of ``tokens`` tokens, shared by ``fraction`` of requests."""

    groups: int = Field(ge=1, le=100_000)
    tokens: int = Field(ge=1, le=MAX_TOKENS, description="Length of each shared system prompt.")
    fraction: float = Field(gt=0, le=1, description="Share of requests that carry one.")


class Sessions(_Strict):
    """Multi-turn chats: ``fraction`` of requests are turns of ``turns``-turn sessions."""

    fraction: float = Field(gt=0, le=1)
    turns: int = Field(ge=2, le=256)


class AgentPrefix(_Strict):
    """``groups`` shared contexts (system prompt + repository) of ``tokens`` tokens; each
    agent session draws one, uniformly."""

    groups: int = Field(ge=1, le=100_000)
    tokens: int = Field(ge=1, le=MAX_TOKENS, description="Length of each shared context.")


class SubAgents(_Strict):
    """After a main call (not the last), with ``probability``, a fan-out into ``count``
    subagents of ``calls`` calls each, which rejoin before the main agent's next call."""

    probability: float = Field(gt=0, le=1, description="Chance of a fan-out after a call.")
    count: Distribution = Field(description=f"Subagents per fan-out (at most {MAX_SUBAGENTS}).")
    calls: Distribution = Field(description="LLM calls of each subagent.")

    @model_validator(mode="after")
    def _few(self) -> Self:
        top = _top(self.count)
        if top > MAX_SUBAGENTS:
            raise ValueError(
                f"count: reaches {top:g} subagents, more than the {MAX_SUBAGENTS} one fan-out "
                "may spawn; lower it or set max:"
            )
        return self


class AgentSessions(_Strict):
    """Causal agent sessions: each call is sent when the call(s) it waits for ended, plus
    a tool delay, and resends the growing context (see ``docs/scenarios.md``)."""

    calls: Distribution = Field(description="The main agent's LLM calls per session.")
    tool_delay_ms: Distribution = Field(description="Tool run before each next call, in ms.")
    tool_output_tokens: Distribution = Field(description="Tool output appended after a call.")
    prefix: AgentPrefix | None = Field(default=None, description="Shared context groups.")
    subagents: SubAgents | None = None

    def max_calls(self) -> int:
        """The most calls a session may hold: every main call but the last may fan out."""
        n = int(_top(self.calls))
        sub = self.subagents
        if sub is None:
            return n
        return n + (n - 1) * int(_top(sub.count)) * int(_top(sub.calls))

    @model_validator(mode="after")
    def _bounded_calls(self) -> Self:
        n = self.max_calls()
        if n > MAX_SESSION_CALLS:
            raise ValueError(
                f"calls: a session may hold {n} calls (main calls, each but the last fanning "
                f"out to subagents), more than the {MAX_SESSION_CALLS} lbtune indexes; lower "
                "calls or subagents.count/calls, or set max:"
            )
        return self


_Weight = Annotated[float, Field(gt=0, le=MAX_WEIGHT)]
Weights = Annotated[dict[Name, _Weight], Field(min_length=1)]
ApiMix = ApiName | Annotated[dict[ApiName, _Weight], Field(min_length=1)]
Priority = Annotated[int, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)]
PriorityMix = Annotated[dict[Priority, _Weight], Field(min_length=1)]


class TrafficClass(_Strict):
    """One kind of traffic in a mix; unset fields are inherited from the scenario."""

    name: Name = Field(min_length=1)
    weight: float = Field(gt=0, le=MAX_WEIGHT, description="Relative share of requests.")
    api: ApiMix | None = None
    models: Weights | None = None
    prompt_tokens: Distribution | None = None
    output_tokens: Distribution | None = None
    prefix: PrefixGroups | Literal[False] | None = Field(
        default=None, description="false = no shared prefix even if the scenario has one."
    )
    sessions: Sessions | Literal[False] | None = Field(
        default=None, description="false = single requests even if the scenario has sessions."
    )
    stream: bool | Annotated[float, Field(ge=0, le=1)] | None = None
    priority: PriorityMix | None = None


class FitRecord(_Strict):
    """Where a fitted scenario came from, and the trace's own figures (``scenarios show``)."""

    trace: str
    format: str
    requests: int = Field(ge=1, le=MAX_FIT_REQUESTS)
    percentiles: dict[str, dict[str, Annotated[float, Field(ge=0, le=MAX_FIT_VALUE)]]] = Field(
        default_factory=dict, description="figure -> {pNN: value} measured on the trace."
    )
    fit: dict[str, str] = Field(default_factory=dict, description="figure -> how it was fitted.")


class Scenario(_Strict):
    """A named, seeded traffic pattern and load shape."""

    name: Name = Field(default="", description="Defaults to the file name.")
    description: str = ""
    seed: int = Field(default=0, ge=0, lt=2**63)
    duration_s: float = Field(
        default=60.0,
        gt=0,
        le=MAX_DURATION_S,
        description="Default test length (steps: their total); at most a week.",
    )
    warmup_s: float = Field(
        default=0.0, ge=0, le=MAX_DURATION_S, description="Excluded from the figures."
    )
    cooldown_s: float = Field(
        default=0.0, ge=0, le=MAX_DURATION_S, description="Excluded from the figures."
    )
    slo: Slo = Field(default_factory=Slo)
    load: LoadShape

    api: ApiMix = "chat"
    models: Weights = Field(description="Model name -> weight.")
    prompt_tokens: Distribution = Field(description="Length of each new user message.")
    output_tokens: Distribution = Field(description="max_tokens of each request.")
    prefix: PrefixGroups | None = None
    sessions: Sessions | None = None
    stream: bool | Annotated[float, Field(ge=0, le=1)] = Field(
        default=True, description="true, false, or the fraction of streamed requests."
    )
    priority: PriorityMix | None = Field(
        default=None, description="priority value -> weight (sent as RequestSpec.priority)."
    )
    classes: list[TrafficClass] | None = Field(default=None, min_length=1)
    source: TraceSource | None = Field(
        default=None, description="Replay a trace file instead of the distributions."
    )
    fitted: FitRecord | None = Field(default=None, description="Set by `scenarios fit`.")
    agent: AgentSessions | None = Field(
        default=None,
        description="Causal agent sessions (calls waiting for answers and tools) instead of "
        "placed requests: load users = concurrent sessions, rate = session starts/s.",
    )

    turn_gap: int = Field(
        default=64, ge=2, le=100_000, description="Requests between two turns of a session."
    )
    ignore_eos: bool = Field(
        default=True, description="Ask the server to generate exactly max_tokens."
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="Merged into every request body."
    )

    @model_validator(mode="before")
    @classmethod
    def _trace_defaults(cls, data: Any) -> Any:
        # A trace sets lengths (and, when timed, arrivals): those fields become optional.
        if not isinstance(data, dict) or not isinstance(data.get("source"), dict):
            return data
        fill: dict[str, Any] = {
            "models": {DEFAULT_TRACE_MODEL: 1},
            "prompt_tokens": {"type": "fixed", "value": 1},
            "output_tokens": {"type": "fixed", "value": 1},
            # Timed traces ignore it; an untimed one (ShareGPT) gets 1 req/s (--rate scales).
            "load": {"type": "rate", "rate": 1},
        }
        return {**{k: v for k, v in fill.items() if k not in data}, **data}

    @model_validator(mode="before")
    @classmethod
    def _steps_duration(cls, data: Any) -> Any:
        # A steps shape without duration_s lasts as long as its steps.
        if isinstance(data, dict) and "duration_s" not in data:
            load = data.get("load")
            if isinstance(load, dict) and load.get("type") == "steps":
                steps = load.get("steps")
                if isinstance(steps, list) and steps:
                    try:
                        total = sum(float(s["duration"]) for s in steps)
                    except (TypeError, KeyError, ValueError):
                        return data
                    if total > 0:
                        return {**data, "duration_s": total}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.warmup_s + self.cooldown_s >= self.duration_s:
            raise ValueError(
                f"warmup_s + cooldown_s ({self.warmup_s + self.cooldown_s:g} s) leave no "
                f"measurement window in duration_s ({self.duration_s:g} s)"
            )
        self._bounded()
        need = self.load.min_duration()
        if need > self.duration_s:
            raise ValueError(
                f"load: the {self.load.type} shape needs {need:g} s, more than duration_s "
                f"({self.duration_s:g} s); lengthen duration_s or shorten the shape"
            )
        if self.source is not None and self.classes is not None:
            raise ValueError("source: a trace replay cannot also have classes")
        self._agent_alone()
        if self.classes is not None:
            names = [c.name for c in self.classes]
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"classes: duplicate name(s) {', '.join(sorted(dup))}")
        return self

    def _agent_alone(self) -> None:
        """``agent`` sessions are the whole traffic: no placed sessions, prefixes, classes
        or trace beside them."""
        if self.agent is None:
            return
        for field, what in (
            ("sessions", "an agent session is its own chain of calls"),
            ("prefix", "set agent.prefix for the shared context"),
            ("classes", "agent traffic is one class; use another scenario for a mix"),
            ("source", "a trace replays its own requests"),
        ):
            if getattr(self, field) is not None:
                raise ValueError(f"agent: cannot be combined with {field} ({what}); remove one")

    def _bounded(self) -> None:
        """Load, prompt lengths and cache memory lbtune can generate (the bounds of
        :mod:`lbtune.scenario.limits`)."""
        peak = max(
            (max(g.level0, g.level1) for g in self.load.segments(self.duration_s)), default=0.0
        )
        closed = self.load.mode() == "closed"
        if closed and peak > MAX_USERS:
            raise ValueError(f"load: {peak:g} users, more than the {MAX_USERS} lbtune runs")
        if not closed and peak > MAX_RATE:
            raise ValueError(f"load: {peak:g} req/s, more than the {MAX_RATE:g} lbtune sends")
        if not closed and self.source is None:
            segs = self.load.segments(self.duration_s)
            planned = sum((g.level0 + g.level1) / 2 * (g.end - g.start) for g in segs)
            if planned > MAX_ARRIVALS:
                raise ValueError(
                    f"load: about {planned:.3g} requests in {self.duration_s:g} s, more than "
                    f"the {MAX_ARRIVALS} an open-loop plan may hold; lower the rate or duration_s"
                )
        cached = sum(_traffic_bounds(where, *mix) for where, mix in self._mixes())
        if self.agent is not None:
            cached += _agent_bounds(self.agent, self.prompt_tokens, self.output_tokens)
        if cached * BYTES_PER_TOKEN > MAX_CACHED_BYTES:
            raise ValueError(
                f"{'agent' if self.agent else 'prefix/sessions'}: the generator would keep "
                f"about {cached * BYTES_PER_TOKEN:.3g} bytes of prompt text cached, more than "
                f"the {MAX_CACHED_BYTES} it may hold; use fewer or shorter shared prefixes or "
                "sessions"
            )

    def _mixes(self) -> list[tuple[str, _Mix]]:
        """Each traffic class's lengths, prefix and sessions, inherited fields filled in."""
        own: _Mix = (self.prompt_tokens, self.output_tokens, self.prefix, self.sessions)
        if not self.classes:
            return [("", own)]
        out: list[tuple[str, _Mix]] = []
        for c in self.classes:
            prefix = self.prefix if c.prefix is None else (c.prefix or None)
            sessions = self.sessions if c.sessions is None else (c.sessions or None)
            mix = (
                c.prompt_tokens or self.prompt_tokens,
                c.output_tokens or self.output_tokens,
                prefix,
                sessions,
            )
            out.append((f"classes.{c.name}.", mix))
        return out

    @property
    def mode(self) -> Literal["closed", "open"]:
        """``closed`` (users) or ``open`` (arrival rate) loop."""
        return self.load.mode()

    def model_names(self) -> list[str]:
        """Every model the scenario sends to (classes included), in first-seen order."""
        seen = dict.fromkeys(self.models)
        for c in self.classes or []:
            seen.update(dict.fromkeys(c.models or {}))
        return list(seen)


_Mix = tuple[_Dist, _Dist, PrefixGroups | None, Sessions | None]


def _traffic_bounds(
    where: str, prompt: _Dist, output: _Dist, prefix: PrefixGroups | None, sess: Sessions | None
) -> float:
    """Check one traffic mix's longest request against :data:`MAX_PROMPT_TOKENS` (its
    shared prefix, the longest session history, the new message) and its answers against
    :data:`MAX_TOKENS`; the tokens of text its caches hold (shared prefixes, sessions)."""
    top_in, top_out = prompt.quantile(1 - 1e-9), output.quantile(1 - 1e-9)
    for field, top in (("prompt_tokens", top_in), ("output_tokens", top_out)):
        if top > MAX_TOKENS:
            raise ValueError(
                f"{where}{field}: reaches {top:.3g} tokens, more than the {MAX_TOKENS} lbtune "
                "sends; lower it or set max:"
            )
    turns = sess.turns if sess is not None else 1
    longest = (prefix.tokens if prefix else 0) + turns * top_in + (turns - 1) * top_out
    if longest > MAX_PROMPT_TOKENS:
        parts = f"a shared prefix of {prefix.tokens}, " if prefix else ""
        if turns > 1:
            parts += f"{turns - 1} earlier turns with their answers, "
        raise ValueError(
            f"{where}prompt_tokens: a request may carry {longest:.3g} prompt tokens "
            f"({parts}the new message), more than the {MAX_PROMPT_TOKENS} lbtune sends"
        )
    cached = min(prefix.groups, SYSTEM_PROMPT_CACHE) * prefix.tokens if prefix else 0.0
    if sess is not None:
        cached += SESSION_CACHE * sess.turns * (_mean(prompt) + _mean(output))
    return cached


def _agent_bounds(agent: AgentSessions, prompt: _Dist, output: _Dist) -> float:
    """Check an agent session's longest prompt (the shared context, the task, every earlier
    call's answer and tool output, the subagents' answers rejoining) against
    :data:`MAX_PROMPT_TOKENS`; the tokens of text its caches hold (sessions, contexts)."""
    top_in, top_out, top_tool = _top(prompt), _top(output), _top(agent.tool_output_tokens)
    ctx = agent.prefix.tokens if agent.prefix else 0
    calls, sub = _top(agent.calls), agent.subagents
    joined = (calls - 1) * _top(sub.count) * top_out if sub else 0.0
    longest = ctx + top_in + (calls - 1) * (top_out + top_tool) + joined
    if sub is not None:  # a subagent's own chain, if longer
        longest = max(longest, ctx + top_in + (_top(sub.calls) - 1) * (top_out + top_tool))
    if longest > MAX_PROMPT_TOKENS:
        raise ValueError(
            f"agent: a call may carry {longest:.3g} prompt tokens (the shared context, the "
            "task, earlier answers, tool outputs and subagents' answers), more than the "
            f"{MAX_PROMPT_TOKENS} lbtune sends; lower calls, tool_output_tokens or set max:"
        )
    step = _mean(output) + _mean(agent.tool_output_tokens)
    own = _mean(prompt) + _mean(agent.calls) * step
    if sub is not None:
        fanouts = sub.probability * max(_mean(agent.calls) - 1, 0.0)
        own += fanouts * _mean(sub.count) * (_mean(prompt) + _mean(sub.calls) * step)
    shared = min(agent.prefix.groups, SYSTEM_PROMPT_CACHE) * ctx if agent.prefix else 0
    return AGENT_SESSION_CACHE * own + shared


def _top(d: _Dist) -> float:
    """A distribution's "max": its 1 - 1e-9 quantile."""
    return d.quantile(1 - 1e-9)


def _mean(d: _Dist, n: int = 64) -> float:
    """A distribution's mean length (midpoint rule on its quantile function)."""
    return sum(d.quantile((k + 0.5) / n) for k in range(n)) / n
