"""Prompt synthesis: exact counts, speed, and the optional Hugging Face tokenizer."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from lbtune import tokens
from lbtune.errors import ConfigError
from lbtune.scenario import build_workload, load_scenario
from lbtune.scenario.prompts import WORDS, TextSynth, synth


def test_word_list_fits_the_tokenizer_rule() -> None:
    assert len(WORDS) > 300
    assert all(len(w) <= 6 and w.isalpha() and tokens.count(w) == 1 for w in WORDS)


@pytest.mark.parametrize("n", [1, 2, 4, 5, 17, 512, 32768, 70000])
def test_exact_count(n: int) -> None:
    text = synth(3, (n,), n)
    assert tokens.count(text) == n
    assert synth(3, (n,), n) == text
    assert synth(4, (n,), n) != text


def test_32k_prompt_is_fast() -> None:
    synth(0, (0,), 10)  # builds the word stream once
    t = time.perf_counter()
    for k in range(20):
        synth(1, (k,), 32768)
    assert (time.perf_counter() - t) / 20 < 0.005


def test_tokenizer_needs_optional_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ConfigError, match="pip install tokenizers"):
        build_workload(load_scenario("chat"), tokenizer_path="tokenizer.json")


class _Enc:
    def __init__(self, text: str) -> None:
        # A fake BPE: words of more than 3 letters are two tokens.
        self.ids: list[int] = []
        self.offsets: list[tuple[int, int]] = []
        pos = 0
        for piece in text.split(" "):
            start = text.index(piece, pos)
            pos = start + len(piece)
            if len(piece) > 3:
                self.offsets += [(start, start + 3), (start + 3, pos)]
            elif piece:
                self.offsets.append((start, pos))
        self.ids = list(range(len(self.offsets)))


class _FakeTokenizer:
    @classmethod
    def from_file(cls, path: str) -> _FakeTokenizer:
        return cls()

    @classmethod
    def from_str(cls, text: str) -> _FakeTokenizer:  # lbtune reads the file itself (bounded)
        return cls()

    def encode(self, text: str, add_special_tokens: bool = True) -> _Enc:
        return _Enc(text)


def test_hf_tokenizer_adjusts_text(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake: Any = types.ModuleType("tokenizers")
    fake.Tokenizer = _FakeTokenizer
    monkeypatch.setitem(sys.modules, "tokenizers", fake)
    path = tmp_path / "tokenizer.json"
    path.write_text("{}")
    synth_hf = TextSynth(str(path))
    assert synth_hf.tokenizer == "hf"
    for n in (5, 40, 300):
        text, count = synth_hf.text(1, (n,), n)
        assert count == len(_Enc(text).ids)
        assert abs(count - n) <= 1
    w = build_workload(load_scenario("chat"), tokenizer_path=str(path))
    r = w.request(0)
    assert r.messages is not None
    assert r.prompt_tokens == len(_Enc(r.messages[0]["content"]).ids)
    with pytest.raises(ConfigError, match="no such file"):
        TextSynth(str(tmp_path / "missing.json"))
