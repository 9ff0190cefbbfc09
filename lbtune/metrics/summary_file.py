"""``summary.json``: the machine-readable summary (schema in ``docs/summary-schema.md``).

Written and read through :data:`SUMMARY`, a pydantic ``TypeAdapter`` of
:class:`~lbtune.metrics.summary.RunSummary` (:mod:`lbtune.records.jsonform`): every field
of every record in field order, tuples as lists, NaN and infinities as ``null``. Reading
ignores fields it does not know and gives a field the file lacks its default (a summary
written before the field existed), and refuses a ``schema_version`` newer than it knows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from lbtune.errors import ConfigError, validation_error
from lbtune.metrics.summary import SCHEMA_VERSION, RunSummary
from lbtune.records.jsonform import json_text
from lbtune.safety.files import MAX_REPORT_BYTES, read_bytes

__all__ = ["SUMMARY", "dumps", "read_summary", "summary_from_data", "write_summary"]

SUMMARY: TypeAdapter[RunSummary] = TypeAdapter(RunSummary)


def dumps(summary: RunSummary) -> str:
    """The summary as JSON text (strict: no NaN or Infinity)."""
    return json_text(SUMMARY, summary, indent=2)


def write_summary(path: Path, summary: RunSummary) -> Path:
    path.write_text(dumps(summary), encoding="utf-8")
    return path


def summary_from_data(data: Mapping[str, object]) -> RunSummary:
    """A summary from its JSON form; a newer ``schema_version`` or a malformed summary is
    a :class:`ConfigError`."""
    version = data.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ConfigError(
            f"summary schema_version {version!r} is not supported by this lbtune "
            f"(it reads versions up to {SCHEMA_VERSION}): upgrade lbtune"
        )
    try:
        return SUMMARY.validate_python(data)
    except ValidationError as exc:
        raise validation_error(exc, "summary is malformed", RunSummary, data) from None


def read_summary(path: Path) -> RunSummary:
    """Read a ``summary.json`` back; a missing or malformed file is a :class:`ConfigError`."""
    if not path.exists():
        raise ConfigError(f"{path}: no such summary file")
    try:
        data = json.loads(read_bytes(path, max_bytes=MAX_REPORT_BYTES))
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deeply
        raise ConfigError(f"{path}: not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    try:
        return summary_from_data(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
