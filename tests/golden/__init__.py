"""Golden files: JSON text a test generates from objects it builds, checked byte for byte.

The files under ``tests/golden/`` were first written by the code before the writers moved
to pydantic ``TypeAdapter`` (the JSON forms are contracts: ``docs/summary-schema.md``,
``study.json``, the ``--json`` outputs). When a contract changes on purpose, rewrite them
from the current code with ``LBTUNE_UPDATE_GOLDEN=1 pytest <the test>`` and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR = Path(__file__).parent
UPDATE_ENV = "LBTUNE_UPDATE_GOLDEN"


def expected(name: str, text: str) -> str:
    """The golden file ``name``'s text, for a test to assert ``text`` equal to it byte for
    byte; on update (:data:`UPDATE_ENV`) ``text`` is written as the new golden file first."""
    path = DIR / name
    if os.environ.get(UPDATE_ENV) == "1":
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"no golden file {path}: run with {UPDATE_ENV}=1 to write it"
    return path.read_text(encoding="utf-8")


def read(name: str) -> str:
    return (DIR / name).read_text(encoding="utf-8")
