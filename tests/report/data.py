"""A small but complete run for the report tests: 3 replicas, 3 stages, a server side."""

from __future__ import annotations

from dataclasses import dataclass

from lbtune.metrics.stats import summarize
from lbtune.metrics.summary import (
    GeneratorHealth,
    PromClientSide,
    ReplicaServerSide,
    RunSummary,
    ServerSide,
    Window,
)
from lbtune.records.requests import RequestRecord
from lbtune.records.slo import Slo
from tests.metrics.records import rec

T0 = 1_700_000_000.0
WINDOW = Window(T0 + 2, T0 + 30)


@dataclass(frozen=True)
class Step:
    start_s: float
    end_s: float
    users: int | None
    rate: float | None
    label: str


STAGES = (
    Step(0, 10, 4, None, "4 users"),
    Step(10, 20, 8, None, "8 users"),
    Step(20, 30, 16, None, "16 users"),
)


def records() -> list[RequestRecord]:
    """300 requests over 30 s round-robin over r0..r2; r2 is slow; 3 errors."""
    out = []
    for i in range(300):
        replica = f"r{i % 3}"
        slow = replica == "r2"
        ttft = (0.04 if not slow else 0.2) + (i % 10) * 0.002
        out.append(rec(i, sent=T0 + i * 0.1, ttft=ttft, e2e=ttft + 0.3, replica=replica))
    out += [
        rec(1000 + j, sent=T0 + 5 + j, ttft=None, e2e=1.0, outcome="http_error", replica="r1")
        for j in range(3)
    ]
    return out


def server() -> ServerSide:
    reps = tuple(
        ReplicaServerSide(
            replica=f"r{i}",
            running_avg=1.0 + i,
            kv_usage_avg=0.2 * (i + 1),
            gpu_util=0.3 * (i + 1),
            busy_fraction=0.3 * (i + 1),
            sm_active=0.2 * (i + 1),
            server_ttft_p99=0.05 * (i + 1),
        )
        for i in range(3)
    )
    client = PromClientSide(
        requests_by_outcome={"ok": 281.0, "http_error": 3.0},
        ttft_p50=0.055,
        ttft_p99=0.24,
        ttft_buckets=(0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5),
    )
    return ServerSide(
        window=WINDOW,
        replicas=reps,
        replica_balance=0.245,
        balance_source="sm_active",
        prefix_cache_hit_rate=0.42,
        client=client,
        queries={"running_avg": "sum by (replica) (...)"},
    )


def summary(**overrides: object) -> RunSummary:
    kwargs: dict[str, object] = dict(
        run_start=T0,
        window=WINDOW,
        scenario="ramp",
        target="http://127.0.0.1:8000",
        slo=Slo(ttft_s=0.35, e2e_s=0.8),
        stages=STAGES,
        server=server(),
        generator=GeneratorHealth(lateness_p99_s=0.001, loop_lag_p99_s=0.002, cpu_max_percent=41),
    )
    kwargs.update(overrides)
    return summarize(records(), **kwargs)  # type: ignore[arg-type]
