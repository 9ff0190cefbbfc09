"""The one KEY=VALUE option reader: splitting, and its one error format."""

from __future__ import annotations

import pytest

from lbtune.errors import ConfigError
from lbtune.keyvalue import FlagError, bad_value, parse_pairs
from lbtune.loadgen.source import resolve

KEYS = ("ttft", "e2e")


def test_pairs_in_order_stripped_and_empty_parts_skipped() -> None:
    got = parse_pairs(" ttft = 1s ,, e2e=2s,ttft=3s,", flag="--slo", keys=KEYS, example="x")
    assert got == [("ttft", "1s"), ("e2e", "2s"), ("ttft", "3s")]


def test_separator_and_case_folding() -> None:
    got = parse_pairs("A=1&b=2", flag="f", keys=("a", "b"), example="x", sep="&", fold_case=True)
    assert got == [("a", "1"), ("b", "2")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ttft", "--slo: cannot read 'ttft'; expected KEY=VALUE with KEY one of ttft, e2e (e.g. "),
        ("speed=1", "--slo: unknown key 'speed'; expected one of ttft, e2e (e.g. --slo ttft=1s)"),
        ("TTFT=1", "--slo: unknown key 'TTFT'"),
    ],
)
def test_one_line_errors_name_the_flag_and_the_keys(text: str, message: str) -> None:
    with pytest.raises(FlagError) as exc:
        parse_pairs(text, flag="--slo", keys=KEYS, example="--slo ttft=1s")
    assert str(exc.value).startswith(message)
    assert isinstance(exc.value, ConfigError) and "\n" not in str(exc.value)


def test_bad_value_names_flag_key_value_and_the_fix() -> None:
    assert str(bad_value("--slo", "ttft", "fast", "a duration like 2s")) == (
        "--slo ttft: cannot read 'fast'; expected a duration like 2s"
    )
    assert str(bad_value("--w", "e2e", "-1", "a number >= 0", "is out of range")) == (
        "--w e2e: '-1' is out of range; expected a number >= 0"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fixed:outpt=5", "fixed:outpt=5: unknown key 'outpt'; expected one of api, arrival,"),
        ("fixed:output=abc", "fixed:output=abc output: cannot read 'abc'; expected a whole"),
        ("fixed:api=grpc", "fixed:api=grpc api: cannot read 'grpc'; expected chat or completions"),
    ],
)
def test_a_fixed_workload_spec_reports_through_it(spec: str, message: str) -> None:
    with pytest.raises(FlagError) as exc:
        resolve(spec, seed=0, duration_s=1.0, users=1, rate=None)
    assert str(exc.value).startswith(message)
