"""Errors a user can act on.

Exit codes (documented in the README): 0 ok; 1 a regression, an SLO breach or an
untrusted measurement (``--strict``); 2 bad input or an unreachable target or
Prometheus; 3 an infrastructure failure (the embedded cluster, a missing
program, a failed apply, a run that measured nothing); 130 interrupted (Ctrl-C);
143 terminated (SIGTERM: ``stress`` and ``optimize`` stop as on Ctrl-C and write their
partial report; any other command unwinds as on an error, so a balancer config it changed
is put back and what it started is stopped).

Every subclass of :class:`LbtuneError` is shown by the CLI as one line on stderr,
without a traceback, and the process exits with ``exit_code``. Anything else that
escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

TERMINATED_EXIT = 128 + 15
"""Exit status of a command ended by SIGTERM (what a shell reports for a process it killed)."""

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` safe to print on one line of a terminal: control characters (an ANSI escape,
    CR/LF, a bidi override...) are shown as escapes (``\\x1b``, ``\\u202e``), never sent raw."""
    return _UNPRINTABLE.sub(
        lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 256 else f"\\u{ord(m[0]):04x}", text
    )


class LbtuneError(Exception):
    """Shown to the user as one line, without a traceback."""

    exit_code = 2


class ConfigError(LbtuneError):
    """A scenario, space, cluster or parameter file is invalid."""


class TargetError(LbtuneError):
    """The target, the balancer or Prometheus is unreachable or misbehaves.

    Exit code 2 like bad input: the user must point lbtune at something that answers.
    """


class ClusterError(LbtuneError):
    """The embedded cluster cannot be started, stopped or inspected."""

    exit_code = 3


class DependencyError(LbtuneError):
    """A required external program (haproxy, prometheus, ...) is missing."""

    exit_code = 3


class MissingExtra(LbtuneError):
    """An optional Python package is not installed: ``pip install 'lbtune[<extra>]'`` fixes it."""


class ApplyError(LbtuneError):
    """A playbook or runtime change failed; the last known good config was kept."""

    exit_code = 3


class NothingMeasured(LbtuneError):
    """A run sent no request, or every request failed before any response: an
    infrastructure failure (the generator or the path to the target), not a measurement."""

    exit_code = 3


class Outage(LbtuneError):
    """The target refused connections during a run (its balancer went down): the figures
    describe an outage, not the config; the report is written and names it."""

    exit_code = 3


class TrialFailed(LbtuneError):
    """One trial could not be measured; the study goes on."""


class BalancerDown(ClusterError):
    """The cluster's balancer process exited under a study: every further trial would
    fail, so the study stops (``--resume`` continues it once the cluster is up again)."""


MAX_VALIDATION_ERRORS = 3
"""Most pydantic errors one ConfigError line lists (``(and N more)`` after them)."""


def validation_error(exc: Any, where: str, model: type, data: Any = None) -> ConfigError:
    """One ConfigError line from a pydantic ``ValidationError`` of ``model`` validating
    ``data``: ``where: field.path: what is wrong; ...`` — YAML paths (``replicas[0].gpu``),
    the valid fields for an unknown one, bounds for a number out of range, the valid
    ``type`` tags of a tagged union; the first :data:`MAX_VALIDATION_ERRORS` errors.

    Reads the model's annotations only (no pydantic import: ``lbtune --help`` stays light).
    """
    return ConfigError(f"{where}: {validation_message(exc, model, data)}")


def validation_message(exc: Any, model: type, data: Any = None) -> str:
    """The text of :func:`validation_error` without the ``where:`` in front (for a
    validator that reports a nested model's errors as its own ``ValueError``)."""
    errors = exc.errors(include_url=False)
    # A union reports every branch; keep the deepest (most specific) paths.
    paths = [_walk(tuple(e["loc"]), data, model)[0] for e in errors]
    errors = [
        e
        for e, p in zip(errors, paths, strict=True)
        if not any(o.startswith(f"{p}.") or o.startswith(f"{p}[") for o in paths)
    ]
    parts = [_one(e, data, model) for e in errors[:MAX_VALIDATION_ERRORS]]
    more = len(errors) - MAX_VALIDATION_ERRORS
    return "; ".join(dict.fromkeys(parts)) + (f" (and {more} more)" if more > 0 else "")


def _one(err: Any, data: Any, model: type) -> str:
    loc, fields, tags = _walk(tuple(err["loc"]), data, model)
    kind = err["type"]
    ctx = err.get("ctx") or {}
    got = err.get("input")
    if kind == "extra_forbidden":
        valid = f"; valid fields: {', '.join(fields)}" if fields else ""
        msg = f"unknown field{valid}"
    elif kind == "missing":
        msg = "required field is missing"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<"}.get(kind, "<=")
        bound = _number(next(iter(ctx.values()), "?"))
        unit = _unit(tuple(err["loc"]), model) if op.startswith("<") else None
        msg = f"must be {op} {bound}{f' {unit}' if unit else ''} (got {got!r})"
    elif kind == "too_short":
        msg = "must not be empty (give at least one entry)"
    elif kind == "union_tag_invalid":
        msg = f"unknown type {ctx.get('tag')!r}; expected one of: {ctx.get('expected_tags')}"
    elif kind == "union_tag_not_found":
        msg = f"needs a type: one of {', '.join(tags)}" if tags else "needs a type"
    elif "[key]" in err["loc"]:
        msg = f"invalid key {got!r}: {err['msg']}"
    elif kind == "value_error":
        msg = str(err["msg"]).removeprefix("Value error, ")
    else:
        msg = f"{err['msg']} (got {got!r})" if not isinstance(got, dict | list) else err["msg"]
    return f"{loc}: {msg}" if loc else msg


def _number(value: Any) -> Any:
    """A bound as a person reads it: ``1048576``, ``2147483647``, ``0.5``, ``1e+09``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if isinstance(value, int) or (value.is_integer() and abs(value) < 1e8):
        return str(int(value))
    return f"{value:g}"


def _walk(loc: tuple[Any, ...], data: Any, model: type) -> tuple[str, list[str], list[str]]:
    """Dotted YAML path of ``loc`` (union tags dropped), the valid fields there, and the
    valid ``type`` tags when the location is a tagged union."""
    path = ""
    node: Any = data
    ann: Any = model
    parent: Any = model if not loc else None
    for el in loc:
        if el == "[key]":
            continue
        branches = _args(ann)
        if len(branches) > 1 and isinstance(el, str):
            # pydantic names the union member: a discriminator tag or a branch name.
            tagged = _pick_tagged(ann, el)
            if tagged is not ann or not (isinstance(node, dict) and el in node):
                ann = tagged if tagged is not ann else _by_name(ann, el)
                continue
        if isinstance(el, int) and isinstance(node, list | None):
            path += f"[{el}]"
            node = node[el] if isinstance(node, list) and el < len(node) else None
            ann = _item(ann)
            continue
        path += f".{el}" if path else str(el)
        parent, ann = ann, _field(ann, el)
        node = node.get(el) if isinstance(node, dict) else None
    found = _model(parent)
    fields = [f.alias or n for n, f in found.model_fields.items()] if found else []
    tags = [
        str(t)
        for a in _args(ann)
        if _is_model(a) and "type" in a.model_fields
        for t in typing.get_args(a.model_fields["type"].annotation)
    ]
    return path, sorted(fields, key=lambda f: f != "type"), tags


def _is_model(ann: Any) -> bool:
    """A pydantic model class (duck-typed: its fields are ``model_fields``)."""
    return isinstance(ann, type) and isinstance(getattr(ann, "model_fields", None), dict)


def _by_name(ann: Any, name: str) -> Any:
    for a in _args(ann):
        if isinstance(a, type) and a.__name__ == name:
            return a
    return ann


def _args(ann: Any) -> tuple[Any, ...]:
    """Members of a (possibly Annotated, possibly nested) union, ``None`` dropped."""
    while typing.get_origin(ann) is typing.Annotated:
        ann = typing.get_args(ann)[0]
    origin = typing.get_origin(ann)
    if origin is typing.Union or origin is types.UnionType:
        return tuple(m for a in typing.get_args(ann) if a is not type(None) for m in _args(a))
    return (ann,)


def _model(ann: Any) -> Any:
    models = [a for a in _args(ann) if _is_model(a)]
    return models[0] if len(models) == 1 else None


def _pick_tagged(ann: Any, tag: Any) -> Any:
    for a in _args(ann):
        if _is_model(a):
            f = a.model_fields.get("type")
            if f is not None and tag in typing.get_args(f.annotation):
                return a
    return ann


def _unit(loc: tuple[Any, ...], model: type) -> str | None:
    """The ``unit`` a field declares (``Field(json_schema_extra={"unit": "req/s"})``) at the
    end of ``loc``, if any."""
    ann: Any = model
    info: Any = None
    for el in loc:
        found = None
        for a in _args(ann):
            if _is_model(a):
                f = a.model_fields.get(el) if isinstance(el, str) else None
                f = f or next((v for v in a.model_fields.values() if v.alias == el), None)
                if f is None and isinstance(el, str):
                    tagged = _pick_tagged(ann, el)
                    found = (tagged, None) if tagged is not ann else found
                    continue
                found = (f.annotation, f) if f is not None else found
            elif isinstance(el, int) and typing.get_origin(a) in (list, tuple):
                found = (typing.get_args(a)[0], None)
        if found is None:
            return None
        ann, info = found
    extra = getattr(info, "json_schema_extra", None)
    return extra.get("unit") if isinstance(extra, dict) else None


def _field(ann: Any, key: Any) -> Any:
    for a in _args(ann):
        if _is_model(a):
            for name, f in a.model_fields.items():
                if key in (name, f.alias):
                    return f.annotation
        elif typing.get_origin(a) is dict:
            return typing.get_args(a)[1]
    return None


def _item(ann: Any) -> Any:
    for a in _args(ann):
        if typing.get_origin(a) in (list, tuple):
            return typing.get_args(a)[0]
    return None
