"""Issue 29, class 6: an API key from the environment never reaches what lbtune writes.

The secret-variants family: a key of visible ASCII, then the texts a run could carry it in
(as is, lower- or upper-cased, a truncated prefix or suffix of 8+ characters, inside other
text, repeated); whatever the text, no 8-character piece of the key is left in any letter
case. Then each writer: JSON documents (``summary.json``, ``study.json``), JUnit, log
lines, the CLI's error line.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import string
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from lbtune.errors import ConfigError
from lbtune.records.jsonform import json_text
from lbtune.report.junit import JUnitCase, JUnitSuite, write_junit
from lbtune.safety.secrets import MIN_FRAGMENT, Scrubber, ScrubFilter, check_key
from tests.robustness.test_fuzz import FRESH

KEY = "sk-LiveKey0123456789abcdefXYZ"
VISIBLE = string.ascii_letters + string.digits + string.punctuation
KEYS = st.text(alphabet=VISIBLE, min_size=MIN_FRAGMENT, max_size=64)


def _pieces_left(key: str, text: str) -> list[str]:
    low_key, low = key.lower(), text.lower()
    return [
        low_key[i : i + MIN_FRAGMENT]
        for i in range(len(low_key) - MIN_FRAGMENT + 1)
        if low_key[i : i + MIN_FRAGMENT] in low
    ]


@st.composite
def carried(draw: st.DrawFn, key: str) -> str:
    """``key`` as a text might carry it: cased, cut, inside other text."""
    start = draw(st.integers(0, len(key) - MIN_FRAGMENT))
    end = draw(st.integers(start + MIN_FRAGMENT, len(key)))
    piece = key[start:end]
    piece = draw(st.sampled_from([piece, piece.lower(), piece.upper(), piece.swapcase()]))
    around = st.text(alphabet=VISIBLE + " \n", max_size=20)
    return draw(around) + piece + draw(around) + draw(st.sampled_from(["", piece, key]))


@FRESH
@given(st.data(), KEYS)
def test_no_piece_of_a_key_survives_the_scrubber(data: st.DataObject, key: str) -> None:
    text = data.draw(carried(key))
    assert _pieces_left(key, Scrubber([key])(text)) == []


@FRESH
@given(KEYS, st.text(alphabet=VISIBLE + " \n", max_size=60))
def test_text_without_a_piece_of_the_key_is_left_alone(key: str, text: str) -> None:
    if not _pieces_left(key, text):
        assert Scrubber([key])(text) == text


def test_a_short_key_is_scrubbed_whole_in_any_case() -> None:
    assert Scrubber(["Ab3x"])("token=ab3X;") == "token=***;"


@pytest.mark.parametrize("bad", ["sk-abc\r\nX-Evil: 1", "sk abc", "sk-\x00abc", "sk-ä-abc", ""])
def test_a_key_with_a_control_character_space_or_non_ascii_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_key(bad, "LBTUNE_API_KEY")
    assert "LBTUNE_API_KEY" in str(caught.value)
    assert not bad or bad not in str(caught.value)


@dataclasses.dataclass(frozen=True)
class _Doc:
    note: str
    by_name: dict[str, str]


def test_json_documents_hold_no_piece_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """``summary.json``, ``study.json`` and the compare result are written by json_text."""
    monkeypatch.setenv("LBTUNE_API_KEY", KEY)
    doc = _Doc(
        note=f"HTTP 401: bad key {KEY.lower()[:12]}...",
        by_name={KEY.upper(): "http://user:hunter22@127.0.0.1:1/v1"},
    )
    text = json_text(TypeAdapter(_Doc), doc, indent=1)
    assert _pieces_left(KEY, text) == []
    assert "hunter22" not in text
    assert json.loads(text)["note"].startswith("HTTP 401: bad key ***")


def test_junit_holds_no_piece_of_the_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    case = JUnitCase("run", "lbtune", "error", f"401 for {KEY}", detail=KEY.swapcase())
    path = write_junit(tmp_path / "j.xml", [JUnitSuite("s", (case,))])
    assert _pieces_left(KEY, path.read_text()) == []


def test_log_lines_hold_no_piece_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LBTUNE_API_KEY", KEY)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(ScrubFilter())
    log = logging.getLogger("lbtune.test.secrets")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("the balancer said %s", KEY.lower())
        try:
            raise RuntimeError(f"boom {KEY[3:20]}")
        except RuntimeError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    assert "the balancer said ***" in out.getvalue()
    assert _pieces_left(KEY, out.getvalue()) == []


def test_the_error_line_holds_no_key_and_no_raw_escape(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A name that carries an ANSI escape or a newline reaches the terminal escaped."""
    from lbtune.cli import main

    monkeypatch.setenv("LBTUNE_API_KEY", KEY)
    missing = tmp_path / f"{KEY.lower()}-\x1b[2J\nfake: line.yaml"
    monkeypatch.setattr(sys, "argv", ["lbtune", "scenarios", "show", str(missing)])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert "\x1b" not in err and "\\x1b" in err
    assert _pieces_left(KEY, err) == []
