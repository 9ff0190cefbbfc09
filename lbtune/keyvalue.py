"""Reading a ``KEY=VALUE,KEY=VALUE`` option (``--slo``, ``--weights``, ``--fail-on``,
``fixed:...`` and ``trace:...?...`` scenarios) the same way everywhere.

:func:`parse_pairs` splits the text, strips every key and value, skips empty parts and
refuses a part without ``=`` or with a key it does not know; the caller converts the
values and reports one it cannot read with :func:`bad_value`. Every failure is a
:class:`FlagError`, one line in one format::

    --slo: unknown key 'speed'; expected one of ttft, e2e, errors (e.g. --slo ttft=350ms)
    --slo ttft: cannot read 'fast'; expected a duration like 350ms or 2s
"""

from __future__ import annotations

from collections.abc import Collection

from lbtune.errors import ConfigError

__all__ = ["FlagError", "bad_value", "in_range", "parse_pairs"]


class FlagError(ConfigError):
    """A ``KEY=VALUE`` option that cannot be read: ``FLAG[ KEY]: what was found; expected
    what to write``."""

    def __init__(self, flag: str, found: str, expected: str, key: str | None = None) -> None:
        where = f"{flag} {key}" if key else flag
        super().__init__(f"{where}: {found}; expected {expected}")


def parse_pairs(
    text: str,
    *,
    flag: str,
    keys: Collection[str],
    example: str,
    sep: str = ",",
    fold_case: bool = False,
) -> list[tuple[str, str]]:
    """``(key, value)`` of each ``KEY=VALUE`` part of ``text``, in order (a key given twice
    appears twice: later ones override, for the caller that builds a dict).

    ``keys`` are the keys ``flag`` accepts, listed in that order in the error; ``example``
    is a whole valid option; ``fold_case`` lower-cases keys before they are checked.
    """
    names = ", ".join(keys)
    out: list[tuple[str, str]] = []
    for part in text.split(sep):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        key = key.strip().lower() if fold_case else key.strip()
        if not eq:
            raise FlagError(
                flag,
                f"cannot read {part.strip()!r}",
                f"KEY=VALUE with KEY one of {names} (e.g. {example})",
            )
        if key not in keys:
            raise FlagError(flag, f"unknown key {key!r}", f"one of {names} (e.g. {example})")
        out.append((key, value.strip()))
    return out


def bad_value(flag: str, key: str, value: str, expected: str, problem: str = "") -> FlagError:
    """The error for ``KEY=value`` whose value the caller cannot use: ``problem`` says what
    is wrong with it (``"is out of range"``; default: it cannot be read), ``expected`` what
    would do."""
    found = f"{value!r} {problem}" if problem else f"cannot read {value!r}"
    return FlagError(flag, found, expected, key=key)


def in_range(
    flag: str, key: str, value: str, number: float, low: float, high: float, unit: str = ""
) -> float:
    """``number`` (read from ``value``) when it is finite and within ``low..high``, else the
    one-line error of :func:`bad_value` saying the range: every number of a ``KEY=VALUE``
    option has both bounds (``--slo``, ``--weights``, ``--fail-on``)."""
    if not (low <= number <= high):  # NaN fails too
        expected = f"{low:g}..{high:g}{f' {unit}' if unit else ''}"
        raise bad_value(flag, key, value, expected, "is out of range")
    return number
