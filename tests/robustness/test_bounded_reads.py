"""Issue 29, class 4: every file lbtune reads is a regular file of bounded size, read with a
bounded read; a YAML document says each key once. (Devices, FIFOs and directories at every
reader option: tests/robustness/test_fuzz_files.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.apply.paramfile import read_params_for
from lbtune.cluster.config import load_config
from lbtune.errors import ConfigError
from lbtune.safety.files import open_regular, read_bytes, read_text
from lbtune.safeyaml import load_yaml_text
from lbtune.scenario.loader import load_scenario


def test_a_file_over_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    p = tmp_path / "big.yaml"
    p.write_bytes(b"x" * 101)
    with pytest.raises(ConfigError, match=r"101 bytes, more than the 100 lbtune reads"):
        read_bytes(p, max_bytes=100)
    assert read_bytes(p, max_bytes=101) == b"x" * 101


def test_a_file_that_grows_while_it_is_read_stops_at_the_cap(tmp_path: Path) -> None:
    """The size is checked when the file is opened; a writer appending afterwards (a log
    being written, a crafted FIFO-like regular file) never makes a read exceed the cap."""
    p = tmp_path / "growing.jsonl"
    p.write_bytes(b"a" * 64)
    with open_regular(p, max_bytes=100) as f:
        with p.open("ab") as grow:
            grow.write(b"b" * 4096)
        with pytest.raises(ConfigError, match="larger than the 100 bytes"):
            f.read()


def test_text_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "latin1.yaml"
    p.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as caught:
        read_text(p)
    assert "not UTF-8" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\nb: 2\na: 3\n",
        "load: {type: constant, users: 2, users: 9}\n",
        "1: x\n'1': y\n1: z\n",
    ],
)
def test_a_key_given_twice_is_refused_with_both_lines(text: str) -> None:
    with pytest.raises(ConfigError, match=r"duplicate key .* \(first at line \d+\)"):
        load_yaml_text(text, "doc.yaml")


def test_merge_keys_may_still_be_overridden() -> None:
    doc = load_yaml_text("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\n", "doc.yaml")
    assert doc["use"] == {"x": 1, "y": 3}


def test_every_document_loader_refuses_a_duplicate_key(tmp_path: Path) -> None:
    """A scenario, a cluster file and a parameter file: the second value was kept silently."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: s\nduration_s: 5\nduration_s: 500000\nload: {type: constant, users: 2}\n"
        "models: {m: 1}\nprompt_tokens: {type: fixed, value: 8}\n"
        "output_tokens: {type: fixed, value: 4}\n"
    )
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: c\nbalancer: haproxy\nbalancer: nginx\n")
    params = tmp_path / "p.yaml"
    params.write_text("weight.h100-0: 50\nweight.h100-0: 1000\n")
    for load in (
        lambda: load_scenario(str(scenario)),
        lambda: load_config(cluster),
        lambda: read_params_for(params, "haproxy"),
    ):
        with pytest.raises(ConfigError, match="duplicate key"):
            load()


def test_knobs_beside_a_params_block_are_refused(tmp_path: Path) -> None:
    """They were dropped silently: the file applied less than it said."""
    params = tmp_path / "p.yaml"
    params.write_text("target: haproxy\nweight.l4-0: 5\nparams:\n  weight.h100-0: 50\n")
    with pytest.raises(ConfigError, match=r"weight\.l4-0"):
        read_params_for(params, "haproxy")
