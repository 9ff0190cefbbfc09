"""The one pydantic error formatter: YAML paths, valid fields, bounds, one line."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lbtune.errors import ConfigError, validation_error


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    count: int = Field(1, ge=1)


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[Item]


def error(data: Any) -> str:
    with pytest.raises(ValidationError) as exc:
        Doc.model_validate(data)
    err = validation_error(exc.value, "f.yaml", Doc, data)
    assert isinstance(err, ConfigError) and "\n" not in str(err)
    return str(err)


def test_unknown_field_lists_the_valid_ones_at_its_path() -> None:
    got = error({"items": [{"name": "a", "cnt": 2}]})
    assert got == "f.yaml: items[0].cnt: unknown field; valid fields: name, count"


def test_bounds_and_missing_fields_read_as_sentences() -> None:
    got = error({"items": [{"name": "a", "count": 0}, {}]})
    assert got == (
        "f.yaml: items[0].count: must be >= 1 (got 0); items[1].name: required field is missing"
    )


def test_only_the_first_errors_then_a_count() -> None:
    got = error({"items": [{}, {}, {}, {}, {}]})
    assert got.endswith("items[2].name: required field is missing (and 2 more)")
