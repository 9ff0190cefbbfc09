"""A window sees every request that occupies it: users parked on a slow replica from the
warm-up cannot make a configuration look good (issue 22).

The trial is scored the way :func:`lbtune.tune.harness._measurement` scores it: the
censored samples of the window (:func:`lbtune.metrics.censor.censored_samples`), their
P99s (:func:`lbtune.search.tail.tail_figures`) and the composite score. Only that
existing interface is used, so this test also runs against the rule it replaces (requests
*sent* in the window), where it fails: the parked users send nothing in the window and
their stuck requests were never seen.
"""

from __future__ import annotations

from collections.abc import Callable

from lbtune.metrics.censor import censored_samples
from lbtune.objective import Figures, ObjectiveSpec, composite
from lbtune.records.requests import RequestRecord
from lbtune.search.tail import tail_figures
from tests.metrics.records import rec

USERS = 24
WINDOW = (3.0, 12.0)
"""A 15 s trial: 3 s warm-up, 9 s measured, 3 s cool-down."""
RUN_END = 15.0

Latency = Callable[[int, int], tuple[float, float]]
"""(user, its k-th request) -> (TTFT, E2E) in seconds."""


def closed_loop(latency: Latency) -> list[RequestRecord]:
    """Every user sends its next request when the last one ended (no think time) until the
    run ends; a request still running then is cut off (``cancelled``)."""
    out: list[RequestRecord] = []
    for user in range(USERS):
        t, k = 0.01 * user, 0
        while t < RUN_END:
            ttft, e2e = latency(user, k)
            cut = t + e2e > RUN_END
            span = RUN_END - t if cut else e2e
            first = ttft if ttft < span else None
            out.append(
                rec(
                    len(out),
                    sent=t,
                    ttft=first,
                    e2e=span,
                    outcome="cancelled" if cut else "ok",
                )
            )
            t, k = t + span, k + 1
    return out


def balanced(user: int, k: int) -> tuple[float, float]:
    """Every replica shares the load: 0.7-0.9 s per request."""
    return 0.15, 0.7 + 0.05 * ((user * 7 + k) % 5)


def parked(user: int, k: int) -> tuple[float, float]:
    """22 of 24 users' second request (sent in the warm-up, at ~0.5 s) lands on a slow,
    full replica and waits 12 s for it, past the window's end; the two free users have
    the fast replicas to themselves."""
    if user < 22:
        return (11.5, 12.0) if k == 1 else (0.1, 0.5)
    return 0.1, 0.4


def score(records: list[RequestRecord]) -> float:
    cs = censored_samples(records, start=WINDOW[0], end=WINDOW[1])
    fig = tail_figures(cs)
    assert fig is not None
    return composite(fig, ObjectiveSpec())


def test_users_parked_on_a_slow_replica_from_the_warm_up_score_worse() -> None:
    good, bad = score(closed_loop(balanced)), score(closed_loop(parked))
    # The parked config held 22 users for the whole window: far worse, not "like the optimum".
    assert bad > 3 * good


def test_the_stuck_requests_count_from_their_send() -> None:
    records = closed_loop(parked)
    cs = censored_samples(records, start=WINDOW[0], end=WINDOW[1])
    stuck = [e for e in cs.e2e if e >= 11.0]
    assert len(stuck) == 22  # each parked user once, with the 12 s it waited
    assert cs.carried >= 22  # sent in the warm-up, still running when the window opened
    # A request that ended before the window opened (the parked users' first) does not
    # occupy it, nor does one sent after it closed.
    early = [r for r in records if r.ended_at <= WINDOW[0]]
    late = [r for r in records if r.sent_at >= WINDOW[1]]
    assert len(early) >= 22 and late
    assert cs.sent == len(records) - len(early) - len(late)


def test_live_trials_and_twin_runs_score_through_the_one_rule() -> None:
    """:func:`scored_figures` (a live trial's ``_measurement`` and ``twin_figures`` both call
    it) replaces the summary's P99s, over finished requests sent in the window, with the
    occupancy rule's: the parked users' 12 s requests are in the scored P99."""
    from lbtune.search.tail import scored_figures

    records = closed_loop(parked)
    summary_like = Figures(p99_e2e_s=0.5, p99_ttft_s=0.1, error_rate=0.0)  # what was sent in it
    cs = censored_samples(records, start=WINDOW[0], end=WINDOW[1])
    fig = scored_figures(summary_like, cs)
    assert fig.p99_e2e_s >= 11.0 and fig.samples == len(cs.e2e) and fig.censored == cs.censored
    assert fig.error_rate == cs.error_rate
    empty = censored_samples([], start=WINDOW[0], end=WINDOW[1])
    assert scored_figures(summary_like, empty) == summary_like
