"""The target contract: what every balancer must offer the optimizer.

A target is four things, like Optuna's one-method pruner: a parameter space, a
way to apply a parameter set (and prove it took effect by read-back), a way to
read back what is live, and a rollback to the last known good. Adding nginx or
Envoy later means a new subpackage implementing :class:`Target` and one line in
:data:`lbtune.targets.TARGETS` — nothing in the core changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from lbtune.errors import ApplyError

if TYPE_CHECKING:
    from lbtune.targets.space import ParameterSpace

ParamValue = int | float | str | bool
ParamSet = dict[str, ParamValue]
"""A flat mapping knob name -> value, validated against a ParameterSpace."""


@dataclass(frozen=True)
class ApplyResult:
    changed: bool
    """False when the live state already equalled the requested parameters."""
    applied: ParamSet
    """The full parameter set now live (read back, not assumed)."""
    diff: dict[str, tuple[ParamValue | None, ParamValue | None]] = field(default_factory=dict)
    """knob -> (before, after) for every knob that changed (or would, in check mode)."""
    reloaded: bool = False
    """True when a structural change needed a config reload/restart."""
    check: bool = False
    """True in check mode: nothing was touched."""
    seconds: float = 0.0


class RejectedBeforeApply(ApplyError):
    """The balancer refused the new state before anything was touched (e.g. ``haproxy -c``
    rejected the rendered config): the previous state is still live, nothing to roll back."""


@runtime_checkable
class Target(Protocol):
    """A balancer lbtune can tune."""

    name: str
    state_dir: Path
    """Where the target keeps its files; lbtune.apply puts the lock, LKG and logs there."""

    def space(self) -> ParameterSpace:
        """The knobs, their ranges, conditions and untuned baseline values."""
        ...

    def read_live(self) -> ParamSet:
        """What is live now, in the same format ``apply`` accepts."""
        ...

    def apply(self, params: ParamSet, *, check: bool = False) -> ApplyResult:
        """Make ``params`` live and verify by read-back; raise ApplyError on failure.

        Values outside the space are refused (ConfigError) before anything is touched.
        """
        ...

    def rollback(self) -> ApplyResult:
        """Restore the last known good parameter set."""
        ...
