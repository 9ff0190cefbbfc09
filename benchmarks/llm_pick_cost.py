"""The LLM scheduler's own cost per request, measured in HAProxy (algorithm: llm).

The rig of ``_llmrig.py``: three fake replicas are frontends of a second HAProxy
(`/metrics` answers fixed vLLM gauges, everything else a small JSON 200), so the replicas
cost next to nothing. The balancer is the HAProxy target's own config and apply path. An
asyncio client sends chat requests (~2 KB prompts, 20 shared prefixes) open-loop at
``--rate`` req/s over ``--conns`` keep-alive connections for ``--duration`` s, first under
``leastconn``, then under ``llm`` with ``llm.mode: score`` (v1, ``pick``) and with
``llm.mode: predict`` (v2, ``pick_predict``).

Reported: the scheduler's pick time from its own histogram (``lbtune_llm_pick_microseconds``:
process CPU time around ``llm_pick``; P50/P99 are the upper edges of the buckets that hold
them), its mean, and the client-side latency P50/P99 of both algorithms (the difference is
the whole cost seen by a client, noise included).

    .venv/bin/python benchmarks/llm_pick_cost.py --rate 500 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import requests
from _llmrig import bodies, llm_rig

from lbtune.records.quantiles import percentile


async def load(port: int, rate: float, duration: float, conns: int) -> list[float]:
    """Open loop: request i is due at i/rate; each connection takes the next due one."""
    n = int(rate * duration)
    payloads = bodies(n)
    lat: list[float] = []
    t0 = time.perf_counter() + 0.2
    nxt = 0

    async def worker() -> None:
        nonlocal nxt
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while nxt < n:
            i = nxt
            nxt += 1
            due = t0 + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = payloads[i]
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            start = time.perf_counter()
            writer.write(head + body)
            status = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            if b" 200 " in status:
                lat.append(time.perf_counter() - start)
        writer.close()

    await asyncio.gather(*(worker() for _ in range(conns)))
    return lat


def pick_cost(stats_url: str) -> dict[str, float]:
    text = requests.get(stats_url + "/llm/metrics", timeout=5).text
    buckets: list[tuple[float, float]] = []
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("lbtune_llm_pick_microseconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
        elif line.startswith(("lbtune_llm_scrape", "lbtune_llm_fallback")):
            out[line.split()[0]] = float(line.split()[-1])
        elif line.startswith("lbtune_llm_pick_microseconds_") and "{" not in line:
            out[line.split()[0].rsplit("_", 1)[1]] = float(line.split()[-1])
    total = buckets[-1][1] if buckets else 0.0
    for q in (50, 99):
        out[f"p{q}_le_us"] = next((le for le, c in buckets if c >= total * q / 100), float("nan"))
    out["mean_us"] = out.get("sum", 0.0) / max(1.0, out.get("count", 0.0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--conns", type=int, default=32)
    args = ap.parse_args()
    with llm_rig("lbt-cost-") as rig:
        result: dict[str, object] = {"rate": args.rate, "duration_s": args.duration}
        runs = {
            "leastconn": {"algorithm": "leastconn"},
            "llm": {"algorithm": "llm", "llm.mode": "score"},
            "llm_predict": {"algorithm": "llm", "llm.mode": "predict"},
        }
        for name, params in runs.items():
            # switching to llm reloads: the scheduler's counters start at 0 for each mode
            rig.target.apply({"algorithm": "leastconn"})
            rig.target.apply(params)
            lat = asyncio.run(load(rig.lb, args.rate, args.duration, args.conns))
            want = int(args.rate * args.duration)
            result[name] = {
                "ok": len(lat),
                "sent": want,
                "client_p50_ms": percentile(lat, 50) * 1000,
                "client_p99_ms": percentile(lat, 99) * 1000,
            }
            if params["algorithm"] == "llm":
                result["pick" if name == "llm" else f"pick_{name[4:]}"] = pick_cost(
                    f"http://127.0.0.1:{rig.stats}"
                )
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
