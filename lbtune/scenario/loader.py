"""Reading scenario files: built-in names or paths, errors that name file and field.

A validation error becomes one :class:`~lbtune.errors.ConfigError` line such as
``scenarios/x.yaml: load.rate: must be > 0 (got -1)``. Field paths follow the
YAML (the ``type`` tag of a shape or distribution is not part of the path) and
an unknown field lists the valid ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lbtune.errors import ConfigError, validation_error
from lbtune.keyvalue import bad_value, parse_pairs
from lbtune.resources import scenarios_dir
from lbtune.safeyaml import load_yaml_file
from lbtune.scenario.models import Scenario
from lbtune.scenario.traces.read import guess_format
from lbtune.scenario.traces.replay import pin

BUILTIN_DIR = scenarios_dir()
"""Where built-in scenarios live: ``lbtune/data/scenarios/NAME.yaml`` (package data)."""


def builtin_names() -> list[str]:
    """Names of the built-in scenarios, sorted."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def _resolve(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    path = Path(text)
    looks_like_path = (
        isinstance(name_or_path, Path)
        or path.suffix in (".yaml", ".yml")
        or "/" in text
        or path.exists()
    )
    if looks_like_path:
        if not path.exists():
            raise ConfigError(f"{text}: no such scenario file")
        return path
    builtin = BUILTIN_DIR / f"{text}.yaml"
    if builtin.is_file():
        return builtin
    available = ", ".join(builtin_names()) or "(none)"
    raise ConfigError(
        f"Unknown scenario '{text}'. Available: {available} (or give a path to a YAML file)"
    )


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        try:
            return str(path.resolve().relative_to(BUILTIN_DIR.parent))
        except ValueError:
            return str(path)


TRACE_PREFIX = "trace:"
_TRACE_SUFFIXES = (".csv", ".jsonl", ".json", ".parquet")
_TRACE_KEYS = {"format": str, "speedup": float, "start": float, "limit": int, "rate_scale": float}


def trace_ref(
    path: str | Path, fmt: str | None = None, speedup: float | None = None, **more: Any
) -> str:
    """The scenario reference of a trace replay: ``trace:PATH?format=F&speedup=K``."""
    opts: dict[str, Any] = {"format": fmt or guess_format(path)}
    opts.update(speedup=1.0 if speedup is None else speedup, start=0.0)  # the window, always
    opts.update(more)
    query = "&".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in opts.items()
        if v is not None
    )
    return f"{TRACE_PREFIX}{path}" + (f"?{query}" if query else "")


def trace_scenario(ref: str) -> Scenario:
    """The scenario of ``trace:PATH?format=F&speedup=K&start=S&limit=N&rate_scale=R`` (or a
    bare trace file path): replay the file, format guessed from it when not given."""
    text = ref.removeprefix(TRACE_PREFIX)
    path, _, query = text.partition("?") if "=" in text.rpartition("?")[2] else (text, "", "")
    source: dict[str, Any] = {"trace": path}
    example = f"{TRACE_PREFIX}{path}?speedup=2&limit=500"
    for key, value in parse_pairs(query, flag=ref, keys=_TRACE_KEYS, example=example, sep="&"):
        try:
            source[key] = _TRACE_KEYS[key](value)
        except ValueError:
            raise bad_value(ref, key, value, "a number") from None  # only numbers can fail
    source.setdefault("format", guess_format(path))
    sc = scenario_from_dict({"source": source}, source=ref)
    src = sc.source
    assert src is not None
    unit = "sessions" if src.sessions else "requests"
    window = f"from {src.start:g} s, {src.limit or 'all'} {unit}"
    thin = f", {src.rate_scale:g} of them" if src.rate_scale < 1 else ""
    name = f"trace {Path(path).name} ({src.format}, {window}{thin}, x{src.speedup:g} speed)"
    return _pin(sc.model_copy(update={"name": name}), None)


def _pin(sc: Scenario, base: Path | None) -> Scenario:
    if sc.source is None:
        return sc
    return pin(sc, base)


def _is_trace(text: str) -> bool:
    return text.startswith(TRACE_PREFIX) or Path(text.partition("?")[0]).suffix in _TRACE_SUFFIXES


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A built-in scenario by name (see :func:`builtin_names`), a scenario file by path, or
    a trace replay (``trace:PATH?...`` or a trace file, see :func:`trace_scenario`)."""
    if _is_trace(str(name_or_path)):
        return trace_scenario(str(name_or_path))
    path = _resolve(name_or_path)
    where = _display(path)
    data = load_yaml_file(path, where)  # non-UTF-8, bad YAML, an alias bomb: one line
    sc = scenario_from_dict(data, source=where, default_name=path.stem)
    return _pin(sc, path.resolve().parent)  # a relative trace path: next to the scenario


def scenario_from_dict(data: Any, source: str = "<scenario>", default_name: str = "") -> Scenario:
    """Validate a parsed scenario; errors are :class:`ConfigError` naming ``source`` and field."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise ConfigError(f"{source}: expected a mapping of scenario fields, found {kind}")
    if default_name and "name" not in data:
        data = {"name": default_name, **data}
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, source, Scenario, data) from None


def list_scenarios() -> list[Scenario]:
    """Every built-in scenario, validated, sorted by name."""
    return [load_scenario(BUILTIN_DIR / f"{n}.yaml") for n in builtin_names()]
