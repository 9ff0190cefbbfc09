"""A compact agent scenario with an agentic trace's shape: ``lbtune scenarios fit`` of a
``weka``, ``otel`` or ``copilot`` trace.

Fitted from the sessions alone (no text leaves the file), each length with
:func:`~.fit.fit_lengths` (a lognormal when it fits, else the trace's percentile table):

* ``agent.calls``: the main agent's calls per session;
* ``agent.tool_delay_ms``: the delay of every call that waits for an earlier one, in ms;
* ``agent.tool_output_tokens``: what a call's prompt grew by since its agent's previous
  call, ``prompt_k - prompt_prev - output_prev`` less the answers of subagents rejoining
  at call k (the synthetic agent resends those itself), at least 1 (a compacted context
  counts 1);
* ``prompt_tokens`` (each agent's task): the main agent's first prompt less the session's
  shared prefix; ``output_tokens``: every call's output;
* ``agent.prefix``, shared contexts, when any session shares one. With ``hash_ids``:
  sessions whose first call begins with the same block id share a context (a group: an id
  two sessions or more begin with), as long as the blocks their first calls agree on.
  Without: a first call with ``cached_tokens`` > 0 found its context in a cache, so an
  earlier session sent it too; it shares that many tokens, and sessions with equal cached
  lengths count as one group (the same system prompt and tools, the same length).
  ``groups`` = the contexts found, ``tokens`` = the median shared length;
* ``agent.subagents``, when any main call but a session's last fans out: the share of
  those calls followed by subagents (a subagent belongs to the latest main call before
  its first call), subagents per fan-out (at most 16), calls per subagent;
* ``load``: session starts as an open loop, rate and burstiness (:func:`~.fit.fit_arrivals`);
* the model mix of the calls.

The synthetic agent never compacts its context, so a long session's prompts grow with
every call: when the fit would pass lbtune's bounds (4096 calls a session, 1 048 576
prompt tokens a call, 1 GiB of cached text), the calls' ``max`` is lowered until the
document validates, and ``fitted.fit`` says so. The trace's own percentiles go into
``fitted`` for ``lbtune scenarios show``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lbtune.records.quantiles import percentile
from lbtune.scenario.limits import MAX_SUBAGENTS, MAX_TOKENS
from lbtune.scenario.models import DEFAULT_TRACE_MODEL, Scenario
from lbtune.scenario.traces.fit import Kind, fit_arrivals, fit_lengths, pcts
from lbtune.scenario.traces.readsessions import read_sessions
from lbtune.scenario.traces.sessiongraph import TraceCall, TraceSession

__all__ = ["fit_sessions"]

_MAX_GROUPS = 100_000
"""Most shared contexts ``agent.prefix.groups`` may give."""


@dataclass
class _Figures:
    """The fitted lengths' distributions, how each was fitted and the trace's percentiles."""

    kind: Kind
    fits: dict[str, str] = field(default_factory=dict)
    trace: dict[str, dict[str, float]] = field(default_factory=dict)

    def lengths(self, figure: str, values: list[int]) -> dict[str, Any]:
        if not values:
            self.fits[figure] = "fixed 1 (none in the trace)"
            return {"type": "fixed", "value": 1}
        values = [min(max(v, 1), MAX_TOKENS) for v in values]
        fit = fit_lengths(values, self.kind)
        self.fits[figure] = fit.how
        self.trace[figure] = pcts([float(v) for v in values])
        return fit.dist


def fit_sessions(
    path: str | Path, fmt: str, *, kind: Kind = "auto", block_tokens: int = 512, name: str = ""
) -> dict[str, Any]:
    """The fitted agent scenario document (a dict ready for YAML) of an agentic trace."""
    sessions = read_sessions(path, fmt)
    figs = _Figures(kind)
    calls = [c for x in sessions for c in x.calls]
    shared, prefix = _shared_prefix(sessions, block_tokens)
    tasks = [_first_main(x).prompt_tokens - n for x, n in zip(sessions, shared, strict=True)]
    prompt = figs.lengths("prompt_tokens", tasks)
    output = figs.lengths("output_tokens", [c.output_tokens for c in calls])
    agent = _agent(sessions, figs)
    if prefix is not None:
        agent["prefix"] = prefix
        figs.fits["prefix"] = (
            f"{sum(n > 0 for n in shared) / len(sessions):.1%} of sessions share one of "
            f"{prefix['groups']} contexts (median {prefix['tokens']} tokens)"
        )
    subagents = _subagents(sessions, figs)
    if subagents is not None:
        agent["subagents"] = subagents
    arrivals = fit_arrivals([x.start_s for x in sessions], unit="session")
    figs.fits.update(arrivals.fits)
    figs.trace.update(arrivals.percentiles)
    models = Counter(c.model or DEFAULT_TRACE_MODEL for c in calls)
    doc: dict[str, Any] = {
        "name": name or f"fit-{Path(path).stem}",
        **({"duration_s": arrivals.duration_s} if arrivals.duration_s is not None else {}),
        "load": arrivals.load,
        "models": dict(models.most_common()),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "agent": agent,
    }
    capped = _within_bounds(doc)
    if capped is not None:
        figs.fits["calls"] += capped
    doc["fitted"] = {
        "trace": str(path),
        "format": fmt,
        "requests": len(calls),
        "percentiles": figs.trace,
        "fit": figs.fits,
    }
    return doc


def _agent(sessions: tuple[TraceSession, ...], figs: _Figures) -> dict[str, Any]:
    """``agent.calls``, ``tool_delay_ms`` and ``tool_output_tokens`` (see the module's doc)."""
    main_calls = [sum(c.agent == 0 for c in x.calls) for x in sessions]
    delays = [round(c.delay_s * 1000) for x in sessions for c in x.calls if c.after]
    return {
        "calls": figs.lengths("calls", main_calls),
        "tool_delay_ms": figs.lengths("tool_delay_ms", delays),
        "tool_output_tokens": figs.lengths(
            "tool_output_tokens", [g for x in sessions for g in _growth(x)]
        ),
    }


def _first_main(x: TraceSession) -> TraceCall:
    """The main agent's first call (the session's first, when no call is the main agent's)."""
    return next((c for c in x.calls if c.agent == 0), x.calls[0])


def _growth(x: TraceSession) -> list[int]:
    """Each call's context growth since its agent's previous call (see the module's doc)."""
    out: list[int] = []
    last: dict[int, TraceCall] = {}
    for c in x.calls:
        prev = last.get(c.agent)
        if prev is not None:
            joined = sum(x.calls[a].output_tokens for a in c.after if x.calls[a].agent != c.agent)
            out.append(max(c.prompt_tokens - prev.prompt_tokens - prev.output_tokens - joined, 1))
        last[c.agent] = c
    return out


def _shared_prefix(
    sessions: tuple[TraceSession, ...], block: int
) -> tuple[list[int], dict[str, int] | None]:
    """Each session's shared prefix (tokens, 0: none) and ``agent.prefix`` (see the
    module's doc), from the main agent's first calls."""
    firsts = [_first_main(x) for x in sessions]
    shared = [0] * len(firsts)
    if any(c.hash_ids for c in firsts):
        by_id: dict[int, list[int]] = {}
        for k, c in enumerate(firsts):
            if c.hash_ids:
                by_id.setdefault(c.hash_ids[0], []).append(k)
        groups = [ks for ks in by_id.values() if len(ks) > 1]
        for ks in groups:  # each agrees with the group's first; the first, with its best
            ids = [firsts[k].hash_ids or () for k in ks]
            for j, k in enumerate(ks):
                agree = _common(ids[0], ids[j]) if j else max(_common(ids[0], o) for o in ids[1:])
                shared[k] = min(agree * block, firsts[k].prompt_tokens)
        n_groups = len(groups)
    else:
        shared = [min(c.cached_tokens, c.prompt_tokens) for c in firsts]
        n_groups = len({n for n in shared if n > 0})
    if n_groups == 0:
        return shared, None
    tokens = max(round(percentile([float(n) for n in shared if n > 0], 50)), 1)
    return shared, {"groups": min(n_groups, _MAX_GROUPS), "tokens": tokens}


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading ids ``a`` and ``b`` agree on."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _subagents(sessions: tuple[TraceSession, ...], figs: _Figures) -> dict[str, Any] | None:
    """``agent.subagents`` (see the module's doc); ``None`` when no main call fans out."""
    eligible = fanned = 0
    counts: list[int] = []
    calls: list[int] = []
    for x in sessions:
        main = [k for k, c in enumerate(x.calls) if c.agent == 0]
        per_agent = Counter(c.agent for c in x.calls if c.agent != 0)
        spawned: Counter[int] = Counter()
        for a, n in per_agent.items():
            first = next(k for k, c in enumerate(x.calls) if c.agent == a)
            parent = max((m for m in main if m < first), default=None)
            if parent is not None and parent != main[-1]:
                spawned[parent] += 1
                calls.append(n)
        eligible += max(len(main) - 1, 0)
        fanned += len(spawned)
        counts += [min(n, MAX_SUBAGENTS) for n in spawned.values()]
    if fanned == 0:
        return None
    probability = min(max(round(fanned / eligible, 4), 1e-4), 1.0)
    figs.fits["subagents"] = f"{probability:.1%} of main calls (not a session's last) fan out"
    return {
        "probability": probability,
        "count": figs.lengths("subagents.count", counts),
        "calls": figs.lengths("subagents.calls", calls),
    }


def _within_bounds(doc: dict[str, Any]) -> str | None:
    """Lower ``agent.calls``' (and ``subagents.calls``') ``max`` to the largest that lets
    the document validate; what was done, or ``None`` when it validates as fitted."""
    if _valid(doc):
        return None
    calls = doc["agent"]["calls"]
    lo, hi = 1, int(calls.get("max", calls.get("value", 1)))
    while lo < hi:  # the largest cap that validates (1 if none does)
        mid = (lo + hi + 1) // 2
        if _valid(_capped(doc, mid)):
            lo = mid
        else:
            hi = mid - 1
    doc["agent"] = _capped(doc, lo)["agent"]
    return (
        f"; max lowered to {lo} calls (main and subagent): the synthetic agent resends its "
        "whole context and never compacts, and longer sessions pass lbtune's bounds"
    )


def _capped(doc: dict[str, Any], cap: int) -> dict[str, Any]:
    """``doc`` with the main agent's and the subagents' calls clipped at ``cap``."""
    agent = {**doc["agent"], "calls": _clip(doc["agent"]["calls"], cap)}
    if "subagents" in agent:
        agent["subagents"] = {
            **agent["subagents"],
            "calls": _clip(agent["subagents"]["calls"], cap),
        }
    return {**doc, "agent": agent}


def _clip(dist: dict[str, Any], cap: int) -> dict[str, Any]:
    if dist["type"] == "fixed":
        return {**dist, "value": min(dist["value"], cap)}
    out = {**dist, "max": min(dist.get("max", cap), cap)}
    if "min" in out:
        out["min"] = min(out["min"], out["max"])
    return out


def _valid(doc: dict[str, Any]) -> bool:
    try:
        Scenario.model_validate(doc)
    except ValidationError:
        return False
    return True
