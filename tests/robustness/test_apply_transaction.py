"""An apply is a transaction (issue 29, item 1), on every registered balancer.

* What the balancer itself does not accept is refused before the first change, whatever
  the space file allows (a space is the user's: it may search less, never more).
* A failure once the balancer was touched puts back the state that was live before the
  apply, which need not be the last known good.
* A last known good is restorable whatever space recorded it, by ``lbtune rollback`` and
  by a target made with another space.

The spaces here are built from each balancer's own packaged space, so a new balancer is
covered with no edit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lbtune.apply import apply_params, rollback
from lbtune.errors import ApplyError, ConfigError
from lbtune.records.endpoints import Endpoints
from lbtune.targets import get_target
from lbtune.targets.base import ParamSet, ParamValue
from lbtune.targets.lkg import LkgStore
from lbtune.targets.space import ParamSpec
from lbtune.targets.targetbase import WEIGHT_PREFIX, TargetBase
from tests.robustness.conftest import run_cli

pytestmark = pytest.mark.integration


def _packaged(t: TargetBase) -> dict[str, Any]:
    """The balancer's own space file (``t`` is made without a space of the user's)."""
    doc: dict[str, Any] = yaml.safe_load(t.space_file.read_text(encoding="utf-8"))
    return doc


def _family(doc: dict[str, Any], name: str) -> str:
    """The space file's key of knob ``name`` (``weight.h100-0`` -> ``weight``)."""
    return name if name in doc["params"] else name.split(".", 1)[0]


def _alternatives(spec: ParamSpec, baseline: ParamValue) -> list[ParamValue]:
    """Values of ``spec`` other than ``baseline`` (a few, valid by its own rules)."""
    if spec.type == "categorical":
        return [c for c in spec.choices or [] if c != baseline]
    if spec.type == "bool":
        return [not baseline]
    assert spec.low is not None and spec.high is not None
    step = spec.step or 1
    cast = int if spec.type == "int" else float
    vals = [cast(spec.low), cast(spec.high), cast(spec.low + step), cast(spec.high - step)]
    return [v for v in dict.fromkeys(vals) if v != baseline and spec.low <= v <= spec.high]


def _changeable(t: TargetBase) -> tuple[str, list[ParamValue]]:
    """A knob active now that a test may move (not a weight: 0 takes a replica out), with
    two or more values other than its live one."""
    live = t.read_live()
    limits = t.space()
    for name, spec in limits.params.items():
        if name.startswith(WEIGHT_PREFIX) or not limits.is_active(name, live):
            continue
        alts = _alternatives(spec, live[name])
        if len(alts) >= 2 and spec.type != "bool":
            return name, alts
    pytest.skip(f"{t.name}: no knob with two alternative values")


def _numeric(t: TargetBase) -> str:
    """A numeric knob active now whose value the balancer bounds above."""
    live = t.read_live()
    limits = t.space()
    for name, spec in limits.params.items():
        if spec.type in ("int", "float") and limits.is_active(name, live):
            return name
    pytest.skip(f"{t.name}: no numeric knob")


def _write_space(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _state(t: TargetBase) -> tuple[ParamSet, str | None]:
    lkg = LkgStore(t.state_dir, t.name).get()
    return t.read_live(), None if lkg is None else lkg.sha256


def _fresh(ep: Endpoints, space: Path | None = None) -> TargetBase:
    return get_target(ep.balancer, ep, space_file=space)


def test_what_the_balancer_refuses_is_refused_before_the_first_change(
    deployed: Endpoints, tmp_path: Path
) -> None:
    t = _fresh(deployed)
    apply_params(t, {}, via="direct")  # a last known good exists
    knob, alts = _changeable(t)
    bounded = _numeric(t)
    spec = t.space().params[bounded]
    assert spec.high is not None
    beyond = int(spec.high) * 1000 + 1
    doc = _packaged(t)
    doc["params"][_family(doc, bounded)]["high"] = beyond  # the space allows it; the balancer not
    wide = _fresh(deployed, _write_space(tmp_path / "wide.yaml", doc))
    before = _state(t)
    params: dict[str, object] = {knob: alts[0], bounded: beyond}  # a valid change first
    with pytest.raises(ConfigError) as exc:
        apply_params(wide, params, via="direct", source="file:wide.yaml")
    assert f"{t.name} does not accept" in str(exc.value) and bounded in str(exc.value)
    assert "\n" not in str(exc.value)
    assert _state(_fresh(deployed)) == before


def test_a_failure_after_the_first_change_puts_back_what_was_live(
    deployed: Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = _fresh(deployed)
    apply_params(t, {}, via="direct")  # the last known good: the untuned state
    knob, alts = _changeable(t)
    # What is live differs from the last known good (a study's trial, an agent...).
    apply_params(t, {knob: alts[0]}, via="direct", record=False)
    live_before = _state(t)
    assert live_before[0][knob] == alts[0]
    # The balancer takes the change, then its read-back disagrees once: a mismatch after
    # the balancer was touched.
    real = t.mismatches
    calls = {"n": 0}

    def once(desired: ParamSet, live: ParamSet) -> list[str]:
        calls["n"] += 1
        return ["injected: read-back disagrees"] if calls["n"] == 1 else real(desired, live)

    monkeypatch.setattr(t, "mismatches", once)
    with pytest.raises(ApplyError) as exc:
        apply_params(t, {knob: alts[1]}, via="direct")
    assert "put back the state that was live before" in str(exc.value), exc.value
    assert "\n" not in str(exc.value)
    monkeypatch.undo()
    assert _state(_fresh(deployed)) == live_before
    apply_params(t, {}, via="direct")


def test_a_last_known_good_is_restorable_whatever_space_recorded_it(
    deployed: Endpoints, tmp_path: Path
) -> None:
    t = _fresh(deployed)
    apply_params(t, {}, via="direct")
    knob, alts = _changeable(t)
    doc = _packaged(t)
    # The user's space: only the knob it tunes (every other knob of the balancer unknown
    # to it, e.g. HAProxy's agent.* coefficients).
    doc["params"] = {_family(doc, knob): doc["params"][_family(doc, knob)]}
    narrow = _fresh(deployed, _write_space(tmp_path / "narrow.yaml", doc))
    # Recorded by the packaged space, restored by the narrow one ...
    good = apply_params(t, {knob: alts[0]}, via="direct").lkg
    assert good is not None
    apply_params(narrow, {knob: alts[1]}, via="direct", record=False)
    rollback(narrow, via="direct")
    assert _state(_fresh(deployed))[0] == good.params
    # ... and recorded by the narrow space, restored by the packaged one and the CLI.
    good = apply_params(narrow, {knob: alts[1]}, via="direct").lkg
    assert good is not None and set(good.params) == set(t.space().params)
    apply_params(t, {knob: alts[0]}, via="direct", record=False)
    r = run_cli("rollback", "--direct", "--state-dir", deployed.state_dir)
    assert r.rc == 0, r.stderr
    assert _state(_fresh(deployed))[0] == good.params
    apply_params(t, t.space().baseline(), via="direct")


def test_cli_custom_space_beyond_haproxys_weights_touches_nothing(
    deployed: Endpoints, tmp_path: Path
) -> None:
    """The reproduction of issue 29: a space allowing weights to 100000, weights 50 and
    1000; HAProxy takes 0..256."""
    if deployed.balancer != "haproxy":
        pytest.skip("the issue's reproduction is HAProxy's")
    t = _fresh(deployed)
    apply_params(t, {}, via="direct")
    doc = _packaged(t)
    # The whole space stays: weight's ``when`` names ``algorithm``, so a space of the
    # weight alone is refused before the limits are reached.
    doc["params"]["weight"] = {**doc["params"]["weight"], "high": 100000}
    space = _write_space(tmp_path / "wide.yaml", doc)
    params = tmp_path / "p.yaml"
    params.write_text("weight.h100-0: 50\nweight.l4-0: 1000\n")
    before = _state(t)
    r = run_cli(
        "apply", "--direct", "--space", str(space), "--params", str(params),
        "--state-dir", deployed.state_dir,
    )  # fmt: skip
    assert r.rc == 2, r.stderr
    assert len(r.lines()) == 1 and "weight.l4-0" in r.stderr and "0..256" in r.stderr, r.stderr
    assert _state(_fresh(deployed)) == before
    r = run_cli("rollback", "--direct", "--state-dir", deployed.state_dir)
    assert r.rc == 0, r.stderr
