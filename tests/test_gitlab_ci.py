"""`ci/gitlab-nightly.yml` is a pipeline GitLab accepts, checked offline.

Two checks, both of which a deliberately broken copy must fail:
- GitLab's own JSON schema for ``.gitlab-ci.yml`` (vendored by ``check-jsonschema``, so
  no network: ``--builtin-schema vendor.gitlab-ci``): unknown job keys, wrong types,
  invalid ``rules``/``only``/``cache``/``artifacts``;
- what the schema cannot say but GitLab refuses at pipeline creation: a job with no
  ``script`` (nor ``trigger``/``extends``), a job whose ``stage`` is not declared.

This is the GitLab half of the nightly-workflow lint (actionlint covers the GitHub
workflow in tests/test_nightly_workflow.py).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
GITLAB = ROOT / "ci" / "gitlab-nightly.yml"

# Top-level keys that are not jobs (GitLab's global keywords).
GLOBAL_KEYWORDS = frozenset(
    {"default", "include", "stages", "variables", "workflow", "image", "services", "cache"}
    | {"before_script", "after_script", "spec"}
)
# The stages a pipeline has when `stages:` is not given (the file is included from a
# project's .gitlab-ci.yml, which may not declare any).
DEFAULT_STAGES = (".pre", "build", "test", "deploy", ".post")


def schema_errors(path: Path) -> str | None:
    """GitLab's schema verdict on ``path``: None when valid, else check-jsonschema's report."""
    cmd = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.gitlab-ci"]
    cmd += ["--data-transform", "gitlab-ci", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode == 0:
        return None
    assert "No module named" not in proc.stderr, "check-jsonschema missing: pip install -e '.[dev]'"
    return proc.stdout + proc.stderr


def structure_errors(doc: dict[str, Any]) -> list[str]:
    """What GitLab refuses when it creates the pipeline, beyond the schema."""
    stages = doc.get("stages", DEFAULT_STAGES)
    errors = []
    for name, job in doc.items():
        if name in GLOBAL_KEYWORDS or name.startswith("."):
            continue  # a global keyword, or a hidden job (a template for `extends:`)
        if not isinstance(job, dict):
            errors.append(f"{name}: a job must be a mapping")
            continue
        if not {"script", "trigger", "extends"} & job.keys():
            errors.append(f"{name}: job has no script")
        stage = job.get("stage", "test")
        if stage not in stages:
            errors.append(f"{name}: stage {stage!r} is not one of the stages {list(stages)}")
    return errors


def _load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), f"{path}: not a mapping"
    return doc


def test_the_gitlab_nightly_job_passes_gitlabs_schema_and_structure() -> None:
    assert schema_errors(GITLAB) is None
    doc = _load(GITLAB)
    assert structure_errors(doc) == []
    assert [n for n in doc if n not in GLOBAL_KEYWORDS] == ["lbtune-nightly"]


Breaker = Callable[[dict[str, Any]], None]


def _set(key: str, value: object) -> Breaker:
    return lambda job: job.__setitem__(key, value)


def _drop(key: str) -> Breaker:
    return lambda job: job.pop(key)


def _only_instead_of_rules(job: dict[str, Any]) -> None:
    del job["rules"]
    job["only"] = {"bogus": ["schedules"]}


BROKEN: dict[str, tuple[Breaker, str]] = {
    "unknown job key": (_set("scripts", ["x"]), "'scripts' was unexpected"),
    "rules with an unknown key": (_set("rules", [{"iff": "$X"}]), "rules[0]"),
    "only with an unknown key": (_only_instead_of_rules, ".only"),
    "cache:when not a choice": (
        lambda job: job["cache"].__setitem__("when", "sometimes"),
        ".cache",
    ),
    "artifacts:paths not a list": (
        lambda job: job["artifacts"].__setitem__("paths", "nightly/"),
        "is not of type 'array'",
    ),
    "no script": (_drop("script"), "job has no script"),
    "undeclared stage": (_set("stage", "nightly"), "stage 'nightly' is not one of the stages"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_copy_of_the_job_fails(case: str, tmp_path: Path) -> None:
    breaker, expected = BROKEN[case]
    doc = copy.deepcopy(_load(GITLAB))
    breaker(doc["lbtune-nightly"])
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(doc))
    found = [schema_errors(broken) or "", *structure_errors(doc)]
    assert any(expected in e for e in found), (case, found)
