"""The SLO record and ``--slo``: the TPOT bound ``lbtune capacity`` reads."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from lbtune.errors import ConfigError
from lbtune.metrics.stats import meets_slo
from lbtune.records.slo import Slo, parse_slo
from tests.metrics.records import rec


def test_tpot_is_read_only_when_asked() -> None:
    slo = parse_slo("ttft=300ms,tpot=50ms,e2e=8s", Slo(), tpot=True)
    assert (slo.ttft_s, slo.tpot_s, slo.e2e_s) == (0.3, 0.05, 8.0)
    with pytest.raises(ConfigError, match="tpot"):
        parse_slo("tpot=50ms", Slo())


def test_an_slo_without_tpot_keeps_its_json_form() -> None:
    ta = TypeAdapter(Slo)
    assert "tpot_s" not in ta.dump_python(Slo(0.3, 1.0))
    assert ta.dump_python(Slo(0.3, 1.0, tpot_s=0.05))["tpot_s"] == 0.05
    assert ta.validate_python(ta.dump_python(Slo(tpot_s=0.05))) == Slo(tpot_s=0.05)


def test_meets_slo_judges_tpot_when_bounded() -> None:
    # 11 output tokens, first at 0.1 s, end at 1.1 s: TPOT = 1.0 / 10 = 0.1 s.
    r = rec(0, sent=0.0, ttft=0.1, e2e=1.1, output_tokens=11)
    assert meets_slo(r, Slo(ttft_s=0.2, e2e_s=2.0))
    assert meets_slo(r, Slo(ttft_s=0.2, e2e_s=2.0, tpot_s=0.1))
    assert not meets_slo(r, Slo(ttft_s=0.2, e2e_s=2.0, tpot_s=0.099))
    one_token = rec(1, sent=0.0, ttft=0.1, e2e=1.1, output_tokens=1)
    assert meets_slo(one_token, Slo(tpot_s=0.001))  # no TPOT to judge: E2E covers it


def test_without_tpot_leaves_the_run_slo_its_own_bounds() -> None:
    from lbtune.records.slo import without_tpot

    assert without_tpot("ttft=2s,tpot=100ms,e2e=30s") == "ttft=2s,e2e=30s"
    assert without_tpot("tpot=100ms") is None
    assert without_tpot(None) is None
    with pytest.raises(ConfigError, match="--slo"):
        without_tpot("itl=5ms")
