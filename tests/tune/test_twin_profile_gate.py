"""A study screens with a fitted profile only when its validation holds (refused before
any load otherwise); ``--screen 0`` tunes live and leaves the profile unused."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.errors import ConfigError
from lbtune.tune.optimize import _twin_profile
from lbtune.tune.options import OptimizeOptions
from lbtune.twin.fitted import TwinProfile, Validation
from tests.twin.test_fitted import fit


def _profile(tmp_path: Path, error: float) -> Path:
    val = Validation(
        scenario="chat",
        duration_s=30,
        runs=2,
        live={"requests_per_s": 10.0},
        twin={"requests_per_s": 10.0 * (1 + error)},
        errors={"requests_per_s": error},
    )
    prof = TwinProfile(
        measured_at="x", cluster="c", time_scale=1.0, replicas=[fit()], validation=val
    )
    return prof.write(tmp_path / f"p{error}.json")


def test_an_untrusted_profile_is_refused_unless_the_study_tunes_live(tmp_path: Path) -> None:
    bad, good = _profile(tmp_path, 0.4), _profile(tmp_path, 0.1)
    with pytest.raises(ConfigError, match=r"missed requests_per_s by 40%.*--screen 0"):
        _twin_profile(OptimizeOptions(twin_profile=bad))
    assert _twin_profile(OptimizeOptions(twin_profile=bad, screen=0)) is None
    ok = _twin_profile(OptimizeOptions(twin_profile=bad, max_twin_error=0.5))
    assert ok is not None and ok.replicas[0].name == "r"
    got = _twin_profile(OptimizeOptions(twin_profile=good, screen=30))
    assert got is not None and got.validation is not None
    assert _twin_profile(OptimizeOptions()) is None
