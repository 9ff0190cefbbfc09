"""An end-to-end check of the feedback agent on an embedded HAProxy cluster: slow one replica.

:func:`slowdown_check` drives a bounded closed-loop load of streaming chat requests
through HAProxy with the agent running, measures one replica's weight and share of new
requests from HAProxy's per-server session counters (``stot`` deltas of ``show stat``),
then slows that replica with the sim's ``POST /admin/slowdown {"factor": F}`` and
measures again, sampling the replica's weight twice per second meanwhile.
It runs its own agent in a thread, or (``run_agent=False``) relies on the agent the
cluster runs (``agent.enabled`` in the cluster YAML). It leaves the replica unslowed and,
with its own agent, the weights as they were.

Used by the integration test and callable by hand::

    from lbtune.cluster.api import up
    from lbtune.targets.haproxy.agent_check import slowdown_check
    print(slowdown_check(up("mini2")))
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from lbtune.agent.config import AgentConfig
from lbtune.agent.loop import AgentThread
from lbtune.errors import TargetError
from lbtune.records.endpoints import Endpoints, ReplicaEndpoint
from lbtune.targets.base import pool_names
from lbtune.targets.haproxy.balancer import HaproxyWeights
from lbtune.targets.haproxy.files import HaproxyFiles
from lbtune.targets.haproxy.runtime import HaproxyRuntime

__all__ = ["SlowdownReport", "slowdown_check"]

log = logging.getLogger(__name__)


@dataclass
class SlowdownReport:
    backend: str
    replica: str
    share_before: float
    """The replica's share of new requests before the slowdown (agent on)."""
    share_after: float
    """Its share over the second half of the slowed phase."""
    weight_before: int
    weight_after: int
    weights: list[int] = field(default_factory=list)
    """The replica's weight after each agent step (one step a second); with the cluster's
    agent (``run_agent=False``), the sampled weights of the slowed phase."""
    samples: list[tuple[float, int]] = field(default_factory=list)
    """(seconds since the slowdown, the replica's HAProxy weight), every 0.5 s."""
    requests: int = 0
    errors: int = 0

    def seconds_to(self, weight: float) -> float | None:
        """When the sampled weight first fell to ``weight`` or below after the slowdown."""
        return next((t for t, w in self.samples if w <= weight), None)


def _post(url: str, body: dict[str, float], timeout: float = 10.0) -> Any:
    import requests

    with requests.Session() as s:
        s.trust_env = False  # loopback: never through an HTTP proxy
        resp = s.post(url, json=body, timeout=timeout)
        resp.raise_for_status()
        return resp.json()


_LOCK = threading.Lock()


def _load(
    base: str, model: str, stop: threading.Event, counts: dict[str, int], prompt: str
) -> None:
    import requests

    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 24,
        "stream": True,
    }
    with requests.Session() as s:
        s.trust_env = False
        while not stop.is_set():
            try:
                with s.post(f"{base}/v1/chat/completions", json=body, stream=True, timeout=30) as r:
                    ok = r.status_code == 200
                    for _ in r.iter_content(chunk_size=None):
                        pass
            except requests.RequestException:
                ok = False
            with _LOCK:
                counts["requests"] += 1
                counts["errors"] += 0 if ok else 1


@contextlib.contextmanager
def _load_running(base: str, model: str, concurrency: int, prompt: str) -> Iterator[dict[str, int]]:
    stop = threading.Event()
    counts = {"requests": 0, "errors": 0}
    with ThreadPoolExecutor(concurrency, thread_name_prefix="lbtune-load") as pool:
        futures = [
            pool.submit(_load, base, model, stop, counts, prompt) for _ in range(concurrency)
        ]
        try:
            yield counts
        finally:
            stop.set()
            for f in futures:
                f.result(timeout=60)


def _stot(rt: HaproxyRuntime, backend: str) -> dict[str, int]:
    return {s.server: s.stot for s in rt.stat() if s.backend == backend}


def _share(a: dict[str, int], b: dict[str, int], server: str) -> float:
    deltas = {k: b[k] - a.get(k, 0) for k in b}
    total = sum(deltas.values())
    return deltas.get(server, 0) / total if total else float("nan")


def _slowed_replica(
    ep: Endpoints, replica: str | None, model: str | None
) -> tuple[str, str, ReplicaEndpoint]:
    """(model, backend, replica) of the check: ``replica`` (default: the last) serving ``model``
    (default: the first model served by two replicas or more)."""
    if model is None:
        shared = [m for m in ep.models if sum(m in r.models for r in ep.replicas) >= 2]
        if not shared:
            raise TargetError("slowdown_check needs a model served by two replicas or more")
        model = shared[0]
    members = [r for r in ep.replicas if model in r.models]
    target = next((r for r in members if r.name == (replica or members[-1].name)), None)
    if target is None:
        raise TargetError(f"replica {replica!r} does not serve {model}")
    return model, pool_names(ep.models)[model], target


def _check_agent_config(ep: Endpoints) -> AgentConfig:
    """The check's agent: 1 s interval, latency-led coefficients (see :func:`slowdown_check`)."""
    return AgentConfig(
        prometheus_url=ep.prometheus_url,
        state_dir=ep.state_dir,
        interval_s=1.0,
        metrics_port=None,
        ttft_window_s=4.0,
        # Times in the sim are divided by its time scale: scale the 350 ms TTFT target too.
        ttft_ceiling_s=0.35 / ep.time_scale,
        a=0.2,
        b=0.6,
        c=0.2,
    )


class _Phases:
    """The check's two phases: the replica's share of new requests over each phase's
    second half, and its weight sampled every 0.5 s of the second phase."""

    def __init__(self, rt: HaproxyRuntime, backend: str, server: str) -> None:
        self.rt, self.backend, self.server = rt, backend, server
        self.samples: list[tuple[float, int]] = []

    def weight(self) -> int:
        states = self.rt.servers_state(self.backend)
        return next(s.weight for s in states if s.server == self.server)

    def wait(self, seconds: float, since: float | None) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if since is not None:
                self.samples.append((round(time.monotonic() - since, 2), self.weight()))
            time.sleep(min(0.5, left))

    def measure(self, seconds: float, since: float | None = None) -> tuple[float, int]:
        self.wait(seconds / 2, since)
        a = _stot(self.rt, self.backend)
        self.wait(seconds / 2, since)
        return _share(a, _stot(self.rt, self.backend), self.server), self.weight()


def slowdown_check(
    ep: Endpoints,
    replica: str | None = None,
    model: str | None = None,
    *,
    factor: float = 4.0,
    phase_s: tuple[float, float] = (8.0, 12.0),
    concurrency: int = 6,
    config: AgentConfig | None = None,
    run_agent: bool = True,
) -> SlowdownReport:
    """With the agent running at a 1 s interval throughout, measure ``replica``'s weight
    and share of new requests over the second half of a first phase, then slow it by
    ``factor`` and measure again over the second half of a second phase (``phase_s``).

    Default replica: the last replica serving the first model served by several (on the
    mini2 preset, the L4 beside the H100). Default agent config: the cluster's endpoints,
    a TTFT ceiling of 350 ms scaled by the cluster's time scale, and latency-led
    coefficients (a, b, c) = (0.2, 0.6, 0.2): a slowdown shows in TTFT, not in KV usage,
    which the source's defaults (0.5, 0.3, 0.2) weigh most. With ``run_agent=False`` no
    agent is started (the cluster's own must be running) and ``config`` is not used.
    """
    model, backend, target = _slowed_replica(ep, replica, model)
    rt = HaproxyRuntime(HaproxyFiles.of(ep).runtime_socket)
    saved = {(s.backend, s.server): s.weight for s in rt.servers_state()}
    cfg = config or _check_agent_config(ep)
    prompt = "Summarise the following text. " + "lorem ipsum dolor sit amet " * 60
    phases = _Phases(rt, backend, target.name)
    measure = phases.measure
    samples = phases.samples

    try:
        with (
            _load_running(ep.balancer_url, model, concurrency, prompt) as counts,
            AgentThread(cfg, weights=HaproxyWeights(rt))
            if run_agent
            else contextlib.nullcontext() as agent,
        ):
            share_before, weight_before = measure(phase_s[0])
            _post(f"{target.url}/admin/slowdown", {"factor": factor})
            share_after, weight_after = measure(phase_s[1], since=time.monotonic())
            weights = [
                d.weight
                for res in (list(agent.results) if agent is not None else [])
                for d in res.decisions
                if d.replica == target.name
            ] or [w for _, w in samples]
    finally:
        _post(f"{target.url}/admin/slowdown", {"factor": 1.0})
        if run_agent:
            with contextlib.suppress(TargetError):
                rt.set_weights(saved)
    report = SlowdownReport(
        backend=backend,
        replica=target.name,
        share_before=share_before,
        share_after=share_after,
        weight_before=weight_before,
        weight_after=weight_after,
        weights=weights,
        samples=samples,
        requests=counts["requests"],
        errors=counts["errors"],
    )
    log.info("slowdown check: %s", report)
    return report
