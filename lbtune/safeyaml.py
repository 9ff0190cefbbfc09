"""Reading a user's YAML file without letting the file hang or crash lbtune.

:func:`load_yaml_file` is ``yaml.safe_load`` of a file with every way it fails as one
:class:`~lbtune.errors.ConfigError` line:

* not readable, larger than :data:`MAX_BYTES`, or not UTF-8 text;
* not YAML (the line of the problem);
* an alias bomb: a document whose aliases expand it beyond :data:`MAX_NODES` nodes
  ("billion laughs"; PyYAML shares the aliased objects, so the bomb goes off later, in
  whatever walks the data: validation, ``scenarios show``, JSON). Its expanded size is
  counted on the composed node graph, before any Python object is built; a recursive
  alias counts as unbounded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lbtune.errors import ConfigError

__all__ = ["MAX_BYTES", "MAX_NODES", "load_yaml_file", "load_yaml_text"]

MAX_BYTES = 16 * 1024 * 1024
"""Largest YAML file lbtune reads (scenarios, clusters, parameters, spaces are kilobytes)."""
MAX_NODES = 1_000_000
"""Most nodes a document may hold once its aliases are expanded."""


def _expanded(node: yaml.Node, memo: dict[int, int]) -> int:
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = MAX_NODES + 1  # met again while being counted: a recursive alias
    if isinstance(node, yaml.SequenceNode):
        n = 1 + sum(_expanded(c, memo) for c in node.value)
    elif isinstance(node, yaml.MappingNode):
        n = 1 + sum(_expanded(k, memo) + _expanded(v, memo) for k, v in node.value)
    else:
        n = 1
    memo[key] = n
    return n


def load_yaml_text(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, refusing alias bombs; errors name ``where``."""
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:  # the reader refuses a control character (NUL...) at once
        raise ConfigError(f"{where}: invalid YAML: {str(exc).splitlines()[0]}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded(node, {}) > MAX_NODES:
            raise ConfigError(
                f"{where}: its aliases expand it beyond {MAX_NODES} nodes (an alias bomb?); refused"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: invalid YAML{line}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to read") from None
    finally:
        loader.dispose()


def load_yaml_file(path: str | Path, where: str | None = None) -> Any:
    """The parsed YAML document in ``path``; every failure a one-line ConfigError."""
    p = Path(path)
    where = where or str(p)
    try:
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise ConfigError(f"{where}: {size} bytes, more than the {MAX_BYTES} lbtune reads")
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{where}: not UTF-8 text (byte {exc.start}: {raw[exc.start : exc.start + 1]!r}); "
            "save it as UTF-8"
        ) from None
    return load_yaml_text(text, where)
