"""What every synthetic workload shares: its traffic mixes and how a request is written.

:func:`resolve_classes` fills each traffic class's inherited fields in;
:func:`render_parts` turns ``(role, (text, tokens))`` parts into the chat messages or
the completion prompt and their token count; :func:`request_extra` is the body's extra
fields. :class:`~lbtune.scenario.workload.Workload` (placed requests and sessions) and
:class:`~lbtune.scenario.agent.AgentWorkload` (causal agent sessions) both use them, so
the two write requests alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from lbtune.scenario import draws
from lbtune.scenario.distributions import _Dist
from lbtune.scenario.models import PrefixGroups, Scenario, Sessions, TrafficClass
from lbtune.scenario.request import Api

__all__ = ["Part", "TrafficMix", "render_parts", "request_extra", "resolve_classes"]

Part = tuple[str, tuple[str, int]]
"""One message of a prompt: ``(role, (text, tokens))``."""


@dataclass(frozen=True)
class TrafficMix:
    """One traffic class with every field resolved (classes inherit from the scenario)."""

    name: str
    weight: float
    apis: tuple[Api, ...]
    api_cum: list[float]
    models: tuple[str, ...]
    model_cum: list[float]
    prompt_tokens: _Dist
    output_tokens: _Dist
    prefix: PrefixGroups | None
    sessions: Sessions | None
    stream: float
    priorities: tuple[int, ...]
    priority_cum: list[float]

    def api(self, u: float) -> Api:
        """The API drawn by uniform ``u`` from the class's mix."""
        return self.apis[draws.choose(u, self.api_cum)]

    def model(self, u: float) -> str:
        """The model drawn by uniform ``u``."""
        return self.models[draws.choose(u, self.model_cum)]

    def priority(self, u: float) -> int | None:
        """The priority drawn by uniform ``u``; ``None`` when the class sets none."""
        return self.priorities[draws.choose(u, self.priority_cum)] if self.priorities else None


def resolve_classes(sc: Scenario) -> list[TrafficMix]:
    """The scenario's traffic classes with inherited fields filled in."""
    classes: list[TrafficClass | None] = list(sc.classes) if sc.classes else [None]
    out: list[TrafficMix] = []
    for c in classes:

        def get(field: str, c: TrafficClass | None = c) -> Any:
            value = None if c is None else getattr(c, field)
            return getattr(sc, field) if value is None else value

        api: Api | dict[Api, float] = get("api")
        apis: dict[Api, float] = {api: 1.0} if isinstance(api, str) else dict(api)
        models: dict[str, float] = get("models")
        prio: dict[int, float] = get("priority") or {}
        out.append(
            TrafficMix(
                name="default" if c is None else c.name,
                weight=1.0 if c is None else c.weight,
                apis=tuple(apis),
                api_cum=list(accumulate(apis.values())),
                models=tuple(models),
                model_cum=list(accumulate(models.values())),
                prompt_tokens=get("prompt_tokens"),
                output_tokens=get("output_tokens"),
                prefix=get("prefix") or None,
                sessions=get("sessions") or None,
                stream=float(get("stream")),
                priorities=tuple(prio),
                priority_cum=list(accumulate(prio.values())),
            )
        )
    return out


def render_parts(
    api: Api, parts: Sequence[Part]
) -> tuple[int, tuple[dict[str, str], ...] | None, str | None]:
    """``(prompt tokens, chat messages, completion prompt)`` of ``parts``: one message per
    part (chat), or the texts joined by blank lines (completions); the tokens are the sum
    of the parts' (chat-template tokens and the joins are not counted)."""
    n_tokens = sum(n for _, (_, n) in parts)
    messages = prompt = None
    if api == "chat":
        messages = tuple({"role": role, "content": text} for role, (text, _) in parts)
    else:
        prompt = "\n\n".join(text for _, (text, _) in parts)
    return n_tokens, messages, prompt


def request_extra(sc: Scenario) -> dict[str, Any]:
    """Fields merged into every request body: ``ignore_eos`` (when set), then ``extra_body``."""
    extra = {"ignore_eos": True} if sc.ignore_eos else {}
    return {**extra, **sc.extra_body}
