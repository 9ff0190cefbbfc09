"""From an agentic trace's sessions to the run's session starts and causal calls.

Selection, pure in trace, source and seed (like :mod:`.replay`'s for requests), counted in
sessions:

* ``rate_scale`` keeps each session with a seeded draw keyed by its line (the same
  sessions every run);
* ``start`` skips the sessions that start earlier than the first kept session's start plus
  ``start`` seconds (the window's beginning);
* ``limit`` keeps the window's first N sessions.

A kept session starts ``(start_s - window start) / speedup`` seconds into the run (the
open-loop plan's arrivals), and its calls' ``delay_s`` (tool runs, a user's think time) are
divided by ``speedup`` too: a faster replay compresses the client side's time, never the
cluster's, since each call still waits for the answers it depends on. Session ``s`` is kept
session ``s % n``: a closed loop runs sessions back to back and starts the window over, as
an untimed trace does; its call ``k`` is request ``call_index(s, k)``.

Prompt text, pure in seed, session and call. A call with ``hash_ids`` is built of
Mooncake-style blocks (:class:`~.replay.BlockText`): equal leading ids, a shared prefix.
Otherwise the context grows causally, so prefix caches see the sharing a real agent's do:

* call k = its agent's previous call's messages, that call's answer (an ``assistant``
  message of its output length), then new text (a ``user`` message: tool output, the
  user's turn, rejoining subagents' results) up to the call's ``prompt_tokens``;
* a subagent's first call = the messages of the latest call it waited for (its parent's
  prompt), then its own new text;
* a call with neither starts fresh; so does one whose ``prompt_tokens`` is below the
  context it would inherit plus one token: its agent compacted the context. A fresh call
  without hash ids whose trace says ``cached_tokens`` were served from a cache begins with
  a ``system`` message of that many tokens, keyed by the count alone: the context (system
  prompt, tools) that other sessions sent before it, shared by every such call of equal
  count (the same rule ``scenarios fit`` groups shared contexts by).

Texts are synthesized when a request is built (string slices), so the session cache holds
only each call's plan and the keys of its texts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lbtune.errors import ConfigError
from lbtune.scenario import draws
from lbtune.scenario.limits import AGENT_SESSION_CACHE
from lbtune.scenario.mix import Part, TrafficMix, render_parts, request_extra, resolve_classes
from lbtune.scenario.models import Scenario
from lbtune.scenario.prompts import TextSynth
from lbtune.scenario.request import Api, RequestSpec
from lbtune.scenario.sessionplan import Call, SessionPlan, call_index, split
from lbtune.scenario.traces.read import check_pinned
from lbtune.scenario.traces.readsessions import read_sessions
from lbtune.scenario.traces.replay import BlockText, span_of
from lbtune.scenario.traces.sessiongraph import TraceSession
from lbtune.scenario.traces.spec import TraceSource

__all__ = ["SessionReplay", "TraceSessionWorkload", "session_replay_of"]

_KEEP = 0x7E5
_SESSION = 0x7E6
_STREAM = 0x7E7
_NEW = 0x7E8
_ANSWER = 0x7E9
_SHARED = 0x7EA
_SHARED_GROUP = 0x40000000
"""Prefix group of a cached context: ``_SHARED_GROUP | tokens`` (it equals a block-id
group only if that id's low 31 bits happen to be the same number)."""


@dataclass(frozen=True)
class SessionReplay:
    """The kept sessions of an agentic trace, in start order, and their start offsets."""

    sessions: tuple[TraceSession, ...]
    offsets: tuple[float, ...]
    """Seconds from the run's start to each session's start."""
    source: TraceSource

    @property
    def span_s(self) -> float:
        """Replay length: the last session's start plus one mean gap (:func:`span_of`)."""
        return span_of(self.offsets)


def session_replay_of(scenario: Scenario, seed: int | None = None) -> SessionReplay:
    """The selection of ``scenario.source`` (ConfigError unless it is an agentic trace)."""
    src = scenario.source
    if src is None or not src.sessions:
        raise ConfigError(f"scenario '{scenario.name}' replays no agentic trace")
    check_pinned(src)
    sessions = read_sessions(src.trace, src.format)  # cached while the file is unchanged
    return _select(src, _Same(sessions), scenario.seed if seed is None else seed)


@dataclass(frozen=True, eq=False)
class _Same:
    """The parsed trace as a cache key, by identity: ``read_sessions`` hands out the same
    tuple while the file is unchanged, and hashing every call would cost a pass over it."""

    sessions: tuple[TraceSession, ...]

    def __hash__(self) -> int:
        return id(self.sessions)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.sessions is self.sessions


@lru_cache(maxsize=8)
def _select(src: TraceSource, trace: _Same, seed: int) -> SessionReplay:
    sessions = trace.sessions
    if src.rate_scale < 1:
        sessions = tuple(x for x in sessions if draws.uniform(seed, _KEEP, x.line) < src.rate_scale)
    t0 = (sessions[0].start_s if sessions else 0.0) + src.start
    kept = [x for x in sessions if x.start_s >= t0][: src.limit]
    if not kept:
        raise ConfigError(
            f"{src.trace}: no session to replay from start={src.start:g} s ({len(sessions)} of "
            f"the trace's {len(trace.sessions)} kept by rate_scale={src.rate_scale:g})"
        )
    offsets = tuple((x.start_s - t0) / src.speedup for x in kept)
    return SessionReplay(tuple(kept), offsets, src)


@dataclass(frozen=True, slots=True)
class _CallText:
    """How one call's prompt is written (its texts are synthesized per request)."""

    base: int | None
    """Position of the call whose messages this prompt begins with (``None``: fresh)."""
    answer: bool
    """The base call's answer follows its messages (``False``: a subagent's first call)."""
    new_tokens: int
    """Tokens of the call's own text (a call with hash ids: all of its prompt, as blocks)."""
    shared_tokens: int
    """Of a fresh call's own text without hash ids: the leading tokens the trace says a
    cache served (``cached_tokens``), sent as a context shared by every fresh call with
    the same count (a system prompt and tools other sessions sent before it)."""
    total: int
    """Tokens of the whole prompt (as targeted: a tokenizer file may count a few more)."""
    max_tokens: int
    stream: bool
    model: str
    group: int | None


@dataclass(frozen=True, slots=True)
class _Session:
    plan: SessionPlan
    trace: TraceSession
    api: Api
    priority: int | None
    calls: tuple[_CallText, ...]


class TraceSessionWorkload:
    """Random-access, deterministic replay of an agentic trace's sessions (a
    :class:`~lbtune.scenario.sessionplan.SessionSource`); identical in every process for
    the same trace, window and seed."""

    def __init__(
        self, scenario: Scenario, seed: int | None = None, tokenizer_path: str | None = None
    ) -> None:
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        self.replay = session_replay_of(scenario, self.seed)
        self.mix: TrafficMix = resolve_classes(scenario)[0]
        self.synth = TextSynth(tokenizer_path)
        self._blocks = BlockText(self.synth, self.seed, self.replay.source.block_tokens)
        self._extra: dict[str, Any] = request_extra(scenario)
        self._session: Callable[[int], _Session] = lru_cache(maxsize=AGENT_SESSION_CACHE)(
            self._make_session
        )

    def __len__(self) -> int:
        """Sessions in the window (session ``s`` replays kept session ``s % len``)."""
        return len(self.replay.sessions)

    def session(self, s: int) -> SessionPlan:
        """Session ``s`` (0-based): kept session ``s % len(self)``, its delays sped up."""
        if s < 0:
            raise IndexError(f"session must be >= 0, got {s}")
        return self._session(s).plan

    def _make_session(self, s: int) -> _Session:
        trace = self.replay.sessions[s % len(self.replay.sessions)]
        speedup = self.replay.source.speedup
        u = draws.uniforms(self.seed, _SESSION, trace.line, n=3)
        model = self.mix.model(u[1])
        plan: list[Call] = []
        texts: list[_CallText] = []
        last_of: dict[int, int] = {}  # agent -> its latest call so far
        for k, c in enumerate(trace.calls):
            plan.append(Call(call_index(s, k), c.after, c.delay_s / speedup, c.agent))
            base, answer = last_of.get(c.agent), True
            if base is None and c.after:  # a subagent's first call: its parent's prompt
                base, answer = max(c.after), False
            max_tokens = max(c.output_tokens, 1)
            inherited = 0
            if base is not None:
                inherited = texts[base].total + (texts[base].max_tokens if answer else 0)
            if c.hash_ids or base is None or c.prompt_tokens < inherited + 1:
                base, inherited = None, 0  # blocks, a first call, or a compacted context
            shared = 0
            if base is None and not c.hash_ids:
                shared = max(0, min(c.cached_tokens, c.prompt_tokens - 1))
            group = BlockText.group(c.hash_ids) if base is None else texts[base].group
            if shared:
                group = _SHARED_GROUP | shared
            new = max(c.prompt_tokens - inherited, 1)
            texts.append(
                _CallText(
                    base=base,
                    answer=answer,
                    new_tokens=new,
                    shared_tokens=shared,
                    total=inherited + new,
                    max_tokens=max_tokens,
                    stream=draws.uniform(self.seed, _STREAM, trace.line, k) < self.mix.stream,
                    model=c.model if c.model in self.scenario.models else model,
                    group=group,
                )
            )
            last_of[c.agent] = k
        return _Session(
            plan=SessionPlan(session=s, calls=tuple(plan)),
            trace=trace,
            api=self.mix.api(u[0]),
            priority=self.mix.priority(u[2]),
            calls=tuple(texts),
        )

    def request(self, i: int) -> RequestSpec:
        """Request ``i``: call ``k`` of session ``s`` (``i = call_index(s, k)``);
        ``IndexError`` past the session's last call."""
        if i < 0:
            raise IndexError(f"request index must be >= 0, got {i}")
        s, k = split(i)
        sess = self._session(s)
        if k >= len(sess.calls):
            raise IndexError(f"request {i}: session {s} has {len(sess.calls)} calls, no call {k}")
        call = sess.calls[k]
        n_tokens, messages, prompt = render_parts(sess.api, self._parts(sess, k))
        return RequestSpec(
            index=i,
            api=sess.api,
            model=call.model,
            max_tokens=call.max_tokens,
            stream=call.stream,
            prompt_tokens=n_tokens,
            messages=messages,
            prompt=prompt,
            priority=sess.priority,
            prefix_group=call.group,
            session_id=s,
            turn=k,
            extra_body=dict(self._extra),
            traffic_class="trace",
        )

    def __getitem__(self, i: int) -> RequestSpec:
        return self.request(i)

    def _parts(self, sess: _Session, k: int) -> list[Part]:
        """Call ``k``'s messages: its chain of bases from the first, each followed by the
        answer that came after it (when inherited with one), then the call's own text."""
        chain: list[int] = []
        p: int | None = k
        while p is not None:
            chain.append(p)
            p = sess.calls[p].base
        line = sess.trace.line
        parts: list[Part] = []
        for p in reversed(chain):
            call = sess.calls[p]
            if call.base is not None and call.answer:
                base = sess.calls[call.base]
                answer = self.synth.text(self.seed, (_ANSWER, line, call.base), base.max_tokens)
                parts.append(("assistant", answer))
            hash_ids = sess.trace.calls[p].hash_ids if call.base is None else None
            key, n = (_NEW, line, p), call.new_tokens
            if call.shared_tokens:
                shared = call.shared_tokens
                parts.append(("system", self.synth.text(self.seed, (_SHARED, shared), shared)))
                n -= shared
            own = (
                self._blocks.text(hash_ids, n, key)
                if hash_ids
                else self.synth.text(self.seed, key, n)
            )
            parts.append(("user", own))
        return parts
