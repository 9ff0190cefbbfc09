"""Shared helpers for scenario tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml


def base(**over: Any) -> dict[str, Any]:
    """A minimal valid scenario as a dict, with overrides."""
    data: dict[str, Any] = {
        "name": "t",
        "seed": 7,
        "load": {"type": "constant", "users": 4},
        "models": {"m": 1},
        "prompt_tokens": {"type": "fixed", "value": 32},
        "output_tokens": {"type": "fixed", "value": 16},
    }
    data.update(over)
    return data


@pytest.fixture
def write(tmp_path: Path) -> Any:
    """Write a scenario dict to ``tmp_path/NAME.yaml`` and return the path."""

    def _write(data: Any, name: str = "x") -> Path:
        p = tmp_path / f"{name}.yaml"
        p.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
        return p

    return _write
