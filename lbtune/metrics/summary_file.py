"""``summary.json``: the machine-readable summary (schema in ``docs/summary-schema.md``)."""

from __future__ import annotations

import json
from pathlib import Path

from lbtune.errors import ConfigError
from lbtune.metrics.summary import RunSummary


def dumps(summary: RunSummary) -> str:
    """The summary as JSON text (strict: no NaN or Infinity)."""
    return json.dumps(summary.to_dict(), indent=2, allow_nan=False) + "\n"


def write_summary(path: Path, summary: RunSummary) -> Path:
    path.write_text(dumps(summary), encoding="utf-8")
    return path


def read_summary(path: Path) -> RunSummary:
    """Read a ``summary.json`` back; a missing or malformed file is a :class:`ConfigError`."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such summary file") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    try:
        return RunSummary.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
