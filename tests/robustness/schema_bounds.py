"""Walk a pydantic model's fields to every number a document may hold, with its bounds.

:func:`numeric_fields` yields one :class:`NumericField` per place a number can appear
(a field, an item of a list, a key or value of a mapping, a member of a union), with the
lower and upper bound pydantic checks there (``None`` where there is none). The test that
every number is bounded, and the bounds table of ``docs/scenarios.md``, read it.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class NumericField:
    path: str
    kind: str  # "int" or "float"
    low: float | None
    low_open: bool
    high: float | None
    high_open: bool

    @property
    def bounded(self) -> bool:
        return self.low is not None and self.high is not None

    def range_text(self) -> str:
        lo = "-∞" if self.low is None else _fmt(self.low)
        hi = "∞" if self.high is None else _fmt(self.high)
        return f"{'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"


def _fmt(v: float) -> str:
    if v == 2**63:
        return "2⁶³"
    if float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):_}".replace("_", " ")
    return f"{v:g}"


@dataclass(frozen=True)
class _Bounds:
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False

    def add(self, meta: Any) -> _Bounds:
        b = self
        if isinstance(meta, FieldInfo):
            for m in meta.metadata:
                b = b.add(m)
            return b
        if isinstance(meta, at.Interval):
            for m in meta:
                b = b.add(m)
            return b
        if isinstance(meta, at.Ge):
            return _Bounds(float(meta.ge), False, b.high, b.high_open)  # type: ignore[arg-type]
        if isinstance(meta, at.Gt):
            return _Bounds(float(meta.gt), True, b.high, b.high_open)  # type: ignore[arg-type]
        if isinstance(meta, at.Le):
            return _Bounds(b.low, b.low_open, float(meta.le), False)  # type: ignore[arg-type]
        if isinstance(meta, at.Lt):
            return _Bounds(b.low, b.low_open, float(meta.lt), True)  # type: ignore[arg-type]
        return b


def numeric_fields(model: type[BaseModel], prefix: str = "") -> Iterator[NumericField]:
    """Every place a number can appear in a document of ``model``, with its bounds."""
    yield from _model(model, prefix, set())


_Seen = set[tuple[type, str]]


def _model(model: type[BaseModel], prefix: str, seen: _Seen) -> Iterator[NumericField]:
    if (model, prefix) in seen:
        return
    seen.add((model, prefix))
    for name, field in model.model_fields.items():
        path = f"{prefix}.{field.alias or name}" if prefix else (field.alias or name)
        yield from _walk(field.annotation, _Bounds().add(field), path, seen)


def _walk(ann: Any, bounds: _Bounds, path: str, seen: _Seen) -> Iterator[NumericField]:
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        inner, *meta = typing.get_args(ann)
        for m in meta:
            bounds = bounds.add(m)
        yield from _walk(inner, bounds, path, seen)
    elif origin is typing.Union or origin is types.UnionType:
        for member in typing.get_args(ann):
            yield from _walk(member, bounds, path, seen)
    elif origin in (list, tuple, set, frozenset):
        for item in typing.get_args(ann):
            if item is not Ellipsis:
                yield from _walk(item, _Bounds(), f"{path}[]", seen)
    elif origin is dict:
        key, value = typing.get_args(ann)
        yield from _walk(key, _Bounds(), f"{path}.<key>", seen)
        yield from _walk(value, _Bounds(), f"{path}.<value>", seen)
    elif origin is typing.Literal or ann in (str, bool, type(None), Any, bytes):
        return
    elif isinstance(ann, type) and issubclass(ann, BaseModel):
        tag = ann.model_fields.get("type")
        tags = typing.get_args(tag.annotation) if tag is not None else ()
        yield from _model(ann, f"{path} ({tags[0]})" if len(tags) == 1 else path, seen)
    elif ann in (int, float):
        yield NumericField(
            path, ann.__name__, bounds.low, bounds.low_open, bounds.high, bounds.high_open
        )


def bounds_table(model: type[BaseModel]) -> str:
    """The Markdown table of every number a ``model`` document may hold and its range
    (``docs/scenarios.md`` holds the scenario's). Classes repeat the scenario's traffic
    fields, and ``output_tokens`` takes the same distributions as ``prompt_tokens``: listed
    once, as ``prompt_tokens``."""
    rows: dict[tuple[str, str], str] = {}
    for f in numeric_fields(model):
        path = f.path.removeprefix("classes[].") if f.path != "classes[].weight" else f.path
        if path.startswith("output_tokens"):
            continue
        path = path.replace("prompt_tokens", "prompt_tokens, output_tokens", 1)
        rows.setdefault((path, f.kind), f.range_text())
    lines = ["| field | number | range |", "|---|---|---|"]
    lines += [f"| `{path}` | {kind} | {rng} |" for (path, kind), rng in rows.items()]
    return "\n".join(lines) + "\n"
