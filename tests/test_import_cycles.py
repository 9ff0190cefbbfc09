"""No lbtune module imports itself back through others (grimp's graph: function-body and
``TYPE_CHECKING`` imports included). The layer contracts in pyproject.toml are checked by
``lint-imports`` (scripts/test.sh); this catches a cycle inside one layer too."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp

import lbtune


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph) == [["p.a", "p.b"]]


def test_lbtune_has_no_import_cycle() -> None:
    graph = grimp.build_graph("lbtune", cache_dir=None)
    assert _cycles(graph) == []


# Imported inside a function only where pyproject.toml's [tool.importlinter] note says why:
# heavy or patching, optional, or only needed on one path (a renderer, a probe, a process).
LAZY_THIRD_PARTY = frozenset(
    {
        "ansible_runner",
        "envoy",
        "gevent",
        "locust",
        "matplotlib",
        "numpy",
        "optuna",
        "optuna_dashboard",
        "pandas",
        "prometheus_api_client",
        "psutil",
        "pyarrow",
        "requests",
        "rich",
        "scipy",
        "setproctitle",
        "sqlalchemy",
        "tokenizers",
        "torch",
        "transformers",
        "urllib3",
        "uvloop",
        "vllm_router",
        "yaml",
    }
)
OWN_LAZY_ALLOWED = ("lbtune/cli/", "lbtune/data/")
"""The CLI's commands import their use case in their body (``lbtune --help`` stays light;
nothing imports the CLI back), and Ansible modules run as scripts."""


def _function_body_imports(root: Path) -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    name = "lbtune" if node.level else (node.module or "")
                    found.append((path.as_posix(), node.lineno, name))
                elif isinstance(node, ast.Import):
                    found += [(path.as_posix(), node.lineno, a.name) for a in node.names]
    return found


def test_function_body_imports_are_only_the_named_ones() -> None:
    root = Path(lbtune.__file__).parent
    bad = []
    for path, line, name in _function_body_imports(root):
        where = Path(path).relative_to(root.parent).as_posix()
        top = name.split(".")[0]
        if top == "lbtune":
            ok = where.startswith(OWN_LAZY_ALLOWED)
        else:
            ok = top in sys.stdlib_module_names or top in LAZY_THIRD_PARTY
        if not ok:
            bad.append(f"{where}:{line} {name}")
    assert bad == []
