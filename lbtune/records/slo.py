"""The service-level objective a run is judged by, and the ``--slo`` overrides."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from lbtune.keyvalue import bad_value, in_range, parse_pairs

__all__ = ["Slo", "parse_slo"]


@dataclass(frozen=True)
class Slo:
    """Service-level objective: P99 TTFT and P99 E2E bounds, and the error-rate limit."""

    ttft_s: float | None = None
    e2e_s: float | None = None
    max_error_rate: float = 0.01


# -- SLO overrides --------------------------------------------------------------

_SLO_KEYS = {"ttft": "ttft_s", "e2e": "e2e_s", "errors": "max_error_rate"}


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")
MAX_SLO_S = 86_400.0
"""Longest SLO target ``--slo`` takes (a day; the scenario's own bound too)."""


def parse_slo(text: str | None, base: Slo) -> Slo:
    """Apply ``ttft=350ms,e2e=800ms,errors=1%`` overrides to ``base``."""
    if not text:
        return base
    changes: dict[str, float] = {}
    example = "--slo ttft=350ms,e2e=800ms,errors=1%"
    for key, value in parse_pairs(text, flag="--slo", keys=_SLO_KEYS, example=example):
        if key == "errors":
            pct = value.endswith("%")
            try:
                number = float(value.rstrip("%"))
            except ValueError:
                raise bad_value("--slo", key, value, "a fraction or a percentage") from None
            rate = number / 100 if pct else number
            if not 0 <= rate <= 1:
                raise bad_value("--slo", key, value, "0..100 % (0..1)", "is out of range")
            changes[_SLO_KEYS[key]] = rate
            continue
        m = _DURATION.match(value)
        if not m:
            raise bad_value("--slo", key, value, "a duration like 350ms or 2s")
        number = float(m.group(1))
        seconds = number / 1000 if m.group(2) == "ms" else number
        changes[_SLO_KEYS[key]] = in_range("--slo", key, value, seconds, 0, MAX_SLO_S, "s")
    return replace(base, **changes)
