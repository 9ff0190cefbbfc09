"""The malformed-input probe of issue 16, as a table: every input a careful operator
might get wrong gives one line on stderr, exit 2, and no traceback; those tried against a
running mini2 cluster also leave its balancer as it was (config hash and weights).

Each case is ``(id, argv, exit code, text the line must hold)``; ``{dir}`` in an argument
is the case's own directory (its files are written there first), ``{echo}`` an echo
target's URL and ``{state}`` the mini2 cluster's state directory. Variations (flag values,
scenario fields) are generated. The CLI runs in this process through ``lbtune.cli.main``:
a traceback would fail the test as an uncaught exception.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.robustness.conftest import haproxy_frontends

GOOD = {
    "name": "s",
    "duration_s": "5",
    "load": "{type: constant, users: 2}",
    "models": "{llama-3.1-8b-instruct: 1}",
    "prompt_tokens": "{type: fixed, value: 8}",
    "output_tokens": "{type: fixed, value: 4}",
}


def scenario(**fields: str) -> bytes:
    """A scenario YAML: GOOD with ``fields`` replaced (a value of "" drops the field)."""
    merged = {**GOOD, **fields}
    return "".join(f"{k}: {v}\n" for k, v in merged.items() if v != "").encode()


BOMB = b"".join(
    [b"a0: &a0 [x, x, x, x, x, x, x, x, x]\n"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n".encode() for i in range(1, 9)]
)


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    rc: int
    says: str
    files: dict[str, bytes] = field(default_factory=dict)
    cluster: bool = False
    report: bool = False
    """Copy a real stress report to ``{dir}/a`` before writing ``files`` over it."""


def _scenario_cases() -> list[Case]:
    bad_fields = {
        "users-1e12": ({"load": "{type: constant, users: 1000000000000}"}, "users"),
        "users-0": ({"load": "{type: constant, users: 0}"}, "users"),
        "steps-users-1e9": (
            {"load": "{type: steps, steps: [{users: 1000000000, duration: 5}]}"},
            "users",
        ),
        "rate-1e9": ({"load": "{type: rate, rate: 1.0e9}"}, "req/s"),
        "rate-negative": ({"load": "{type: rate, rate: -1}"}, "rate"),
        "rate-for-a-week": (
            {"load": "{type: rate, rate: 5000}", "duration_s": "604800"},
            "open-loop plan",
        ),
        "duration-inf": ({"duration_s": ".inf"}, "duration_s"),
        "duration-1e308": ({"duration_s": "1.0e308"}, "duration_s"),
        "duration-nan": ({"duration_s": ".nan"}, "duration_s"),
        "duration-negative": ({"duration_s": "-1"}, "duration_s"),
        "duration-text": ({"duration_s": "soon"}, "duration_s"),
        "prompt-1e9": ({"prompt_tokens": "{type: fixed, value: 1000000000}"}, "prompt_tokens"),
        "prompt-lognormal-tail": (
            {"prompt_tokens": "{type: lognormal, median: 1000, sigma: 3}"},
            "prompt_tokens",
        ),
        "prompt-negative": ({"prompt_tokens": "{type: fixed, value: -3}"}, "prompt_tokens"),
        "class-prompt-1e9": (
            {
                "classes": "[{name: big, weight: 1, "
                "prompt_tokens: {type: fixed, value: 1000000000}}]"
            },
            "prompt_tokens",
        ),
        "models-empty": ({"models": "{}"}, "models"),
        "models-weight-0": ({"models": "{m: 0}"}, "models"),
        "no-load": ({"load": ""}, "load"),
        "unknown-field": ({"colour": "blue"}, "unknown field"),
        "warmup-eats-window": ({"warmup_s": "5"}, "measurement window"),
        "seed-negative": ({"seed": "-1"}, "seed"),
        "stream-2": ({"stream": "2"}, "stream"),
        "extra-body-bomb": ({}, "alias bomb"),
    }
    out = []
    for cid, (fields, says) in bad_fields.items():
        body = scenario(**fields)
        if cid == "extra-body-bomb":
            body += b"extra_body:\n" + b"".join(b"  " + ln + b"\n" for ln in BOMB.splitlines())
        out.append(
            Case(
                f"scenario-{cid}",
                ("scenarios", "validate", "{dir}/s.yaml"),
                2,
                says,
                {"s.yaml": body},
            )
        )
    raw = {
        "not-utf8": (b"name: \xff\xfe\x00bad\n" + scenario(), "not UTF-8"),
        "latin1": ("name: caf\xe9\n".encode("latin-1") + scenario(name=""), "not UTF-8"),
        "not-yaml": (b"name: [unclosed\n", "invalid YAML"),
        "tab-indent": (b"load:\n\t type: constant\n", "invalid YAML"),
        "empty": (b"", "empty"),
        "a-list": (b"- 1\n- 2\n", "mapping"),
        "a-number": (b"7\n", "mapping"),
        "recursive-alias": (b"a: &a [*a]\n", "aliases"),
        "alias-bomb": (BOMB, "alias bomb"),
    }
    for cid, (body, says) in raw.items():
        out.append(
            Case(
                f"scenario-{cid}",
                ("scenarios", "validate", "{dir}/s.yaml"),
                2,
                says,
                {"s.yaml": body},
            )
        )
    out.append(Case("scenario-missing", ("scenarios", "validate", "{dir}/none.yaml"), 2, "none"))
    out.append(
        Case(
            "scenario-show-bomb",
            ("scenarios", "show", "{dir}/s.yaml"),
            2,
            "alias bomb",
            {
                "s.yaml": scenario()
                + b"extra_body:\n"
                + b"".join(b"  " + ln + b"\n" for ln in BOMB.splitlines())
            },
        )
    )
    return out


def _stress_flag_cases() -> list[Case]:
    base = ("stress", "--target", "{echo}", "--out", "{dir}/out")
    flags = {
        "duration-inf": (("--duration", "inf"), "--duration"),
        "duration-1e308": (("--duration", "1e308"), "--duration"),
        "duration-0": (("--duration", "0"), "--duration"),
        "duration-negative": (("--duration", "-5"), "--duration"),
        "duration-nan": (("--duration", "nan"), "--duration"),
        "users-0": (("--users", "0"), "--users"),
        "users-1e12": (("--users", "1000000000000"), "--users"),
        "rate-1e12": (("--rate", "1e12"), "--rate"),
        "rate-negative": (("--rate", "-1"), "--rate"),
        "rate-inf": (("--rate", "inf"), "--rate"),
        "rate-for-a-day": (("--rate", "1000", "--duration", "86400"), "open-loop plan"),
        "users-and-rate": (("--users", "2", "--rate", "2"), "not both"),
        "workers-negative": (("--workers", "-1"), "--workers"),
        "expect-workers-0": (("--master", "--expect-workers", "0"), "--expect-workers"),
        "master-port-70000": (("--master", "--master-port", "70000"), "--master-port"),
        "slo-errors-150": (("--slo", "errors=150%"), "0..100"),
        "slo-errors-negative": (("--slo", "errors=-1%"), "0..100"),
        "slo-errors-fraction-2": (("--slo", "errors=2"), "0..100"),
        "slo-errors-text": (("--slo", "errors=many"), "--slo errors"),
        "slo-unknown-key": (("--slo", "speed=1"), "--slo"),
        "slo-ttft-text": (("--slo", "ttft=fast"), "--slo ttft"),
        "until-samples-0": (("--until-samples", "0"), "--until-samples"),
        "max-duration-alone": (("--max-duration", "30"), "--max-duration"),
        "max-duration-inf": (("--until-samples", "5", "--max-duration", "inf"), "--max-duration"),
        "master-bind-any": (("--master", "--master-bind", "0.0.0.0"), "--allow-remote"),
        "worker-remote-master": (("--worker", "--master-host", "192.0.2.7"), "--allow-remote"),
        "prometheus-remote": (("--prometheus", "http://192.0.2.7:9090"), "--allow-remote"),
        "scenario-missing": (("--scenario", "{dir}/none.yaml"), "none.yaml"),
        "scenario-unknown-name": (("--scenario", "no-such-builtin"), "no-such-builtin"),
    }
    out = [Case(f"stress-{cid}", (*base, *args), 2, says) for cid, (args, says) in flags.items()]
    targets = {
        "port-99999": "http://127.0.0.1:99999",
        "port-abc": "http://127.0.0.1:abc",
        "port-negative": "http://127.0.0.1:-1",
        "scheme-ftp": "ftp://127.0.0.1:21",
        "no-scheme": "127.0.0.1:8000",
        "remote-host": "http://192.0.2.7:8000",
        "empty": "",
    }
    for cid, url in targets.items():
        out.append(
            Case(f"stress-target-{cid}", ("stress", "--target", url, "-d", "2"), 2, "--target")
        )
    return out


def _optimize_cases() -> list[Case]:
    out = []
    for v in ("0", "-1", "inf", "nan", "1e308"):
        out.append(
            Case(
                f"optimize-trial-duration-{v}",
                ("optimize", "--trial-duration", v, "--state-dir", "{dir}/state"),
                2,
                "--trial-duration",
            )
        )
    return out


def _compare_cases() -> list[Case]:
    both = ("compare", "{dir}/a", "{dir}/a")
    return [
        Case(
            "compare-corrupt-parquet",
            both,
            2,
            "requests.parquet",
            {"a/requests.parquet": b"PAR1 this is not parquet"},
            report=True,
        ),
        Case(
            "compare-empty-parquet",
            both,
            2,
            "requests.parquet",
            {"a/requests.parquet": b""},
            report=True,
        ),
        Case("compare-parquet-of-something-else", both, 2, "request records", report=True),
        Case("compare-missing-report", ("compare", "{dir}/nope", "{dir}/nope2"), 2, "nope"),
    ]


def _cluster_cases() -> list[Case]:
    """Tried against the running mini2 cluster: refused before anything touches it."""
    st = ("stress", "--state-dir", "{state}", "--out", "{dir}/out", "-s", "{dir}/s.yaml")
    return [
        Case(
            "cluster-unserved-model",
            st,
            2,
            "does not serve",
            {"s.yaml": scenario(models="{no-such-model: 1}")},
            cluster=True,
        ),
        Case(
            "cluster-users-1e12",
            st,
            2,
            "users",
            {"s.yaml": scenario(load="{type: constant, users: 1000000000000}")},
            cluster=True,
        ),
        Case(
            "cluster-prompt-1e9",
            st,
            2,
            "prompt_tokens",
            {"s.yaml": scenario(prompt_tokens="{type: fixed, value: 1000000000}")},
            cluster=True,
        ),
        Case(
            "cluster-not-utf8",
            st,
            2,
            "not UTF-8",
            {"s.yaml": b"\xff\xfe" + scenario()},
            cluster=True,
        ),
        Case("cluster-alias-bomb", st, 2, "alias bomb", {"s.yaml": BOMB}, cluster=True),
        Case(
            "cluster-slo-errors-150",
            (*st, "--slo", "errors=150%"),
            2,
            "0..100",
            {"s.yaml": scenario()},
            cluster=True,
        ),
        Case(
            "cluster-duration-inf",
            (*st, "--duration", "inf"),
            2,
            "--duration",
            {"s.yaml": scenario()},
            cluster=True,
        ),
    ]


CASES = [
    *_scenario_cases(),
    *_stress_flag_cases(),
    *_optimize_cases(),
    *_compare_cases(),
    *_cluster_cases(),
]


def test_the_probe_is_wide_enough() -> None:
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from lbtune.cli import main

    old = sys.argv
    sys.argv = ["lbtune", *argv]
    try:
        main()
        rc = 0
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old
    return rc, capsys.readouterr().err


@pytest.fixture(scope="module")
def stress_report(tmp_path_factory: pytest.TempPathFactory, echo_url: str) -> Path:
    """A real (2 s) stress report against the echo target."""
    from lbtune.run.stress import StressOptions, run_stress

    root = tmp_path_factory.mktemp("report")
    scen = root / "s.yaml"
    scen.write_bytes(scenario(duration_s="2", models="{echo: 1}"))
    out = root / "run"
    run_stress(
        StressOptions(scenario=str(scen), target_url=echo_url, out_dir=out, reports_root=root)
    )
    return out


def balancer_snapshot(ep: Any) -> dict[str, Any]:
    """A mini2 cluster's balancer as lbtune could change it: the live haproxy.cfg's hash,
    every server's weight, the supervised processes' pids and the last known good."""
    import csv
    import io
    import urllib.request

    state = Path(ep.state_dir)
    cfg = Path(ep.balancer_details["haproxy_cfg"]).read_bytes()
    with urllib.request.urlopen(ep.stats_url + ";csv", timeout=5) as resp:
        rows = csv.DictReader(io.StringIO(resp.read().decode().lstrip("# ")))
        weights = {
            (r["pxname"], r["svname"]): r["weight"]
            for r in rows
            if r["svname"] not in ("FRONTEND", "BACKEND")
        }
    return {
        "config": hashlib.sha256(cfg).hexdigest(),
        "weights": weights,
        "pids": {f.name: f.read_text() for f in sorted(state.glob("*.pid"))},
        "lkg": {f.name: f.read_bytes() for f in sorted(state.glob("lkg/*"))},
    }


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c.id, marks=[pytest.mark.integration] if c.cluster or c.report else [])
        for c in CASES
    ],
)
def test_malformed_input(
    case: Case,
    tmp_path: Path,
    echo_url: str,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    if case.report:
        shutil.copytree(request.getfixturevalue("stress_report"), tmp_path / "a")
        if case.id == "compare-parquet-of-something-else":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "a" / "requests.parquet")
    for name, body in case.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(body)
    subst = {"{dir}": str(tmp_path), "{echo}": echo_url}
    ep = None
    if case.cluster:
        ep = request.getfixturevalue("mini2")
        subst["{state}"] = ep.state_dir
        before = balancer_snapshot(ep)
        assert before["weights"] and before["pids"], "the snapshot must see the balancer"
        sent_before = sum(int(r["req_tot"] or 0) for r in haproxy_frontends(ep).values())
    argv = []
    for a in case.argv:
        for k, v in subst.items():
            a = a.replace(k, v)
        argv.append(a)
    rc, err = _run(argv, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err
    assert rc == case.rc, err
    assert len(lines) == 1, err
    assert lines[0].startswith("error:") and case.says in lines[0], lines[0]
    if ep is not None:
        assert balancer_snapshot(ep) == before
        sent = sum(int(r["req_tot"] or 0) for r in haproxy_frontends(ep).values())
        assert sent <= sent_before + 5, "only probes may reach the balancer"
