"""`lbtune stress` options that must reach the load generator (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.errors import ConfigError
from lbtune.loadgen.runner import LoadConfig, run_load
from lbtune.records.slo import Slo, parse_slo
from lbtune.run.target import check_target_allowed


def test_tokenizer_reaches_the_workload(tmp_path: Path) -> None:
    """A --tokenizer the workload cannot use fails before any load is sent."""
    cfg = LoadConfig(
        target_url="http://127.0.0.1:9",
        scenario="chat",
        records_dir=tmp_path,
        tokenizer_path=str(tmp_path / "missing-tokenizer.json"),
    )
    with pytest.raises(ConfigError, match="tokenizer"):
        run_load(cfg)
    assert not list(tmp_path.glob("records-*.jsonl"))


def test_slo_overrides() -> None:
    base = Slo(ttft_s=1.0, e2e_s=10.0)
    got = parse_slo("ttft=350ms, e2e=2s,errors=2%", base)
    assert (got.ttft_s, got.e2e_s, got.max_error_rate) == (0.35, 2.0, 0.02)
    assert parse_slo(None, base) is base
    with pytest.raises(ConfigError, match="--slo"):
        parse_slo("p99=1s", base)


@pytest.mark.parametrize("url", ["http://10.1.2.3:8000", "http://gateway.example:80"])
def test_remote_targets_need_an_explicit_opt_in(url: str) -> None:
    with pytest.raises(ConfigError, match="--allow-remote"):
        check_target_allowed(url, allow_remote=False)
    check_target_allowed(url, allow_remote=True)  # no traffic: only the decision is tested
