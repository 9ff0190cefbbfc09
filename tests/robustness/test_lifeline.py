"""Issue 29, class 3: nothing lbtune starts for itself outlives it, ``kill -9`` included.

No servers: each test starts a small parent process that starts a child the way lbtune does,
kills the parent with SIGKILL and waits (bounded) for the child to be gone. Without the
death signal the child (its own session, busy or ignoring SIGTERM) runs on under init.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import lbtune
from tests.robustness.conftest import processes_mentioning

_CHILD = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"

_POPEN_PARENT = """
import subprocess, sys, time
from lbtune.safety.lifeline import die_with_parent
child = subprocess.Popen(
    [sys.executable, "-c", {child!r}, {marker!r}],
    start_new_session=True,
    preexec_fn=die_with_parent(),
)
print(child.pid, flush=True)
time.sleep(120)
"""

_POOL_PARENT = """
import os, sys, time
from lbtune.twin.pool import TwinPool

if __name__ == "__main__":
    with TwinPool(2) as pool:
        assert pool._pool is not None
        print(pool._pool.submit(os.getpid).result(timeout=60), flush=True)
        time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _kill_parent_then_wait(script: str, tmp_path: Path) -> tuple[int, bool]:
    """Run ``script`` (it prints a child's pid), SIGKILL it, and say whether the child
    is gone within 10 s; the child is killed here either way."""
    path = tmp_path / "parent.py"
    path.write_text(script)
    parent = subprocess.Popen(
        [sys.executable, str(path)], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"the parent printed {line!r}"
        child = int(line)
        assert _alive(child)
    finally:
        parent.kill()
        parent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = not _alive(child)
    if not gone:
        os.kill(child, signal.SIGKILL)
    return child, gone


def test_a_child_started_with_die_with_parent_dies_with_a_kill_9_parent(tmp_path: Path) -> None:
    marker = f"lifeline-{uuid.uuid4().hex}"
    child, gone = _kill_parent_then_wait(
        textwrap.dedent(_POPEN_PARENT.format(child=_CHILD, marker=marker)), tmp_path
    )
    assert gone, f"child {child} outlived its parent"
    assert processes_mentioning(marker) == []


def test_the_twin_pool_workers_die_with_a_kill_9_parent(tmp_path: Path) -> None:
    child, gone = _kill_parent_then_wait(textwrap.dedent(_POOL_PARENT), tmp_path)
    assert gone, f"twin pool worker {child} outlived its parent"


def test_a_child_whose_parent_is_already_gone_kills_itself() -> None:
    """The race a death signal alone leaves open: the parent died before the request."""
    code = "from lbtune.safety.lifeline import arm; import sys; sys.exit(0 if arm(1) else 7)"
    done = subprocess.run([sys.executable, "-c", code], timeout=60, check=False)
    assert done.returncode == 7


# Children meant to outlive the command that started them, with the reason.
_MEANT_TO_OUTLIVE = {
    "lbtune/process/supervisor.py": "the embedded cluster's daemons outlive `cluster up`",
    "lbtune/apply/lease.py": "the lease guard restores the last known good after a kill -9",
}
_STARTERS = {"Popen", "run", "call", "check_call", "check_output", "ProcessPoolExecutor"}
_LIFELINE_KEYWORDS = {"preexec_fn", "initializer"}


def _child_starts(root: Path) -> list[tuple[str, int, set[str]]]:
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent).as_posix()
        if where.startswith("lbtune/data/"):
            continue  # Ansible modules, run on the managed host
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            via_subprocess = (
                isinstance(f, ast.Attribute)
                and isinstance(f.value, ast.Name)
                and f.value.id == "subprocess"
            )
            if (via_subprocess and name in _STARTERS) or name == "ProcessPoolExecutor":
                found.append((where, node.lineno, {k.arg for k in node.keywords if k.arg}))
    return found


def test_every_child_lbtune_starts_dies_with_it() -> None:
    """Enumerates every process start in lbtune: each arms the death signal
    (``preexec_fn=die_with_parent()``, a pool's ``initializer=hold``) or is one of the
    few meant to outlive their command."""
    starts = _child_starts(Path(lbtune.__file__).parent)
    assert len(starts) >= 6, starts  # the walk finds the starts it is meant to check
    bad = [
        f"{where}:{line}"
        for where, line, keywords in starts
        if not keywords & _LIFELINE_KEYWORDS and where not in _MEANT_TO_OUTLIVE
    ]
    assert bad == []
