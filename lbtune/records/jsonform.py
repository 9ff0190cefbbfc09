"""The JSON form of records that cross a file: pydantic ``TypeAdapter``, written as ``json``.

Every record lbtune writes to a file or prints with ``--json`` is a frozen dataclass
serialized by a module-level ``TypeAdapter`` beside it; deliberate quirks of a form
(a renamed key, a computed figure, a left-out field) are pydantic's own means on the
dataclass (``Field(serialization_alias=...)``, ``computed_field``, ``Field(exclude=True)``,
``field_serializer``) and the key order, where it is not the field order, is
:func:`key_order`.

:func:`json_data` is the form as Python data: pydantic's JSON mode, so a non-finite float
is ``None`` (``ser_json_inf_nan="null"``: the file is strict JSON, "a figure that could not
be computed is null, never NaN"), a tuple a list, a mapping's keys strings, and every
key the alias. :func:`json_text` formats it with :func:`json.dumps` (not pydantic's own
writer), so the files keep their text: ASCII escapes, Python's float repr, the indent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import SerializerFunctionWrapHandler, TypeAdapter, model_serializer

from lbtune.safety.secrets import scrub_data

__all__ = ["json_data", "json_text", "key_order"]

T = TypeVar("T")


def json_data(adapter: TypeAdapter[T], value: T) -> Any:
    """``value``'s JSON form as Python data (dicts, lists, str, int, float, bool, None)."""
    # dump_python(mode="json") would keep NaN; only pydantic's JSON writer makes it null.
    return json.loads(adapter.dump_json(value, by_alias=True))


def json_text(adapter: TypeAdapter[T], value: T, *, indent: int) -> str:
    """``value``'s JSON form as the text of a file: strict JSON, ending in a newline, with no
    secret of this process in any string (:func:`lbtune.safety.secrets.scrub_data`)."""
    data = scrub_data(json_data(adapter, value))
    return json.dumps(data, indent=indent, allow_nan=False) + "\n"


def key_order(*keys: str, last: tuple[str, ...] = ()) -> Any:
    """A pydantic ``model_serializer`` (assign it in the class body: ``_json = key_order(...)``)
    that writes ``keys`` first, in this order (aliases and computed fields included), then
    the other keys in field order, then ``last``."""

    def serialize(self: object, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        order = [*keys, *(k for k in data if k not in keys and k not in last), *last]
        return {k: data[k] for k in order if k in data}

    decorate: Callable[[Any], Any] = model_serializer(mode="wrap")
    return decorate(serialize)
