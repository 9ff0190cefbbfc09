"""Deterministic prompt text with an exact token count, offline.

Text is cut from one fixed word stream built once per process from a built-in
list of English words of at most 6 characters, with a full stop every few
words. Under :mod:`lbtune.tokens` every such word is one token and every full
stop one more, so a slice of ``n`` stream entries is exactly ``n`` tokens and
costs one string slice (a 32k-token prompt takes microseconds).

Each piece of text is keyed (seed and a tuple of ints): the key picks four
leading words and a start offset in the stream, so two different keys never
share a prefix by accident (the prefix cache would otherwise see hits the
scenario did not ask for), and equal keys give equal text in every process.

With a Hugging Face ``tokenizer.json`` (optional ``tokenizers`` package) the
text is trimmed or extended until that tokenizer counts the target number of
tokens, and the count reported is that tokenizer's.
"""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path
from typing import Any

from lbtune import tokens
from lbtune.errors import ConfigError
from lbtune.safety.files import MAX_TOKENIZER_BYTES, read_text
from lbtune.scenario import draws

_WORD_TEXT = """
    the of and to in is it you that he was for on are as with his they at be this
    have from or one had by word but not what all were we when your can said there
    use an each which she do how their if will up other about out many then them
    these so some her would make like him into time has look two more write go see
    number no way could people my than first water been call who oil its now find
    long down day did get come made may part over new sound take only little work
    know place year live me back give most very after thing our just name good
    sentence man think say great where help though much before line right too mean
    old any same tell boy follow came want show also around form three small set
    put end does another well large must big even such because turn here why ask
    went men read need land differ home us move try kind hand air away again
    change off play spell animal house point page letter mother answer found study
    still learn should plant cover food sun four world high every near add between
    own below last school father keep tree never start city earth eye light
    thought head under story saw left few while along might close seem next hard
    open begin life always those both paper often later until river car feet care
    second book carry took rain eat room friend began idea fish north once base
    hear horse cut sure watch color face wood main enough plain girl usual young
    ready above ever red list feel talk bird soon body dog family direct pose leave
    song music stand half order red door sure become top ship across today during
    short better best however low hours black yellow white mark early reach table
    listen wind rock space cover fast several hold step morning passed vowel true
    hundred voice seen minute field drive person south group data model server token
    cache queue batch memory signal engine ratio query vector layer weight input
    output prompt reply answer system user agent value index record metric range
"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(w for w in _WORD_TEXT.split() if len(w) <= 6))
"""The fixed vocabulary: unique lowercase words of at most 6 characters."""

_STREAM_TOKENS = 1 << 16
_HEAD = 4


@lru_cache(maxsize=1)
def _stream() -> tuple[str, tuple[int, ...]]:
    """The fixed word stream and the character offset of each of its tokens."""
    rng = random.Random(0x1B7E)
    words = rng.choices(WORDS, k=_STREAM_TOKENS)
    pieces: list[str] = []
    until_stop = rng.randint(6, 18)
    for w in words:
        if len(pieces) >= _STREAM_TOKENS:
            break
        if until_stop == 0:
            pieces.append(".")
            until_stop = rng.randint(6, 18)
            if len(pieces) >= _STREAM_TOKENS:
                break
        pieces.append(" " + w)
        until_stop -= 1
    while len(pieces) < _STREAM_TOKENS:
        pieces.append(" " + WORDS[len(pieces) % len(WORDS)])
    offsets = [0]
    pos = 0
    for p in pieces:
        pos += len(p)
        offsets.append(pos)
    return "".join(pieces), tuple(offsets)


def warm() -> None:
    """Build the word stream now (about 50 ms, once per process), not on the first request:
    an open-loop generator would otherwise send its first requests that much late."""
    _stream()


def _slice(start: int, n: int) -> str:
    text, off = _stream()
    parts: list[str] = []
    a = start % _STREAM_TOKENS
    while n > 0:
        take = min(n, _STREAM_TOKENS - a)
        parts.append(text[off[a] : off[a + take]])
        n -= take
        a = 0
    return "".join(parts)


def synth(seed: int, key: tuple[int, ...], n: int) -> str:
    """Text of exactly ``n`` tokens under :mod:`lbtune.tokens`, a pure function of its inputs."""
    if n <= 0:
        return ""
    u = draws.uniforms(seed, draws.TEXT, *key, n=_HEAD + 1)
    head = [WORDS[int(x * len(WORDS))] for x in u[:_HEAD]]
    if n <= _HEAD:
        return " ".join(head[:n])
    return " ".join(head) + _slice(int(u[_HEAD] * _STREAM_TOKENS), n - _HEAD)


class TextSynth:
    """Synthesizes text to a target count under the tokenizer in use."""

    def __init__(self, tokenizer_path: str | None = None) -> None:
        self._hf: Any = None
        if tokenizer_path is not None:
            self._hf = _load_hf(tokenizer_path)
        warm()

    @property
    def tokenizer(self) -> str:
        """``"lbtune"`` (approximate, see :mod:`lbtune.tokens`) or ``"hf"``."""
        return "lbtune" if self._hf is None else "hf"

    def count(self, text: str) -> int:
        """Token count of ``text`` under the tokenizer in use."""
        if self._hf is None:
            return tokens.count(text)
        return len(self._hf.encode(text, add_special_tokens=False).ids)

    def text(self, seed: int, key: tuple[int, ...], n: int) -> tuple[str, int]:
        """``(text, token count)`` for a target of ``n`` tokens."""
        if self._hf is None or n <= 0:
            return synth(seed, key, n), max(n, 0)
        return self._fit(seed, key, n)

    def _fit(self, seed: int, key: tuple[int, ...], n: int) -> tuple[str, int]:
        # Over-generate, cut at the n-th token's end by character offsets, then
        # nudge the cut until the re-tokenized text counts exactly n if possible.
        text = synth(seed, key, n)
        c = self.count(text)
        if c == n:
            return text, c
        longer = synth(seed, key, max(n + 16, int(n * n / max(c, 1) * 1.2) + 16))
        enc = self._hf.encode(longer, add_special_tokens=False)
        offsets = enc.offsets
        best: tuple[str, int] = (text, c)
        for shift in (0, -1, 1, -2, 2, -3, 3, -4, 4):
            k = n + shift
            if not 1 <= k <= len(offsets):
                continue
            cand = longer[: offsets[k - 1][1]]
            cc = self.count(cand)
            if cc == n:
                return cand, cc
            if abs(cc - n) < abs(best[1] - n):
                best = (cand, cc)
        return best


def _load_hf(path: str) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError(
            f"--tokenizer {path}: needs the optional 'tokenizers' package "
            "(pip install tokenizers, or the lbtune[tokenizer] extra); without --tokenizer "
            "lbtune's approximate tokenizer is used"
        ) from None
    if not Path(path).exists():
        raise ConfigError(f"--tokenizer {path}: no such file (expected a tokenizer.json)")
    text = read_text(path, f"--tokenizer {path}", max_bytes=MAX_TOKENIZER_BYTES)
    try:
        return Tokenizer.from_str(text)
    except Exception as exc:  # the Rust side raises plain Exception subclasses
        raise ConfigError(f"--tokenizer {path}: not a tokenizer.json ({exc})") from None
