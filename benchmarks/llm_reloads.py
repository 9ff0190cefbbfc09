"""The LLM scheduler under reloads: does HAProxy survive ``--reloads`` hitless reloads while
``algorithm: llm`` serves a steady load?

The rig of ``_llmrig.py``, as ``llm_pick_cost.py`` (three fake replicas served by a second
HAProxy, the balancer through the HAProxy target's own config and apply path). ``llm.mode`` is set
(``predict`` by default, v2), a client sends chat requests open loop at ``--rate`` req/s
over ``--conns`` keep-alive connections (reconnecting after a reset), and the benchmark
alternates ``queue_timeout_s`` between two values: a structural knob, so every apply
renders a new config, passes ``haproxy -c`` and reloads, the scheduler staying loaded.

Reported: reloads done (the master's counter), worker starts and abnormal worker exits
counted in HAProxy's log (a segfault is ``exited with code 139``), requests answered 200,
other answers, connection errors (a keep-alive connection the old worker closes mid-request
is the client's to retry: counted, not failed), and the apply time per reload. It passes
when the master is alive, no worker crashed (SIGSEGV, SIGABRT, SIGFPE), every answer was a
200 and every reload happened.

    .venv/bin/python benchmarks/llm_reloads.py --reloads 200 --rate 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import threading
import time

from _llmrig import bodies, llm_rig

from lbtune.records.quantiles import percentile

NEW_WORKER = re.compile(r"New worker \(?\d+\)? forked")
CRASH = re.compile(r"exited with code (139|134|136)\b")
"""A worker that died of SIGSEGV, SIGABRT or SIGFPE: a crash."""
SIGNALLED = re.compile(r"Former worker \(?\d+\)? exited with code (1[2-9]\d)\b")
"""An old worker, already stopping, ended by a signal (a reload's SIGUSR1 reaching a worker
that was still draining from the previous one): counted, not a crash."""


class Tally:
    def __init__(self) -> None:
        self.ok = self.other = self.conn_errors = self.fresh_errors = 0
        self.lock = threading.Lock()


async def load(port: int, rate: float, stop: threading.Event, conns: int, tally: Tally) -> None:
    """Open loop until ``stop``: request i is due at i/rate; a reset connection reconnects."""
    payloads = bodies(2000)
    t0 = time.perf_counter() + 0.2
    nxt = 0

    async def worker() -> None:
        nonlocal nxt
        reader = writer = None
        while not stop.is_set():
            i = nxt
            nxt += 1
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = payloads[i % len(payloads)]
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            fresh = writer is None
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                assert reader is not None
                writer.write(head + body)
                status = await reader.readline()
                if not status:
                    raise ConnectionResetError("closed")
                length, head_lines = 0, b""
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    head_lines += line.lower()
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                with tally.lock:
                    if b" 200 " in status:
                        tally.ok += 1
                    else:
                        tally.other += 1
                if b"connection: close" in head_lines:
                    writer.close()
                    reader = writer = None
            except (OSError, asyncio.IncompleteReadError, ConnectionResetError):
                with tally.lock:
                    tally.conn_errors += 1
                    tally.fresh_errors += fresh
                if writer is not None:
                    writer.close()
                reader = writer = None
        if writer is not None:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(conns)))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--reloads", type=int, default=200)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--mode", choices=["score", "predict"], default="predict")
    args = ap.parse_args()
    stop = threading.Event()
    tally = Tally()
    with llm_rig("lbt-reloads-") as rig:
        target, master = rig.target, rig.balancer
        try:
            target.apply({"algorithm": "llm", "llm.mode": args.mode, "queue_timeout_s": 60})
            first = target.reload_count()
            client = threading.Thread(
                target=lambda: asyncio.run(load(rig.lb, args.rate, stop, args.conns, tally)),
                daemon=True,
            )
            client.start()
            times: list[float] = []
            for i in range(args.reloads):
                t = time.perf_counter()
                target.apply({"queue_timeout_s": 61 if i % 2 == 0 else 60})
                times.append(time.perf_counter() - t)
                if master.poll() is not None:
                    break
            stop.set()
            client.join(timeout=30)
            reloads = target.reload_count() - first if master.poll() is None else -1
            text = rig.log_path.read_text(errors="replace")
            result = {
                "mode": args.mode,
                "reloads_asked": args.reloads,
                "reloads_done": reloads,
                "master_alive": master.poll() is None,
                "worker_starts_in_log": len(NEW_WORKER.findall(text)),
                "worker_crashes": len(CRASH.findall(text)),
                "stopping_workers_ended_by_a_signal": len(
                    [c for c in SIGNALLED.findall(text) if c not in ("139", "134", "136")]
                ),
                "requests_200": tally.ok,
                "requests_other": tally.other,
                "connection_errors": tally.conn_errors,
                "errors_on_a_new_connection": tally.fresh_errors,
                "apply_s_p50": percentile(times, 50) if times else None,
                "apply_s_max": max(times) if times else None,
            }
            result["passed"] = bool(
                result["master_alive"]
                and result["worker_crashes"] == 0
                and result["requests_other"] == 0
                and reloads == args.reloads
            )
            print(json.dumps(result, indent=2))
            if not result["passed"]:
                print(text[-3000:], file=sys.stderr)
                sys.exit(1)
        finally:
            stop.set()


if __name__ == "__main__":
    main()
