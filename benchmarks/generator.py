"""How much load can ONE generator process drive? lbtune vs stock clients, side by side.

Server: ``lbtune.loadgen.echo`` with zero delay, 128 output tokens per request,
in two modes: the whole stream in one write, and one token per chunk (an HTTP
chunk per SSE event, the server yielding between them). Clients, each for the
same duration and concurrency, interleaved per mode:

* lbtune ``LLMUser`` (one process), and lbtune with ``--workers 2``;
* stock Locust ``FastHttpUser`` + per-line ``json.loads`` (benchmarks/_stockclients.py);
* a minimal asyncio + aiohttp client (per-line ``json.loads``).

Printed: completed req/s and tokens/s (first second excluded), generator CPU %,
CPU microseconds per token, ratios to stock Locust; the server process's CPU %, and how
busy the server's *core* was (``/proc/stat``: user, system, irq and softirq time). Only
the core says whether the server rather than the generator was the limit: loopback's
receive path runs in softirq on the sending core and is charged to no process, so a
server at "76 %" of process time had a saturated core (a row whose server core was over
90 % busy is marked ``*``: the client's figure is then a lower bound of what it can do).
With two cores or more, the server is pinned to core 0 and every client (and its
processes) to core 1: one core each, so a client is limited by its own cost, not by
the server's share of a shared core (``--no-pin`` leaves both to the scheduler).
Run: ``python benchmarks/generator.py [--duration 6] [--users 64] [--no-pin]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ttft_accuracy import Load, run_stock, start_echo

from lbtune.loadgen.recordio import read_records
from lbtune.loadgen.runner import LoadConfig, run_load

TOKENS = 128
SKIP_S = 1.0


def rates(rows: list[list[Any]], duration: float) -> tuple[float, float]:
    """(req/s, tokens/s) of requests that ended after the first second."""
    if not rows:
        return 0.0, 0.0
    t0 = min(r[1] for r in rows)
    done = [r for r in rows if r[3] >= t0 + SKIP_S and r[5]]
    end = max(r[3] for r in rows)
    span = max(1e-3, min(end, t0 + duration) - (t0 + SKIP_S))
    done = [r for r in done if r[3] <= t0 + duration]
    return len(done) / span, sum(r[4] for r in done) / span


def run_lb(url: str, users: int, duration: float, workers: int, tmp: Path) -> dict[str, Any]:
    res = run_load(
        LoadConfig(
            target_url=url,
            scenario=f"fixed:output={TOKENS}",
            users=users,
            duration_s=duration,
            workers=workers,
            grace_s=3.0,
            records_dir=tmp / f"lb-{workers}-{time.time()}",
        )
    )
    rows = [
        [
            r.request_id,
            r.sent_at,
            r.first_token_at,
            r.ended_at,
            len(r.chunk_times),
            r.outcome == "ok",
        ]
        for r in read_records(res.records_path)
    ]
    cpu_s = sum(s.cpu_percent for w in res.health.workers for s in w.samples) / 100.0
    n_samples = max((len(w.samples) for w in res.health.workers), default=1)
    return {"records": rows, "cpu_s": cpu_s, "wall_s": float(n_samples), "procs": max(1, workers)}


Jiffies = dict[int, tuple[int, int]]
"""Per core: (busy, total) jiffies."""


def core_busy() -> Jiffies:
    """Per core: (busy, total) jiffies so far (busy = all but idle and iowait)."""
    out: Jiffies = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *vals = line.split()
                v = [int(x) for x in vals[:8]]
                out[int(name[3:])] = (sum(v) - v[3] - v[4], sum(v))
    return out


class CoreSampler:
    """``/proc/stat`` every 0.25 s while a client runs; :meth:`peak` is a core's busy share
    over the busiest 3 s (the load's steady part, not the processes' start and stop)."""

    def __init__(self) -> None:
        self.snaps: list[tuple[float, Jiffies]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.snaps.append((time.monotonic(), core_busy()))
            self._stop.wait(0.25)

    def __enter__(self) -> CoreSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def peak(self, core: int, window: float = 3.0) -> float:
        best = 0.0
        for i, (t0, a) in enumerate(self.snaps):
            later = [(t, b) for t, b in self.snaps[i:] if t - t0 >= window]
            if not later:
                break
            b = later[0][1]
            best = max(best, 100.0 * (b[core][0] - a[core][0]) / max(1, b[core][1] - a[core][1]))
        return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--no-pin", action="store_true", help="leave server and clients unpinned")
    a = ap.parse_args()
    pin = not a.no_pin and len(os.sched_getaffinity(0)) >= 2
    srv_core, gen_core = (sorted(os.sched_getaffinity(0))[:2]) if pin else (None, None)
    print(
        f"Generator capacity: zero-delay echo server, {TOKENS} tokens/request, "
        f"{a.users} concurrent streams, {a.duration:g} s per run (first {SKIP_S:g} s "
        f"excluded), {psutil.cpu_count()} cores, "
        + (
            f"server pinned to core {srv_core}, clients to core {gen_core}"
            if pin
            else "shared by server and clients"
        )
    )
    if gen_core is not None:
        os.sched_setaffinity(0, {gen_core})  # the runner, its generator children, stock clients
    t_start = time.time()
    for mode, args in (
        ("one write", ["--one-write", "--no-truth"]),
        ("token per chunk", ["--no-truth"]),
    ):
        proc, url = start_echo(*args, core=srv_core)
        srv = psutil.Process(proc.pid)
        rows: list[tuple[str, dict[str, Any], tuple[float, float]]] = []
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            for name in ("lbtune", "locust", "aiohttp", "lbtune x2 workers"):
                c0 = srv.cpu_times()
                w0 = time.time()
                with CoreSampler() as cores:
                    if name == "lbtune":
                        doc = run_lb(url, a.users, a.duration, 0, tmp)
                    elif name.startswith("lbtune x2"):
                        doc = run_lb(url, a.users, a.duration, 2, tmp)
                    else:
                        doc = run_stock(name, Load(url, a.users, a.duration, TOKENS, tmp))
                        doc["procs"] = 1
                c1 = srv.cpu_times()
                srv_cpu = 100 * ((c1.user - c0.user) + (c1.system - c0.system)) / (time.time() - w0)
                core = cores.peak(srv_core) if srv_core is not None else float("nan")
                rows.append((name, doc, (srv_cpu, core)))
        proc.terminate()
        proc.wait(timeout=5)
        print(f"\n[{mode}]")
        print(
            f"{'client':18} {'req/s':>8} {'tok/s':>9} {'gen CPU%':>8} {'µs/token':>9} "
            f"{'vs locust':>9} {'server CPU%':>11} {'its core, peak 3 s':>18}"
        )
        base = None
        for name, doc, (srv_cpu, _core) in rows:
            rps, tps = rates(doc["records"], a.duration)
            cpu_pct = 100 * doc["cpu_s"] / max(1e-9, doc["wall_s"])
            us_tok = 1e6 * doc["cpu_s"] / max(1.0, tps * doc["wall_s"])
            if name == "locust":
                base = rps
            rows_out = (name, rps, tps, cpu_pct, us_tok, srv_cpu)
            doc["out"] = rows_out
        for name, doc, (srv_cpu, core) in rows:
            _, rps, tps, cpu_pct, us_tok, _ = doc["out"]
            ratio = f"{rps / base:8.2f}x" if base else "      -"
            mark = " *" if core > 90 else ""
            print(
                f"{name:18} {rps:8.0f} {tps:9.0f} {cpu_pct:8.0f} {us_tok:9.2f} {ratio:>9} "
                f"{srv_cpu:11.0f} {core:17.0f}%{mark}"
            )
    print(
        f"\n(wall {time.time() - t_start:.0f} s; gen CPU% is summed over processes; "
        "µs/token = generator CPU time / tokens received; * = the server's core was over 90 % "
        "busy: that row is bounded by the server, a lower bound of the client)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
