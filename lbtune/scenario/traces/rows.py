"""One parsed trace request and the helpers every parser shares (errors name file, line, column)."""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lbtune.errors import ConfigError
from lbtune.safety.files import MAX_TRACE_BYTES, open_regular
from lbtune.scenario.limits import MAX_TOKENS, MAX_TRACE_ROWS, MAX_TRACE_TIME_S


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace, as the file holds it.

    ``t`` is seconds on the trace's own clock (``None``: untimed, ShareGPT); ``line`` the
    1-based line (or record) number in the file, which also keys the synthesized text.
    ``hash_ids``: Mooncake block hashes (shared leading blocks = shared prefix);
    ``messages``: real texts ``(role, text)``, the last a user turn (ShareGPT);
    ``replay``: index of the request in a recorded lbtune run (its own workload).
    """

    line: int
    t: float | None
    prompt_tokens: int
    output_tokens: int
    model: str | None = None
    hash_ids: tuple[int, ...] | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    session: int | None = None
    turn: int = 0
    replay: int | None = None
    api: str | None = None
    stream: bool | None = None
    prefix_group: int | None = None


def bad(path: str, line: int, column: str | None, what: str) -> ConfigError:
    """``file:line: column 'c': what`` as a ConfigError."""
    col = f" column {column!r}:" if column else ""
    return ConfigError(f"{path}:{line}:{col} {what}")


def as_int(
    path: str, line: int, column: str, raw: object, *, minimum: int = 0, maximum: int = MAX_TOKENS
) -> int:
    """A whole number in ``minimum..maximum`` (``12``, ``"12"`` or ``12.0``; a token count
    by default), else a ConfigError."""
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = float(raw) if isinstance(raw, str | int | float) else math.nan
        if not value.is_integer():
            raise ValueError
    except (TypeError, ValueError):
        raise bad(path, line, column, f"expected a whole number, found {raw!r}") from None
    if value < minimum:
        raise bad(path, line, column, f"must be >= {minimum}, found {raw!r}")
    if value > maximum:
        raise bad(path, line, column, f"must be <= {maximum}, found {raw!r}")
    return int(value)


def as_float(
    path: str, line: int, column: str, raw: object, *, maximum: float = MAX_TRACE_TIME_S
) -> float:
    """A finite number in ``0..maximum`` (a time in seconds by default), else a ConfigError."""
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = float(raw) if isinstance(raw, str | int | float) else math.nan
    except (TypeError, ValueError):
        raise bad(path, line, column, f"expected a number, found {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise bad(path, line, column, f"expected a finite number >= 0, found {raw!r}")
    if value > maximum:
        raise bad(path, line, column, f"must be <= {maximum:g}, found {raw!r}")
    return value


def check_count(path: str, line: int, n: int) -> None:
    """A trace may hold at most :data:`MAX_TRACE_ROWS` requests; ``n`` is the count so far."""
    if n > MAX_TRACE_ROWS:
        raise bad(
            path, line, None, f"more than {MAX_TRACE_ROWS} requests in one trace; split the file"
        )


@contextmanager
def open_text(path: Path, shown: str, newline: str | None = None) -> Iterator[io.TextIOWrapper]:
    """The trace file as UTF-8 text: a regular file of at most :data:`MAX_TRACE_BYTES`, read
    with a bounded read (:func:`lbtune.safety.files.open_regular`)."""
    with open_regular(path, shown, max_bytes=MAX_TRACE_BYTES) as raw:
        yield io.TextIOWrapper(raw, encoding="utf-8", newline=newline)


@contextmanager
def read_errors(shown: str, fmt: str) -> Iterator[None]:
    """A parser's undecodable bytes and OS errors as one ConfigError line naming the file."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{shown}: not UTF-8 text at byte {exc.start} (is it a {fmt} trace?)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read ({exc.strerror})") from None


class Monotonic:
    """Checks that timestamps never go back (a sorted trace is what replay needs)."""

    def __init__(self, path: str, column: str) -> None:
        self.path, self.column = path, column
        self.last: float | None = None

    def check(self, line: int, t: float) -> None:
        if self.last is not None and t < self.last:
            raise bad(
                self.path,
                line,
                self.column,
                f"timestamps go back ({t:.6f} after {self.last:.6f}); sort the trace by time",
            )
        self.last = t


def require_columns(path: str, header: list[str] | None, need: tuple[str, ...]) -> None:
    """The CSV header holds every column in ``need``, else a ConfigError naming the missing."""
    have = [h.strip() for h in header or []]
    missing = [c for c in need if c not in have]
    if missing:
        found = ", ".join(have) if have else "no header"
        raise bad(path, 1, missing[0], f"missing column (need {', '.join(need)}; found {found})")
