"""Defect 9 of issue 16: when a replica dies mid-run, the balancer's own errors are put on
it in the per-replica table, and the report says which replica went down when.

The pure rules on synthetic samples first; then a replica killed under a real stress run
against HAProxy (``mini2``: ``h100-0`` is the only replica of the 70B model, so once it is
dead HAProxy answers every 70B request itself with a 503 that carries no replica header).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest
import requests
from rich.console import Console

from lbtune.cli.stress import _print_summary
from lbtune.metrics.replica_events import ReplicaSample, ReplicaTimeline, events, owners
from lbtune.metrics.stats import replica_stats, summarize
from lbtune.metrics.summary import RunSummary, Window
from lbtune.metrics.summary_file import dumps, summary_from_data
from lbtune.records.endpoints import ReplicaEndpoint
from lbtune.records.requests import ERROR_OUTCOMES, RequestRecord
from lbtune.report.frame import replica_events as event_lines
from lbtune.run import replica_watch
from lbtune.run.replica_watch import EXTERNAL, ReplicaWatch
from lbtune.targets.base import ReplicaRow
from tests.conftest import running_cluster
from tests.metrics.records import rec
from tests.targets.test_haproxy_target import fake_endpoints

T0 = 1_000_000.0


def _samples(name: str, states: list[tuple[float, bool, int]]) -> list[ReplicaSample]:
    return [ReplicaSample(T0 + t, name, "DOWN" if d else "UP", d, f) for t, d, f in states]


def _proxy_503(i: int, sent: float, model: str = "m") -> RequestRecord:
    r = rec(i, sent=T0 + sent, outcome="http_error", replica=None, ttft=None, e2e=0.05)
    return dataclasses.replace(r, status_code=503, model=model)


# a: up, errors counted at 2.0-2.5 s, down from 3.0 s, back up at 6.0 s; b: up throughout.
TIMELINE = ReplicaTimeline(
    source="haproxy",
    samples=(
        *_samples(
            "a",
            [
                (0, False, 0),
                (2.0, False, 0),
                (2.5, False, 4),
                (3.0, True, 6),
                (4.0, True, 6),
                (6.0, False, 6),
                (8.0, False, 6),
            ],
        ),
        *_samples("b", [(0, False, 0), (4.0, False, 0), (8.0, False, 0)]),
    ),
    models={"a": ("m", "big"), "b": ("m",)},
)


def test_an_outage_is_named_with_its_times_and_request_count() -> None:
    records = [rec(i, sent=T0 + 0.1 * i, replica="b") for i in range(25)]  # sent until 2.4 s
    ev = events(TIMELINE, records, records, run_start=T0)
    assert ev.known and ev.source == "haproxy"
    (o,) = ev.outages
    assert (o.replica, o.down_s, o.up_s, o.trouble_s) == ("a", 3.0, 6.0, 2.0)
    assert o.after_requests == 25
    summary = dataclasses.replace(_summary(records, TIMELINE), replica_events=ev)
    line = (
        "replica a went DOWN at t=3.0 s (after 25 requests, first errors at t=2.0 s), "
        "back UP at t=6.0 s."
    )
    assert event_lines(summary) == [line]
    console = Console(record=True, width=300)
    _print_summary(console, summary)  # what `lbtune stress` prints
    assert line in console.export_text()


def test_balancer_errors_go_to_the_one_replica_of_the_model_that_was_down() -> None:
    records = [
        _proxy_503(0, 2.2),  # errors counted on a (between samples at 2.0 and 2.5)
        _proxy_503(1, 4.5, model="big"),  # a down
        _proxy_503(2, 7.0),  # nobody down or failing: unattributed
        rec(3, sent=T0 + 4.5, replica="b"),
        dataclasses.replace(
            rec(4, sent=T0 + 4.5, replica=None, outcome="http_error"), status_code=429
        ),  # balancer's own 429: not a replica's
    ]
    owned, why = owners(records, TIMELINE)
    assert owned == ["a", "a", None, "b", None]
    assert why == {"no replica was down or failing while it was answered": 1}
    reps = {r.replica: r for r in replica_stats(records, TIMELINE)}
    assert (reps["a"].sent, reps["a"].errors, reps["a"].balancer_errors) == (2, 2, 2)
    assert reps["unknown"].sent == 2 and reps["unknown"].balancer_errors == 0
    assert sum(r.sent for r in reps.values()) == len(records)
    ev = events(TIMELINE, records, records, run_start=T0)
    assert ev.unattributed == 1
    lines = event_lines(dataclasses.replace(_summary(records, TIMELINE), replica_events=ev))
    assert lines[-1] == (
        "unattributed: 1, balancer answered itself "
        "(1: no replica was down or failing while it was answered)."
    )


def test_two_replicas_of_the_model_down_is_said_not_guessed() -> None:
    both = ReplicaTimeline(
        "haproxy",
        (
            *_samples("a", [(0, False, 0), (1, True, 0), (2, True, 0)]),
            *_samples("b", [(0, False, 0), (1, True, 0), (2, True, 0)]),
        ),
        {"a": ("m",), "b": ("m",)},
    )
    owned, why = owners([_proxy_503(0, 1.5)], both)
    assert owned == [None]
    assert why == {"several replicas of m were down or failing (a, b)": 1}


def test_an_external_target_says_unknown_and_counts_what_it_cannot_attribute() -> None:
    with ReplicaWatch(None) as watch:
        pass
    timeline = watch.timeline()
    assert not timeline.known and timeline.reason == EXTERNAL
    records = [_proxy_503(0, 1.0), rec(1, sent=T0 + 1, replica="b")]
    ev = events(timeline, records, records, run_start=T0)
    assert not ev.known and ev.reason == EXTERNAL and ev.outages == ()
    assert ev.unattributed == 1 and EXTERNAL in ev.unattributed_reason
    # No response named a replica: a header-less 5xx is no sign of the balancer.
    bare = [_proxy_503(0, 1.0), rec(1, sent=T0 + 1, replica=None)]
    assert events(timeline, bare, bare, run_start=T0).unattributed == 0


@pytest.mark.parametrize("down", [None, False], ids=["cannot-say", "can-say"])
def test_the_watch_asks_again_only_a_balancer_that_can_say(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, down: bool | None
) -> None:
    calls: list[float] = []

    class Fake:
        def replica_rows(self, ep: object) -> list[ReplicaRow]:
            calls.append(time.time())
            return [ReplicaRow("a", "healthy", down=down)]

    monkeypatch.setattr(replica_watch, "balancer", lambda name: Fake())
    one = ReplicaEndpoint(name="a", url="http://127.0.0.1:1", models=["m"])
    ep = fake_endpoints(tmp_path).model_copy(update={"balancer": "fake", "replicas": [one]})
    with ReplicaWatch(ep, interval_s=0.01) as watch:
        deadline = time.monotonic() + 10
        while down is not None and len(calls) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    timeline = watch.timeline()
    if down is None:
        assert len(calls) == 1
        assert not timeline.known and timeline.reason == "fake does not say when a replica is down"
    else:
        assert len(calls) >= 5 and timeline.known and timeline.models == {"a": ("m",)}


def test_the_events_survive_summary_json() -> None:
    records = [_proxy_503(0, 4.5), rec(1, sent=T0 + 1, replica="b")]
    s = _summary(records, TIMELINE)
    assert s.replica_events is not None and s.replica_events.outages[0].replica == "a"
    back = summary_from_data(json.loads(dumps(s)))
    assert back.replica_events == s.replica_events
    assert {r.replica: r.balancer_errors for r in back.replicas} == {"a": 1, "b": 0}
    old = {k: v for k, v in json.loads(dumps(s)).items() if k != "replica_events"}
    assert summary_from_data(old).replica_events is None  # a summary from before


def _summary(records: list[RequestRecord], timeline: ReplicaTimeline) -> RunSummary:
    return summarize(
        records,
        run_start=T0,
        window=Window(T0, T0 + 10),
        scenario="s",
        target="t",
        replicas=timeline,
    )


# --- a replica killed under a real run ------------------------------------------------------

SCENARIO = """\
name: two-models
duration_s: 14
load: {type: constant, users: 6}
models: {llama-3.1-8b-instruct: 1, llama-3.1-70b-instruct-awq: 1}
prompt_tokens: {type: fixed, value: 16}
output_tokens: {type: fixed, value: 8}
"""


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_replica_killed_mid_run_is_named_and_haproxys_errors_are_put_on_it(
    tmp_path: Path,
) -> None:
    from lbtune.loadgen.recordio import read_records
    from lbtune.metrics.replica_events import balancer_made
    from lbtune.run.stress import StressOptions, run_stress

    scen = tmp_path / "two-models.yaml"
    scen.write_text(SCENARIO)
    with running_cluster(tmp_path / "state", time_scale=8.0) as ep:
        victim = next(r for r in ep.replicas if r.name == "h100-0")
        out = tmp_path / "report"
        done = threading.Event()
        killed_at: list[float] = []

        def kill_when_loaded() -> None:
            deadline = time.monotonic() + 60
            flowing = None  # when the first records appeared
            while time.monotonic() < deadline and not done.is_set():
                served = sum(p.stat().st_size for p in out.glob("records-*.jsonl"))
                if served and flowing is None:
                    flowing = time.monotonic()
                # A few dozen requests recorded (or 4 s of load): well inside the 14 s run.
                if served > 20_000 or (flowing is not None and time.monotonic() - flowing > 4):
                    break
                time.sleep(0.1)
            killed_at.append(time.time())
            requests.post(f"{victim.url}/admin/crash", json={}, timeout=5)

        saboteur = threading.Thread(target=kill_when_loaded)
        saboteur.start()
        try:
            result = run_stress(
                StressOptions(scenario=str(scen), state_dir=Path(ep.state_dir), out_dir=out)
            )
        finally:
            done.set()
            saboteur.join(timeout=30)

    s = result.summary
    records = read_records(result.records_path)
    # Every request is accounted for, in the run and in the window's table.
    every = s.all_outcomes
    errors = sum(n for o, n in every.counts.items() if o in ERROR_OUTCOMES)
    assert every.sent == len(records) == every.counts["ok"] + errors + every.counts["cancelled"]
    assert sum(r.sent for r in s.replicas) == s.outcomes.sent
    # The killed replica is named, with a down time inside the run, after the kill.
    ev = s.replica_events
    assert ev is not None and ev.known and ev.source == "haproxy", ev
    (o,) = [o for o in ev.outages if o.replica == "h100-0"]
    ran_s = result.load.ended_at - result.load.started_at
    assert killed_at and killed_at[0] - result.load.started_at <= o.down_s < ran_s
    assert o.up_s is None  # a crashed replica stays dead
    assert 0 < o.after_requests < len(records)
    assert [x.replica for x in ev.outages] == ["h100-0"]
    # HAProxy's own 503s (70B: no other replica) are put on it, none left unknown.
    window = Window(s.window.start, s.window.end)
    mine = [r for r in records if balancer_made(r) and window.contains(r.sent_at)]
    assert mine, "HAProxy must have answered some 70B requests itself"
    assert {r.model for r in mine} == {"llama-3.1-70b-instruct-awq"}
    reps = {r.replica: r for r in s.replicas}
    assert reps["h100-0"].balancer_errors == len(mine)
    assert ev.unattributed == 0
    assert reps.get("unknown") is None or reps["unknown"].balancer_errors == 0
    # The report says it, from summary.json.
    line = f"replica h100-0 went DOWN at t={o.down_s:.1f} s (after {o.after_requests} requests"
    assert line in (out / "report.md").read_text()
    assert line in (out / "report.html").read_text()
    saved = json.loads((out / "summary.json").read_text())["replica_events"]
    assert saved["outages"][0]["replica"] == "h100-0"
