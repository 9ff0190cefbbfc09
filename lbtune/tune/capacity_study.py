"""A capacity study (``optimize --objective capacity``): where its trials run, and the
capacity at the SLO before and after, in the twin.

**The trials' rate.** At the live config's capacity it attains the target share exactly;
past it, it misses, and a config with more capacity still meets the SLO there or misses
it by less, so the SLO stretch (:mod:`lbtune.objective`) tells the configs apart. Too far
past it, every config in the space misses by a lot and their queues, not their routing,
decide. :func:`trial_rate` puts the trials at ``RATE_FACTOR`` (1.25) times the live
config's capacity in the twin (``--rate`` overrides it), its probes as long as a trial: an
overloaded queue grows with the window, so a 25-s trial sees a higher capacity than a
minute-long probe, and the rate must be past the capacity the trials see.

**Before and after.** The study report's "capacity at SLO" row: the twin's capacity
search of the live config and of the winner (:func:`twin_capacities`) with ``lbtune
capacity``'s own probes (a minute or more each), seconds to a minute of CPU each. A live
figure with a CI is a capacity search away: ``lbtune capacity --compare`` on the two param
files, which the report names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from lbtune.capacity.fit import Estimate
from lbtune.capacity.probes import Probes, ProbeShape, TwinProbe
from lbtune.capacity.search import SearchOptions, for_twin, search
from lbtune.capacity.twincase import twin_case
from lbtune.errors import ConfigError
from lbtune.objective import ObjectiveSpec
from lbtune.records.slo import Slo
from lbtune.run.stress import StressOptions
from lbtune.search.result import CapacityAtSlo

__all__ = ["RATE_FACTOR", "trial_rate", "twin_capacities"]

RATE_FACTOR = 1.25
"""The trials' rate over the live config's capacity in the twin."""


def _twin_capacity(
    trials: StressOptions,
    slo: Slo,
    attainment: float,
    state_dir: Path | None,
    params: Mapping[str, object] | None = None,
    *,
    probe_s: float | None = None,
) -> Estimate:
    """The twin's capacity search of ``params`` (else the live config) on the study's
    traffic (``trials``' scenario and seed, open loop at the rates the search picks), each
    probe ``probe_s`` long (None: ``lbtune capacity``'s own probe length)."""
    case = twin_case(state_dir, None, params)
    base = replace(trials, rate=None, users=None, plan=None, duration_s=probe_s)
    probes = Probes(base, ProbeShape(), "req/s")
    opts = for_twin(SearchOptions(attainment=attainment, precision=0.1))
    return search(TwinProbe(probes, slo, case), opts).estimate


def trial_rate(
    trials: StressOptions,
    slo: Slo,
    attainment: float,
    state_dir: Path | None,
    say: Callable[[str], None],
) -> float:
    """``RATE_FACTOR`` times the live config's capacity in the twin (the running embedded
    cluster's), at ``slo`` for ``attainment`` of the requests. ConfigError (one line,
    naming ``--rate``) when the twin does not model the cluster or the live config meets
    the SLO at no rate."""
    try:
        est = _twin_capacity(trials, slo, attainment, state_dir, probe_s=trials.duration_s)
    except ConfigError as exc:
        raise ConfigError(
            f"--objective capacity: no twin to place the trials' rate ({exc}); give --rate R "
            "(req/s; e.g. the capacity `lbtune capacity` found)"
        ) from None
    if est.capacity is None:
        raise ConfigError(
            "--objective capacity: in the twin the live config meets the SLO at no rate "
            "(loosen --slo or lower --attainment, or give --rate R)"
        )
    rate = round(est.capacity * RATE_FACTOR, 3)
    say(
        f"capacity study: the live config's capacity in the twin is {est.capacity:.3g} req/s "
        f"({est.kind}); every trial runs open loop at {rate:g} req/s ({RATE_FACTOR:g}x)"
    )
    return rate


def twin_capacities(
    trials: StressOptions,
    spec: ObjectiveSpec,
    state_dir: Path | None,
    baseline: Mapping[str, object],
    winner: Mapping[str, object] | None,
    probe_s: float | None = None,
) -> CapacityAtSlo:
    """The study report's "capacity at SLO" row: the twin's capacity of the live config
    (``baseline``) and of the ``winner`` (None: not confirmed), with the trials' rate; a
    note instead of figures when the twin does not model the cluster. Probes of
    ``probe_s`` (None: ``lbtune capacity``'s own)."""
    assert spec.slo is not None
    row = CapacityAtSlo.of(spec)
    try:
        slo, share = spec.slo, spec.share
        before = _twin_capacity(trials, slo, share, state_dir, baseline, probe_s=probe_s)
        after = None
        if winner is not None:
            after = _twin_capacity(trials, slo, share, state_dir, winner, probe_s=probe_s)
    except ConfigError as exc:
        return replace(row, note=f"no twin capacity ({exc})")
    return replace(
        row,
        baseline=before.capacity,
        baseline_kind=before.kind,
        winner=None if after is None else after.capacity,
        winner_kind=None if after is None else after.kind,
    )
