"""One capacity search end to end: the library behind ``lbtune capacity``::

    from lbtune.capacity.run import CapacityOptions, run_capacity
    report = run_capacity(CapacityOptions(StressOptions(scenario="mixed"), slo, out_dir=d))
    print(report.live.capacity, report.live.ci)

The search is over the open-loop rate, or over closed-loop users when
``search.unit`` is ``"users"`` (``lbtune capacity --users``): the probes run the scenario
at that many users, and the capacity is the highest whole count meeting the SLO.

With a twin case (the cluster is the embedded one and the twin models its balancer), the
same search runs first in virtual time, and the live search starts from a bracket of
``twin_margin`` around the twin's capacity; the report says how far apart the two were.
Every live probe is a stress run whose directory sits under ``out_dir``; the report is
``out_dir/capacity.json``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from lbtune.capacity.frame import CapacityReport, SearchFrame, frame, twin_error
from lbtune.capacity.probes import LiveProbe, Probes, ProbeShape, TwinCase, TwinProbe
from lbtune.capacity.report import write
from lbtune.capacity.search import Probe, ProbeResult, SearchOptions, for_twin, search
from lbtune.errors import ConfigError, LbtuneError
from lbtune.records.slo import Slo
from lbtune.run.stress import StressOptions, check_bounds

__all__ = ["CapacityOptions", "SloNotMet", "check_load", "check_slo", "measure", "run_capacity"]

log = logging.getLogger(__name__)


class SloNotMet(LbtuneError):
    """No level the search probed met the SLO: the SLO is impossible for this cluster."""


@dataclass(frozen=True)
class CapacityOptions:
    stress: StressOptions
    """The probes' stress options (scenario, target, seed, duration); the level (rate or
    users, ``search.unit``) is the search's."""
    slo: Slo
    out_dir: Path
    search: SearchOptions = field(default_factory=SearchOptions)
    twin: TwinCase | None = None
    twin_margin: float = 0.2
    """The live bracket: the twin's capacity ± this share."""
    shape: ProbeShape = field(default_factory=ProbeShape)


def check_slo(slo: Slo, share: float) -> None:
    """An SLO no rate can meet, or that every request meets, is a one-line error."""
    if not 0 < share < 1:
        raise ConfigError(f"--attainment: must be between 0 and 1 (e.g. 0.99), got {share:g}")
    bounds = {"ttft": slo.ttft_s, "tpot": slo.tpot_s, "e2e": slo.e2e_s}
    if all(v is None for v in bounds.values()):
        raise ConfigError(
            "--slo: no latency bound (ttft, tpot or e2e) and the scenario sets none: every "
            "served request would meet it (e.g. --slo ttft=1s,tpot=100ms,e2e=20s)"
        )
    for key, v in bounds.items():
        if v is not None and v <= 0:
            raise ConfigError(f"--slo {key}={v:g}s: no request is served in no time; give > 0")


def check_load(opts: CapacityOptions) -> None:
    """The probes can run: the stress options within bounds, and the scenario at the
    search's unit (a trace that sets its own arrivals takes neither a rate nor users); one
    line, before anything starts."""
    check_bounds(opts.stress)
    Probes(opts.stress, opts.shape, opts.search.unit)


def measure(
    opts: CapacityOptions,
    live: Probe,
    twin: Probe | None = None,
    on_probe: Callable[[ProbeResult], None] | None = None,
) -> CapacityReport:
    """The search with these probes (the twin's first, when given), reported and written."""
    check_slo(opts.slo, opts.search.attainment)
    sopts = opts.search
    twin_frame: SearchFrame | None = None
    if twin is not None:
        t0 = time.monotonic()
        tres = search(twin, for_twin(sopts), on_probe)
        twin_frame = frame(tres, "twin", time.monotonic() - t0)
        cap = tres.estimate.capacity
        if cap is not None and tres.estimate.kind == "bracketed":
            m = opts.twin_margin
            sopts = replace(sopts, bracket=(cap * (1 - m), cap * (1 + m)))
    t0 = time.monotonic()
    lres = search(live, sopts, on_probe)
    live_frame = frame(lres, "live", time.monotonic() - t0)
    report = CapacityReport(
        scenario=opts.stress.scenario,
        target=opts.stress.target_url or "the embedded cluster",
        slo=opts.slo,
        attainment=sopts.attainment,
        precision=sopts.precision,
        confidence=sopts.ci.confidence,
        live=live_frame,
        twin=twin_frame,
        twin_error=twin_error(live_frame, twin_frame),
    )
    path = write(report, opts.out_dir)
    if live_frame.kind == "below":
        level = "user count" if sopts.unit == "users" else "rate"
        why = lres.stopped or f"the SLO was not met at any {level} probed"
        raise SloNotMet(f"{why}; see {path}")
    return report


def run_capacity(
    opts: CapacityOptions,
    *,
    on_probe: Callable[[ProbeResult], None] | None = None,
    say: Callable[[str], None] = log.info,
) -> CapacityReport:
    """Live probes as stress runs under ``opts.out_dir`` (twin probes first with a case)."""
    check_slo(opts.slo, opts.search.attainment)
    check_bounds(opts.stress)
    unit = opts.search.unit
    live = LiveProbe(Probes(opts.stress, opts.shape, unit), opts.slo, opts.out_dir, say)
    twin = None
    if opts.twin is not None:
        twin = TwinProbe(Probes(opts.stress, opts.shape, unit), opts.slo, opts.twin)
    return measure(opts, live, twin, on_probe)
