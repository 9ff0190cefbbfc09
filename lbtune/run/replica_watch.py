"""Sample the balancer's view of its replicas while a run's load is going.

A thread asks the target's registry entry (``Balancer.replica_rows``: for HAProxy one
``show stat`` on its runtime socket) every ``interval_s`` and keeps every answer;
:mod:`lbtune.metrics.replica_events` turns them into outages and attributions. Only the
embedded cluster's balancer can be asked: for an external ``--target`` the timeline says
so and the report marks what it cannot attribute.
"""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

from lbtune.metrics.replica_events import ReplicaSample, ReplicaTimeline
from lbtune.targets import balancer

if TYPE_CHECKING:
    from lbtune.records.endpoints import Endpoints

log = logging.getLogger(__name__)

INTERVAL_S = 0.25
"""A quarter of a second: HAProxy's fast checks take a dead replica out within ~0.5 s."""
EXTERNAL = "an external target: lbtune cannot ask its balancer which replica was down"


class ReplicaWatch:
    """``with ReplicaWatch(endpoints): run the load``; then :meth:`timeline`."""

    def __init__(self, endpoints: Endpoints | None, interval_s: float = INTERVAL_S) -> None:
        self._ep = endpoints
        self._interval = interval_s
        self._samples: list[ReplicaSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: str = ""

    def __enter__(self) -> ReplicaWatch:
        if self._ep is not None:
            self._poll()  # the state before the load
            if any(s.down is not None for s in self._samples):
                # Only a balancer that can say when a replica is down is asked again
                # (Envoy, nginx, vllm-router: once, and the timeline says "unknown").
                self._thread = threading.Thread(target=self._run, name="replica-watch")
                self._thread.daemon = True
                self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._poll()  # the state at the end

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._poll()

    def _poll(self) -> None:
        assert self._ep is not None
        try:
            rows = balancer(self._ep.balancer).replica_rows(self._ep)
        except Exception as exc:  # replica_rows never raises; a bug here must not end a run
            self._failed = f"asking {self._ep.balancer} failed: {exc}"
            log.debug("replica watch: %s", self._failed)
            return
        now = time.time()
        self._samples.extend(
            ReplicaSample(now, r.replica, r.status, r.down, r.failures) for r in rows
        )

    def timeline(self) -> ReplicaTimeline:
        ep = self._ep
        if ep is None:
            return ReplicaTimeline(source="", reason=EXTERNAL)
        samples = tuple(self._samples)
        reason = ""
        if not samples:
            reason = self._failed or f"{ep.balancer} could not be asked about its replicas"
        elif all(s.down is None for s in samples):
            reason = f"{ep.balancer} does not say when a replica is down"
        models = {r.name: tuple(r.models) for r in ep.replicas}
        return ReplicaTimeline(ep.balancer, samples, models, reason)
