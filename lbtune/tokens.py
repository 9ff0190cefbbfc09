"""The documented approximate tokenizer shared by prompt synthesis and the simulator.

Real servers count tokens with the model's own tokenizer; lbtune must work offline
and identically on every machine, so it uses a simple, deterministic rule that is
close to BPE tokenizers on English text (about 4 characters per token):

* a token is a run of 1 to 6 word characters (``\\w``); longer words are split
  into runs of 6, or
* a single non-space, non-word character (punctuation).

Whitespace is not a token. Token ids are stable 31-bit hashes of the token text,
so identical text yields identical ids in every process (prefix caching in the
simulator hashes blocks of these ids).

Prompts synthesised by :mod:`lbtune.scenario` use words of at most 6 characters,
so their token count is exactly the number of words and punctuation marks. When
a real Hugging Face ``tokenizer.json`` is given to ``lbtune stress --tokenizer``,
prompt lengths are checked with it instead.
"""

from __future__ import annotations

import re
import zlib
from functools import lru_cache

_TOKEN_RE = re.compile(r"\w{1,6}|[^\w\s]")


def split(text: str) -> list[str]:
    """Split ``text`` into token strings."""
    return _TOKEN_RE.findall(text)


def count(text: str) -> int:
    """Number of tokens in ``text``."""
    return sum(1 for _ in _TOKEN_RE.finditer(text))


@lru_cache(maxsize=65536)
def token_id(piece: str) -> int:
    """Stable id of one token string."""
    return zlib.crc32(piece.encode("utf-8")) & 0x7FFFFFFF


def encode(text: str) -> list[int]:
    """Token ids of ``text``."""
    return [token_id(p) for p in _TOKEN_RE.findall(text)]
