"""Locust users speaking the OpenAI API with exact per-request timing.

Importing this module imports Locust (which monkey-patches the process with
gevent): import it only in a load-generator process — a ``locust -f`` locustfile
or ``python -m lbtune.loadgen.worker``, never in the tuning driver.

* :class:`LLMUser` — closed loop: each user sends its next request as soon as the
  previous one ended — unless it failed: after an error a user backs off
  exponentially (:mod:`lbtune.loadgen.pacing`: ``BACKOFF_BASE_S`` doubling per consecutive
  error, capped at ``BACKOFF_CAP_S``; a success resets it), so that a dead cluster answering
  with instant 503s is not hammered by an error storm. Usable from a plain locustfile::

      from lbtune.loadgen.user import LLMUser   # noqa: F401  (that is all)

  and run ``locust -f locustfile.py --host http://127.0.0.1:8080
  --lbtune-scenario chat --lbtune-records-dir out/``.
* :class:`AgentUser` — closed loop over agent sessions (a
  :class:`~lbtune.scenario.sessionplan.SessionSource` workload): sessions back to back,
  run by :mod:`lbtune.loadgen.sessions` (which says how their calls are timed and
  recorded); after a session with a failed call it backs off like :class:`LLMUser`.
* :class:`OpenLoopUser` — one per generator process: a dispatcher that sends at
  each scheduled arrival regardless of completions (a greenlet per request, or per
  session, bounded by ``max_in_flight``; hitting the cap is counted), recording
  ``scheduled_at`` and ``sent_at`` so lateness is measured.
* :class:`PlanShape` — a ``LoadTestShape`` that follows the plan's
  ``users_at(t)``.

Request (or session) indices come from one counter per process, strided across
workers (worker k of n sends k, k+n, …), so a seed gives the same traffic for any n.
Every record also fires Locust's ``request`` event (for its UI), but lbtune's
figures come from the records only.
"""

from __future__ import annotations

import itertools
import logging
import os
import uuid
from pathlib import Path
from time import time
from typing import Any

import gevent
import gevent.event
import gevent.pool
from locust import LoadTestShape, User, constant, events, task
from locust.exception import StopUser

from lbtune.loadgen.client import OpenSet, StreamClient
from lbtune.loadgen.exporter import ExporterServer, MetricsRegistry
from lbtune.loadgen.health import HealthSample
from lbtune.loadgen.monitor import HealthMonitor
from lbtune.loadgen.pacing import backoff_s, spawn_rate
from lbtune.loadgen.recordio import RecordWriter
from lbtune.loadgen.sessions import SessionResult, is_sessions, run_session
from lbtune.loadgen.source import Workload, resolve
from lbtune.records.requests import ERROR_OUTCOMES, RequestRecord
from lbtune.safety.secrets import api_key_from_env
from lbtune.scenario.sessionplan import Call, SessionSource

__all__ = [
    "STATE",
    "AgentUser",
    "GeneratorState",
    "LLMUser",
    "OpenLoopUser",
    "PlanShape",
]

log = logging.getLogger(__name__)


class GeneratorState:
    """Everything one generator process shares between its users."""

    def __init__(self) -> None:
        self.workload: Workload | None = None
        self.plan: Any = None
        self.worker = "local"
        self.worker_index = 0
        self.worker_count = 1
        self.run_id = uuid.uuid4().hex[:8]
        self.request_timeout_s = 120.0
        self.replica_header = "X-Lbtune-Replica"
        self.max_in_flight = 4096
        self.locust_stats = True
        self.writer: RecordWriter | None = None
        self.monitor: HealthMonitor | None = None
        self.on_sample: list[Any] = []
        self.on_record: list[Any] = []
        self.stopping = False
        self.sent = 0
        self.completed = 0
        self.in_flight = 0
        self.cap_hits = 0
        self.backoffs = 0
        """Closed loop: pauses users took after failed requests (or sessions)."""
        self.sessions = 0
        self.sessions_failed = 0
        """Sessions that a failed call ended (:mod:`lbtune.loadgen.sessions`)."""
        self.calls_abandoned = 0
        """Calls of those sessions never sent."""
        self.open = OpenSet()
        """Requests sent and not ended, reported with every health sample."""
        self._indices: Any = None
        self._sessions: Any = None
        self._env: Any = None
        self._slot_free = gevent.event.Event()

    def configure(self, **kw: Any) -> None:
        for k, v in kw.items():
            if not hasattr(self, k):
                raise AttributeError(k)
            setattr(self, k, v)

    def load(
        self,
        scenario: str,
        seed: int,
        duration_s: float,
        users: int | None,
        rate: float | None,
        tokenizer_path: str | None = None,
    ) -> None:
        self.workload, self.plan = resolve(scenario, seed, duration_s, users, rate, tokenizer_path)

    def next_index(self) -> int:
        if self._indices is None:
            self._indices = itertools.count(self.worker_index, self.worker_count)
        i: int = next(self._indices)
        return i

    def next_session(self) -> int:
        if self._sessions is None:
            self._sessions = itertools.count(self.worker_index, self.worker_count)
        s: int = next(self._sessions)
        return s

    def start(self, env: Any, records_dir: str | Path | None) -> None:
        """Open the records file and start the health monitor (once per process)."""
        self._env = env
        if records_dir is not None and self.writer is None:
            name = f"records-{self.worker}.jsonl"
            self.writer = RecordWriter(Path(records_dir) / name)
        if self.monitor is None:
            self.monitor = HealthMonitor(self.worker, self.counters, self._sample)
            self.monitor.start()

    def counters(self) -> tuple[int, int, int, int]:
        return self.in_flight, self.sent, self.completed, self.cap_hits

    def _sample(self, s: HealthSample) -> None:
        if self.writer is not None:
            self.writer.flush()
        for cb in self.on_sample:
            cb(s)

    def client(self, host: str) -> StreamClient:
        return StreamClient(
            host,
            api_key=api_key_from_env(),
            replica_header=self.replica_header,
            timeout_s=self.request_timeout_s,
            worker=self.worker,
            id_prefix=f"lbt-{self.run_id}-",
            open_set=self.open,
            # A diagnostic knob (benchmarks/ttft_accuracy.py --loop-stamps): stamp reads
            # with time.time() as before kernel stamps, to compare the two.
            kernel_timestamps=os.environ.get("LBTUNE_TIMESTAMPS", "kernel") != "loop",
        )

    def send(
        self,
        client: StreamClient,
        i: int,
        scheduled_at: float | None = None,
        reserved: bool = False,
    ) -> RequestRecord:
        """Send request ``i``; emit its record whatever happens (even when killed).

        ``reserved``: the caller already counted it in ``in_flight`` (the open-loop
        dispatcher does, before spawning, so the cap holds between spawn and send).
        """
        assert self.workload is not None, "no workload configured (scenario or workload=)"
        if not reserved:
            self.in_flight += 1
        try:
            spec = self.workload.request(i)
        except BaseException:
            self.in_flight -= 1
            raise
        self.sent += 1
        try:
            rec = client.send(spec, scheduled_at=scheduled_at)
        except gevent.GreenletExit as e:
            cut: RequestRecord | None = getattr(e, "record", None)
            if cut is not None:
                self.emit(cut)
            raise
        finally:
            self.in_flight -= 1
            self._slot_free.set()
        self.emit(rec)
        return rec

    def run_session(
        self, client: StreamClient, s: int, start: float, open_loop: bool
    ) -> SessionResult:
        """Run session ``s`` from ``start`` through ``client`` (:mod:`.sessions`)."""
        workload = self.workload
        assert isinstance(workload, SessionSource), "a session workload was expected"

        def send(call: Call, due: float) -> RequestRecord | None:
            if not open_loop:
                rec = self.send(client, call.index)
                if self.monitor is not None:
                    self.monitor.note_idle(rec.sent_at - due, rec.e2e)
                return rec
            self.wait_slot()
            return None if self.stopping else self.send(client, call.index, due)

        self.sessions += 1
        res = run_session(workload.session(s), send, stopping=lambda: self.stopping, start=start)
        if res.error:
            self.sessions_failed += 1
            self.calls_abandoned += res.unsent
        return res

    def emit(self, rec: RequestRecord) -> None:
        self.completed += 1
        mon = self.monitor
        if mon is not None:
            if rec.scheduled_at is not None:
                mon.note_lateness(rec.sent_at - rec.scheduled_at)
            if rec.stream and rec.outcome == "ok" and rec.first_token_at is not None:
                mon.note_ttft(
                    rec.first_token_at - rec.sent_at,
                    rec.first_token_bound_s,
                    rec.timing,
                    rec.read_bound_s,
                )
        if self.writer is not None:
            self.writer.add(rec)
        for cb in self.on_record:
            cb(rec)
        if self.locust_stats and self._env is not None:
            self._env.events.request.fire(
                request_type="SSE" if rec.stream else "POST",
                name=f"/{rec.api}",
                response_time=rec.e2e * 1000.0,
                response_length=rec.output_tokens or 0,
                exception=None if rec.outcome == "ok" else RuntimeError(rec.outcome),
                context={},
            )

    def wait_slot(self) -> None:
        """Block while ``max_in_flight`` requests are outstanding (counted once)."""
        if self.in_flight < self.max_in_flight:
            return
        self.cap_hits += 1
        while self.in_flight >= self.max_in_flight:
            self._slot_free.clear()
            self._slot_free.wait(1.0)

    def drain(self, grace_s: float) -> None:
        """Stop sending, then wait up to ``grace_s`` for in-flight requests."""
        self.stopping = True
        deadline = time() + grace_s
        while self.in_flight and time() < deadline:
            gevent.sleep(0.02)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        if self.writer is not None:
            self.writer.close()


STATE = GeneratorState()


class _ClosedLoopUser(User):
    """What :class:`LLMUser` and :class:`AgentUser` share: workload, client, back-off."""

    abstract = True
    wait_time = constant(0)
    # Class attributes a locustfile may override (command-line options win):
    scenario: str | None = None
    seed: int = 0
    workload: Workload | None = None
    records_dir: str | None = None

    def on_start(self) -> None:
        if STATE.workload is None and self.workload is not None:
            STATE.workload = self.workload
        if STATE.workload is None and self.scenario is not None:
            STATE.load(self.scenario, self.seed, 3600.0, None, None)
        STATE.start(self.environment, self.records_dir)
        self._client = STATE.client(self.host or self.environment.host or "")
        self._last_end: float | None = None
        self._errors = 0

    def on_stop(self) -> None:
        client = getattr(self, "_client", None)
        if client is not None:
            client.close()

    def _after(self, failed: bool) -> None:
        """After a request (or session): pause :func:`backoff_s` of the consecutive failed
        ones, unless stopping; a chosen pause is not starvation (``_last_end`` forgotten)."""
        self._errors = self._errors + 1 if failed else 0
        pause = backoff_s(self._errors)
        if pause > 0:
            STATE.backoffs += 1
            end = time() + pause
            while not STATE.stopping and time() < end:
                gevent.sleep(min(0.1, end - time()))
            self._last_end = None


class LLMUser(_ClosedLoopUser):
    """Closed-loop OpenAI-API user (one keep-alive connection per user)."""

    @task
    def one_request(self) -> None:
        if STATE.stopping:
            raise StopUser()
        rec = STATE.send(self._client, STATE.next_index())
        # Starvation: how long after its previous response ended did this user send?
        if self._last_end is not None and STATE.monitor is not None:
            STATE.monitor.note_idle(rec.sent_at - self._last_end, rec.e2e)
        self._last_end = rec.ended_at
        self._after(rec.outcome in ERROR_OUTCOMES)


class AgentUser(_ClosedLoopUser):
    """Closed-loop agent user: sessions back to back (see the module's docstring)."""

    @task
    def one_session(self) -> None:
        if STATE.stopping:
            raise StopUser()
        # Due when the previous session ended: a late start is this user's idle.
        start = self._last_end if self._last_end is not None else time()
        res = STATE.run_session(self._client, STATE.next_session(), start, open_loop=False)
        self._last_end = max((r.ended_at for r in res.records), default=None)
        self._after(res.error)


class OpenLoopUser(User):
    """The open-loop dispatcher (one instance per generator process)."""

    wait_time = constant(3600)

    def on_start(self) -> None:
        STATE.start(self.environment, None)
        self._client = STATE.client(self.host or self.environment.host or "")
        self._group = gevent.pool.Group()

    @task
    def dispatch(self) -> None:
        arrivals = STATE.plan.arrivals  # sessions: each one's start
        sessions = is_sessions(STATE.workload)
        t0 = time()
        for i in range(STATE.worker_index, len(arrivals), STATE.worker_count):
            if STATE.stopping:
                break
            due = t0 + arrivals[i]
            delay = due - time()
            if delay > 0:
                gevent.sleep(delay)
            STATE.wait_slot()
            if STATE.stopping:
                break
            if sessions:  # each call takes its slot when it is sent
                self._group.spawn(STATE.run_session, self._client, i, due, True)
                continue
            STATE.in_flight += 1  # reserve the slot now; the greenlet runs later
            self._group.spawn(STATE.send, self._client, i, due, True)
        self._group.join()
        while not STATE.stopping:
            gevent.sleep(0.1)
        raise StopUser()

    def on_stop(self) -> None:
        group = getattr(self, "_group", None)
        if group is not None:
            group.kill(block=True, timeout=5)


class PlanShape(LoadTestShape):
    """Closed-loop users from the plan's ``users_at(t)`` (steps are immediate)."""

    use_common_options = False

    def __init__(self, plan: Any, duration_s: float) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.plan = plan
        self.duration_s = duration_s

    def tick(self) -> tuple[int, float] | None:
        run_time: float = self.get_run_time()  # type: ignore[no-untyped-call]
        t = min(run_time, self.duration_s)
        n = max(0, int(self.plan.users_at(t)))
        return n, spawn_rate(n)


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _options(parser: Any) -> None:
    g = parser.add_argument_group("lbtune")
    g.add_argument(
        "--lbtune-scenario",
        default=os.environ.get("LBTUNE_SCENARIO"),
        help="Scenario name/path or fixed:... workload",
    )
    g.add_argument("--lbtune-seed", type=int, default=0)
    g.add_argument("--lbtune-records-dir", default=None, help="Write records-<worker>.jsonl here")
    g.add_argument("--lbtune-timeout", type=float, default=120.0, help="Per-request timeout (s)")
    g.add_argument("--lbtune-replica-header", default="X-Lbtune-Replica")
    g.add_argument("--lbtune-exporter-port", type=int, default=0, help="Serve /metrics here")


@events.init.add_listener  # type: ignore[untyped-decorator]
def _init(environment: Any, **_: Any) -> None:
    """Plain ``locust -f`` runs: configure from the parsed --lbtune-* options."""
    opts = environment.parsed_options
    if opts is None or getattr(opts, "lbtune_scenario", None) is None or STATE.workload:
        return
    STATE.configure(
        request_timeout_s=opts.lbtune_timeout,
        replica_header=opts.lbtune_replica_header,
        locust_stats=True,  # a plain locust run shows Locust's own stats and UI
    )
    STATE.load(opts.lbtune_scenario, opts.lbtune_seed, float(opts.run_time or 3600), None, None)
    if opts.lbtune_records_dir:
        LLMUser.records_dir = AgentUser.records_dir = opts.lbtune_records_dir
    if opts.lbtune_exporter_port:
        reg = MetricsRegistry()
        STATE.on_record.append(reg.observe)
        STATE.on_sample.append(
            lambda s: reg.set_generator(s.worker, s.lateness_p99_s, s.cpu_percent)
        )
        ExporterServer(reg, opts.lbtune_exporter_port)


@events.quitting.add_listener  # type: ignore[untyped-decorator]
def _quitting(environment: Any, **_: Any) -> None:
    if STATE.writer is not None:
        STATE.writer.flush()
