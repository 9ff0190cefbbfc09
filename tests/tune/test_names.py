"""Default study names: a directory name and a URL path segment, whatever the scenario."""

from __future__ import annotations

import pytest

from lbtune.tune.options import _name_part


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("mixed", "mixed"),
        ("trace:/tmp/ti/az2k.csv?format=azure&speedup=4&start=0", "trace-az2k"),
        ("/a/b/my.yaml", "my"),
        ("scenarios/chat.yaml", "chat"),
        ("we ird/name?.yml", "name"),
    ],
)
def test_study_name_parts_are_safe(scenario: str, expected: str) -> None:
    part = _name_part(scenario)
    assert part == expected
    assert all(c.isalnum() or c in "._-" for c in part)
