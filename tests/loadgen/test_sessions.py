"""Agent sessions in the generator: the executor's timing and policies, and real runs.

The workload here is :class:`FakeSessions`, a hand-made
:class:`~lbtune.scenario.sessionplan.SessionSource`: the executor and the users are
written against that interface only, and a fixed graph (a chain, a fan-out of two
subagents, their rejoin) makes every due time checkable by hand. The real
:class:`~lbtune.scenario.agent.AgentWorkload` (its graphs and contents) is tested in
``tests/scenario``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gevent
import pytest

from lbtune.loadgen.recordio import finalize, read_records
from lbtune.loadgen.runner import LoadConfig, run_load
from lbtune.loadgen.sessions import SessionRun, is_sessions, run_session
from lbtune.loadgen.settings import GeneratorSettings, SourceSettings, write_settings
from lbtune.loadgen.source import FixedWorkload
from lbtune.records.requests import Outcome, RequestRecord
from lbtune.scenario import build_workload, load_scenario
from lbtune.scenario.request import RequestSpec
from lbtune.scenario.sessionplan import Call, SessionPlan, SessionSource, call_index, split
from tests.metrics import records

ROOT = Path(__file__).resolve().parents[2]

GRAPH: tuple[tuple[tuple[int, ...], float, int], ...] = (
    ((), 0.0, 0),  # 0: the task
    ((0,), 0.03, 0),  # 1: after a tool run
    ((1,), 0.01, 1),  # 2: subagent 1 ...
    ((1,), 0.02, 2),  # 3: subagent 2, in parallel
    ((2,), 0.0, 1),  # 4: subagent 1's second call
    ((3, 4), 0.02, 0),  # 5: the rejoin: after the last of both subagents
)
"""(after, delay_s, agent) of each call of every fake session."""
OUTPUT = (3, 3, 8, 2, 4, 3)
"""Tokens each call asks for (the echo server streams exactly that many)."""


@dataclass(frozen=True)
class FakeSessions:
    """Every session is :data:`GRAPH`; with ``fail_every`` n, call 1 of every n-th
    session fails (HTTP 500: the echo server's ``x-http-500`` model)."""

    fail_every: int = 0

    def session(self, s: int) -> SessionPlan:
        calls = tuple(
            Call(call_index(s, k), after, delay, agent)
            for k, (after, delay, agent) in enumerate(GRAPH)
        )
        return SessionPlan(s, calls)

    def failing(self, s: int) -> bool:
        return self.fail_every > 0 and s % self.fail_every == self.fail_every - 1

    def request(self, i: int) -> RequestSpec:
        s, k = split(i)
        model = "x-http-500" if k == 1 and self.failing(s) else "echo"
        return FixedWorkload(model=model, prompt_tokens=8, output_tokens=OUTPUT[k]).request(i)


def rec(pos: int, sent: float, ended: float, outcome: Outcome = "ok") -> RequestRecord:
    return records.rec(pos, sent=sent, e2e=ended - sent, outcome=outcome)


def plan(*calls: tuple[tuple[int, ...], float]) -> SessionPlan:
    return SessionPlan(0, tuple(Call(k, after, d) for k, (after, d) in enumerate(calls)))


def dues(run: SessionRun) -> dict[int, float]:
    return {pos: due for pos, _call, due in run.ready()}


# -- SessionRun: the bookkeeping, by hand ------------------------------------------------


def test_a_chain_is_due_at_each_end_plus_its_delay() -> None:
    run = SessionRun(plan(((), 0.5), ((0,), 0.2), ((1,), 0.0)), start=100.0)
    assert dues(run) == {0: 100.5}
    assert dues(run) == {}  # handed out once
    run.ended(0, rec(0, 100.5, 101.0))
    assert dues(run) == {1: 101.2}
    run.ended(1, rec(1, 101.2, 102.0))
    assert dues(run) == {2: 102.0}
    run.ended(2, rec(2, 102.0, 103.0))
    assert dues(run) == {}
    res = run.result()
    assert [r.index for r in res.records] == [0, 1, 2]
    assert (res.failed, res.error, res.unsent) == (False, False, 0)


def test_a_fan_out_starts_together_and_rejoins_after_the_last_end() -> None:
    run = SessionRun(
        plan(((), 0.0), ((0,), 0.1), ((0,), 0.2), ((0,), 0.3), ((1, 2, 3), 0.05)), start=0.0
    )
    assert dues(run) == {0: 0.0}
    run.ended(0, rec(0, 0.0, 10.0))
    assert dues(run) == {1: 10.1, 2: 10.2, 3: 10.3}  # all three at once
    run.ended(2, rec(2, 10.2, 12.0))
    run.ended(1, rec(1, 10.1, 15.0))  # ends last ...
    assert dues(run) == {}
    run.ended(3, rec(3, 10.3, 13.0))  # ... though reported first of the three
    assert dues(run) == {4: 15.05}


def test_a_failed_call_ends_the_session() -> None:
    run = SessionRun(plan(((), 0.0), ((0,), 0.0), ((0,), 0.0), ((1,), 0.0), ((2,), 0.0)), 0.0)
    assert dues(run) == {0: 0.0}
    run.ended(0, rec(0, 0.0, 1.0))
    assert set(dues(run)) == {1, 2}
    run.ended(1, rec(1, 1.0, 1.1, "http_error"))
    assert dues(run) == {}  # not 3 ...
    run.ended(2, rec(2, 1.0, 2.0))  # ... and not 4: the sibling in flight still ends
    assert dues(run) == {}
    res = run.result()
    assert (res.failed, res.error, res.unsent, len(res.records)) == (True, True, 2, 3)


def test_a_call_cut_off_fails_the_session_but_is_no_error() -> None:
    run = SessionRun(plan(((), 0.0), ((0,), 0.0)), 0.0)
    dues(run)
    run.ended(0, rec(0, 0.0, 1.0, "cancelled"))
    res = run.result()
    assert dues(run) == {} and (res.failed, res.error, res.unsent) == (True, False, 1)


def test_an_after_that_does_not_point_back_is_refused() -> None:
    with pytest.raises(ValueError, match="earlier calls"):
        SessionRun(plan(((1,), 0.0), ((), 0.0)), 0.0)


def test_is_sessions() -> None:
    assert is_sessions(FakeSessions())
    assert not is_sessions(FixedWorkload())


# -- run_session: the gevent driver, real time, fake sends ------------------------------


class FakeSend:
    """A send that takes ``durations[pos]`` seconds (``failing``: ends in an HTTP error)
    and keeps (call, due, record) of each call it sent."""

    def __init__(self, durations: dict[int, float], failing: frozenset[int] = frozenset()):
        self.durations, self.failing = durations, failing
        self.sent: list[tuple[Call, float, RequestRecord]] = []

    def __call__(self, call: Call, due: float) -> RequestRecord:
        t0 = time.time()
        gevent.sleep(self.durations.get(call.index, 0.0))
        outcome: Outcome = "http_error" if call.index in self.failing else "ok"
        r = rec(call.index, t0, time.time(), outcome)
        self.sent.append((call, due, r))
        return r


def test_run_session_keeps_every_due_time_and_runs_subagents_at_once() -> None:
    p = FakeSessions().session(0)
    send = FakeSend({0: 0.02, 2: 0.06, 3: 0.02, 4: 0.03})
    t0 = time.time()
    res = run_session(p, send, stopping=lambda: False, start=t0)
    sent = send.sent
    assert len(res.records) == 6 and not res.failed and res.unsent == 0
    by_pos = {c.index: r for c, _d, r in sent}
    for call, due, r in sent:
        ends = [by_pos[d].ended_at for d in call.after]
        assert due == pytest.approx(max(ends, default=t0) + call.delay_s, abs=1e-9)
        assert r.sent_at >= due  # never early
        assert r.sent_at - due < 0.05  # and not much late (an idle 2-core machine: ms)
    # The two subagents overlap; the rejoin waited for the later of their last calls.
    assert by_pos[2].sent_at < by_pos[3].ended_at and by_pos[3].sent_at < by_pos[2].ended_at
    assert by_pos[5].sent_at >= max(by_pos[3].ended_at, by_pos[4].ended_at) + 0.02


def test_run_session_stops_sending_after_a_failure() -> None:
    send = FakeSend({2: 0.05}, failing=frozenset({3}))
    res = run_session(FakeSessions().session(0), send, stopping=lambda: False)
    sent = sorted(c.index for c, _d, _r in send.sent)
    assert sent == [0, 1, 2, 3]  # 2 was in flight when 3 failed: it ended, 4 never went
    assert res.failed and res.error and res.unsent == 2


def test_run_session_sends_nothing_once_stopping() -> None:
    p = plan(((), 0.0), ((0,), 5.0), ((0,), 5.0))
    stop: list[bool] = []
    gevent.spawn_later(0.1, stop.append, True)
    t0 = time.monotonic()
    res = run_session(p, FakeSend({}), stopping=lambda: bool(stop))
    assert time.monotonic() - t0 < 1.0  # at the next look (POLL_S), not after 5 s
    assert [r.index for r in res.records] == [0] and res.unsent == 2 and not res.failed


def test_run_session_raises_what_a_send_raised() -> None:
    def send(call: Call, due: float) -> RequestRecord:
        raise RuntimeError(f"no content for {call.index}")

    with pytest.raises(RuntimeError, match="no content for 0"):
        run_session(plan(((), 0.0)), send, stopping=lambda: False)


def test_killing_a_session_kills_its_calls() -> None:
    killed: list[int] = []

    def send(call: Call, due: float) -> RequestRecord:
        try:
            gevent.sleep(10)
        except gevent.GreenletExit:
            killed.append(call.index)
            raise
        raise AssertionError("not killed")

    p = plan(((), 0.0), ((), 0.0))
    g = gevent.spawn(run_session, p, send, stopping=lambda: False)
    gevent.sleep(0.05)
    g.kill(block=True, timeout=2)
    assert g.dead and sorted(killed) == [0, 1]


# -- real runs: the generator process against the echo server ---------------------------

_DRIVER = """
import sys
from gevent import monkey

monkey.patch_all()
from lbtune.loadgen import worker
from lbtune.loadgen.source import SimplePlan, Source
from tests.loadgen.test_sessions import FakeSessions

mode = sys.argv[2]
plan = (
    SimplePlan(mode="closed", users=3)
    if mode == "closed"
    else SimplePlan(mode="open", arrivals=tuple(0.15 * k for k in range(12)))
)
worker.open_source = lambda settings: Source(FakeSessions(fail_every=4), plan, 2.0)
sys.exit(worker.main(["--config", sys.argv[1]]))
"""


def run_generator(url: str, tmp: Path, mode: str) -> tuple[list[RequestRecord], dict[str, object]]:
    """One generator process (``python -m lbtune.loadgen.worker``'s ``main``) for 2 s,
    with :class:`FakeSessions` as its source (there is no scenario file for it)."""
    settings = GeneratorSettings(
        target_url=url,
        records_dir=str(tmp),
        source=SourceSettings(scenario="fixed:", duration_s=2.0),  # replaced by the driver
        grace_s=2.0,
        request_timeout_s=10.0,
        replica_header="X-Lbtune-Replica",
        max_in_flight=64,
        master_port=0,
        expect_workers=1,
    )
    path = write_settings(tmp / "load-config.json", settings)
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(path), mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    final = next(x for x in lines if x.get("type") == "final")
    return read_records(finalize(tmp)), final


def assert_causal(records: list[RequestRecord], source: SessionSource) -> dict[int, RequestRecord]:
    """Every call was sent once, after each call it waits for ended (ok) plus its delay."""
    by_index = {r.index: r for r in records}
    assert len(by_index) == len(records)  # each call sent once
    for r in records:
        s, k = split(r.index)
        call = source.session(s).calls[k]
        assert call.index == r.index
        for d in call.after:
            dep = by_index.get(call_index(s, d))
            assert dep is not None, f"call {k} of session {s} sent before call {d}"
            assert dep.outcome == "ok", "a call after a failed one was sent"
            assert dep.ended_at <= r.sent_at
        if call.after:
            ended = max(by_index[call_index(s, d)].ended_at for d in call.after)
            assert r.sent_at >= ended + call.delay_s - 1e-6
    return by_index


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["closed", "open"])
def test_sessions_through_the_generator_keep_their_causal_order(
    echo_url: str, tmp_path: Path, mode: str
) -> None:
    records, final = run_generator(echo_url, tmp_path, mode)
    fake = FakeSessions(fail_every=4)
    by_index = assert_causal(records, fake)
    sessions = {split(r.index)[0] for r in records}
    assert len(sessions) >= 4
    overlapped = 0
    for r in records:
        s, k = split(r.index)
        call = fake.session(s).calls[k]
        if mode == "open":  # due: the arrival (first call), else the ends + delay
            assert r.scheduled_at is not None and r.sent_at >= r.scheduled_at
            first = by_index[call_index(0, 0)].scheduled_at
            assert first is not None
            ends = [by_index[call_index(s, d)].ended_at for d in call.after]
            due = max(ends, default=first + 0.15 * s) + call.delay_s
            assert r.scheduled_at == pytest.approx(due, abs=1e-6)
        else:
            assert r.scheduled_at is None  # closed loop: no schedule
        if k == 2 and (sib := by_index.get(call_index(s, 3))) is not None:
            overlapped += r.sent_at < sib.ended_at and sib.sent_at < r.ended_at
    assert overlapped >= 1, "subagents never ran at the same time"
    failing = {s for s in sessions if fake.failing(s)}
    assert failing, "no failing session in the run"
    for s in failing:  # the failed call 1 ended its session: calls 2..5 never went
        assert {split(r.index)[1] for r in records if split(r.index)[0] == s} <= {0, 1}
    counts = final["sessions"]
    assert isinstance(counts, dict)
    assert counts["failed"] == len({s for s in failing if call_index(s, 1) in by_index})
    assert counts["calls_abandoned"] == 4 * counts["failed"]


@pytest.mark.integration
def test_the_agent_scenario_through_run_load(echo_url: str, tmp_path: Path) -> None:
    """The built-in ``agent`` scenario end to end (the runner, its real workload)."""
    cfg = LoadConfig(
        target_url=echo_url,
        scenario="agent",
        records_dir=tmp_path,
        duration_s=3.0,
        grace_s=2.0,
        users=4,
    )
    res = run_load(cfg)
    records = read_records(res.records_path)
    assert res.sent == len(records) > 4 and not res.failures
    workload = build_workload(load_scenario("agent"), cfg.seed)
    assert isinstance(workload, SessionSource)
    assert_causal(records, workload)
    assert all(r.session_id == split(r.index)[0] for r in records)  # the session figures' key
    assert any(split(r.index)[1] > 0 for r in records), "no session got past its first call"
