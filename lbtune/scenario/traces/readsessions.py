"""Read an agentic trace file (``weka``, ``otel``, ``copilot``) into session graphs.

This module owns the file and the JSON: a bounded read of a regular file, the decoding
(an error is one line with the file and its line), the cache (by path, size and mtime,
like :func:`lbtune.scenario.traces.read.read_trace`), the order (by start) and the one
graph check (:func:`~lbtune.scenario.traces.sessiongraph.check_session`). The formats'
schemas and their rules for the graph live in :mod:`~lbtune.scenario.traces.weka` (JSON
lines, given one decoded line at a time), :mod:`~lbtune.scenario.traces.otel` and
:mod:`~lbtune.scenario.traces.copilot` (JSON documents, given the decoded document).
:func:`detect_session_format` tells the three apart from a file's first 64 KiB.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from lbtune.errors import ConfigError
from lbtune.safety.files import MAX_TRACE_BYTES, open_regular, read_text
from lbtune.scenario.traces import copilot, otel, weka
from lbtune.scenario.traces.rows import bad, check_count, open_text, read_errors
from lbtune.scenario.traces.sessiongraph import SESSION_FORMATS, TraceSession, check_session

__all__ = ["detect_session_format", "read_sessions"]

HEAD_BYTES = 64 * 1024
"""How much of a file :func:`detect_session_format` reads."""

_DETECT: tuple[tuple[str, tuple[re.Pattern[str], ...]], ...] = (
    ("otel", (re.compile(r'"resourceSpans"\s*:'),)),
    ("weka", tuple(re.compile(p) for p in (r'"requests"\s*:\s*\[', r'"in"\s*:', r'"out"\s*:'))),
    ("copilot", (re.compile(r'"(?:sessions|turns|llm_calls)"\s*:\s*\['),)),
)
"""Each format with the keys its first bytes hold (all of them), tried in this order."""


def _json(shown: str, line: int, text: str) -> object:
    """``text`` decoded; a ConfigError at its line (``line`` + the line inside ``text``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = line + exc.lineno - 1
        raise bad(shown, where, None, f"invalid JSON at column {exc.colno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # a huge integer, a deep nesting
        raise bad(shown, line, None, f"invalid JSON: {str(exc)[:200]}") from None


def _read_weka(path: Path, shown: str) -> list[TraceSession]:
    out: list[TraceSession] = []
    calls = 0
    with open_text(path, shown) as f:
        for line, text in enumerate(f, start=1):
            if text.strip():
                obj = _json(shown, line, (text.lstrip("\ufeff") if line == 1 else text).rstrip())
                out.append(weka.session(shown, line, obj))
                calls += len(out[-1].calls)
                check_count(shown, line, calls)
    return out


_Reader = Callable[[Path, str], list[TraceSession]]


def _document(parse: Callable[[str, object], list[TraceSession]]) -> _Reader:
    """A reader that decodes the whole file as one JSON document and hands it to ``parse``."""

    def read(path: Path, shown: str) -> list[TraceSession]:
        text = read_text(path, shown, max_bytes=MAX_TRACE_BYTES)
        return parse(shown, _json(shown, 1, text)) if text.strip() else []

    return read


_READERS: dict[str, _Reader] = {
    "weka": _read_weka,
    "otel": _document(otel.sessions),
    "copilot": _document(copilot.sessions),
}


def read_sessions(path: str | Path, fmt: str) -> tuple[TraceSession, ...]:
    """Every session in ``path`` (a ``fmt`` agentic trace), each checked with
    :func:`~lbtune.scenario.traces.sessiongraph.check_session`, ordered by ``start_s``
    (stable); a ConfigError (one line: file, line or record, field, what to do) on the
    first bad one, or when the file holds no session."""
    if fmt not in _READERS:
        raise ConfigError(
            f"Unknown agentic trace format '{fmt}'. Available: {', '.join(SESSION_FORMATS)}"
        )
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the trace ({exc.strerror})") from None
    return _cached(str(p.resolve()), fmt, st.st_size, st.st_mtime_ns, str(path))


@lru_cache(maxsize=8)
def _cached(path: str, fmt: str, size: int, mtime: int, shown: str) -> tuple[TraceSession, ...]:
    with read_errors(shown, fmt):
        sessions = _READERS[fmt](Path(path), shown)
    if not sessions:
        raise ConfigError(f"{shown}: the trace holds no sessions (is it a {fmt} trace?)")
    for session in sessions:
        check_session(shown, session)
    return tuple(sorted(sessions, key=lambda s: s.start_s))


def detect_session_format(path: str | Path) -> str | None:
    """``"weka"``, ``"otel"`` or ``"copilot"`` when the file's first :data:`HEAD_BYTES`
    (a JSON object or array) hold that format's keys; ``None`` when they match none. A
    path that is not a readable regular file is a ConfigError."""
    with open_regular(path, max_bytes=MAX_TRACE_BYTES) as f:
        try:
            head = f.read(HEAD_BYTES).decode("utf-8", errors="replace")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    if head.lstrip("\ufeff \t\r\n")[:1] not in ("{", "["):
        return None
    return next((fmt for fmt, keys in _DETECT if all(k.search(head) for k in keys)), None)
