"""Agent sessions per column of a ``headline.py --columns --scenario agent`` run.

Reads ``DIR/results.json`` (each run's window and server-side prefix-cache hit rate) and
``DIR/runs/<round>-<COLUMN>/`` (``run.json``, the records), and prints, per column,
pooled over its rounds: sessions started (and per minute of window: a closed loop's
session throughput), completed and failed; session completion time P50 / P99 (first call
sent -> last call ended, completed sessions; :mod:`lbtune.metrics.sessions`), the share
of that time spent in the cluster, the same-replica share (a client-side proxy for
prefix affinity), the server's prefix-cache hit rate (mean over the column's runs, from
Prometheus), per-call TTFT P99 and calls/s. Completion P50/P99 come with a 95 % interval
of their ratio to the first column, from the paired two-level bootstrap the headline
uses: draw the rounds with replacement (the same rounds for every column), then the
sessions within each drawn run; withheld under the estimator's sample-count rule.

    .venv/bin/python benchmarks/agent_sessions.py /tmp/lbtune-headline-<time>
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lbtune.loadgen.recordio import read_records
from lbtune.metrics.sessions import completion_times, session_stats
from lbtune.metrics.summary import Window
from lbtune.records.quantiles import MIN_SAMPLES, percentile
from lbtune.run.summary import session_calls
from lbtune.scenario.runplan import read_run_plan


@dataclass
class Run:
    column: str
    round: int
    completions: list[float]
    started: int
    completed: int
    failed: int
    in_cluster_share: float | None
    same_replica: float | None
    hit_rate: float | None
    ttfts: list[float]
    calls_per_s: float
    minutes: float


def load_run(d: Path, column: str, rnd: int, facts: dict[str, Any]) -> Run:
    window = Window(*facts["window"])
    records = read_records(d)
    planned = session_calls(read_run_plan(d), records)
    if planned is None:
        raise SystemExit(f"{d}: not an agent-session run")
    stats = session_stats(records, window, planned)
    in_window = [r for r in records if window.contains(r.sent_at)]
    ok = [r for r in in_window if r.outcome == "ok"]
    ttfts = [r.first_token_at - r.sent_at for r in ok if r.stream and r.first_token_at]
    return Run(
        column=column,
        round=rnd,
        completions=completion_times(records, window, planned),
        started=stats.started,
        completed=stats.completed,
        failed=stats.failed,
        in_cluster_share=stats.in_cluster_share,
        same_replica=stats.same_replica_share,
        hit_rate=facts.get("hit"),
        ttfts=ttfts,
        calls_per_s=len(ok) / max(1e-9, window.end - window.start),
        minutes=(window.end - window.start) / 60.0,
    )


def pct(values: list[float], q: int) -> float | None:
    """The project's percentile, withheld under its sample-count rule (P99: 100)."""
    return percentile(values, q) if len(values) >= MIN_SAMPLES[f"p{q}"] else None


def fmt(v: float | None, scale: float = 1.0, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v * scale, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    results = json.loads((a.dir / "results.json").read_text(encoding="utf-8"))
    runs: dict[str, dict[int, Run]] = defaultdict(dict)
    order: list[str] = [c["name"] for c in results["columns"]]
    for facts in results["runs"]:
        col, rnd = facts["config"], facts["repeat"] + 1
        runs[col][rnd] = load_run(a.dir / "runs" / f"{rnd}-{col}", col, rnd, facts)
    common = [set(runs[c]) for c in order]
    rounds = sorted(set.intersection(*common)) if common else []
    if not rounds:
        raise SystemExit(f"{a.dir}: no round holds every column")
    base = order[0]
    rng = np.random.default_rng(a.seed)
    draws = rng.integers(0, len(rounds), size=(a.bootstrap, len(rounds)))
    print(
        f"{a.dir}: {len(rounds)} paired rounds of {', '.join(order)}; ratios to {base} with a "
        f"95 % paired bootstrap ({a.bootstrap} replicates: rounds, then sessions)"
    )
    head = (
        f"{'column':8} {'sess':>5} {'/min':>5} {'done':>5} {'fail':>4} {'P50 s':>7} {'P99 s':>7} "
        f"{'P50/' + base:>19} {'P99/' + base:>19} {'in-cl':>6} {'same':>6} {'hit':>6} "
        f"{'TTFT99':>7} {'call/s':>7}"
    )
    print(head)
    boot: dict[str, np.ndarray] = {}
    for col in order:
        reps = np.full((a.bootstrap, 2), np.nan)
        for b in range(a.bootstrap):
            pooled: list[float] = []
            for k in draws[b]:
                xs = runs[col][rounds[k]].completions
                if xs:
                    pooled.extend(np.asarray(xs)[rng.integers(0, len(xs), size=len(xs))])
            if pooled:
                reps[b] = [percentile(pooled, 50), percentile(pooled, 99)]
        boot[col] = reps
    for col in order:
        rs = [runs[col][k] for k in rounds]
        comp = [x for r in rs for x in r.completions]
        ttft = [x for r in rs for x in r.ttfts]

        def ratio(i: int, col: str = col, comp: list[float] = comp) -> str:
            if col == base:
                return "-"
            need = MIN_SAMPLES["p99" if i else "p50"]
            if min(len(comp), sum(len(runs[base][k].completions) for k in rounds)) < need:
                return f"n/a (<{need})"
            q = boot[col][:, i] / boot[base][:, i]
            q = q[np.isfinite(q)]
            if len(q) == 0:
                return "n/a"
            mid, lo, hi = (percentile(q, x) for x in (50, 2.5, 97.5))
            return f"{mid:.2f} [{lo:.2f}, {hi:.2f}]"

        def mean(vals: list[float | None]) -> str:
            got = [v for v in vals if v is not None]
            return f"{100 * sum(got) / len(got):5.1f}%" if got else "   n/a"

        p50, p99, t99 = pct(comp, 50), pct(comp, 99), pct(ttft, 99)
        print(
            f"{col:8} {sum(r.started for r in rs):5d} "
            f"{sum(r.started for r in rs) / sum(r.minutes for r in rs):5.1f} "
            f"{sum(r.completed for r in rs):5d} "
            f"{sum(r.failed for r in rs):4d} "
            f"{fmt(p50):>7} {fmt(p99):>7} "
            f"{ratio(0):>19} {ratio(1):>19} {mean([r.in_cluster_share for r in rs]):>6} "
            f"{mean([r.same_replica for r in rs]):>6} {mean([r.hit_rate for r in rs]):>6} "
            f"{fmt(t99, 1e3, '.0f'):>7} "
            f"{sum(r.calls_per_s for r in rs) / len(rs):7.2f}"
        )
    print(
        "sess: sessions whose first call was sent in the window (/min: per minute of window, "
        "the session throughput of a closed loop); done/fail: of them completed before the run "
        "ended (long sessions are cut: completion times favour the short ones), failed; "
        "P50/P99: completion time (P99 withheld under 100 sessions); in-cl: time in the "
        "cluster / completion; same: later calls on the first call's replica; hit: the "
        "server's prefix-cache hit rate; TTFT99: per-call TTFT P99 in ms (streamed, ok); call/s: "
        "ok calls per second of window. A shared, noisy 2-core machine: read the intervals."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
