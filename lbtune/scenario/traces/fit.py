"""A compact synthetic scenario with a trace's shape: ``lbtune scenarios fit``.

What is fitted, from the trace's rows alone (no text leaves the file):

* prompt and output lengths: a lognormal (median, sigma of ln) when it fits — the
  Kolmogorov-Smirnov distance between the trace's lengths and the lognormal is at most
  :data:`KS_OK` — else the trace's empirical percentile table (``kind`` forces either);
  the KS distance is the goodness-of-fit figure, recorded in ``fitted.fit``;
* arrivals (timed traces): the mean rate and the coefficient of variation of the gaps:
  Poisson when the CV is within 0.1 of 1, else gamma with that CV (the burstiness);
* prefix sharing (Mooncake ``hash_ids``): the share of requests whose first block an
  earlier request had, the number of such first blocks (groups) and the median shared
  length; the prompt table is then fitted on the rest of the prompt;
* sessions (ShareGPT turns, Mooncake ``session_id``): the share of requests that are
  turns of a multi-turn session and the median turns per session; a turn's length is
  its new message;
* the model mix, as counted (rename models your cluster does not serve).

The trace's own percentiles are stored in ``fitted`` so that ``lbtune scenarios show``
prints them beside the fit's.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any, Literal

from lbtune import tokens
from lbtune.records.quantiles import percentile
from lbtune.scenario.models import DEFAULT_TRACE_MODEL
from lbtune.scenario.traces.read import read_trace
from lbtune.scenario.traces.rows import TraceRow

KS_OK = 0.05
"""Largest KS distance at which the lognormal is used (``kind: auto``)."""
SHOW_PCTS = (50.0, 68.0, 90.0, 99.0, 99.9, 100.0)
"""The percentiles ``scenarios show`` prints (and the trace's are stored at)."""
TABLE_PCTS = (0.0, 1.0, 5.0, 10.0, 25.0, 50.0, 68.0, 75.0, 90.0, 95.0, 99.0, 99.9, 100.0)
MAX_DURATION_S = 600.0
Kind = Literal["auto", "lognormal", "empirical"]


@dataclass(frozen=True)
class LengthFit:
    """A length distribution as scenario YAML, and how well it matches."""

    dist: dict[str, Any]
    how: str
    ks: float


def ks_lognormal(values: list[int], mu: float, sigma: float) -> float:
    """Kolmogorov-Smirnov distance between ``values`` and LogNormal(mu, sigma)."""
    xs = sorted(values)
    n = len(xs)
    if sigma <= 0:
        return max(abs((k + 1) / n - (1.0 if x >= math.exp(mu) else 0.0)) for k, x in enumerate(xs))
    nd = NormalDist(mu, sigma)
    d = 0.0
    for k, x in enumerate(xs):
        # Lengths are whole numbers: compare at x + 0.5 (the rounding the sampler does).
        f = nd.cdf(math.log(x + 0.5))
        d = max(d, abs((k + 1) / n - f), abs(f - k / n))
    return d


def fit_lengths(values: list[int], kind: Kind = "auto") -> LengthFit:
    """A lognormal or an empirical table for whole-number lengths >= 1."""
    logs = [math.log(max(v, 1)) for v in values]
    mu = sum(logs) / len(logs)
    sigma = math.sqrt(sum((x - mu) ** 2 for x in logs) / max(len(logs) - 1, 1))
    ks = ks_lognormal(values, mu, sigma)
    lo, hi = min(values), max(values)
    if lo == hi:
        return LengthFit({"type": "fixed", "value": max(lo, 1)}, "fixed (every length equal)", 0.0)
    if kind == "lognormal" or (kind == "auto" and ks <= KS_OK):
        dist = {
            "type": "lognormal",
            "median": round(math.exp(mu), 2),
            "sigma": round(sigma, 4),
            "min": max(lo, 1),
            "max": max(hi, 1),
        }
        return LengthFit(dist, f"lognormal (KS distance {ks:.3f})", ks)
    table: dict[float, int] = {}
    last = 0
    for p in TABLE_PCTS:
        v = max(round(percentile(values, p)), last, 1 if p == 0 else 0)
        table[p] = v
        last = v
    emp = {"type": "empirical", "percentiles": table, "min": max(lo, 1), "max": max(hi, 1)}
    return LengthFit(emp, f"empirical table (a lognormal's KS distance: {ks:.3f})", ks)


def pcts(values: list[float]) -> dict[str, float]:
    """The trace's own percentiles of a figure (:data:`SHOW_PCTS`), as ``fitted`` stores them."""
    return {f"p{p:g}": round(percentile(values, p), 4) for p in SHOW_PCTS}


@dataclass(frozen=True)
class ArrivalFit:
    """An open-loop load fitted to arrival times, and what the trace's own gaps were."""

    load: dict[str, Any]
    duration_s: float | None
    """The trace's span, at most :data:`MAX_DURATION_S` (``None``: untimed)."""
    fits: dict[str, str]
    percentiles: dict[str, dict[str, float]]


def fit_arrivals(times: list[float], unit: str = "req") -> ArrivalFit:
    """The mean rate of ``times`` (sorted, seconds) and its burstiness: Poisson when the
    gaps' CV is within 0.1 of 1, constant below 0.1, else gamma with that CV; 1 ``unit``/s
    Poisson when fewer than three times span no time (untimed)."""
    if len(times) < 3 or times[-1] <= times[0]:
        fits = {"arrival": f"untimed trace: 1 {unit}/s Poisson (set load)"}
        return ArrivalFit({"type": "rate", "rate": 1}, None, fits, {})
    gaps = [b - a for a, b in itertools.pairwise(times)]
    span = times[-1] - times[0]
    rate = (len(times) - 1) / span
    mean = sum(gaps) / len(gaps)
    cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / max(len(gaps) - 1, 1)) / mean
    load: dict[str, Any] = {"type": "rate", "rate": round(rate, 4)}
    if cv < 0.1:
        load["arrival"] = "constant"
        fits = {"arrival": f"constant (gap CV {cv:.2f})"}
    elif abs(cv - 1) <= 0.1:
        load["arrival"] = "poisson"
        fits = {"arrival": f"poisson (gap CV {cv:.2f}, within 0.1 of 1)"}
    else:
        load.update(arrival="gamma", cv=round(cv, 3))
        fits = {"arrival": f"gamma with the gaps' CV {cv:.2f} (1 = Poisson)"}
    if span > MAX_DURATION_S:
        fits["duration_s"] = f"{MAX_DURATION_S:g} s (the trace spans {span:g} s)"
    figures = {"gap_s": pcts(gaps), "arrival": {"rate": round(rate, 4), "cv": round(cv, 4)}}
    return ArrivalFit(load, round(min(span, MAX_DURATION_S), 3), fits, figures)


def fit_trace(
    path: str | Path, fmt: str, *, kind: Kind = "auto", block_tokens: int = 512, name: str = ""
) -> dict[str, Any]:
    """The fitted scenario document (a dict ready for YAML) of a trace."""
    rows = list(read_trace(path, fmt))
    doc: dict[str, Any] = {"name": name or f"fit-{Path(path).stem}"}
    fits: dict[str, str] = {}
    trace_pcts: dict[str, dict[str, float]] = {}

    prefix, prefix_tokens = _prefix(rows, block_tokens)
    sessions = _sessions(rows)
    new_prompt = [_new_message(r, prefix_tokens.get(id(r), 0)) for r in rows]
    outputs = [r.output_tokens for r in rows]
    p_fit, o_fit = fit_lengths(new_prompt, kind), fit_lengths(outputs, kind)
    fits["prompt_tokens"], fits["output_tokens"] = p_fit.how, o_fit.how
    trace_pcts["prompt_tokens"] = pcts([float(v) for v in new_prompt])
    trace_pcts["output_tokens"] = pcts([float(v) for v in outputs])

    arrivals = fit_arrivals([r.t for r in rows if r.t is not None])
    fits.update(arrivals.fits)
    trace_pcts.update(arrivals.percentiles)
    if arrivals.duration_s is not None:
        doc["duration_s"] = arrivals.duration_s
    doc["load"] = arrivals.load

    models = Counter(r.model or DEFAULT_TRACE_MODEL for r in rows)
    doc["models"] = {m: c for m, c in models.most_common()}
    doc["prompt_tokens"] = p_fit.dist
    doc["output_tokens"] = o_fit.dist
    if prefix is not None:
        doc["prefix"] = prefix
        fits["prefix"] = (
            f"{prefix['fraction']:.1%} of requests share a leading block with an earlier one"
        )
    if sessions is not None:
        doc["sessions"] = sessions
        fits["sessions"] = f"{sessions['fraction']:.1%} of requests are session turns"
    doc["fitted"] = {
        "trace": str(path),
        "format": fmt,
        "requests": len(rows),
        "percentiles": trace_pcts,
        "fit": fits,
    }
    return doc


def _new_message(row: TraceRow, prefix: int) -> int:
    if row.messages:
        return max(tokens.count(row.messages[-1][1]), 1)
    return max(row.prompt_tokens - prefix, 1)


def _prefix(rows: list[TraceRow], block: int) -> tuple[dict[str, Any] | None, dict[int, int]]:
    """Prefix groups from hash ids: a request shares when an earlier one began alike."""
    seen: dict[int, TraceRow] = {}
    shared: dict[int, int] = {}
    for r in rows:
        ids = list(r.hash_ids or ())
        if not ids:
            continue
        first = seen.get(ids[0])
        if first is None:
            seen[ids[0]] = r
            continue
        earlier = list(first.hash_ids or ())
        k = 0
        while k < min(len(ids), len(earlier)) and ids[k] == earlier[k]:
            k += 1
        shared[id(r)] = min(k * block, r.prompt_tokens)
        # The group's first request carries the prefix too.
        shared.setdefault(id(first), min(k * block, first.prompt_tokens))
    if not shared or not rows:
        return None, {}
    groups = sum(1 for r in seen.values() if id(r) in shared)
    sharers = len(shared)
    tokens_ = max(round(percentile(list(shared.values()), 50)), 1)
    return (
        {
            "groups": groups,
            "tokens": tokens_,
            "fraction": round(min(sharers / len(rows), 1.0), 4),
        },
        shared,
    )


def _sessions(rows: list[TraceRow]) -> dict[str, Any] | None:
    turns = Counter(r.session for r in rows if r.session is not None)
    multi = {s: n for s, n in turns.items() if n >= 2}
    if not multi:
        return None
    in_sessions = sum(multi.values())
    return {
        "fraction": round(in_sessions / len(rows), 4),
        "turns": min(max(round(percentile(list(multi.values()), 50)), 2), 256),
    }
