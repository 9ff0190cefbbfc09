"""A balancer's parameter values: what a :class:`~lbtune.targets.space.ParameterSpace`
validates and a :class:`~lbtune.targets.targetbase.TargetBase` applies (both re-export them)."""

from __future__ import annotations

__all__ = ["ParamSet", "ParamValue"]

ParamValue = int | float | str | bool
ParamSet = dict[str, ParamValue]
"""A flat mapping knob name -> value, validated against a ParameterSpace."""
