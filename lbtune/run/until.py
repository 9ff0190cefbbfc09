"""``--until-samples``: end a stress run once its measurement window holds enough
successful requests, or when the caller says stop, whichever comes first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from lbtune.loadgen.collect import Progress
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
    successful requests (the records the run's one tail hands on with each snapshot)."""

    def __init__(self, plan: RunPlan, need: int, stop: threading.Event) -> None:
        self._plan, self._need, self._stop = plan, need, stop
        self._shape_end_s = plan.shape_window()[1]
        self._ok_sent: list[float] = []
        self.window: tuple[float, float] | None = None
        """The window as of the latest snapshot (:meth:`RunPlan.window_at` of the run's
        start as the runner knows it then: it learns the generators' start a little
        after they send it)."""
        self.reached_at: float | None = None

    def __call__(self, p: Progress) -> None:
        if self.reached_at is not None:
            return
        self._ok_sent.extend(r.sent_at for r in p.records if r.outcome == "ok")
        self.window = start, end = self._plan.window_at(p.started_at)
        shape_done = p.elapsed_s >= self._shape_end_s
        if shape_done and sum(1 for t in self._ok_sent if start <= t < end) >= self._need:
            self.reached_at = time.time()
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
