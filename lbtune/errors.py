"""Errors a user can act on.

Exit codes (documented in the README): 0 ok; 1 a regression, an SLO breach or an
untrusted measurement (``--strict``); 2 bad input or an unreachable target or
Prometheus; 3 an infrastructure failure (the embedded cluster, a missing
program, a failed apply, a run that measured nothing); 130 interrupted (Ctrl-C);
143 terminated (SIGTERM, ``stress``: the partial report is written as on Ctrl-C).

Every subclass of :class:`LbtuneError` is shown by the CLI as one line on stderr,
without a traceback, and the process exits with ``exit_code``. Anything else that
escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class LbtuneError(Exception):
    """Shown to the user as one line, without a traceback."""

    exit_code = 2


class ConfigError(LbtuneError):
    """A scenario, space, cluster or parameter file is invalid."""


class TargetError(LbtuneError):
    """The target, the balancer or Prometheus is unreachable or misbehaves.

    Exit code 2 like bad input: the user must point lbtune at something that answers.
    """


class ClusterError(LbtuneError):
    """The embedded cluster cannot be started, stopped or inspected."""

    exit_code = 3


class DependencyError(LbtuneError):
    """A required external program (haproxy, prometheus, ...) is missing."""

    exit_code = 3


class MissingExtra(LbtuneError):
    """An optional Python package is not installed: ``pip install 'lbtune[<extra>]'`` fixes it."""


class ApplyError(LbtuneError):
    """A playbook or runtime change failed; the last known good config was kept."""

    exit_code = 3


class NothingMeasured(LbtuneError):
    """A run sent no request, or every request failed before any response: an
    infrastructure failure (the generator or the path to the target), not a measurement."""

    exit_code = 3


class TrialFailed(LbtuneError):
    """One trial could not be measured; the study goes on."""


def validation_error(exc: Any, where: str, known_fields: Callable[[str], str]) -> ConfigError:
    """One ConfigError line from a pydantic ``ValidationError``: ``where: loc: message; ...``.

    ``known_fields(loc)`` names the valid fields for an unknown one at ``loc``.
    """
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown field; known: {known_fields(loc)}"
        parts.append(f"{loc}: {msg}")
    return ConfigError(f"{where}: " + "; ".join(parts))
