"""The host process: ``python -m lbtune.sim`` and the in-process API (time scale, seed)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import openai

from lbtune.sim.host import run_in_thread
from tests.sim.conftest import M8, free_port, http, make_spec

ROOT = Path(__file__).resolve().parents[2]


def start_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lbtune.sim", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_cli_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    p1, p2 = free_port(), free_port()
    gt = tmp_path / "gt.jsonl"
    spec = {
        "time_scale": 20,
        "replicas": [{"name": "x", "port": p1, "gpu": "h100-80g", "models": [M8]}],
    }
    spec_file = tmp_path / "host.json"
    spec_file.write_text(json.dumps(spec))
    proc = start_cli(
        "--spec", str(spec_file), "--replica", f"y:{p2}:l4-24g:{M8}", "--ground-truth", str(gt)
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert lines[0].startswith(f"sim replica x listening on http://127.0.0.1:{p1} ")
        assert lines[1].startswith(f"sim replica y listening on http://127.0.0.1:{p2} ")
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{p2}/v1", api_key="x", max_retries=0)
        r = c.completions.create(
            model=M8, prompt="hi", max_tokens=3, extra_headers={"x-request-id": "cli-1"}
        )
        assert r.usage is not None and r.usage.completion_tokens <= 3
        assert http(f"http://127.0.0.1:{p1}/health")[0] == 200
        long = HTTPConnection("127.0.0.1", p1, timeout=10)  # still streaming at SIGTERM
        body = {"model": M8, "prompt": "x", "max_tokens": 20000, "stream": True, "ignore_eos": True}
        long.request(
            "POST",
            "/v1/completions",
            json.dumps(body),
            {"Content-Type": "application/json", "x-request-id": "cli-2"},
        )
        assert long.getresponse().fp.readline()
    finally:
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(10)
    assert rc == 0, proc.stderr.read() if proc.stderr else ""
    assert time.monotonic() - t0 < 5
    records = {r["request_id"]: r for r in map(json.loads, gt.read_text().splitlines())}
    assert records["cli-1"]["replica"] == "y" and records["cli-1"]["status"] == 200
    assert records["cli-2"]["status"] == 499 and records["cli-2"]["finish_reason"] == "abort"


def test_cli_busy_port_exits_3_and_leaves_nothing_listening() -> None:
    free, busy = free_port(), socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    busy_port = busy.getsockname()[1]
    try:
        proc = start_cli(
            "--replica", f"ok:{free}:h100-80g:{M8}", "--replica", f"no:{busy_port}:h100-80g:{M8}"
        )
        out, err = proc.communicate(timeout=20)
    finally:
        busy.close()
    assert proc.returncode == 3
    assert err.count("\n") == 1 and err.startswith("error: ") and str(busy_port) in err
    assert out == ""
    with socket.socket() as s:  # the first replica's port was released
        s.bind(("127.0.0.1", free))


def test_cli_invalid_spec_exits_2(tmp_path: Path) -> None:
    proc = start_cli("--replica", "bad:1:h100-80g")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2 and err.startswith("error: ") and err.count("\n") == 1


def _timed_request(time_scale: float, tokens: int = 96) -> float:
    with run_in_thread(make_spec(time_scale=time_scale, t=("h100-80g", [M8], {}))) as host:
        c = openai.OpenAI(base_url=host.urls["t"] + "/v1", api_key="x", max_retries=0)
        c.completions.create(model=M8, prompt="warm up", max_tokens=1)
        t0 = time.perf_counter()
        c.completions.create(
            model=M8, prompt="timed", max_tokens=tokens, extra_body={"ignore_eos": True}
        )
        return time.perf_counter() - t0


def test_time_scale_makes_requests_proportionally_faster() -> None:
    # Interleaved pairs, the fastest of each: a busy machine only ever adds time, so the
    # minimum is the least disturbed measurement of either scale (one pair read 2.6x).
    pairs = [(_timed_request(4.0), _timed_request(16.0)) for _ in range(3)]
    slow, fast = min(p[0] for p in pairs), min(p[1] for p in pairs)
    assert 3.0 < slow / fast < 5.0, pairs


def _outputs(seed: int) -> list[str]:
    with run_in_thread(make_spec(seed=seed, d=("h100-80g", [M8], {}))) as host:
        c = openai.OpenAI(base_url=host.urls["d"] + "/v1", api_key="x", max_retries=0)
        msgs: list[Any] = [[{"role": "user", "content": f"question {i}"}] for i in range(4)]
        out = [c.chat.completions.create(model=M8, messages=m, max_tokens=400) for m in msgs]
        return [r.choices[0].message.content or "" for r in out]


def test_same_seed_same_outputs_other_seed_differs() -> None:
    a, b, other = _outputs(7), _outputs(7), _outputs(8)
    assert a == b
    assert a != other
    assert len({len(x) for x in a}) > 1  # lengths are drawn, not constant
