"""Where lbtune's built-in data lives: inside the package, found with ``importlib.resources``.

``lbtune/data/`` holds the built-in scenarios, the cluster presets and the Ansible playbooks
(with the templates the embedded cluster renders too). They ship in the wheel as package data,
so an installed lbtune finds them wherever it is run from; user files (``--scenario my.yaml``,
``--config my.yaml``) are resolved by their callers before these built-in names.
"""

from __future__ import annotations

import functools
from importlib.resources import files
from pathlib import Path
from typing import Any

import jinja2

from lbtune.errors import ClusterError, DependencyError

__all__ = [
    "clusters_dir",
    "data_dir",
    "playbooks_dir",
    "render_template",
    "scenarios_dir",
    "templates_dir",
]


def data_dir() -> Path:
    """``lbtune/data`` as a real directory (ansible-runner and Jinja need one on disk)."""
    root = files("lbtune").joinpath("data")
    if not isinstance(root, Path) or not root.is_dir():
        raise DependencyError(
            f"lbtune's built-in data is not a directory on disk ({root}); "
            "install lbtune from its wheel or a checkout (pip install lbtune)"
        )
    return root


def scenarios_dir() -> Path:
    """The built-in scenarios: ``NAME.yaml`` for ``--scenario NAME``."""
    return data_dir() / "scenarios"


def clusters_dir() -> Path:
    """The cluster presets: ``NAME.yaml`` for ``cluster up --config NAME``."""
    return data_dir() / "clusters"


def playbooks_dir() -> Path:
    """The Ansible project ``lbtune apply`` runs (playbooks, modules, inventories)."""
    return data_dir() / "playbooks"


def templates_dir() -> Path:
    """Jinja templates shared by the embedded cluster and the playbooks."""
    return playbooks_dir() / "templates"


@functools.cache
def _environment() -> jinja2.Environment:
    """One environment per process: it caches compiled templates (a compile is ~45 ms, a
    render ~1 ms; the loader still notices an edited template by its mtime)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_template(name: str, context: dict[str, Any]) -> str:
    try:
        return _environment().get_template(name).render(**context)
    except jinja2.TemplateError as exc:
        raise ClusterError(f"{templates_dir() / name}: cannot render: {exc}") from None
