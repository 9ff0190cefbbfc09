"""Issue 29, class 2: every number that becomes work has a bound, checked at load time.

* Every numeric field of every document lbtune reads (scenario, cluster, sim host spec,
  parameter space, agent config, run plan, generator settings) has a lower and an upper
  bound: a walk of the pydantic models fails on one without (:mod:`.schema_bounds`), and
  the scenario's bounds table in ``docs/scenarios.md`` is the walk's.
* What the numbers imply together (a prefix and a session history beyond any context, a
  trace replay of centuries, a priority beyond 64 bits...) is one line, exit 2, before any
  process starts: ``lbtune stress`` against a port where nothing listens never gets as far
  as connecting.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from lbtune.agent.config import AgentConfig
from lbtune.cluster.config import ClusterConfig
from lbtune.loadgen.settings import GeneratorSettings
from lbtune.scenario.models import Scenario
from lbtune.scenario.runplan import RunPlan
from lbtune.sim.spec import HostSpec
from lbtune.targets.space import SpaceFile
from tests.robustness.conftest import run_cli
from tests.robustness.schema_bounds import bounds_table, numeric_fields

DOCUMENTS: list[type[BaseModel]] = [
    Scenario,
    ClusterConfig,
    HostSpec,
    SpaceFile,
    AgentConfig,
    RunPlan,
    GeneratorSettings,
]


@pytest.mark.parametrize("model", DOCUMENTS, ids=lambda m: m.__name__)
def test_every_number_of_every_document_has_both_bounds(model: type[BaseModel]) -> None:
    fields = list(numeric_fields(model))
    assert fields, f"{model.__name__}: the walk found no number at all"
    unbounded = [f"{f.path} {f.range_text()}" for f in fields if not f.bounded]
    assert unbounded == [], f"{model.__name__}: numbers without a bound: {unbounded}"


class _Toy(BaseModel):
    ok: int = Field(ge=0, le=3)
    loose: float = Field(gt=0)
    items: dict[int, list[float]] = Field(default_factory=dict)


def test_the_walk_finds_a_number_without_a_bound() -> None:
    """The walk itself: a field, a mapping key and a list item without bounds are found."""
    found = {f.path: f.bounded for f in numeric_fields(_Toy)}
    assert found == {"ok": True, "loose": False, "items.<key>": False, "items.<value>[]": False}


def test_the_docs_list_every_bound_of_a_scenario() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "scenarios.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- bounds:begin[^>]*-->\n(.*?)<!-- bounds:end -->", doc, re.S)
    assert m is not None, "docs/scenarios.md lost its bounds table"
    assert m.group(1) == bounds_table(Scenario), "regenerate the table: bounds_table(Scenario)"


# -- what the numbers imply, at the command line ------------------------------------------

_BASE = (
    "load: {type: constant, users: 2}\nmodels: {m: 1}\n"
    "prompt_tokens: {type: fixed, value: 8}\noutput_tokens: {type: fixed, value: 4}\n"
)
_OPEN = _BASE.replace("{type: constant, users: 2}", "{type: rate, rate: 2}")
SCENARIOS = {
    "prefix-1e9-tokens": _BASE + "prefix: {groups: 1, tokens: 1000000000, fraction: 1}\n",
    "lognormal-std-1e200": _BASE.replace(
        "prompt_tokens: {type: fixed, value: 8}",
        "prompt_tokens: {type: lognormal, mean: 100, std: 1.0e200}",
    ),
    "gamma-cv-1e300": _OPEN.replace("rate: 2}", "rate: 2, arrival: gamma, cv: 1.0e300}"),
    "priority-1e20": _BASE + "priority: {100000000000000000000: 1}\n",
    "prefix-and-history-beyond-a-context": _BASE.replace("value: 8", "value: 8000")
    + "prefix: {groups: 1, tokens: 1000000, fraction: 1}\nsessions: {fraction: 1, turns: 200}\n",
    "cached-prefixes-beyond-memory": _BASE
    + "prefix: {groups: 100000, tokens: 1000000, fraction: 1}\n",
    "normal-output-beyond-a-context": _BASE.replace(
        "output_tokens: {type: fixed, value: 4}",
        "output_tokens: {type: normal, mean: 1000000, std: 1000000}",
    ),
    "weight-inf": _BASE.replace("models: {m: 1}", "models: {m: .inf}"),
    "warmup-1e300": _BASE + "warmup_s: 1.0e300\n",
    "ramp-over-1e300": _OPEN.replace(
        "{type: rate, rate: 2}", "{type: ramp, to: 2, over: 1.0e300, mode: open}"
    ),
    "empirical-key-nan": _BASE.replace(
        "prompt_tokens: {type: fixed, value: 8}",
        "prompt_tokens: {type: empirical, percentiles: {0: 1, .nan: 5, 100: 9}}",
    ),
}
TRACES = {
    "azure-1e300-tokens.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n0,1e300,10\n",
    "azure-2023-to-9999.csv": (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.68,374,44\n9999-11-16 18:15:50.99,396,109\n"
    ),
    "azure-time-1e300.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n0,1,1\n1e300,2,2\n",
    "mooncake-1e300.jsonl": json.dumps({"timestamp": 0, "input_length": 1e300, "output_length": 4})
    + "\n",
    "mooncake-huge-hash.jsonl": json.dumps(
        {"timestamp": 0, "input_length": 8, "output_length": 4, "hash_ids": [10**30]}
    )
    + "\n",
    "mooncake-digits.jsonl": '{"timestamp": 0, "input_length": 8, "output_length": 4, '
    '"hash_ids": [' + "9" * 5000 + "]}\n",
    "burstgpt-1e300.csv": "Timestamp,Model,Request tokens,Response tokens\n0,m,8,1e300\n",
}


NOWHERE = "http://127.0.0.1:9"
"""A loopback port where nothing listens: a run that got as far as its target fails there."""


def _one_line(*args: str) -> str:
    began = time.monotonic()
    ran = run_cli(*args, timeout=60)
    assert time.monotonic() - began < 45, "refused, but only after a long while"
    assert "Traceback" not in ran.stderr, ran.stderr
    assert ran.rc == 2, ran.stderr
    assert len(ran.lines()) == 1 and ran.lines()[0].startswith("error:"), ran.stderr
    return ran.lines()[0]


def _refused_before_anything(tmp_path: Path, *args: str) -> str:
    """``stress ARGS`` is refused for its input: one line, exit 2, before the run directory
    is made and before the target is even tried."""
    out = tmp_path / "out"
    line = _one_line("stress", *args, "--target", NOWHERE, "--out", str(out))
    assert not out.exists(), "the run directory was made: something started"
    assert "127.0.0.1:9" not in line, f"refused for the target, not for the input: {line}"
    return line


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_scenario_number_that_would_explode_is_one_line_before_anything(
    tmp_path: Path, name: str
) -> None:
    scen = tmp_path / f"{name}.yaml"
    scen.write_text(SCENARIOS[name], encoding="utf-8")
    _one_line("scenarios", "validate", str(scen))
    _refused_before_anything(tmp_path, "--scenario", str(scen))


@pytest.mark.parametrize("name", sorted(TRACES))
def test_a_trace_number_that_would_explode_is_one_line_before_anything(
    tmp_path: Path, name: str
) -> None:
    trace = tmp_path / name
    trace.write_text(TRACES[name], encoding="utf-8")
    _one_line("scenarios", "show", str(trace))
    _refused_before_anything(tmp_path, "--trace", str(trace))


def test_scaling_a_shape_beyond_the_bounds_is_one_line(tmp_path: Path) -> None:
    """``--users`` scales a spike's peak by the same factor as its base."""
    scen = tmp_path / "spike.yaml"
    scen.write_text(
        _BASE.replace(
            "{type: constant, users: 2}", "{type: spike, base: 1, peak: 100, at: 1, for: 1}"
        ),
        encoding="utf-8",
    )
    line = _refused_before_anything(tmp_path, "--scenario", str(scen), "--users", "50000")
    assert "users" in line


@pytest.mark.parametrize(
    "flags",
    [
        ("--seed", "-1"),
        ("--seed", str(2**64)),
        ("--workers", "100000"),
        ("--until-samples", str(10**12)),
    ],
    ids=lambda f: "=".join(f),
)
def test_a_command_line_number_beyond_its_bound_is_one_line(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    line = _refused_before_anything(tmp_path, "--scenario", "chat", *flags)
    assert flags[0] in line
