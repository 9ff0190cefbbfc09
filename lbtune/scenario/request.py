"""One request the workload asks the load generator to send.

The scenario turns a seed into an identical sequence of :class:`RequestSpec` on
every run, so two balancer configurations are compared on the same traffic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Api = Literal["chat", "completions"]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    index: int
    """Position in the workload's sequence (0-based); stable under the seed."""
    api: Api
    model: str
    max_tokens: int
    stream: bool
    prompt_tokens: int
    """Prompt length in tokens: the sum over message contents, counted by the tokenizer in
    use (lbtune's approximate one, :mod:`lbtune.tokens`, or a ``--tokenizer`` file).
    Chat-template tokens are not included."""
    messages: tuple[dict[str, str], ...] | None = None
    """Chat messages (``api == "chat"``)."""
    prompt: str | None = None
    """Completion prompt (``api == "completions"``)."""
    priority: int | None = None
    """Value of the ``priority`` field/header, when the scenario mixes priorities."""
    prefix_group: int | None = None
    """Shared-prefix group (system prompt) this request belongs to, if any."""
    session_id: int | None = None
    turn: int = 0
    """Multi-turn session and turn number (turn > 0 resends the growing history)."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Merged into the body last (built-ins send ``ignore_eos: true``)."""
    traffic_class: str | None = None
    """Name of the scenario's traffic class (``"default"`` when it has no ``classes``)."""

    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    def body(self) -> dict[str, Any]:
        """The JSON body sent to the OpenAI-compatible API."""
        b: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens}
        if self.api == "chat":
            b["messages"] = [dict(m) for m in (self.messages or ())]
        else:
            b["prompt"] = self.prompt or ""
        if self.stream:
            b["stream"] = True
            b["stream_options"] = {"include_usage": True}
        if self.priority is not None:
            b["priority"] = self.priority
        b.update(self.extra_body)
        return b
