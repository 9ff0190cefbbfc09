"""Agent sessions: each session a causal graph of LLM calls (a scenario's ``agent:``).

Session ``s`` is a pure function of the seed and ``s`` (draw stream
:data:`~lbtune.scenario.draws.AGENT`). Its main agent makes ``calls`` LLM calls in a
chain: call t+1 waits for call t's answer and a tool run of ``tool_delay_ms``. After
main call t (not the last), with ``subagents.probability``, it fans out into ``count``
subagents of ``calls`` calls each: a subagent's first call waits for call t (plus a tool
delay), its calls chain, and main call t+1 waits for the last call of every subagent
(plus the main agent's tool delay). :meth:`AgentWorkload.session` gives the
:class:`~lbtune.scenario.sessionplan.SessionPlan`; :meth:`AgentWorkload.request` the
content of each call.

Content. Every call of a session carries the session's shared context (a ``system``
message: one of ``prefix.groups`` texts, the same for every session of that group), then
its agent's task (``prompt_tokens``; one per agent), then for each earlier call of the
same agent its answer (synthesized with that call's ``max_tokens``, not the server's
text) and the tool output that followed (``tool_output_tokens``), and after a fan-out
each subagent's last answer (one ``user`` message per subagent). So call t+1's prompt
is call t's plus answer t plus tool output t (plus the subagents' answers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lbtune.scenario import draws
from lbtune.scenario.limits import AGENT_SESSION_CACHE, MAX_SUBAGENTS, SYSTEM_PROMPT_CACHE
from lbtune.scenario.mix import Part, TrafficMix, render_parts, request_extra, resolve_classes
from lbtune.scenario.models import AgentSessions, Scenario
from lbtune.scenario.prompts import TextSynth
from lbtune.scenario.request import Api, RequestSpec
from lbtune.scenario.sessionplan import (
    MAX_SESSION_CALLS,
    Call,
    SessionPlan,
    call_index,
    split,
)

__all__ = ["AgentWorkload"]

_PREFIX_KEY = -1
"""Text key of the shared contexts, ``(AGENT, -1, group)``: apart from every session's."""


@dataclass(frozen=True, slots=True)
class _CallText:
    """What one call sends and what it adds to its agent's next call."""

    prev: int | None
    """Position of the same agent's previous call (``None``: its first call)."""
    max_tokens: int
    stream: bool
    adds: tuple[Part, ...]
    """Appended to the context of the agent's next call: this call's answer, the tool
    output, the subagents' last answers after a fan-out."""


@dataclass(frozen=True, slots=True)
class _Session:
    plan: SessionPlan
    api: Api
    model: str
    group: int | None
    priority: int | None
    tasks: tuple[tuple[str, int], ...]
    """Each agent's task (0 = the main agent)."""
    calls: tuple[_CallText, ...]


@dataclass
class _Step:
    """A call of a session being built."""

    key: tuple[int, ...]
    prev: int | None
    max_tokens: int
    stream: bool
    tool_tokens: int
    adds: list[Part]


@dataclass
class _Draft:
    """A session being built: its calls, their texts, the agents' tasks."""

    session: int
    calls: list[Call]
    steps: list[_Step]
    tasks: list[tuple[str, int]]


class AgentWorkload:
    """Random-access, deterministic agent sessions of one scenario and seed
    (a :class:`~lbtune.scenario.sessionplan.SessionSource`)."""

    def __init__(
        self, scenario: Scenario, seed: int | None = None, tokenizer_path: str | None = None
    ) -> None:
        if scenario.agent is None:
            raise ValueError(f"scenario {scenario.name!r} has no agent sessions")
        self.scenario = scenario
        self.agent: AgentSessions = scenario.agent
        self.seed = scenario.seed if seed is None else seed
        self.mix: TrafficMix = resolve_classes(scenario)[0]
        self.synth = TextSynth(tokenizer_path)
        self._extra: dict[str, Any] = request_extra(scenario)
        self._session: Callable[[int], _Session] = lru_cache(maxsize=AGENT_SESSION_CACHE)(
            self._make_session
        )
        self._context: Callable[[int, int], tuple[str, int]] = lru_cache(
            maxsize=SYSTEM_PROMPT_CACHE
        )(self._make_context)

    # -- sessions -----------------------------------------------------------

    def session(self, s: int) -> SessionPlan:
        """Session ``s`` (0-based); identical in every process for the same seed."""
        if s < 0:
            raise IndexError(f"session must be >= 0, got {s}")
        return self._session(s).plan

    def _make_context(self, group: int, n: int) -> tuple[str, int]:
        return self.synth.text(self.seed, (draws.AGENT, _PREFIX_KEY, group), n)

    def _text(self, key: tuple[int, ...], n: int) -> tuple[str, int]:
        return self.synth.text(self.seed, (draws.AGENT, *key), n)

    def _make_session(self, s: int) -> _Session:
        mix, agent = self.mix, self.agent
        u = draws.uniforms(self.seed, draws.AGENT, s, n=6)
        group = None
        if agent.prefix is not None:
            group = min(int(u[2] * agent.prefix.groups), agent.prefix.groups - 1)
        d = _Draft(session=s, calls=[], steps=[], tasks=[])
        d.tasks.append(self._text((s, 0), mix.prompt_tokens.sample(u[4])))
        main = self._add_call(d, (0, 0), after=(), delay_s=0.0, agent_no=0)
        for t in range(1, agent.calls.sample(u[5])):
            ut = draws.uniforms(self.seed, draws.AGENT, s, 1, t, n=3)
            self._tool_output(d, main)
            rejoin = self._fan_out(d, t - 1, main, ut[1], ut[2])
            delay = agent.tool_delay_ms.sample(ut[0]) / 1000
            main = self._add_call(
                d, (0, t), after=rejoin or (main,), delay_s=delay, agent_no=0, prev=main
            )
        return _Session(
            plan=SessionPlan(session=s, calls=tuple(d.calls)),
            api=mix.api(u[0]),
            model=mix.model(u[1]),
            group=group,
            priority=mix.priority(u[3]),
            tasks=tuple(d.tasks),
            calls=tuple(_CallText(c.prev, c.max_tokens, c.stream, tuple(c.adds)) for c in d.steps),
        )

    def _add_call(
        self,
        d: _Draft,
        key: tuple[int, ...],
        *,
        after: tuple[int, ...],
        delay_s: float,
        agent_no: int,
        prev: int | None = None,
    ) -> int:
        """Append the call ``key`` (``(0, t)``: main call t; ``(t, j, c)``: call c of
        subagent j of the fan-out after main call t) and its answer; its position."""
        s, pos = d.session, len(d.calls)
        u = draws.uniforms(self.seed, draws.AGENT, s, 2, *key, n=3)
        out = self.mix.output_tokens.sample(u[0])
        d.calls.append(Call(call_index(s, pos), after, delay_s, agent_no))
        answer = self._text((s, 3, *key), out)
        tool = self.agent.tool_output_tokens.sample(u[2])
        d.steps.append(_Step(key, prev, out, u[1] < self.mix.stream, tool, [("assistant", answer)]))
        return pos

    def _tool_output(self, d: _Draft, pos: int) -> None:
        """The tool output after call ``pos``: its agent's next call carries it."""
        step = d.steps[pos]
        step.adds.append(("user", self._text((d.session, 4, *step.key), step.tool_tokens)))

    def _fan_out(self, d: _Draft, t: int, parent: int, u_has: float, u_k: float) -> tuple[int, ...]:
        """Maybe spawn subagents after main call ``t`` (position ``parent``); the
        positions of their last calls (empty: no fan-out)."""
        sub, s = self.agent.subagents, d.session
        if sub is None or u_has >= sub.probability:
            return ()
        lasts: list[int] = []
        for j in range(min(sub.count.sample(u_k), MAX_SUBAGENTS)):
            uj = draws.uniforms(self.seed, draws.AGENT, s, 5, t, j, n=3)
            m = sub.calls.sample(uj[1])
            if len(d.calls) + m + 1 > MAX_SESSION_CALLS:
                break  # beyond the validated bound (a 1e-9 tail): the session stops growing
            agent_no = len(d.tasks)
            d.tasks.append(self._text((s, 6, t, j), self.mix.prompt_tokens.sample(uj[0])))
            delay = self.agent.tool_delay_ms.sample(uj[2]) / 1000
            last = self._add_call(d, (t, j, 0), after=(parent,), delay_s=delay, agent_no=agent_no)
            for c in range(1, m):
                self._tool_output(d, last)
                uc = draws.uniform(self.seed, draws.AGENT, s, 7, t, j, c)
                delay = self.agent.tool_delay_ms.sample(uc) / 1000
                last = self._add_call(
                    d, (t, j, c), after=(last,), delay_s=delay, agent_no=agent_no, prev=last
                )
            lasts.append(last)
        for last in lasts:  # each subagent's last answer rejoins the main agent
            d.steps[parent].adds.append(("user", d.steps[last].adds[0][1]))
        return tuple(lasts)

    # -- requests -----------------------------------------------------------

    def request(self, i: int) -> RequestSpec:
        """Request ``i``: call ``i % MAX_SESSION_CALLS`` of session ``i // MAX_SESSION_CALLS``
        (:func:`~lbtune.scenario.sessionplan.call_index`); ``IndexError`` past the plan."""
        if i < 0:
            raise IndexError(f"request index must be >= 0, got {i}")
        s, k = split(i)
        sess = self._session(s)
        if k >= len(sess.calls):
            raise IndexError(f"request {i}: session {s} has {len(sess.calls)} calls, no call {k}")
        call, plan_call = sess.calls[k], sess.plan.calls[k]
        chain: list[int] = []
        p = call.prev
        while p is not None:
            chain.append(p)
            p = sess.calls[p].prev
        parts: list[Part] = []
        if sess.group is not None and self.agent.prefix is not None:
            parts.append(("system", self._context(sess.group, self.agent.prefix.tokens)))
        parts.append(("user", sess.tasks[plan_call.agent]))
        for p in reversed(chain):
            parts.extend(sess.calls[p].adds)
        n_tokens, messages, prompt = render_parts(sess.api, parts)
        return RequestSpec(
            index=i,
            api=sess.api,
            model=sess.model,
            max_tokens=call.max_tokens,
            stream=call.stream,
            prompt_tokens=n_tokens,
            messages=messages,
            prompt=prompt,
            priority=sess.priority,
            prefix_group=sess.group,
            session_id=s,
            turn=k,
            extra_body=dict(self._extra),
            traffic_class="agent" if plan_call.agent == 0 else "subagent",
        )

    def __getitem__(self, i: int) -> RequestSpec:
        return self.request(i)
