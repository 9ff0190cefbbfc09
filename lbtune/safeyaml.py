"""Reading a user's YAML file without letting the file hang or crash lbtune.

:func:`load_yaml_file` is ``yaml.safe_load`` of a file with every way it fails as one
:class:`~lbtune.errors.ConfigError` line:

* not a regular file (a FIFO, a device), not readable, larger than :data:`MAX_BYTES`, or
  not UTF-8 text (read by :func:`lbtune.safety.files.read_text`, a bounded read);
* not YAML (the line of the problem);
* a mapping that gives the same key twice (YAML would keep the last one silently);
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
from lbtune.safety.files import MAX_DOCUMENT_BYTES, read_text

__all__ = ["MAX_BYTES", "MAX_NODES", "load_yaml_file", "load_yaml_text"]

MAX_BYTES = MAX_DOCUMENT_BYTES
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


class _Loader(yaml.SafeLoader):
    """``SafeLoader`` that refuses a key given twice in one mapping (merge keys ``<<``
    aside: an explicit key overriding a merged one is what they are for)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # unhashable: the base constructor says so
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {first})",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_MERGE = "tag:yaml.org,2002:merge"


def load_yaml_text(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, refusing alias bombs and duplicate keys; errors name
    ``where``."""
    try:
        loader = _Loader(text)
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
    where = where or str(path)
    return load_yaml_text(read_text(path, where, max_bytes=MAX_BYTES), where)
