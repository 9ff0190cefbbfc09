"""The request sequence of a scenario: request ``i`` is a pure function of (scenario, seed, i).

Layout. The index space is cut into blocks of ``turn_gap`` requests. Turn ``t``
of a session that starts in block ``m`` sits in block ``m + t`` (so a session's
turns are about ``turn_gap`` requests apart, time for the previous answer to
arrive), at a position given by a seeded shuffle of the block. Each block starts
``weight * sessions.fraction * turn_gap / turns`` sessions of each class on
average (stochastic rounding, seeded per block); the remaining positions are
single requests of a class drawn by weight. Any process computes block ``m``
alone, so request ``i`` needs no knowledge of requests before it.

Lengths. ``prompt_tokens`` is the length of each *new* user message; a request
also carries its group's shared system prompt and, for turn ``t > 0``, the
session's history (earlier user messages and the assistant replies, each
synthesized with that turn's ``max_tokens`` — not the server's actual text).
``RequestSpec.prompt_tokens`` is the total of the message contents (chat
template tokens are not counted).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from pathlib import Path
from typing import Any

from lbtune.scenario import draws
from lbtune.scenario.agent import AgentWorkload
from lbtune.scenario.limits import SESSION_CACHE, SYSTEM_PROMPT_CACHE
from lbtune.scenario.mix import Part, TrafficMix, render_parts, request_extra, resolve_classes
from lbtune.scenario.models import Scenario
from lbtune.scenario.prompts import TextSynth
from lbtune.scenario.request import Api, RequestSpec
from lbtune.scenario.traces.lbtune_run import recorded_run
from lbtune.scenario.traces.replay import TraceWorkload
from lbtune.scenario.traces.sessions import TraceSessionWorkload


@dataclass(frozen=True)
class _Single:
    cls: int


@dataclass(frozen=True)
class _Turn:
    cls: int
    block: int
    slot: int
    turn: int


@dataclass(frozen=True)
class _Session:
    api: Api
    model: str
    group: int | None
    system: tuple[str, int] | None
    priority: int | None
    users: tuple[tuple[str, int], ...]
    replies: tuple[tuple[str, int], ...]
    max_tokens: tuple[int, ...]
    stream: tuple[bool, ...]


class Workload:
    """Random-access, deterministic request sequence of one scenario and seed."""

    def __init__(
        self, scenario: Scenario, seed: int | None = None, tokenizer_path: str | None = None
    ) -> None:
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        self.classes = resolve_classes(scenario)
        self.synth = TextSynth(tokenizer_path)
        self._gap = scenario.turn_gap
        total = sum(c.weight for c in self.classes)
        self._started = [  # sessions started per block, on average, by class
            (c.weight / total) * c.sessions.fraction * self._gap / c.sessions.turns
            if c.sessions
            else 0.0
            for c in self.classes
        ]
        single_w = [
            c.weight * (1 - (c.sessions.fraction if c.sessions else 0.0)) for c in self.classes
        ]
        if sum(single_w) <= 0:
            single_w = [c.weight for c in self.classes]
        self._single_cum = list(accumulate(single_w))
        self._extra: dict[str, Any] = request_extra(scenario)
        self._layout: Callable[[int], tuple[_Single | _Turn, ...]] = lru_cache(maxsize=256)(
            self._block_layout
        )
        self._session: Callable[[int, int, int], _Session] = lru_cache(maxsize=SESSION_CACHE)(
            self._make_session
        )
        self._system: Callable[[int, int], tuple[str, int]] = lru_cache(
            maxsize=SYSTEM_PROMPT_CACHE
        )(self._make_system)

    # -- layout -------------------------------------------------------------

    def _n_started(self, block: int, cls: int) -> int:
        lam = self._started[cls]
        if block < 0 or lam <= 0:
            return 0
        base = math.floor(lam)
        return base + (draws.uniform(self.seed, draws.LAYOUT, block, cls) < lam - base)

    def _block_layout(self, block: int) -> tuple[_Single | _Turn, ...]:
        turns: list[_Single | _Turn] = []
        for c, mix in enumerate(self.classes):
            if mix.sessions is None:
                continue
            for t in range(mix.sessions.turns):
                start = block - t
                turns.extend(_Turn(c, start, j, t) for j in range(self._n_started(start, c)))
        turns.sort(key=lambda x: x.turn if isinstance(x, _Turn) else 0)
        slots: list[_Single | _Turn] = turns[: self._gap]  # overflow: latest turns dropped
        u = draws.uniforms(self.seed, draws.LAYOUT, block, -1, n=2 * self._gap)
        for k in range(self._gap - len(slots)):
            slots.append(_Single(draws.choose(u[self._gap + k], self._single_cum)))
        for k in range(len(slots) - 1, 0, -1):  # Fisher-Yates
            j = int(u[k] * (k + 1))
            slots[k], slots[j] = slots[j], slots[k]
        return tuple(slots)

    # -- pieces -------------------------------------------------------------

    def _make_system(self, group: int, n: int) -> tuple[str, int]:
        return self.synth.text(self.seed, (draws.PREFIX, group), n)

    def _prefix(self, mix: TrafficMix, u_has: float, u_group: float) -> tuple[int | None, Any]:
        if mix.prefix is None or u_has >= mix.prefix.fraction:
            return None, None
        g = min(int(u_group * mix.prefix.groups), mix.prefix.groups - 1)
        return g, self._system(g, mix.prefix.tokens)

    def _make_session(self, cls: int, block: int, slot: int) -> _Session:
        mix = self.classes[cls]
        assert mix.sessions is not None
        k = mix.sessions.turns
        u = draws.uniforms(self.seed, draws.SESSION, cls, block, slot, n=5 + 3 * k)
        group, system = self._prefix(mix, u[2], u[3])
        users, replies, max_tokens, stream = [], [], [], []
        for t in range(k):
            ut = u[5 + 3 * t : 8 + 3 * t]
            key = (draws.SESSION, cls, block, slot, t)
            users.append(self.synth.text(self.seed, (*key, 0), mix.prompt_tokens.sample(ut[0])))
            out = mix.output_tokens.sample(ut[1])
            max_tokens.append(out)
            replies.append(self.synth.text(self.seed, (*key, 1), out))
            stream.append(ut[2] < mix.stream)
        return _Session(
            api=mix.api(u[0]),
            model=mix.model(u[1]),
            group=group,
            system=system,
            priority=mix.priority(u[4]),
            users=tuple(users),
            replies=tuple(replies),
            max_tokens=tuple(max_tokens),
            stream=tuple(stream),
        )

    # -- requests -----------------------------------------------------------

    def request(self, i: int) -> RequestSpec:
        """Request ``i`` (0-based); identical in every process for the same scenario and seed."""
        if i < 0:
            raise IndexError(f"request index must be >= 0, got {i}")
        slot = self._layout(i // self._gap)[i % self._gap]
        if isinstance(slot, _Turn):
            return self._turn_request(i, slot)
        return self._single_request(i, slot.cls)

    def __getitem__(self, i: int) -> RequestSpec:
        return self.request(i)

    def _single_request(self, i: int, cls: int) -> RequestSpec:
        mix = self.classes[cls]
        u = draws.uniforms(self.seed, draws.SINGLE, i, n=8)
        group, system = self._prefix(mix, u[4], u[5])
        user = self.synth.text(self.seed, (draws.SINGLE, i), mix.prompt_tokens.sample(u[2]))
        parts = ([("system", system)] if system else []) + [("user", user)]
        return self._spec(
            i,
            mix,
            api=mix.api(u[0]),
            model=mix.model(u[1]),
            max_tokens=mix.output_tokens.sample(u[3]),
            stream=u[6] < mix.stream,
            parts=parts,
            priority=mix.priority(u[7]),
            group=group,
            session=None,
            turn=0,
        )

    def _turn_request(self, i: int, slot: _Turn) -> RequestSpec:
        mix = self.classes[slot.cls]
        s = self._session(slot.cls, slot.block, slot.slot)
        parts: list[Part] = [("system", s.system)] if s.system else []
        for t in range(slot.turn):
            parts += [("user", s.users[t]), ("assistant", s.replies[t])]
        parts.append(("user", s.users[slot.turn]))
        sid = (slot.block * len(self.classes) + slot.cls) * self._gap + slot.slot
        return self._spec(
            i,
            mix,
            api=s.api,
            model=s.model,
            max_tokens=s.max_tokens[slot.turn],
            stream=s.stream[slot.turn],
            parts=parts,
            priority=s.priority,
            group=s.group,
            session=sid,
            turn=slot.turn,
        )

    def _spec(
        self,
        i: int,
        mix: TrafficMix,
        *,
        api: Api,
        model: str,
        max_tokens: int,
        stream: bool,
        parts: list[Part],
        priority: int | None,
        group: int | None,
        session: int | None,
        turn: int,
    ) -> RequestSpec:
        n_tokens, messages, prompt = render_parts(api, parts)
        return RequestSpec(
            index=i,
            api=api,
            model=model,
            max_tokens=max_tokens,
            stream=stream,
            prompt_tokens=n_tokens,
            messages=messages,
            prompt=prompt,
            priority=priority,
            prefix_group=group,
            session_id=session,
            turn=turn,
            extra_body=dict(self._extra),
            traffic_class=mix.name,
        )


def has_sessions(scenario: Scenario) -> bool:
    """Whether the scenario's traffic is causal sessions: an ``agent`` block, or an agentic
    trace (``weka``, ``otel``, ``copilot``). :func:`build_workload` then gives a
    :class:`~lbtune.scenario.sessionplan.SessionSource`, and request ``i`` is a call of a
    session's plan rather than a placed request."""
    src = scenario.source
    return scenario.agent is not None or (src is not None and src.sessions)


def build_workload(
    scenario: Scenario, seed: int | None = None, tokenizer_path: str | None = None
) -> Workload | TraceWorkload | AgentWorkload | TraceSessionWorkload:
    """The deterministic request sequence of ``scenario`` (``seed`` overrides its seed);
    a trace replay when the scenario has a ``source``; sessions (request ``i`` is a call of
    a :class:`~lbtune.scenario.sessionplan.SessionPlan`) when it has ``agent`` or replays
    an agentic trace (:func:`has_sessions`)."""
    if scenario.agent is not None:
        return AgentWorkload(scenario, seed=seed, tokenizer_path=tokenizer_path)
    src = scenario.source
    if src is None:
        return Workload(scenario, seed=seed, tokenizer_path=tokenizer_path)
    if src.sessions:
        return TraceSessionWorkload(scenario, seed=seed, tokenizer_path=tokenizer_path)
    recorded = None
    if src.format == "lbtune":
        run = recorded_run(Path(src.trace))
        if run is not None:  # the recorded run's own requests, rebuilt exactly
            doc, run_seed, tok = run
            inner = Scenario.model_validate(doc)
            recorded = build_workload(inner, run_seed, tok if tok is not None else tokenizer_path)
    return TraceWorkload(scenario, seed=seed, tokenizer_path=tokenizer_path, recorded=recorded)
