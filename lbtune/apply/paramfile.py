"""A parameter file as ``lbtune apply --params`` reads it: for the target it names.

The file is what ``lbtune apply --show`` prints (``target: haproxy`` and ``params:``), or a
flat ``knob: value`` mapping. Its ``target:``, when present, must be the target being
applied; ``params:``, when present, must be a mapping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lbtune.errors import ConfigError
from lbtune.safeyaml import load_yaml_file
from lbtune.targets.space import load_params_file

__all__ = ["read_params_for"]


def read_params_for(path: str | Path, target: str) -> dict[str, Any]:
    """The file's knobs (unvalidated); ConfigError when it names another target or its
    ``params:`` is not a mapping."""
    values = load_params_file(path)  # read and YAML errors, one line each
    doc = load_yaml_file(path)  # a mapping: load_params_file checked it
    if "params" in doc and not isinstance(doc["params"], dict):
        raise ConfigError(
            f"{path}: params: must be a mapping of knob: value (e.g. weight.h100-0: 50), "
            f"not {type(doc['params']).__name__} {doc['params']!r}"[:300]
        )
    named = doc.get("target")
    if named is not None and named != target:
        raise ConfigError(
            f"{path}: written for target {named!r}, but the target applied is {target!r}: "
            "pass the file made for this target (`lbtune apply --show` writes one)"
        )
    values.pop("target", None)  # a flat file may carry it beside its knobs
    return values
