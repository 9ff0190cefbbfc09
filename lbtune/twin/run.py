"""One run of a plan against the embedded cluster, in virtual time: :func:`simulate`.

A discrete-event simulation: one heap of timed events, no sockets, no sleeping. The
clients follow the live generator's rules (:mod:`lbtune.twin.load`), each request goes
through the balancer's routing model (:mod:`lbtune.twin.routing`) to a replica
(:mod:`lbtune.twin.replica`), whose engine is only stepped while it has work. Every
request leaves the record the live client would (:mod:`lbtune.twin.flight`), so the same
metrics, censoring and objective read a twin run and a live one::

    source = RequestSource(plan)                       # reusable across trials
    run = simulate(plan, replicas, model, TwinOptions(time_scale=4), Reuse(source))
    run.summary().latency.e2e.p99

The path of one request: send → balancer (``route``) → replica after ``to_replica_s``
→ engine after the GPU profile's request overhead / time scale → tokens at the ends of
the engine steps that produce them (+ ``to_client_s`` to the client) → end, which frees
the balancer's slot (``on_end``) and lets a closed-loop user send again. The run ends
at the plan's duration plus ``grace_s``: what is still in flight then is ``cancelled``,
as the live generator's drain leaves it.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lbtune.errors import ConfigError
from lbtune.records.requests import ERROR_OUTCOMES, Outcome, RequestRecord
from lbtune.scenario.runplan import RunPlan
from lbtune.sim.engine import Engine, SimRequest, StepResult
from lbtune.sim.textgen import ApiError, ParsedRequest
from lbtune.twin.flight import Flight, record_of
from lbtune.twin.load import ClosedLoop, User
from lbtune.twin.options import TwinOptions
from lbtune.twin.replica import ReplicaSim, TwinReplica
from lbtune.twin.requests import RequestSource
from lbtune.twin.result import TwinRun
from lbtune.twin.routing import ClusterView, Queue, Refuse, Retry, RoutingModel, Send

__all__ = ["Reuse", "simulate"]

Handler = Callable[[float, Any], None]


@dataclass(frozen=True)
class Reuse:
    """What a run may take over from earlier ones."""

    source: RequestSource | None = None
    """The requests' text and tokens, built for the same plan (trials of a study share it)."""
    engines: Mapping[str, Engine] | None = None
    """A previous run's :attr:`TwinRun.engines`: the replicas start with its prefix caches,
    as a live cluster keeps them from one trial to the next."""


def simulate(
    plan: RunPlan,
    replicas: Sequence[TwinReplica],
    routing: RoutingModel,
    options: TwinOptions | None = None,
    reuse: Reuse | None = None,
) -> TwinRun:
    """Run ``plan`` against ``replicas`` behind ``routing`` in virtual time, taking over
    what ``reuse`` holds from earlier runs."""
    options = options or TwinOptions()
    reuse = reuse or Reuse()
    source, engines = reuse.source, reuse.engines
    if not replicas:
        raise ConfigError("twin: the cluster has no replica to simulate")
    served = {m for r in replicas for m in r.models}
    missing = [m for m in plan.scenario.model_names() if m not in served]
    if missing:
        raise ConfigError(
            f"twin: scenario {plan.scenario_name} uses {', '.join(missing)}, which no replica "
            f"serves (served: {', '.join(sorted(served))})"
        )
    src = source if source is not None else RequestSource(plan, options.host_seed)
    if src.plan is not plan and src.plan != plan:
        raise ConfigError("twin: the request source was built for another plan")
    cpu0 = time.process_time()
    sim = _Simulation(plan, replicas, routing, options, src)
    if engines is not None:
        sim.carry(engines)
    sim.run()
    return TwinRun(
        records=tuple(sorted(sim.records, key=lambda r: (r.sent_at, r.index))),
        plan=plan,
        ended_at=sim.ended_at,
        unmodeled=tuple(routing.unmodeled),
        cpu_s=time.process_time() - cpu0,
        events=sim.events,
        replica_busy_s={r.name: r.busy_s for r in sim.replicas.values()},
        replica_steps={r.name: r.steps for r in sim.replicas.values()},
        engines={r.name: r.engine for r in sim.replicas.values()},
    )


class _Simulation:
    """The event loop and its handlers (one instance per run)."""

    def __init__(
        self,
        plan: RunPlan,
        replicas: Sequence[TwinReplica],
        routing: RoutingModel,
        opts: TwinOptions,
        source: RequestSource,
    ) -> None:
        self.plan = plan
        self.load = plan.load_plan()
        self.opts = opts
        self.routing = routing
        self.source = source
        self.replicas = {
            r.name: ReplicaSim(r, opts.time_scale, opts.step_extra_s) for r in replicas
        }
        self.view = ClusterView(self.replicas, opts.time_scale)
        self.heap: list[tuple[float, int, Handler, Any]] = []
        self.seq = 0
        self.events = 0
        self.records: list[RequestRecord] = []
        self.open: dict[int, Flight] = {}  # id(flight) -> flight, every flight not ended
        self.by_eid: dict[str, tuple[Flight, ReplicaSim]] = {}
        self.results: dict[str, StepResult] = {}
        self.stopping = False
        self.ended_at = self.load.duration_s
        self.closed = (
            ClosedLoop(self.load, opts.user_start_gap_s) if self.load.mode == "closed" else None
        )
        self.queued: dict[int, Flight] = {}  # request index -> flight held by the balancer
        self.waiting_slot: list[int] = []  # open loop: arrivals held by max_in_flight
        self.serial = 0

    def carry(self, engines: Mapping[str, Engine]) -> None:
        """Start from these (idle) engines: their prefix caches stay warm."""
        for name, engine in engines.items():
            rs = self.replicas.get(name)
            if rs is None or engine.has_work():
                raise ConfigError(f"twin: cannot carry engine {name!r} into this run")
            rs.engine = engine

    # -- the loop ----------------------------------------------------------------------

    def at(self, t: float, handler: Handler, arg: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, handler, arg))

    def run(self) -> None:
        duration = self.load.duration_s
        if self.closed is not None:
            for t in self.closed.tick_times():
                self.at(t, self._shape)
        else:
            for i, t in enumerate(self.load.arrivals):
                self.at(t, self._arrival, i)
        self.at(duration, self._stop)
        self.at(duration + self.opts.grace_s, self._cut)
        self._schedule_tick()
        heap = self.heap
        while heap:
            t, _, handler, arg = heapq.heappop(heap)
            self.events += 1
            handler(t, arg)

    def _schedule_tick(self) -> None:
        nxt = self.routing.next_tick()
        if nxt is not None:
            self.at(nxt, self._tick)

    def _tick(self, t: float, _: Any) -> None:
        self.routing.tick(t, self.view)
        self._schedule_tick()

    def _stop(self, t: float, _: Any) -> None:
        self.stopping = True
        if not self.open:
            self._finish(t)

    def _cut(self, t: float, _: Any) -> None:
        for fl in list(self.open.values()):
            self._abandon(t, fl, "cancelled")
        self._finish(t)

    def _finish(self, t: float) -> None:
        self.ended_at = t
        self.heap.clear()

    # -- clients -----------------------------------------------------------------------

    def _shape(self, t: float, _: Any) -> None:
        assert self.closed is not None
        for start, user in self.closed.shape(t):
            self.at(start, self._user_send, user)

    def _user_send(self, t: float, user: User) -> None:
        assert self.closed is not None
        if self.stopping or user.retired:
            return
        user.busy = True
        self._send(t, self.closed.take_index(), user.uid, None)

    def _arrival(self, t: float, i: int) -> None:
        if self.stopping:
            return
        if len(self.open) >= self.opts.max_in_flight:
            self.waiting_slot.append(i)
            return
        self._send(t, i, None, t)

    def _send(self, t: float, i: int, user: int | None, scheduled: float | None) -> None:
        fl = Flight(self.source[i], t, user, scheduled)
        self.open[id(fl)] = fl
        self.at(t + self.opts.request_timeout_s, self._timeout, fl)
        self._route(t, fl)

    def _client_done(self, fl: Flight, ended_at: float, outcome: Outcome) -> None:
        """A request ended for its client: free its slot; its user sends again."""
        self.open.pop(id(fl), None)
        if self.closed is not None and fl.user is not None and outcome != "cancelled":
            user = self.closed.users[fl.user]
            user.busy = False
            pause = user.pause_after(outcome in ERROR_OUTCOMES)
            self.at(ended_at + pause, self._user_send, user)
        elif self.waiting_slot and not self.stopping:
            i = self.waiting_slot.pop(0)
            self._send(ended_at, i, None, self.load.arrivals[i])
        if self.stopping and not self.open:
            self._finish(max(ended_at, self.load.duration_s))

    # -- the balancer ------------------------------------------------------------------

    def _route(self, t: float, fl: Flight) -> None:
        if fl.ended:
            return
        d = self.routing.route(fl.req, t, self.view)
        if isinstance(d, Send):
            self._forward(t, fl, d.replica)
        elif isinstance(d, Queue):
            fl.queued = True
            self.queued[fl.req.index] = fl
            if d.timeout_s is not None:
                self.at(t + d.timeout_s, self._queue_timeout, fl)
        elif isinstance(d, Refuse):
            self._end_error(t, fl, ApiError(d.status, d.message), None)
        elif isinstance(d, Retry):
            self.at(t + d.after_s, self._route_again, fl)
        else:  # pragma: no cover - the Decision union is closed
            raise TypeError(f"routing model returned {d!r}")

    def _route_again(self, t: float, fl: Flight) -> None:
        self._route(t, fl)

    def _forward(self, t: float, fl: Flight, replica: str) -> None:
        if replica not in self.replicas:
            raise ConfigError(f"twin: the routing model picked unknown replica {replica!r}")
        if fl.queued:
            fl.queued = False
            self.queued.pop(fl.req.index, None)
        fl.replica = replica
        self.at(t + self.opts.to_replica_s, self._arrive, fl)

    def _queue_timeout(self, t: float, fl: Flight) -> None:
        if fl.queued and not fl.ended and self.routing.cancel(fl.req, t):
            fl.queued = False
            self.queued.pop(fl.req.index, None)
            self._end_error(t, fl, ApiError(503, "No server is available (queue timeout)"), None)

    def _released(self, t: float, fl: Flight) -> None:
        """``fl`` no longer holds its replica's slot at the balancer."""
        assert fl.replica is not None
        for req, name in self.routing.on_end(fl.req, fl.replica, t):
            queued = self.queued.get(req.index)
            if queued is not None:
                self._forward(t, queued, name)

    # -- the replica -------------------------------------------------------------------

    def _arrive(self, t: float, fl: Flight) -> None:
        if fl.ended:
            return
        assert fl.replica is not None
        rs = self.replicas[fl.replica]
        rs.in_flight += 1
        fl.arrived = True
        fl.arrived_at = t
        parsed = fl.req.parsed
        if isinstance(parsed, ApiError):
            self._replica_error(t, fl, rs, parsed)
        elif fl.req.model not in rs.models:
            err = ApiError(404, f"The model `{fl.req.model}` does not exist.", "model")
            self._replica_error(t, fl, rs, err)
        else:
            self.at(t + rs.overhead_s(fl.req.model) + self.opts.server_extra_s, self._admit, fl)

    def _admit(self, t: float, fl: Flight) -> None:
        if fl.ended:
            return
        assert fl.replica is not None
        rs = self.replicas[fl.replica]
        p = fl.req.parsed
        assert isinstance(p, ParsedRequest)
        self.serial += 1
        fl.eid = str(self.serial)
        err = rs.admit(SimRequest(fl.eid, p.model, p.prompt_ids, p.output_tokens, t))
        if err is not None:
            self._replica_error(t, fl, rs, err)
            return
        fl.admitted = True
        fl.admitted_at = t
        self.by_eid[fl.eid] = (fl, rs)
        if fl.req.stream:
            fl.headers_at = t + self.opts.to_client_s
            self.routing.on_headers(fl.req, rs.name, t)
        if not rs.busy:
            self._step(t, rs)

    def _step(self, t: float, rs: ReplicaSim) -> None:
        started = rs.start_step(t)
        if started is None:
            rs.busy = False
            return
        end, res = started
        for eid in res.scheduled_first:
            entry = self.by_eid.get(eid)
            if entry is not None:
                rs.observe_queue(max(0.0, t - entry[0].admitted_at))
        self.results[rs.name] = res
        self.at(end, self._step_end, rs)

    def _step_end(self, t: float, rs: ReplicaSim) -> None:
        res = self.results.pop(rs.name)
        rs.busy = False
        back = t + self.opts.to_client_s
        keep = self.opts.chunk_times
        by_eid = self.by_eid
        for eid in res.tokens:
            entry = by_eid.get(eid)
            if entry is None:  # aborted while the step ran
                continue
            fl = entry[0]
            if fl.output_tokens == 0:
                rs.observe_ttft(t - fl.arrived_at, fl.req.prompt_tokens)
            else:
                rs.observe_itl(t - fl.last_token_at)
            fl.output_tokens += 1
            fl.last_token_at = t
            if fl.req.stream and (keep or not fl.chunks or eid in res.finished):
                fl.chunks.append(back)
        for eid in res.finished:
            entry = by_eid.pop(eid, None)
            if entry is not None:
                self._end_ok(t, entry[0], rs)
        self._step(t, rs)

    # -- ends --------------------------------------------------------------------------

    def _end_ok(self, t: float, fl: Flight, rs: ReplicaSim) -> None:
        fl.ended = True
        rs.in_flight -= 1
        ended_at = t + self.opts.to_client_s
        if not fl.req.stream:
            self.routing.on_headers(fl.req, rs.name, t)
        self.records.append(record_of(fl, "ok", ended_at, rs.name))
        self._released(t, fl)
        self._client_done(fl, ended_at, "ok")

    def _replica_error(self, t: float, fl: Flight, rs: ReplicaSim, err: ApiError) -> None:
        rs.in_flight -= 1
        self.routing.on_headers(fl.req, rs.name, t)
        self._end_error(t, fl, err, rs.name)
        self._released(t, fl)
        if not rs.busy:
            self._step(t, rs)

    def _end_error(self, t: float, fl: Flight, err: ApiError, replica: str | None) -> None:
        fl.ended = True
        ended_at = t + self.opts.to_client_s
        self.records.append(record_of(fl, "http_error", ended_at, replica, err))
        self._client_done(fl, ended_at, "http_error")

    def _timeout(self, t: float, fl: Flight) -> None:
        if not fl.ended:
            self._abandon(t, fl, "timeout")

    def _abandon(self, t: float, fl: Flight, outcome: Outcome) -> None:
        """The client gives up on ``fl`` (its timeout, or the run's end)."""
        fl.ended = True
        if fl.queued:
            self.routing.cancel(fl.req, t)
            self.queued.pop(fl.req.index, None)
        elif fl.replica is not None:
            rs = self.replicas[fl.replica]
            if fl.arrived:
                rs.in_flight -= 1
            if fl.admitted and fl.eid in self.by_eid:
                del self.by_eid[fl.eid]
                rs.abort(fl.eid)
            self._released(t, fl)
            if not rs.busy:
                self._step(t, rs)
        if outcome == "cancelled":
            error = "cut off when the test stopped"
        else:
            error = f"no end after {t - fl.sent_at:g} s"
        seen = fl.replica if fl.headers_at is not None else None
        self.records.append(record_of(fl, outcome, t, seen, error))
        self._client_done(fl, t, outcome)
