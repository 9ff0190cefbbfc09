"""`lbtune scenarios fit`: lengths, burstiness, prefixes, sessions and models from a trace;
`scenarios show` prints the trace's percentiles beside the fit's."""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from lbtune.cli import app
from lbtune.scenario import load_scenario, plan_load
from lbtune.scenario.traces.fit import fit_lengths, fit_trace
from tests.scenario.traces.conftest import sharegpt_doc


def _lognormal_mooncake(path: Path, n: int, cv: float, seed: int = 3) -> list[int]:
    """Lognormal prompt lengths, gamma gaps with coefficient of variation ``cv``; half the
    requests share one of 4 two-block system prompts."""
    rng = random.Random(seed)
    k = 1 / cv**2
    t = 0.0
    lengths = []
    lines = []
    for i in range(n):
        t += rng.gammavariate(k, 1 / k) * 100.0  # mean gap 100 ms
        new = max(1, round(rng.lognormvariate(math.log(300), 0.6)))
        if i % 2 == 0:
            g = rng.randrange(4)
            ids = [10 * g, 10 * g + 1, *(100_000 + 10 * i + j for j in range(new // 512 + 1))]
            prompt = 1024 + new
        else:
            ids = [200_000 + 10 * i + j for j in range(new // 512 + 1)]
            prompt = new
        lengths.append(new)
        lines.append(
            json.dumps(
                {
                    "timestamp": round(t, 3),
                    "input_length": prompt,
                    "output_length": 50 + i % 40,
                    "hash_ids": ids,
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return lengths


def test_lognormal_lengths_fit_a_lognormal_and_skewed_ones_a_table() -> None:
    rng = random.Random(1)
    values = [max(1, round(rng.lognormvariate(math.log(200), 0.5))) for _ in range(4000)]
    f = fit_lengths(values)
    assert f.dist["type"] == "lognormal" and f.ks < 0.05
    assert abs(f.dist["median"] - 200) < 10 and abs(f.dist["sigma"] - 0.5) < 0.03
    bimodal = [20] * 2000 + [2000] * 2000
    g = fit_lengths(bimodal)
    assert g.dist["type"] == "empirical" and g.ks > 0.05
    assert g.dist["percentiles"][25.0] == 20 and g.dist["percentiles"][75.0] == 2000


def test_fit_measures_burstiness_prefixes_and_keeps_only_shapes(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    new = _lognormal_mooncake(p, 3000, cv=2.5)
    doc = fit_trace(p, "mooncake")
    load = doc["load"]
    assert load["arrival"] == "gamma" and 2.0 < load["cv"] < 3.0
    assert 8 < load["rate"] < 12
    assert doc["prefix"]["groups"] == 4 and doc["prefix"]["tokens"] == 1024
    assert 0.45 < doc["prefix"]["fraction"] < 0.55
    # Lengths are fitted on the new part of each prompt: the trace's lognormal(300, 0.6).
    assert doc["prompt_tokens"]["type"] == "lognormal"
    assert abs(doc["prompt_tokens"]["median"] - 300) < 20
    assert doc["fitted"]["percentiles"]["prompt_tokens"]["p50"] == statistics.median(new)
    assert "hash_ids" not in json.dumps(doc)  # no data of the trace, only its shape


def test_fit_of_sessions_and_models(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    p.write_text(json.dumps(sharegpt_doc(10)))
    doc = fit_trace(p, "sharegpt")
    assert doc["sessions"] == {"fraction": round(10 / 15, 4), "turns": 2}
    assert "duration_s" not in doc and doc["load"]["rate"] == 1
    b = tmp_path / "b.csv"
    b.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        + "".join(f"{i},{'GPT-4' if i % 4 == 0 else 'ChatGPT'},{10 + i},5,0,x\n" for i in range(40))
    )
    assert fit_trace(b, "burstgpt")["models"] == {"ChatGPT": 30, "GPT-4": 10}


def test_fit_then_show_prints_the_traces_and_the_fits_percentiles(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    _lognormal_mooncake(p, 2000, cv=1.0)
    out = tmp_path / "fitted.yaml"
    runner = CliRunner()
    res = runner.invoke(app, ["scenarios", "fit", str(p), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "prompt_tokens: lognormal (KS distance" in res.output
    sc = load_scenario(out)
    assert sc.fitted is not None and sc.fitted.requests == 2000
    assert sc.load.type == "rate" and plan_load(sc).arrival == "poisson"
    shown = runner.invoke(app, ["scenarios", "show", str(out)])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    at = lines.index(next(x for x in lines if x.strip().startswith("prompt_tokens") and "p50" in x))
    assert [x.split()[0] for x in lines[at + 1 : at + 4]] == ["trace", "spec", "sampled"]
    trace_p50, spec_p50 = float(lines[at + 1].split()[1]), float(lines[at + 2].split()[1])
    assert abs(trace_p50 - spec_p50) / trace_p50 < 0.1
    assert any(x.strip().startswith("gap_s") for x in lines)
    assert yaml.safe_load(out.read_text())["fitted"]["format"] == "mooncake"


def test_fit_of_a_bad_trace_is_one_line_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens\n1,2\n")
    out = tmp_path / "x.yaml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lbtune",
            "scenarios",
            "fit",
            str(p),
            "--format",
            "azure",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "a.csv:1: column 'GeneratedTokens'" in lines[0]
    assert not out.exists()
