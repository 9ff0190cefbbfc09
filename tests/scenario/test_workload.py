"""The request sequence: deterministic random access, lengths, prefixes, sessions, mixes."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import Counter
from collections.abc import Callable

import pytest

from lbtune import tokens
from lbtune.scenario import (
    AgentWorkload,
    build_workload,
    list_scenarios,
    load_scenario,
    scenario_from_dict,
)
from lbtune.scenario.request import RequestSpec
from tests.scenario.conftest import base


def _request_or_none(request: Callable[[int], RequestSpec], i: int) -> RequestSpec | None:
    """Request ``i``, or None past an agent session's last call (another seed's plan)."""
    try:
        return request(i)
    except IndexError:
        return None


def _content_tokens(r: RequestSpec) -> int:
    if r.messages is not None:
        return sum(tokens.count(m["content"]) for m in r.messages)
    return tokens.count(r.prompt or "")


@pytest.mark.parametrize("sc", list_scenarios(), ids=lambda s: s.name)
def test_builtin_workload_deterministic(sc: object) -> None:
    from lbtune.scenario import Scenario

    assert isinstance(sc, Scenario)
    w = build_workload(sc)
    idx = list(range(200))
    if isinstance(w, AgentWorkload):  # request indices are (session, call) pairs
        idx = [c.index for s in range(40) for c in w.session(s).calls][:200]
    first = [w.request(i) for i in idx]
    again = build_workload(sc)
    assert [again.request(i) for i in reversed(idx)][::-1] == first  # random access
    other = build_workload(sc, seed=sc.seed + 1)
    assert (
        sum(_request_or_none(other.request, i) == r for i, r in zip(idx, first, strict=True)) == 0
    )
    for r in first:
        assert r.extra_body == {"ignore_eos": True}
        assert r.prompt_tokens == _content_tokens(r)
        assert r.model in sc.model_names()


def test_same_requests_in_another_process() -> None:
    code = (
        "from lbtune.scenario import build_workload, load_scenario;"
        "w = build_workload(load_scenario('mixed'));"
        "print(repr([w.request(i) for i in (0, 77, 150, 999)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    w = build_workload(load_scenario("mixed"))
    assert out == repr([w.request(i) for i in (0, 77, 150, 999)])


def test_longctx_percentiles_match_table() -> None:
    w = build_workload(load_scenario("longctx"))
    lengths = sorted(w.request(i).prompt_tokens for i in range(5000))
    share_le_512 = sum(n <= 512 for n in lengths) / len(lengths)
    assert share_le_512 == pytest.approx(0.68, abs=0.02)

    def pct(p: float) -> int:
        return lengths[int(p * len(lengths)) - 1]

    assert pct(0.90) == pytest.approx(2048, rel=0.12)
    assert pct(0.99) == pytest.approx(8192, rel=0.25)
    assert max(lengths) <= 32768
    assert min(lengths) >= 16


def test_exact_prompt_token_counts() -> None:
    sc = scenario_from_dict(
        base(prompt_tokens={"type": "uniform", "min": 1, "max": 3000}, api="completions")
    )
    w = build_workload(sc)
    for i in range(300):
        r = w.request(i)
        assert r.prompt is not None and r.messages is None
        assert tokens.count(r.prompt) == r.prompt_tokens
        assert 1 <= r.prompt_tokens <= 3000
        assert r.path() == "/v1/completions"


def test_shared_prefix_requests_share_first_tokens() -> None:
    sc = scenario_from_dict(base(prefix={"groups": 3, "tokens": 200, "fraction": 0.6}))
    w = build_workload(sc)
    reqs = [w.request(i) for i in range(600)]
    by_group: dict[int, set[str]] = {}
    for r in reqs:
        assert r.messages is not None
        if r.prefix_group is None:
            assert r.messages[0]["role"] == "user"
            continue
        first200 = tokens.split(r.messages[0]["content"] + " " + r.messages[1]["content"])[:200]
        by_group.setdefault(r.prefix_group, set()).add(" ".join(first200))
        assert r.messages[0]["role"] == "system"
        assert r.prompt_tokens == 200 + 32
    assert sorted(by_group) == [0, 1, 2]
    assert all(len(v) == 1 for v in by_group.values())  # one shared prefix per group
    assert len({next(iter(v)) for v in by_group.values()}) == 3  # groups differ
    share = sum(r.prefix_group is not None for r in reqs) / len(reqs)
    assert share == pytest.approx(0.6, abs=0.07)
    # Requests without a shared prefix do not share a beginning by accident.
    heads = [
        tokens.split(r.messages[0]["content"])[:6]
        for r in reqs
        if r.prefix_group is None and r.messages is not None
    ]
    assert len({tuple(h) for h in heads}) == len(heads)


def test_session_turns_grow_and_resend_history() -> None:
    sc = scenario_from_dict(
        base(sessions={"fraction": 0.5, "turns": 3}, turn_gap=16, stream=0.5, priority={1: 1})
    )
    w = build_workload(sc)
    reqs = [w.request(i) for i in range(16 * 40)]
    sessions: dict[int, list[RequestSpec]] = {}
    for r in reqs:
        if r.session_id is not None:
            sessions.setdefault(r.session_id, []).append(r)
    assert sum(len(v) for v in sessions.values()) / len(reqs) == pytest.approx(0.5, abs=0.1)
    complete = [v for v in sessions.values() if len(v) == 3]
    assert len(complete) > 20
    for turns in complete:
        assert [t.turn for t in turns] == [0, 1, 2]  # in index order
        assert turns[1].index - turns[0].index < 2 * 16
        for prev, cur in itertools.pairwise(turns):
            assert prev.messages is not None and cur.messages is not None
            assert cur.prompt_tokens > prev.prompt_tokens
            assert cur.messages[: len(prev.messages)] == prev.messages  # history resent
            reply = cur.messages[len(prev.messages)]
            assert reply["role"] == "assistant"
            assert tokens.count(reply["content"]) == prev.max_tokens
            assert cur.model == prev.model and cur.priority == 1
    assert {r.stream for r in reqs} == {True, False}


def test_model_api_priority_mixes() -> None:
    sc = scenario_from_dict(
        base(
            models={"a": 3, "b": 1},
            api={"chat": 1, "completions": 1},
            priority={0: 1, 5: 1},
            stream=False,
        )
    )
    w = build_workload(sc)
    reqs = [w.request(i) for i in range(2000)]
    models = Counter(r.model for r in reqs)
    assert models["a"] / 2000 == pytest.approx(0.75, abs=0.04)
    assert Counter(r.api for r in reqs)["chat"] / 2000 == pytest.approx(0.5, abs=0.04)
    assert Counter(r.priority for r in reqs)[5] / 2000 == pytest.approx(0.5, abs=0.04)
    assert not any(r.stream for r in reqs)
    body = reqs[0].body()
    assert body["ignore_eos"] is True and body["priority"] in (0, 5)


def test_classes_inherit_and_override() -> None:
    sc = scenario_from_dict(
        base(
            classes=[
                {"name": "short", "weight": 3},
                {"name": "long", "weight": 1, "prompt_tokens": {"type": "fixed", "value": 999}},
            ]
        )
    )
    reqs = [build_workload(sc).request(i) for i in range(1000)]
    counts = Counter(r.traffic_class for r in reqs)
    assert counts["short"] / 1000 == pytest.approx(0.75, abs=0.05)
    assert {r.prompt_tokens for r in reqs if r.traffic_class == "long"} == {999}
    assert {r.prompt_tokens for r in reqs if r.traffic_class == "short"} == {32}


def test_negative_index_rejected() -> None:
    with pytest.raises(IndexError):
        build_workload(load_scenario("chat")).request(-1)
