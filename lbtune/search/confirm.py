"""Confirmation: is the best candidate really better than where the user started, and
than the best reference config the study measured?

After the budget, the best few candidates are re-run against the baseline (the live
configuration, always measured afresh: its search run is never used) and the study's
best reference config (arm ``R``: round robin or least-conn, where it differs from the
live one) in **rounds**: in every round the baseline first, then each candidate, then
the reference, ``A B1 B2 R A B1 B2 R ...``, on the same traffic (the study's seed), so
that drift of the cluster hits every arm alike. A round whose baseline run cannot be
measured (after one retry) is skipped whole — its candidates would have nothing to be
paired with — and does not count towards ``runs``. If the baseline has not been measured
in :data:`BASELINE_TRIES` rounds in a row (nor in any before), or by the round cap,
:class:`BaselineUnmeasurable` is raised.

**Enough samples.** At least ``runs`` rounds with a measured baseline; then more, one
at a time, while some arm's pooled requests are fewer than a P99 needs
(:data:`~lbtune.records.quantiles.MIN_SAMPLES`, 100), up to ``max_rounds`` rounds and
``max_s`` seconds of confirmation (a round is started only if it is expected to end in
time). If the cap is hit, every arm is judged on the highest tail its samples support
(:func:`lbtune.search.paired.tail_quantile`) and the note says so:
"P99 from N samples: not enough; reporting P95".

**Verdict** (:func:`lbtune.search.judge.verdict`): each candidate is compared with the
baseline and with the reference, the reference with the baseline, each over the rounds
both arms were measured in, by the paired two-level bootstrap of
:mod:`lbtune.search.paired`. A candidate wins only if it beats both; else the reference
wins if it beats the baseline; otherwise: "no significant improvement", and nothing is
applied.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from lbtune.errors import LbtuneError, TrialFailed
from lbtune.objective import ObjectiveSpec
from lbtune.records.quantiles import MIN_SAMPLES
from lbtune.search.judge import Arm, Arms, Rounds, verdict
from lbtune.search.result import Confirmation
from lbtune.search.trial import Measurement, TrialRunner

__all__ = ["Arm", "BaselineUnmeasurable", "confirm"]

log = logging.getLogger(__name__)

MAX_ROUNDS = 6
"""Default cap on confirmation rounds when the pooled samples are too few for a P99."""
MAX_SECONDS = 900.0
"""Default cap on the wall time of confirmation (15 min)."""
NEED = MIN_SAMPLES["p99"]
"""Pooled samples per arm for a P99 (100)."""
BASELINE_TRIES = 3
"""Rounds in a row (each run retried once) an arm may fail, when no round has measured it
yet, before it is given up: the baseline is then unmeasurable (the study stops with
:class:`BaselineUnmeasurable`), a candidate gets no further rounds (it cannot win)."""


class BaselineUnmeasurable(LbtuneError):
    """The live configuration could not be measured in any confirmation round."""


def _measure(
    runner: TrialRunner, arm: Arm, label: str, say: Callable[[str], None]
) -> tuple[Measurement | None, str, str]:
    """One confirmation run, a failed or untrusted one retried once: (m, why not, label)."""
    reason = ""
    for attempt in (1, 2):
        used = label if attempt == 1 else f"{label}-retry"
        try:
            m = runner.run(arm.params, used)
        except TrialFailed as exc:
            reason = str(exc)
            say(
                f"confirmation run {label} failed ({exc}); "
                + ("retrying" if attempt == 1 else "skipped")
            )
            continue
        if m.stopped:
            return None, "stopped", used
        if m.samples is None or m.figures is None:
            return None, "not measurable: no samples", used
        return m, "", used
    return None, reason, label


def confirm(
    runner: TrialRunner,
    baseline: Arm,
    candidates: Sequence[Arm],
    spec: ObjectiveSpec,
    *,
    runs: int,
    max_rounds: int = MAX_ROUNDS,
    max_s: float = MAX_SECONDS,
    seed: int = 0,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = log.info,
    clock: Callable[[], float] = time.monotonic,
    reference: Arm | None = None,
) -> Confirmation:
    """Interleaved rounds and the paired bootstrap verdict; see the module docstring.
    ``reference``: the study's best reference config (arm ``R``), run last in each round."""
    arms = Arms(baseline, tuple(candidates), reference)
    if not arms.challengers:
        return Confirmation("baseline is best", baseline.trial, note="no candidate to confirm")
    rounds = Rounds()
    t0 = clock()
    misses = dict.fromkeys((a.label for a in arms.all), 0)  # tried and failed, rounds in a row
    dropped: set[str] = set()
    while stop is None or not stop.is_set():
        good = sum(1 for _, label in rounds.measured if label == baseline.label)
        n = rounds.smallest_pool([a for a in arms.all if a.label not in dropped])
        if good >= runs and n >= NEED:
            break
        if good == 0 and misses[baseline.label] >= BASELINE_TRIES:
            break
        k = rounds.k
        per_round = (clock() - t0) / k if k else 0.0
        if k >= max_rounds or (k and clock() - t0 + per_round > max_s):
            rounds.cap_hit = (
                f"confirmation stopped at {k} round(s), {clock() - t0:.0f} s "
                f"(cap {max_rounds} rounds, {max_s:.0f} s)"
            )
            break
        if good >= runs:
            say(f"confirmation: {n} pooled samples in the smallest arm, a P99 needs {NEED}")
        rounds.k += 1
        _round(runner, arms, rounds, (misses, dropped), stop, say)
        if len(dropped) == len(arms.challengers):
            break
    _check_baseline(arms.baseline, rounds, stop)
    return verdict(arms, rounds, spec, seed, say)


def _check_baseline(baseline: Arm, rounds: Rounds, stop: threading.Event | None) -> None:
    """BaselineUnmeasurable when no round measured the baseline (unless stopped)."""
    if any(label == baseline.label for _, label in rounds.measured):
        return
    if stop is not None and stop.is_set():
        return
    reasons = {why for _, a, _, m, why in rounds.plan if a is baseline and m is None}
    raise BaselineUnmeasurable(
        f"the live configuration (trial {baseline.trial}) could not be measured in any of "
        f"{rounds.k} confirmation round(s) ({'; '.join(sorted(reasons)) or 'no run'}): "
        "no verdict, nothing applied"
    )


def _round(
    runner: TrialRunner,
    arms: Arms,
    rounds: Rounds,
    failing: tuple[dict[str, int], set[str]],
    stop: threading.Event | None,
    say: Callable[[str], None],
) -> None:
    """Round ``rounds.k``: every arm once, the baseline first; an arm is skipped when this
    round's baseline failed and dropped once it failed ``BASELINE_TRIES`` rounds in a row
    without ever being measured. ``rounds`` and ``failing`` (misses in a row per arm, the
    arms dropped) grow."""
    misses, dropped = failing
    k, baseline = rounds.k, arms.baseline
    for arm in arms.all:
        if stop is not None and stop.is_set():
            return
        label = f"confirm-{k}-{arm.label}"
        if arm is not baseline and (k, baseline.label) not in rounds.measured:
            rounds.plan.append((k, arm, label, None, "skipped: the baseline of this round failed"))
            continue
        if arm.label in dropped:
            rounds.plan.append((k, arm, label, None, "dropped: not measurable"))
            continue
        what = f"{arm.role} reference, " if arm is arms.reference else ""
        say(f"confirmation round {k}: {arm.label} ({what}trial {arm.trial})")
        rounds.order.append(arm.label)
        m, why, label = _measure(runner, arm, label, say)
        misses[arm.label] = 0 if m is not None else misses[arm.label] + 1
        if m is not None:
            rounds.measured[(k, arm.label)] = m
        elif arm is baseline:
            say(f"round {k}: the baseline could not be measured ({why}); round skipped")
        elif misses[arm.label] >= BASELINE_TRIES and not any(
            label == arm.label for _, label in rounds.measured
        ):
            dropped.add(arm.label)
            say(
                f"confirmation: {arm.label} (trial {arm.trial}) not measurable in "
                f"{BASELINE_TRIES} rounds in a row; no further rounds for it"
            )
        rounds.plan.append((k, arm, label, m, why))
