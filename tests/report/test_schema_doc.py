"""docs/summary-schema.md documents every field of summary.json (the CI contract)."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

from lbtune.metrics import summary as summary_module
from lbtune.metrics.summary import SCHEMA_VERSION, RunSummary

DOC = Path(__file__).resolve().parents[2] / "docs" / "summary-schema.md"


def _dataclasses(tp: object, seen: set[type]) -> None:
    for arg in typing.get_args(tp):
        _dataclasses(arg, seen)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp not in seen:
        seen.add(tp)
        for hint in typing.get_type_hints(tp).values():
            _dataclasses(hint, seen)


def test_every_field_is_documented() -> None:
    text = DOC.read_text()
    seen: set[type] = set()
    _dataclasses(RunSummary, seen)
    assert len(seen) >= 15
    missing = [
        f"{cls.__name__}.{f.name}"
        for cls in seen
        for f in dataclasses.fields(cls)
        if f"`{f.name}`" not in text
    ]
    assert missing == []
    assert f"**Current `schema_version`: {SCHEMA_VERSION}.**" in text
    assert re.search(r"^## `RunSummary`|^## Top level: `RunSummary`", text, re.M)
    assert summary_module.__doc__ and "summary-schema.md" in summary_module.__doc__
