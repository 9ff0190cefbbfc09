"""How many concurrent streams one sim process sustains on one core at time scale 1.

The sim (``python -m lbtune.sim``, one H100 8B replica by default) runs in a subprocess
pinned to one core; this process, pinned to another core when there is one, is the
client: for each level N it keeps N streaming completions open (``ignore_eos``, fixed
lengths, a new request as soon as one ends), warms up, then measures for a window:

* streamed tokens/s — content chunks the client received in the window, per second;
* the step ratio — wall time the sim's GPU loop took for its steps over the time the
  cost model asked for (``/admin/state``: ``actual_s`` / ``modelled_s`` deltas). 1.00
  means the simulated GPU kept its modelled speed; above 1.05 the sim's CPU is the
  bottleneck and latencies it reports are inflated;
* sim cpu% — CPU the sim process used in the window (100 = its core is saturated);
* wait% — time the sim was runnable but waiting for its core (Linux schedstat): other
  processes on that core. A ratio above 1.05 with a high wait% and a sim cpu% well
  under 100 is contention from outside, not the sim's limit: rerun on a quiet machine.

It prints one row per level (levels stop at the first one over 5 %; a level that fails
while the sim waited for its core more than 10 % of the time is retried once) and the
largest N whose ratio stays within 5 %. Loopback only; bounded in time (about 6 s per
level, 12 s with a retry) and in requests.

    .venv/bin/python benchmarks/sim_capacity.py [--levels 16,64,128,256,512,1024] [--window 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
MODEL = "llama-3.1-8b-instruct"
PROMPT = " ".join(f"w{i % 97}" for i in range(128))  # 128 tokens, distinct per request below


LIMIT = 1.05
"""Step ratio (actual / modelled) up to which the sim counts as keeping up."""
CONTENDED_WAIT_PCT = 10.0
"""Runqueue wait above which a failing level is retried once."""
COLUMNS = (  # header, row key, width, decimals
    ("streams", "streams", 8, 0),
    ("running", "running", 8, 0),
    ("tok/s", "tokens_per_s", 9, 0),
    ("steps", "steps", 6, 0),
    ("model ms", "modelled_step_ms", 9, 2),
    ("actual ms", "actual_step_ms", 9, 2),
    ("ratio", "ratio", 7, 3),
    ("sim cpu%", "sim_cpu_pct", 8, 0),
    ("wait%", "sim_wait_pct", 6, 0),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def choose_cpus() -> tuple[int | None, int | None]:
    if not hasattr(os, "sched_getaffinity"):
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[0], (cpus[1] if len(cpus) > 1 else None)


async def stream_worker(
    session: aiohttp.ClientSession, url: str, wid: int, max_tokens: int, counter: list[int]
) -> None:
    n = 0
    while True:
        n += 1
        body = {
            "model": MODEL,
            "prompt": f"req {wid} {n} {PROMPT}",
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                await resp.read()
                await asyncio.sleep(0.05)
                continue
            async for line in resp.content:
                if line.startswith(b"data: {") and b'"finish_reason":null' in line:
                    counter[0] += 1


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (Linux ``/proc``; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runqueue_wait_seconds(pid: int) -> float | None:
    """Seconds ``pid`` was runnable but waiting for a CPU (Linux schedstat): other
    processes on the sim's core, not the sim itself, when this grows."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


async def state(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with session.get(base + "/admin/state") as r:
        data: dict[str, Any] = await r.json()
        return data


async def run_level(
    base: str, n: int, warmup: float, window: float, max_tokens: int, sim_pid: int
) -> dict[str, float]:
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        counter = [0]
        url = base + "/v1/completions"
        workers = [
            asyncio.create_task(stream_worker(session, url, i, max_tokens, counter))
            for i in range(n)
        ]
        await asyncio.sleep(warmup)
        s0, c0, t0 = await state(session, base), counter[0], time.monotonic()
        cpu0, wait0 = cpu_seconds(sim_pid), runqueue_wait_seconds(sim_pid)
        await asyncio.sleep(window)
        s1, c1, t1 = await state(session, base), counter[0], time.monotonic()
        cpu1, wait1 = cpu_seconds(sim_pid), runqueue_wait_seconds(sim_pid)
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    steps = s1["steps"] - s0["steps"]
    modelled = s1["modelled_s"] - s0["modelled_s"]
    actual = s1["actual_s"] - s0["actual_s"]
    return {
        "streams": n,
        "running": s1["num_running"],
        "tokens_per_s": (c1 - c0) / (t1 - t0),
        "steps": steps,
        "modelled_step_ms": 1000 * modelled / max(steps, 1),
        "actual_step_ms": 1000 * actual / max(steps, 1),
        "ratio": actual / modelled if modelled > 0 else float("nan"),
        "sim_cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0) if cpu0 is not None and cpu1 else -1.0,
        "sim_wait_pct": 100 * (wait1 - wait0) / (t1 - t0)
        if wait0 is not None and wait1 is not None
        else -1.0,
    }


def start_sim(port: int, gpu: str, cpu: int | None) -> subprocess.Popen[str]:
    spec = {
        "time_scale": 1.0,
        "replicas": [
            {
                "name": "bench",
                "port": port,
                "gpu": gpu,
                "models": [MODEL],
                "max_num_seqs": 1024,
                "max_waiting": 4096,
            }
        ],
    }
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f)
    proc = subprocess.Popen(
        [sys.executable, "-m", "lbtune.sim", "--spec", path],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: pin(cpu)) if cpu is not None else None,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    os.unlink(path)
    if "listening" not in line:
        proc.kill()
        raise SystemExit(f"sim did not start: {line!r}")
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="16,64,128,256,512,1024")
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--window", type=float, default=4.0)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--gpu", default="h100-80g")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    sim_cpu, client_cpu = choose_cpus()
    port = free_port()
    proc = start_sim(port, args.gpu, sim_cpu)
    pin(client_cpu)
    print(f"sim pid {proc.pid} on cpu {sim_cpu}, client on cpu {client_cpu}, {args.gpu} {MODEL}")
    print(" ".join(f"{h:>{w}}" for h, _, w, _ in COLUMNS))
    rows = []
    try:
        base = f"http://127.0.0.1:{port}"
        for n in levels:
            for attempt in range(2):  # one retry when the core was taken by other processes
                row = asyncio.run(
                    run_level(base, n, args.warmup, args.window, args.max_tokens, proc.pid)
                )
                line = " ".join(f"{row[k]:>{w}.{d}f}" for _, k, w, d in COLUMNS)
                contended = row["ratio"] > LIMIT and row["sim_wait_pct"] > CONTENDED_WAIT_PCT
                print(line + ("  (contended)" if contended else ""), flush=True)
                if not contended or attempt == 1:
                    break
            rows.append(row)
            if row["ratio"] > LIMIT:
                break
    finally:
        proc.terminate()
        proc.wait(10)
    ok = [r for r in rows if r["ratio"] <= LIMIT]
    if not ok:
        print("no level kept the step ratio within 5 %")
    else:
        best = ok[-1]
        print(
            f"largest N within 5 % of the cost model: {best['streams']:.0f} streams, "
            f"{best['tokens_per_s']:.0f} streamed tokens/s"
        )
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
