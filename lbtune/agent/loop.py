"""The feedback loop: read inputs, score, push the changed weights, export, repeat.

The agent drives any balancer that takes live weights through a :class:`WeightActuator`
(what a registry entry's ``Balancer.weights(endpoints)`` returns: the CLI builds it from
the cluster named by ``state_dir``; tests pass one in). It names no balancer.

One step (:meth:`Agent.step`):

1. the live weights per replica from the actuator (which replicas exist, and their
   weights);
2. per-replica inputs from Prometheus (:mod:`lbtune.agent.source`);
3. :func:`lbtune.agent.scoring.step` (pure) → one decision per replica;
4. the weights that differ from the live ones, in one call to the actuator (skipped
   when ``enabled`` is false or in a dry run); changes logged at INFO.

Resilience: when Prometheus, the balancer or a replica's series is missing, the
step changes nothing (the balancer keeps the last weights; a replica without series keeps
its own), the problem is logged once at WARNING, counted in
``lbtune_agent_errors_total{kind}`` every time, retried every interval, and its end
is logged once at INFO. :func:`run` never raises for these; it stops on ``stop_event``
or after ``max_iterations``, and re-reads the config file when ``reload_event`` is set
(the CLI sets it on SIGHUP).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lbtune.agent import scoring
from lbtune.agent.config import AgentConfig, load_agent_config
from lbtune.agent.exporter import AgentMetrics, ExporterServer
from lbtune.agent.source import InputSource, PrometheusSource
from lbtune.errors import ConfigError, TargetError

__all__ = [
    "Agent",
    "AgentThread",
    "Connect",
    "StepResult",
    "WeightActuator",
    "install_signal_handlers",
    "run",
    "run_agent",
]

log = logging.getLogger(__name__)


class WeightActuator(Protocol):
    """Per-replica live weights (``lbtune.targets.base.LiveWeights``, by shape)."""

    max_weight: int

    def weights(self) -> dict[str, int]: ...

    def set_weights(self, weights: Mapping[str, int]) -> None: ...


Connect = Callable[[AgentConfig], WeightActuator]
"""Builds the actuator for a config (again after a reload that changes ``state_dir``);
TargetError while the balancer cannot be reached."""


@dataclass(frozen=True)
class StepResult:
    """What one step did."""

    ok: bool
    """False when Prometheus or the balancer failed (nothing was changed)."""
    decisions: list[scoring.Decision] = field(default_factory=list)
    pushed: dict[str, int] = field(default_factory=dict)
    """replica → weight sent to the balancer in this step."""
    error: str | None = None


def _describe(d: scoring.Decision) -> str:
    n = d.smoothed
    inputs = (
        f"kv {n.kv:.2f} latency {n.latency if n.latency is not None else float('nan'):.2f} "
        f"queue {n.queue:.2f}"
        if n is not None
        else "no inputs"
    )
    score = f"{d.score:.3f}" if d.score is not None else "-"
    return (
        f"{d.replica}: weight {d.previous} → {d.weight} (score {score}; {inputs}; "
        f"{', '.join(d.reasons)})"
    )


class Agent:
    """The loop's state and one :meth:`step`; :func:`run` drives it."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        config_path: str | Path | None = None,
        overrides: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
        source: InputSource | None = None,
        weights: WeightActuator | None = None,
        connect: Connect | None = None,
        metrics: AgentMetrics | None = None,
        dry_run: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        self.defaults = dict(defaults or {})
        if weights is None and connect is None:
            raise ValueError("Agent needs weights (an actuator) or connect (to build one)")
        self._own_source = source is None
        self.source: InputSource = source or PrometheusSource(config)
        self._connect = connect
        self.actuator: WeightActuator | None = weights
        self.metrics = metrics or AgentMetrics()
        self.dry_run = dry_run
        self.clock = clock
        self.state = scoring.AgentState()
        self.metrics_url: str | None = None
        """Where :func:`run_agent` serves /metrics while it runs."""
        self.down: dict[str, str] = {}
        """Problem key (``prometheus``, ``balancer``, ``balancer:set``, ``series:<replica>``)
        → its message; each is logged when it starts and when it ends, not in between."""

    # -- log once -----------------------------------------------------------------------

    def _fail(self, key: str, message: str) -> None:
        self.metrics.error(key.split(":", 1)[0])
        if key not in self.down:
            log.warning(
                "%s; holding the last weights, retrying every %gs", message, self.config.interval_s
            )
            self.down[key] = message
        else:
            log.debug("%s: still failing", key)

    def _ok(self, key: str, message: str) -> None:
        if self.down.pop(key, None) is not None:
            log.info("%s; resuming", message)

    # -- one step -----------------------------------------------------------------------

    def step(self) -> StepResult:
        cfg = self.config
        self.metrics.iteration(cfg.enabled and not self.dry_run)
        try:
            if self.actuator is None:
                assert self._connect is not None
                self.actuator = self._connect(cfg)
            actuator = self.actuator
            live = actuator.weights()
        except TargetError as exc:
            self._fail("balancer", str(exc))
            return StepResult(ok=False, error="balancer")
        self._ok("balancer", "the balancer answers again")
        current = dict(live)

        try:
            inputs = self.source.read()
        except TargetError as exc:
            self._fail("prometheus", str(exc))
            return StepResult(ok=False, error="prometheus")
        self._ok("prometheus", f"Prometheus at {cfg.prometheus_url} answers again")
        for r in sorted(current):
            if r in inputs:
                self._ok(f"series:{r}", f"replica {r} has metrics in Prometheus again")
            else:
                self._fail(
                    f"series:{r}",
                    f'replica {r} has no {cfg.replica_label}="{r}" series in Prometheus '
                    "(vllm:kv_cache_usage_perc); keeping its weight",
                )

        self.state, decisions = scoring.step(cfg, self.state, inputs, current)
        pushed = {
            d.replica: min(d.weight, actuator.max_weight)
            for d in decisions
            if live.get(d.replica) != min(d.weight, actuator.max_weight)
        }
        apply = cfg.enabled and not self.dry_run
        if pushed and apply:
            try:
                actuator.set_weights(pushed)
            except TargetError as exc:
                # A refusal (e.g. HAProxy with a static algorithm) while reading works:
                # its own key, so that it is logged once and not "recovered" every step.
                self._fail("balancer:set", str(exc))
                return StepResult(ok=False, decisions=decisions, error="balancer")
            self._ok("balancer:set", "the balancer accepts the weights again")
        for d in decisions:
            if d.changed:
                log.info("%s%s", "" if apply else "[not applied] ", _describe(d))
            else:
                log.debug("%s", _describe(d))
        final = {**live, **pushed} if apply else live
        self.metrics.weights(sorted(final.items()))
        self.metrics.decisions(decisions)
        self.metrics.success(self.clock())
        return StepResult(ok=True, decisions=decisions, pushed=pushed if apply else {})

    # -- reload -------------------------------------------------------------------------

    def reload(self) -> bool:
        """Re-read the config file (CLI overrides stay pinned); False if it is invalid."""
        if self.config_path is None:
            log.info("reload requested but the agent runs without --config; nothing to do")
            return False
        try:
            new = load_agent_config(self.config_path, self.overrides, self.defaults)
        except ConfigError as exc:
            self.metrics.error("config")
            log.error("config reload failed, keeping the running config: %s", exc)
            return False
        old = self.config
        changed = sorted(k for k in AgentConfig.model_fields if getattr(new, k) != getattr(old, k))
        pinned = sorted(set(self.overrides) & set(AgentConfig.model_fields))
        self.config = new
        if self._own_source and (
            new.prometheus_url != old.prometheus_url or new.query_timeout_s != old.query_timeout_s
        ):
            self.source = PrometheusSource(new)
        elif isinstance(self.source, PrometheusSource):
            self.source.cfg = new
        if self._connect is not None and new.state_dir != old.state_dir:
            self.actuator = None  # the next step connects to the new cluster's balancer
        log.info(
            "config reloaded from %s: %s%s",
            self.config_path,
            ", ".join(changed) or "no change",
            f" (pinned by flags: {', '.join(pinned)})" if pinned else "",
        )
        return True


def _start_exporter(metrics: AgentMetrics, port: int | None) -> ExporterServer | None:
    if port is None:
        return None
    try:
        server = ExporterServer(metrics, port).start()
    except OSError as exc:
        raise TargetError(
            f"cannot serve the agent's /metrics on 127.0.0.1:{port} ({exc.strerror}); "
            "pick another with --port (0 = any free port)"
        ) from None
    log.info("agent metrics on %s", server.url)
    return server


def run(
    config: AgentConfig,
    stop_event: threading.Event | None = None,
    max_iterations: int | None = None,
    *,
    reload_event: threading.Event | None = None,
    on_step: Callable[[StepResult], None] | None = None,
    **agent_kwargs: Any,
) -> Agent:
    """Run the loop until ``stop_event`` is set or ``max_iterations`` steps ran.

    ``agent_kwargs`` go to :class:`Agent` (``config_path``, ``overrides``, ``defaults``,
    ``source``, ``weights`` or ``connect``, ``metrics``, ``dry_run``). Raises only for a
    busy metrics port.
    """
    agent = Agent(config, **agent_kwargs)
    run_agent(agent, stop_event, max_iterations, reload_event=reload_event, on_step=on_step)
    return agent


def run_agent(
    agent: Agent,
    stop_event: threading.Event | None = None,
    max_iterations: int | None = None,
    *,
    reload_event: threading.Event | None = None,
    on_step: Callable[[StepResult], None] | None = None,
) -> None:
    """:func:`run` with an :class:`Agent` built by the caller."""
    config = agent.config
    stop = stop_event or threading.Event()
    exporter = _start_exporter(agent.metrics, config.metrics_port)
    agent.metrics_url = exporter.url if exporter is not None else None
    log.info(
        "agent started: every %gs, Prometheus %s, the balancer of %s%s",
        config.interval_s,
        config.prometheus_url,
        config.state_dir or "the running cluster",
        "" if config.enabled else " (observe only: enabled=false)",
    )
    done = 0
    try:
        while not stop.is_set():
            if reload_event is not None and reload_event.is_set():
                reload_event.clear()
                port = agent.config.metrics_port
                if agent.reload() and agent.config.metrics_port != port:
                    if exporter is not None:
                        exporter.stop()
                    exporter = _start_exporter(agent.metrics, agent.config.metrics_port)
                    agent.metrics_url = exporter.url if exporter is not None else None
            started = time.monotonic()
            result = agent.step()
            if on_step is not None:
                on_step(result)
            done += 1
            if max_iterations is not None and done >= max_iterations:
                break
            stop.wait(max(0.0, agent.config.interval_s - (time.monotonic() - started)))
    finally:
        if exporter is not None:
            exporter.stop()
        agent.metrics_url = None
        log.info("agent stopped after %d steps", done)


def install_signal_handlers(stop_event: threading.Event, reload_event: threading.Event) -> None:
    """SIGHUP → reload the config file; SIGTERM/SIGINT → stop (main thread only)."""
    signal.signal(signal.SIGHUP, lambda *_: reload_event.set())
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: stop_event.set())


class AgentThread:
    """The loop in a daemon thread: ``with AgentThread(cfg, **agent_kwargs) as t: ...``
    (for tests and for callers such as an end-to-end check or the embedded cluster)."""

    def __init__(self, config: AgentConfig, **agent_kwargs: Any) -> None:
        self.stop_event = threading.Event()
        self.reload_event = threading.Event()
        self.started = threading.Event()
        self.results: list[StepResult] = []
        self.agent = Agent(config, **agent_kwargs)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="lbtune-agent", daemon=True)

    def _on_step(self, result: StepResult) -> None:
        self.results.append(result)
        self.started.set()

    def _main(self) -> None:
        try:
            run_agent(
                self.agent,
                self.stop_event,
                reload_event=self.reload_event,
                on_step=self._on_step,
            )
        except BaseException as exc:
            self.error = exc
            self.started.set()
            raise

    def wait_steps(self, n: int, timeout: float = 10.0) -> bool:
        """Wait until ``n`` steps ran (True) or ``timeout`` passed (False)."""
        deadline = time.monotonic() + timeout
        while len(self.results) < n and self.error is None:
            if time.monotonic() > deadline:
                return False
            self.stop_event.wait(0.01)
        return len(self.results) >= n

    def start(self) -> AgentThread:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        self._thread.join(timeout)

    def __enter__(self) -> AgentThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
