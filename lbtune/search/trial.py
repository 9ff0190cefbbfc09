"""One trial: apply a parameter set (direct path), measure the scenario, check the figures.

The measurement is a callable (:class:`Measure`) so that the study loop can be
tested with a fake and run for real with :class:`lbtune.tune.harness.StressMeasure`.
A trial that cannot be measured raises :class:`~lbtune.errors.TrialFailed` with a
reason; the study records it and goes on. A measurement the generator marked degraded
raises :class:`GeneratorBehind` (a TrialFailed that the study re-measures once, in the
same trial, see :func:`lbtune.search.study.run_loop`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from lbtune.errors import LbtuneError, TrialFailed
from lbtune.objective import Figures
from lbtune.scenario.runplan import RunPlan

if TYPE_CHECKING:
    from lbtune.targets.base import ParamSet
    from lbtune.targets.targetbase import TargetBase

log = logging.getLogger(__name__)

WindowHook = Callable[[int, Figures], bool]
"""Called once per measurement window with the figures so far; True asks to stop (prune)."""


class GeneratorBehind(TrialFailed):
    """The load generator fell behind: the figures are not trusted."""


@dataclass(frozen=True, eq=False)
class Samples:
    """Latencies of the requests sent in the measurement window (seconds), paired per request.

    ``ttft[i]`` is NaN for a request that has no first token (not streamed); ``tpot[i]``
    (empty when not collected) NaN where the request has no time per output token.
    """

    ttft: np.ndarray[tuple[int], np.dtype[np.float64]]
    e2e: np.ndarray[tuple[int], np.dtype[np.float64]]
    sent: int = 0
    errors: int = 0
    tpot: np.ndarray[tuple[int], np.dtype[np.float64]] = field(default_factory=lambda: np.empty(0))

    @classmethod
    def of(
        cls, ttft: object, e2e: object, sent: int = 0, errors: int = 0, tpot: object = ()
    ) -> Samples:
        return cls(
            np.asarray(ttft, dtype=np.float64).ravel(),
            np.asarray(e2e, dtype=np.float64).ravel(),
            sent,
            errors,
            np.asarray(tpot, dtype=np.float64).ravel(),
        )

    def pick(self, idx: np.ndarray[tuple[int], np.dtype[np.intp]]) -> Samples:
        """The requests at ``idx`` (a bootstrap draw), every per-request array alike."""
        tpot = self.tpot[idx] if self.tpot.size else self.tpot
        return Samples(self.ttft[idx], self.e2e[idx], self.sent, self.errors, tpot)


@dataclass(frozen=True, eq=False)
class Measurement:
    figures: Figures | None
    """None only when the run was stopped before it could be summarised."""
    samples: Samples | None = None
    degraded: tuple[str, ...] = ()
    """Why the generator is not trusted (empty = trusted)."""
    stopped: bool = False
    """Stopped early (pruned or interrupted): the figures cover part of the window."""
    seconds: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)
    plan: RunPlan | None = None
    """The run plan as it ran (``run.json``): what was sent, when, against what; the
    study records it per trial (``study.json``). None for a measurement without one."""


class Measure(Protocol):
    """Run the scenario once against whatever is live and measure it."""

    def __call__(self, label: str, on_window: WindowHook | None = None) -> Measurement: ...


ApplyFn = Callable[["ParamSet"], object]


@dataclass
class TrialRunner:
    """Apply → measure → check, for the study loop, the confirmation and the verification."""

    target: TargetBase
    measure: Measure
    apply: ApplyFn | None = None
    """How parameters become balancer state; default ``target.apply`` (the direct path)."""
    settle_s: float = 0.0
    """Pause after an apply before the load starts (HAProxy reload hand-over)."""
    check_balancer: Callable[[], None] = lambda: None
    """Asked when an apply or a measurement failed: raises
    :class:`~lbtune.errors.BalancerDown` (which ends the study) when the balancer itself
    is gone, so that a dead balancer does not fail every remaining trial one by one."""

    def run(self, params: ParamSet, label: str, on_window: WindowHook | None = None) -> Measurement:
        t0 = time.monotonic()
        apply = self.apply or (lambda p: self.target.apply(p))
        try:
            apply(params)
        except TrialFailed:
            raise
        except LbtuneError as exc:
            self.check_balancer()
            raise TrialFailed(f"apply failed: {exc}") from exc
        if self.settle_s:
            time.sleep(self.settle_s)
        applied = time.monotonic() - t0
        try:
            m = self.measure(label, on_window)
        except TrialFailed:
            raise
        except LbtuneError as exc:
            self.check_balancer()
            raise TrialFailed(f"measurement failed: {exc}") from exc
        except ValueError as exc:  # e.g. no successful request in the window
            raise TrialFailed(f"not measurable: {exc}") from exc
        if m.degraded and not m.stopped:
            raise GeneratorBehind("load generator fell behind: " + "; ".join(m.degraded))
        if m.figures is None and not m.stopped:
            raise TrialFailed("not measurable: no figures")
        timing = m.extra.get("timing")
        if isinstance(timing, dict):
            timing["apply"] = round(applied, 3)
        log.debug("%s measured in %.1f s", label, time.monotonic() - t0)
        return m
