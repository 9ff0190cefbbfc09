"""Bad trace input: one ConfigError naming file, line and column; at the CLI one line, exit 2,
before anything is sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lbtune.errors import ConfigError
from lbtune.scenario.traces.read import read_trace

AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BG = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"

CASES = [
    # (format, file name, content, expected fragments)
    (
        "azure",
        "a.csv",
        AZ + "2023-11-16 18:15:46.68,10,5\n2023-11-16 18:15:47,ten,5\n",
        ["a.csv:3:", "'ContextTokens'", "whole number", "'ten'"],
    ),
    (
        "azure",
        "a.csv",
        "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,10\n",
        ["a.csv:1:", "'GeneratedTokens'", "missing column"],
    ),
    (
        "azure",
        "a.csv",
        AZ + "2023-11-16 18:15:47,10,5\n2023-11-16 18:15:46,10,5\n",
        ["a.csv:3:", "'TIMESTAMP'", "go back"],
    ),
    ("azure", "a.csv", AZ + "yesterday,10,5\n", ["a.csv:2:", "'TIMESTAMP'", "'yesterday'"]),
    ("azure", "a.csv", AZ + "2023-11-16 18:15:47,10\n", ["a.csv:2:", "expected 3 fields"]),
    (
        "burstgpt",
        "b.csv",
        BG + "0,ChatGPT,10,5,15,x\n1,ChatGPT,-3,5,2,x\n",
        ["b.csv:3:", "'Request tokens'", ">= 1"],
    ),
    (
        "burstgpt",
        "b.csv",
        BG + "5,ChatGPT,10,5,15,x\n2,ChatGPT,10,5,15,x\n",
        ["b.csv:3:", "'Timestamp'", "go back"],
    ),
    (
        "mooncake",
        "m.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1,\n',
        ["m.jsonl:2:", "invalid JSON"],
    ),
    (
        "mooncake",
        "m.jsonl",
        '{"timestamp": 0, "output_length": 1}\n',
        ["m.jsonl:1:", "'input_length'", "missing field"],
    ),
    (
        "mooncake",
        "m.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}\n',
        ["m.jsonl:1:", "'hash_ids'", "list of integers"],
    ),
    (
        "mooncake",
        "m.jsonl",
        '{"timestamp": 9, "input_length": 5, "output_length": 1}\n'
        '{"timestamp": 3, "input_length": 5, "output_length": 1}\n',
        ["m.jsonl:2:", "go back"],
    ),
    (
        "mooncake",
        "m.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "tokens": 3}\n',
        ["m.jsonl:1:", "'tokens'", "unknown field"],
    ),
    (
        "sharegpt",
        "s.json",
        '[\n{"conversations": [{"from": "human", "value": "hi"}]},\n'
        '{"conversations": [{"from": "robot", "value": "x"}]}\n]',
        ["s.json:3:", "'conversations[0].from'", "unknown role"],
    ),
    ("sharegpt", "s.json", '{"conversations": []}', ["s.json:1:", "JSON array"]),
    ("lbtune", "r.parquet", "not parquet", ["r.parquet", "not a Parquet file"]),
]


@pytest.mark.parametrize(("fmt", "name", "content", "needles"), CASES)
def test_a_bad_trace_is_one_error_naming_file_line_and_column(
    tmp_path: Path, fmt: str, name: str, content: str, needles: list[str]
) -> None:
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(ConfigError) as err:
        read_trace(p, fmt)
    msg = str(err.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg


def test_unknown_format_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text(AZ)
    with pytest.raises(ConfigError, match=r"Unknown trace format 'csv'\. Available: azure"):
        read_trace(tmp_path / "a.csv", "csv")
    with pytest.raises(ConfigError, match="no such trace file"):
        read_trace(tmp_path / "none.csv", "azure")
    with pytest.raises(ConfigError, match="holds no requests"):
        read_trace(tmp_path / "a.csv", "azure")


def test_the_source_block_is_validated_with_its_bounds() -> None:
    from lbtune.scenario import scenario_from_dict

    with pytest.raises(ConfigError, match=r"source.speedup: must be > 0"):
        scenario_from_dict({"source": {"trace": "x.csv", "format": "azure", "speedup": 0}})
    with pytest.raises(ConfigError, match=r"source.rate_scale: must be <= 1"):
        scenario_from_dict({"source": {"trace": "x.csv", "format": "azure", "rate_scale": 2}})
    with pytest.raises(ConfigError, match=r"source.window: unknown field"):
        scenario_from_dict({"source": {"trace": "x.csv", "format": "azure", "window": 2}})


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--trace-format", "azure"], "a.csv:3: column 'ContextTokens'"),
        (["--trace-format", "parquet"], "format"),
        (["--trace-format", "azure", "--users", "3"], "--users/--rate do not apply"),
    ],
)
def test_stress_with_a_bad_trace_is_one_line_exit_2_and_sends_nothing(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    p = tmp_path / "a.csv"
    bad_row = "ten" if "--users" not in args else "12"
    p.write_text(AZ + f"2023-11-16 18:15:46.68,10,5\n2023-11-16 18:15:47,{bad_row},5\n")
    # A target nothing listens on: the error must come before any connection is tried.
    line = _one_error_line(
        ["stress", "--trace", str(p), *args, "--target", "http://127.0.0.1:9",
         "--out", str(tmp_path / "out")]
    )  # fmt: skip
    assert needle in line, line
    assert not (tmp_path / "out").exists()


def _one_error_line(args: list[str]) -> str:
    """``python -m lbtune ARGS`` must exit 2 with one ``error:`` line on stderr: that line."""
    proc = subprocess.run(
        [sys.executable, "-m", "lbtune", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def _otel_cycle(path: Path) -> None:
    """Two chat spans, each the other's parent."""
    attrs = [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
        {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "100"}},
        {"key": "gen_ai.usage.output_tokens", "value": {"intValue": 5}},
    ]
    spans = [
        {"traceId": "t", "spanId": a, "parentSpanId": b, "name": "chat",
         "startTimeUnixNano": "0", "endTimeUnixNano": "1000000000", "attributes": attrs}
        for a, b in (("a", "b"), ("b", "a"))
    ]  # fmt: skip
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))


def _weka_orphan(path: Path) -> None:
    """A session whose first call is a subagent's: it has no parent call."""
    req = {"t": 0, "in": 100, "out": 10, "type": "subagent", "agent": "a"}
    path.write_text(json.dumps({"session_id": "s", "t": 0, "requests": [req]}) + "\n")


def _copilot_negative(path: Path) -> None:
    """A tool batch of -5 ms between two turns."""
    turns = [
        {"llm_calls": [{"prompt_tokens": 100, "completion_tokens": 5}],
         "tool_batches": [{"duration_ms": -5}]},
        {"llm_calls": [{"prompt_tokens": 200, "completion_tokens": 5}]},
    ]  # fmt: skip
    path.write_text(json.dumps({"sessions": [{"id": "x", "start": 0, "turns": turns}]}))


@pytest.mark.parametrize(
    ("name", "write", "needle"),
    [
        ("spans.json", _otel_cycle, "a cycle in the span graph"),
        ("agent.jsonl", _weka_orphan, "a subagent without a parent"),
        ("copilot.json", _copilot_negative, "duration_ms': expected a finite number >= 0"),
    ],
    ids=["otel-cycle", "weka-orphan-subagent", "copilot-negative-duration"],
)
def test_a_malformed_agent_trace_is_one_line_exit_2_from_stress_and_fit(
    tmp_path: Path, name: str, write: Callable[[Path], None], needle: str
) -> None:
    """Issue 28: the agentic formats' graph errors, detected from the file (no
    --trace-format), end both commands in one line naming the file, exit 2."""
    p = tmp_path / name
    write(p)
    for args in (
        [
            "stress",
            "--trace",
            str(p),
            "--target",
            "http://127.0.0.1:9",
            "--out",
            str(tmp_path / "o"),
        ],
        ["scenarios", "fit", str(p), "-o", str(tmp_path / "fit.yaml")],
    ):
        line = _one_error_line(args)
        assert name in line and needle in line, line
    assert not (tmp_path / "o").exists() and not (tmp_path / "fit.yaml").exists()
