"""dashboards/: the Grafana dashboard and the Prometheus rules hold up against a real cluster.

``promtool check rules`` and ``promtool test rules`` validate the rules file. Then one
cluster (mini2 with the feedback agent, so that its panels have series) loads the rules
into its Prometheus and runs one ~15 s stress run; afterwards every PromQL expression
of the dashboard (Grafana's ``$__rate_interval`` and ``$replica`` expanded as Grafana
would: ``10s`` and the "All" value ``.*``; the ``label_values`` variable as the
equivalent ``count by``) and of the rules is evaluated at a moment inside the run and
must return at least one finite sample. An alert's expression is checked without its
threshold comparison (the signal it watches must exist; it need not fire), and every
rule must report ``health: ok`` to Prometheus.

The dashboard has a panel row per registered balancer (``Balancer: <name> (job <job>``,
the job being the registry name); the HAProxy row is checked with the rest above. Every
other balancer's row is checked on its own test cluster (its ``test_preset``, a few
requests sent through it): each expression must parse in that cluster's Prometheus and
each metric name in it must have a series there.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.conftest import running_cluster

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "lbtune.json"
RULES = ROOT / "dashboards" / "rules.yml"
RULES_TEST = ROOT / "dashboards" / "rules_test.yml"
RATE_INTERVAL = "10s"
_LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$")
_THRESHOLD = re.compile(r"^(.*?)\s*(>|<|>=|<=|==|!=)\s*[-+0-9.e]+\s*$", re.S)
_BALANCER_ROW = re.compile(r"^Balancer: .*?\(job ([A-Za-z0-9_-]+)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w:])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def panels_by_balancer() -> dict[str | None, list[dict[str, Any]]]:
    """The panels of each balancer row (by job name); ``None``: the panels of other rows."""
    out: dict[str | None, list[dict[str, Any]]] = {None: []}
    row: str | None = None
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        if panel["type"] == "row":
            m = _BALANCER_ROW.match(panel["title"])
            row = m.group(1) if m else None
            out.setdefault(row, [])
        else:
            out[row].append(panel)
    return out


def panel_queries(panels: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (f"panel {p['title']!r} {t['refId']}", grafana_expand(t["expr"]))
        for p in panels
        for t in p.get("targets", [])
    ]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    bare = _GROUPING.sub(" ", bare)
    return {n for n in _NAME.findall(bare) if n.lower() not in _KEYWORDS}


def dashboard_queries(balancer: str = "haproxy") -> list[tuple[str, str]]:
    """(where, PromQL) for every target of every panel outside the balancer rows and in
    ``balancer``'s row, and every query variable."""
    dash = json.loads(DASHBOARD.read_text())
    rows = panels_by_balancer()
    out = panel_queries(rows[None] + rows.get(balancer, []))
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = _LABEL_VALUES.match(var["definition"])
            assert m, var["definition"]
            out.append((f"variable {var['name']}", f"count by ({m.group(2)}) ({m.group(1)})"))
    return out


def grafana_expand(expr: str) -> str:
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$replica", ".*")


def rule_queries() -> list[tuple[str, str]]:
    """(where, PromQL): each recording rule's expr and its recorded series; each alert's
    expression without its threshold."""
    out = []
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                out.append((f"record {rule['record']} (expr)", rule["expr"]))
                out.append((f"record {rule['record']} (series)", rule["record"]))
            else:
                m = _THRESHOLD.match(rule["expr"].strip())
                assert m, f"alert {rule['alert']}: expected 'SIGNAL > THRESHOLD'"
                out.append((f"alert {rule['alert']} (signal)", m.group(1)))
    return out


def test_dashboard_is_importable_grafana_json() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] and dash["schemaVersion"] >= 36
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"] and p["description"], p["title"]
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "replica"} <= names
    text = DASHBOARD.read_text()
    for needle in (
        "lbtune_ttft_seconds",
        "vllm:kv_cache_usage_perc",
        "DCGM_FI_DEV_GPU_UTIL",
        "vllm:prefix_cache_hits_total",
        "haproxy_backend_current_queue",
        "haproxy_server_current_sessions",
        "lbtune_agent_weight",
        "envoy_cluster_upstream_rq_xx",
        "nginx_http_requests_total",
        "vllm_router_processed_requests_total",
    ):
        assert needle in text


def test_a_panel_row_per_registered_balancer() -> None:
    from lbtune.targets import names

    rows = panels_by_balancer()
    assert set(rows) - {None} == set(names())
    for name in names():
        assert rows[name], f"the {name} row has no panels"
        assert all(metric_names(e) for _, e in panel_queries(rows[name])), name


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, replica) (rate(a_bucket{x="y", le!="1"}[10s]))) '
        "/ ignoring (code) b:c_total - sum(rate(d[1m] offset 5m)) and time() > 0"
    )
    assert metric_names(expr) == {"a_bucket", "b:c_total", "d"}


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is needed (Debian package prometheus): run scripts/setup.sh")
    check = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [promtool, "test", "rules", str(RULES_TEST)], capture_output=True, text=True, timeout=60
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """mini2 + agent, the rules loaded into its Prometheus, one 15 s stress run."""
    from lbtune.run.stress import StressOptions, record_stress, run_stress

    state = tmp_path_factory.mktemp("dash-cluster")
    with running_cluster(state, "mini2-agent", time_scale=8.0) as ep:
        _load_rules(ep.prometheus_url, Path(ep.prometheus_yml), state)
        out = tmp_path_factory.mktemp("dash-report") / "run"
        opts = StressOptions(
            scenario="mixed",
            duration_s=15,
            users=8,
            state_dir=Path(ep.state_dir),
            out_dir=out,
        )
        res = run_stress(opts, on_result=record_stress)  # the caller writes the history
        at = min(res.summary.window.end, res.load.ended_at - 1.0)
        yield {"prom": ep.prometheus_url, "at": at, "out": out, "result": res}


@pytest.mark.integration
def test_every_dashboard_and_rule_query_returns_data(measured: dict[str, Any]) -> None:
    queries = dashboard_queries() + rule_queries()
    empty = []
    for where, expr in queries:
        samples = _query(measured["prom"], expr, measured["at"])
        if not any(math.isfinite(float(s["value"][1])) for s in samples):
            empty.append(f"{where}: {expr} -> {samples}")
    assert not empty, "queries without data:\n" + "\n".join(empty)
    assert len(queries) > 50


@pytest.mark.integration
def test_every_rule_is_healthy_in_prometheus(measured: dict[str, Any]) -> None:
    groups = requests.get(f"{measured['prom']}/api/v1/rules", timeout=5).json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    want = sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])
    assert len(rules) == want
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad


@pytest.mark.integration
def test_the_stress_run_was_indexed_in_history(measured: dict[str, Any]) -> None:
    from lbtune.history import ENV_DB
    from lbtune.history.store import HistoryStore

    entries = HistoryStore(os.environ[ENV_DB]).entries("mixed")
    (mine,) = [e for e in entries if e.report_dir == str(measured["out"])]
    run = mine.figures["run"]
    summary = measured["result"].summary
    e2e = summary.latency.e2e  # P99, or the maximum below 100 samples (as the objective)
    assert mine.kind == "stress" and run.p99_e2e_s == (e2e.p99 if e2e.p99 is not None else e2e.max)
    assert run.degraded == summary.generator.degraded and run.records_dir == str(measured["out"])
    assert mine.config_hash  # the embedded cluster's last known good


def _load_rules(prom: str, prometheus_yml: Path, state: Path) -> None:
    rules = state / "rules.yml"
    shutil.copy(RULES, rules)
    cfg = yaml.safe_load(prometheus_yml.read_text())
    cfg["rule_files"] = [str(rules)]
    prometheus_yml.write_text(yaml.safe_dump(cfg))
    requests.post(f"{prom}/-/reload", timeout=10).raise_for_status()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        groups = requests.get(f"{prom}/api/v1/rules", timeout=5).json()["data"]["groups"]
        if len(groups) == 2:
            return
        time.sleep(0.2)
    pytest.fail("Prometheus did not load dashboards/rules.yml")


def _query(prom: str, expr: str, at: float) -> list[dict[str, Any]]:
    query: dict[str, str | float] = {"query": expr, "time": at}
    r = requests.get(f"{prom}/api/v1/query", params=query, timeout=10)
    body = r.json()
    assert body.get("status") == "success", f"{expr}: {body}"
    result = body["data"]["result"]
    if body["data"]["resultType"] == "scalar":
        return [{"value": result}]
    assert isinstance(result, list)
    return result


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["envoy", "nginx", "vllm-router"])
def test_the_balancer_row_queries_parse_and_their_metrics_exist(name: str, tmp_path: Path) -> None:
    from lbtune.cluster import api
    from lbtune.errors import DependencyError
    from lbtune.targets import balancer

    queries = panel_queries(panels_by_balancer()[name])
    wanted = set().union(*(metric_names(e) for _, e in queries))
    state = tmp_path / "state"
    try:
        try:
            ep = api.up(balancer(name).test_preset, state)
        except DependencyError as exc:
            pytest.skip(f"{name}: {exc}")
        model = "llama-3.1-8b-instruct" if "llama-3.1-8b-instruct" in ep.models else ep.models[0]
        for _ in range(4):
            r = requests.post(
                f"{ep.balancer_url}/v1/chat/completions",
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8,
                },
                timeout=30,
            )
            assert r.status_code == 200, r.text
        missing = set(wanted)
        deadline = time.monotonic() + 30
        while missing and time.monotonic() < deadline:
            found = requests.get(f"{ep.prometheus_url}/api/v1/label/__name__/values", timeout=5)
            missing = wanted - set(found.json()["data"])
            time.sleep(0.5)
        assert not missing, f"{name}: no series in Prometheus for {sorted(missing)}"
        for _, expr in queries:
            _query(ep.prometheus_url, expr, time.time())  # asserts the expression parsed
        if name == "envoy":  # the row's legends name the per-model clusters whole
            url = f"{ep.prometheus_url}/api/v1/label/envoy_cluster_name/values"
            clusters = set(requests.get(url, timeout=5).json()["data"])
            assert "model_llama-3_1-8b-instruct" in clusters, clusters
    finally:
        api.down(state)
