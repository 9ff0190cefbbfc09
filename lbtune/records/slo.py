"""The service-level objective a run is judged by, and the ``--slo`` overrides."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Annotated

from pydantic import Field

from lbtune.keyvalue import bad_value, in_range, parse_pairs

__all__ = ["Slo", "parse_slo", "without_tpot"]


@dataclass(frozen=True)
class Slo:
    """Service-level objective: P99 TTFT and P99 E2E bounds, and the error-rate limit.

    ``tpot_s`` bounds each request's time per output token; only ``lbtune capacity`` reads
    it (``parse_slo(..., tpot=True)``): a stress run's SLO has no TPOT bound, and a record
    without one (``None``) keeps the form it had: no ``tpot_s`` key in its JSON, and its
    repr, which golden files of summaries hold, unchanged (``repr=False``).
    """

    ttft_s: float | None = None
    e2e_s: float | None = None
    max_error_rate: float = 0.01
    tpot_s: Annotated[float | None, Field(exclude_if=lambda v: v is None)] = field(
        default=None, repr=False
    )


# -- SLO overrides --------------------------------------------------------------

_SLO_KEYS = {"ttft": "ttft_s", "e2e": "e2e_s", "errors": "max_error_rate"}
_TPOT_KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "errors": "max_error_rate"}


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")
MAX_SLO_S = 86_400.0
"""Longest SLO target ``--slo`` takes (a day; the scenario's own bound too)."""


def parse_slo(text: str | None, base: Slo, *, tpot: bool = False) -> Slo:
    """Apply ``ttft=350ms,e2e=800ms,errors=1%`` overrides to ``base``; with ``tpot``, a
    ``tpot=50ms`` bound is read too (``lbtune capacity``)."""
    if not text:
        return base
    changes: dict[str, float] = {}
    keys = _TPOT_KEYS if tpot else _SLO_KEYS
    example = "--slo ttft=350ms,e2e=800ms,errors=1%"
    if tpot:
        example = "--slo ttft=350ms,tpot=50ms,e2e=10s"
    for key, value in parse_pairs(text, flag="--slo", keys=keys, example=example):
        if key == "errors":
            pct = value.endswith("%")
            try:
                number = float(value.rstrip("%"))
            except ValueError:
                raise bad_value("--slo", key, value, "a fraction or a percentage") from None
            rate = number / 100 if pct else number
            if not 0 <= rate <= 1:
                raise bad_value("--slo", key, value, "0..100 % (0..1)", "is out of range")
            changes[keys[key]] = rate
            continue
        m = _DURATION.match(value)
        if not m:
            raise bad_value("--slo", key, value, "a duration like 350ms or 2s")
        number = float(m.group(1))
        seconds = number / 1000 if m.group(2) == "ms" else number
        changes[keys[key]] = in_range("--slo", key, value, seconds, 0, MAX_SLO_S, "s")
    return replace(base, **changes)


def without_tpot(text: str | None) -> str | None:
    """``--slo`` text with a TPOT bound, as a run's SLO reads it: its ``tpot=`` part left
    out (a run's SLO has no TPOT bound; the capacity objective judges it). Keys are
    checked as :func:`parse_slo` with ``tpot`` checks them."""
    if not text:
        return text
    example = "--slo ttft=350ms,tpot=50ms,e2e=10s"
    pairs = parse_pairs(text, flag="--slo", keys=_TPOT_KEYS, example=example)
    kept = [f"{k}={v}" for k, v in pairs if k != "tpot"]
    return ",".join(kept) or None
