"""``--until-samples``: end a stress run once its measurement window holds enough
successful requests, or when the caller says stop, whichever comes first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from lbtune.loadgen.collect import Progress, RecordTail
from lbtune.records.requests import RequestRecord
from lbtune.scenario.runplan import RunPlan

__all__ = ["StopEither", "WindowCounter", "chain"]


class StopEither(threading.Event):
    """Set by lbtune itself (enough samples) or by the caller's ``stop``."""

    def __init__(self, outer: threading.Event | None) -> None:
        super().__init__()
        self._outer = outer

    def is_set(self) -> bool:
        return super().is_set() or (self._outer is not None and self._outer.is_set())


class WindowCounter:
    """Stops the run once the shape has run and the measurement window holds ``need``
    successful requests (their records, tailed about once a second)."""

    def __init__(self, out_dir: Path, plan: RunPlan, need: int, stop: threading.Event) -> None:
        self._plan, self._need, self._stop = plan, need, stop
        self._ok_sent: list[float] = []
        self.reached_at: float | None = None
        self._tail = RecordTail(out_dir, on_record=self._keep)

    def _keep(self, r: RequestRecord) -> None:
        if r.outcome == "ok":
            self._ok_sent.append(r.sent_at)

    def __call__(self, p: Progress) -> None:
        if self.reached_at is not None:
            return
        now = time.time()
        # The run's start as the runner knows it now (it learns the generators' start
        # message a little after they send it): recomputed at every snapshot.
        opens = now - p.elapsed_s + self._plan.window_start_s
        self._tail.poll()
        shape_done = p.elapsed_s >= self._plan.load.shape_duration_s - self._plan.load.cooldown_s
        if shape_done and sum(1 for t in self._ok_sent if t >= opens) >= self._need:
            self.reached_at = now
            self._stop.set()


def chain(
    first: Callable[[Progress], None] | None, then: Callable[[Progress], None] | None
) -> Callable[[Progress], None] | None:
    """Both progress callbacks, in order (either may be None)."""
    if first is None or then is None:
        return first or then

    def both(p: Progress) -> None:
        first(p)
        then(p)

    return both
