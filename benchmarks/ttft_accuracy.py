"""How exact is lbtune's TTFT? Per-request client TTFT against server ground truth.

Server: ``lbtune.loadgen.echo`` (a minimal asyncio SSE server in its own process;
the simulator is not used because its TTFT depends on its engine model): a
role-only chunk at once, first content chunk after 50 ms, then one token per
chunk every 10 ms; it stamps its own wall clock right before each first content
write (``t_first``) and after reading the request (``t_recv``).

Per request, from ONE generator process, at 16/64/256/512 concurrent streams:

* error   = client TTFT − server TTFT = (first − sent) − (t_first − t_recv)
* stamp   = first − t_first  (wire + generator delay before the time stamp)
* sendlag = t_recv − sent    (generator + server delay before the server saw it)
* CPU of the generator process; lbtune's own ``degraded`` verdict.

Side by side in one run: lbtune's ``LLMUser`` and stock Locust ``FastHttpUser`` +
per-line JSON. Requests sent in the first 2 s of each run are excluded.
Run: ``python benchmarks/ttft_accuracy.py [--duration 8] [--levels 16,64,256,512]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lbtune.loadgen.health import percentile
from lbtune.loadgen.recordio import read_records
from lbtune.loadgen.runner import LoadConfig, run_load

HERE = Path(__file__).resolve().parent
WARMUP_S = 2.0
AIM = {256: (1.0, 5.0), 512: (2.0, 10.0)}


def start_echo(*args: str) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "lbtune.loadgen.echo", "--port", "0", *args],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    port = json.loads(proc.stdout.readline())["port"]
    return proc, f"http://127.0.0.1:{port}"


def truth(url: str) -> dict[str, dict[str, float]]:
    with urllib.request.urlopen(f"{url}/debug/requests", timeout=30) as r:
        doc: dict[str, dict[str, float]] = json.loads(r.read())
        return doc


def run_lbtune(url: str, users: int, duration: float, tokens: int, tmp: Path) -> dict[str, Any]:
    res = run_load(
        LoadConfig(
            target_url=url,
            scenario=f"fixed:output={tokens}",
            users=users,
            duration_s=duration,
            records_dir=tmp / f"lbtune-{users}",
            grace_s=3.0,
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
    w = res.health.workers[0]
    return {
        "records": rows,
        "cpu": w.cpu_mean_percent,
        "degraded": res.health.degraded,
        "why": list(res.health.reasons),
        "lag_p99_ms": (w.loop_lag_p99_s or 0) * 1e3,
    }


def run_stock(
    kind: str, url: str, users: int, duration: float, tokens: int, tmp: Path
) -> dict[str, Any]:
    out = tmp / f"{kind}-{users}.json"
    subprocess.run(
        [
            sys.executable,
            str(HERE / "_stockclients.py"),
            kind,
            "--url",
            url,
            "--users",
            str(users),
            "--duration",
            str(duration),
            "--output-tokens",
            str(tokens),
            "--out",
            str(out),
        ],
        check=True,
        timeout=duration + 120,
        stderr=subprocess.DEVNULL,
    )
    doc: dict[str, Any] = json.loads(out.read_text())
    doc["cpu"] = 100.0 * doc["cpu_s"] / doc["wall_s"]
    doc["degraded"] = None
    return doc


def analyse(doc: dict[str, Any], gt: dict[str, dict[str, float]]) -> dict[str, Any]:
    rows = [r for r in doc["records"] if r[2] is not None and r[0] in gt]
    t0 = min((r[1] for r in rows), default=0.0)
    rows = [r for r in rows if r[1] >= t0 + WARMUP_S]
    err, stamp, lag = [], [], []
    for rid, sent, first, _end, _n, _ok in rows:
        g = gt[rid]
        err.append(abs((first - sent) - (g["t_first"] - g["t_recv"])) * 1e3)
        stamp.append((first - g["t_first"]) * 1e3)
        lag.append((g["t_recv"] - sent) * 1e3)
    return {
        "n": len(rows),
        "err_p50": percentile(err, 50),
        "err_p99": percentile(err, 99),
        "stamp_p50": percentile(stamp, 50),
        "stamp_p99": percentile(stamp, 99),
        "lag_p50": percentile(lag, 50),
        "lag_p99": percentile(lag, 99),
        "cpu": doc["cpu"],
        "degraded": doc.get("degraded"),
        "why": doc.get("why", []),
        "loop_lag_p99": doc.get("lag_p99_ms"),
    }


def fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{x:6.2f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--levels", default="16,64,256,512")
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    proc, url = start_echo("--ttft", "0.05", "--itl", "0.01")
    results: dict[str, dict[int, dict[str, Any]]] = {"lbtune": {}, "locust": {}}
    t_start = time.time()
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            for n in levels:  # interleaved, so both clients see the same machine noise
                raw_l = run_lbtune(url, n, a.duration, a.tokens, tmp)
                raw_s = run_stock("locust", url, n, a.duration, a.tokens, tmp)
                gt = truth(url)
                results["lbtune"][n] = analyse(raw_l, gt)
                results["locust"][n] = analyse(raw_s, gt)
    finally:
        proc.terminate()
        proc.wait(timeout=5)
    print(
        f"TTFT accuracy vs server ground truth (echo server: TTFT 50 ms, 10 ms/token, "
        f"{a.tokens} tokens, 1 token/chunk; {a.duration:g} s per run, first {WARMUP_S:g} s "
        f"excluded; wall {time.time() - t_start:.0f} s)"
    )
    print(
        f"{'client':8} {'streams':>7} {'n':>6} | {'|err| P50':>9} {'P99':>7} ms | "
        f"{'stamp P50':>9} {'P99':>7} | {'sendlag P50':>11} {'P99':>7} | {'CPU%':>5} | flag"
    )
    for n in levels:
        for client in ("lbtune", "locust"):
            r = results[client][n]
            flag = {True: "DEGRADED", False: "ok", None: "(none)"}[r["degraded"]]
            if r.get("loop_lag_p99") is not None:
                flag += f" (loop lag P99 {r['loop_lag_p99']:.1f} ms)"
            err = f"{fmt(r['err_p50']):>9} {fmt(r['err_p99']):>7}"
            stamp = f"{fmt(r['stamp_p50']):>9} {fmt(r['stamp_p99']):>7}"
            lag = f"{fmt(r['lag_p50']):>11} {fmt(r['lag_p99']):>7}"
            cpu = f"{r['cpu'] or 0:5.0f}"
            print(f"{client:8} {n:7d} {r['n']:6d} | {err}    | {stamp} | {lag} | {cpu} | {flag}")
        lb, st = results["lbtune"][n], results["locust"][n]
        if lb["err_p50"] and st["err_p50"]:
            r50 = st["err_p50"] / lb["err_p50"]
            r99 = st["err_p99"] / lb["err_p99"]
            print(
                f"{'':8} {'ratio':>7} {'':6} | locust/lbtune error: P50 {r50:.1f}x, P99 {r99:.1f}x"
            )
    verdicts = []
    for n, (p50, p99) in AIM.items():
        r = results["lbtune"].get(n)
        if r is None or r["err_p50"] is None:
            continue
        met = r["err_p50"] <= p50 and r["err_p99"] <= p99
        verdicts.append(
            f"{n} streams: aim P50<={p50:g}/P99<={p99:g} ms -> "
            + (
                "MET"
                if met
                else "missed, flagged DEGRADED"
                if r["degraded"]
                else "MISSED, NOT flagged"
            )
        )
        if r["why"]:
            verdicts[-1] += f" ({'; '.join(r['why'])})"
    print("\n".join(verdicts))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
