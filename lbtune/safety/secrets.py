"""Secrets (API keys, URL passwords): checked when read, scrubbed from what lbtune writes.

One owner for the rule, used by every writer (request records and ``requests.parquet``,
logs, reports, error lines, the simulated replica's ground-truth log):

* a key (``LBTUNE_API_KEY``, ``OPENAI_API_KEY``) must be visible ASCII: a control
  character (CR/LF would inject headers), a space or a non-ASCII character is refused by
  :func:`check_key`, naming the variable, never the key;
* :class:`Scrubber` replaces with ``***`` every stretch of a text made of substrings of
  :data:`MIN_FRAGMENT` (8) or more characters of a secret, in any letter case (an echo in
  lower case, a truncated prefix), and a whole secret of 4 to 7 characters in any case;
* :func:`without_userinfo` drops the ``user:password@`` of every URL in a text.

:func:`scrub` is all three for this process: the keys of its environment, whatever
:func:`register` added (a URL's password), and URL userinfo. :func:`scrub_data` applies it
to every string (keys too) of a JSON document before it is written (``summary.json``,
``study.json``, the compare result), :class:`ScrubFilter` to every log line a handler
emits; the reports' Markdown, HTML and JUnit texts and the CLI's error line go through
:func:`scrub` whole.
"""

from __future__ import annotations

import logging
import os
import re
import string
from collections.abc import Iterable
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from lbtune.errors import ConfigError

__all__ = [
    "ENV_KEYS",
    "MIN_FRAGMENT",
    "ScrubFilter",
    "Scrubber",
    "api_key_from_env",
    "check_key",
    "process_scrubber",
    "register",
    "scrub",
    "scrub_data",
    "url_secrets",
    "without_userinfo",
]

ENV_KEYS = ("LBTUNE_API_KEY", "OPENAI_API_KEY")
"""Where the API key comes from, first set wins."""
MIN_FRAGMENT = 8
"""Shortest piece of a secret scrubbed on its own (shorter keys: only whole)."""
MIN_WHOLE = 4
"""Shortest secret scrubbed at all (a 1-3 character key would blank ordinary words)."""
MASK = "***"

_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s]*@")


def check_key(key: str, what: str) -> str:
    """``key`` when it is visible ASCII (what an HTTP header may carry), else a ConfigError
    naming ``what`` and the offending character's kind, never the key."""
    if not key:
        raise ConfigError(f"{what}: empty; unset it or give the key")
    for c in key:
        if ord(c) < 32 or ord(c) == 127:
            raise ConfigError(
                f"{what}: holds a control character ({ord(c):#04x}; a CR/LF would inject "
                "headers); give the key alone"
            )
        if c == " " or ord(c) > 126:
            kind = "a space" if c == " " else "a non-ASCII character"
            raise ConfigError(f"{what}: holds {kind}; a key is visible ASCII")
    return key


def api_key_from_env(env: dict[str, str] | None = None) -> str | None:
    """The API key (``LBTUNE_API_KEY``, else ``OPENAI_API_KEY``), checked; ``None`` if unset."""
    source = os.environ if env is None else env
    for name in ENV_KEYS:
        value = source.get(name)
        if value:
            return check_key(value, name)
    return None


class Scrubber:
    """Masks the given secrets in text (see the module docstring for the rule)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        low = {s.translate(_LOWER) for s in secrets if len(s) >= MIN_WHOLE}
        self._grams = frozenset(
            s[i : i + MIN_FRAGMENT] for s in low for i in range(len(s) - MIN_FRAGMENT + 1)
        )
        self._whole = tuple(sorted(s for s in low if len(s) < MIN_FRAGMENT))

    def __bool__(self) -> bool:
        return bool(self._grams or self._whole)

    def __call__(self, text: str) -> str:
        if not self or not text:
            return text
        low = text.translate(_LOWER)
        hits = [g for g in self._grams if g in low] + [w for w in self._whole if w in low]
        if not hits:
            return text
        masked = bytearray(len(text))
        for piece in hits:
            at = low.find(piece)
            while at >= 0:
                masked[at : at + len(piece)] = b"\x01" * len(piece)
                at = low.find(piece, at + 1)
        out: list[str] = []
        k = 0
        while k < len(text):
            if masked[k]:
                while k < len(text) and masked[k]:
                    k += 1
                out.append(MASK)
            else:
                j = masked.find(b"\x01", k)
                j = len(text) if j < 0 else j
                out.append(text[k:j])
                k = j
        return "".join(out)


def without_userinfo(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it shown as ``***@``."""
    return _USERINFO.sub(lambda m: f"{m[1]}{MASK}@", text) if "@" in text else text


def url_secrets(url: str) -> list[str]:
    """The user name and password a URL carries (to :func:`register` them)."""
    try:
        u = urlsplit(url)
    except ValueError:
        return []
    return [s for s in (u.username, u.password) if s]


_registered: set[str] = set()


def register(*secrets: str | None) -> None:
    """Add secrets (a URL's password, a key read from a file) to :func:`scrub`'s."""
    _registered.update(s for s in secrets if s)


def process_scrubber() -> Scrubber:
    """The scrubber of this process: its environment's keys and the registered secrets."""
    keys = [v for name in ENV_KEYS if (v := os.environ.get(name))]
    return _scrubber(frozenset([*keys, *_registered]))


@lru_cache(maxsize=4)
def _scrubber(secrets: frozenset[str]) -> Scrubber:
    return Scrubber(secrets)


def scrub(text: str) -> str:
    """``text`` without this process's secrets and without URL userinfo."""
    return without_userinfo(process_scrubber()(text))


def scrub_data(data: Any) -> Any:
    """JSON-like ``data`` (dicts, lists, strings, numbers) with every string, keys
    included, passed through :func:`scrub`; other values as they are."""
    scrubber = process_scrubber()

    def clean(text: str) -> str:
        return without_userinfo(scrubber(text))

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return clean(value)
        if isinstance(value, dict):
            return {clean(k) if isinstance(k, str) else k: walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v) for v in value]
        return value

    return walk(data)


class ScrubFilter(logging.Filter):
    """A handler's filter: the line a record becomes holds no secret of this process (the
    message is formatted here, scrubbed, and handed on without its arguments)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = scrub(logging.Formatter().formatException(record.exc_info))
        return True
