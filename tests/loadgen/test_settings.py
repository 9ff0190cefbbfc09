"""The generator's settings file: typed on both sides, an unknown key is refused.

The runner writes ``load-config.json`` (:class:`GeneratorSettings`) and the generator
process reads it back with the same model; what to send comes from the run plan it names
(``run.json``) or, without one, from the scenario/``fixed:`` source settings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lbtune.errors import ConfigError
from lbtune.loadgen.runner import LoadConfig, _settings
from lbtune.loadgen.settings import (
    SETTINGS_FILE,
    GeneratorSettings,
    SourceSettings,
    read_settings,
    write_settings,
)
from lbtune.loadgen.source import open_source
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.scenario.runplan import write_run_plan


def _fixed(tmp_path: Path, **kw: object) -> GeneratorSettings:
    cfg = LoadConfig(
        target_url="http://127.0.0.1:9", scenario="fixed:output=5", records_dir=tmp_path
    )
    return _settings(cfg, tmp_path).model_copy(update=kw)


def test_the_settings_round_trip_through_their_file(tmp_path: Path) -> None:
    s = _fixed(tmp_path)
    assert s.source == SourceSettings(scenario="fixed:output=5", seed=0, duration_s=60.0)
    assert s.run_plan is None and s.expect_workers == 1
    assert read_settings(write_settings(tmp_path / SETTINGS_FILE, s)) == s


def test_a_run_plan_is_the_source_whole(tmp_path: Path) -> None:
    plan = plan_run(StressOptions(scenario="chat", duration_s=12, users=3))
    path = write_run_plan(tmp_path, plan)
    cfg = LoadConfig(
        target_url="http://127.0.0.1:9",
        scenario="ignored",
        records_dir=tmp_path,
        run_plan=str(path),
    )
    s = _settings(cfg, tmp_path)
    assert s.source is None and s.run_plan == str(path)
    src = open_source(s)
    assert src.duration_s == plan.load.duration_s == 12
    assert src.plan.mode == "closed" and src.plan.users_at(5.0) == 3


def test_exactly_one_source(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one of run_plan and source"):
        GeneratorSettings.model_validate({**_fixed(tmp_path).model_dump(), "source": None})


def test_an_unknown_key_is_one_line_naming_it(tmp_path: Path) -> None:
    path = write_settings(tmp_path / SETTINGS_FILE, _fixed(tmp_path))
    path.write_text(json.dumps({**json.loads(path.read_text()), "duration": 30}))
    with pytest.raises(ConfigError, match="duration") as err:
        read_settings(path)
    assert "\n" not in str(err.value)


def test_the_generator_process_refuses_a_settings_file_with_an_unknown_key(
    tmp_path: Path,
) -> None:
    path = write_settings(tmp_path / SETTINGS_FILE, _fixed(tmp_path))
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_inflight": 8}))
    p = subprocess.run(
        [sys.executable, "-m", "lbtune.loadgen.worker", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0]["type"] == "error"
    assert "max_inflight" in lines[0]["error"] and "\n" not in lines[0]["error"]
    assert not list(tmp_path.glob("records-*.jsonl"))  # it sent nothing
