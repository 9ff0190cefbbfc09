"""Defect 11 of issue 16: ``compare`` calls no regression on a figure its samples cannot
support (the MIN_SAMPLES rule of lbtune.records.quantiles): it says "not enough samples"."""

from __future__ import annotations

import random

import pytest

from lbtune.records.requests import RequestRecord


def _side(name: str, n: int, ttft: float, seed: int):  # type: ignore[no-untyped-def]
    from lbtune.compare.sources import Side
    from lbtune.metrics.bootstrap import RunArrays
    from lbtune.metrics.summary import Window

    rng = random.Random(seed)
    recs = []
    for i in range(n):
        t0 = 1000.0 + i * 0.5
        first = t0 + ttft * rng.uniform(0.8, 1.2)
        recs.append(
            RequestRecord(
                request_id=f"{name}{i}",
                index=i,
                model="m",
                api="chat",
                stream=True,
                sent_at=t0,
                ended_at=first + 0.05,
                outcome="ok",
                status_code=200,
                headers_at=t0 + 0.001,
                first_token_at=first,
                chunk_times=(first, first + 0.05),
                output_tokens=2,
            )
        )
    arrays = RunArrays.from_records(recs, Window(1000.0, 1000.0 + n * 0.5 + 1))
    return Side(
        name=name,
        label=name,
        path=name,
        kind="stress",
        scenario="s",
        figures={},
        arrays=arrays,
        requests=n,
    )


@pytest.mark.parametrize(("na", "nb"), [(50, 49), (99, 100), (100, 60), (150, 150)])
def test_a_p99_on_too_few_samples_is_not_a_regression(na: int, nb: int) -> None:
    from lbtune.compare.verdict import compare
    from lbtune.records.quantiles import MIN_SAMPLES

    r = compare(_side("A", na, 0.1, 1), _side("B", nb, 0.2, 2), resamples=400)
    p99 = {f.key: f for f in r.figures}["ttft_p99"]
    if min(na, nb) < MIN_SAMPLES["p99"]:
        assert p99.status == "untested" and not p99.failed
        assert "not enough samples" in p99.note
        assert str(min(na, nb)) in p99.note and "100" in p99.note
    else:  # enough on both sides: a doubled TTFT is a regression
        assert p99.status == "regression" and p99.failed


def test_p50_rests_on_its_own_minimum() -> None:
    from lbtune.compare.verdict import compare

    r = compare(_side("A", 50, 0.1, 1), _side("B", 50, 0.2, 2), resamples=400)
    assert {f.key: f for f in r.figures}["ttft_p50"].status == "regression"
