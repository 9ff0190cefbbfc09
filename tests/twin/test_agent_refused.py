"""The twin models placed requests: a scenario of causal agent sessions is refused, one line."""

from __future__ import annotations

import pytest

from lbtune.errors import ConfigError
from lbtune.scenario import load_scenario
from lbtune.twin.requests import RequestSource
from tests.twin.helpers import plan


def test_agent_sessions_are_refused_with_the_option_to_use() -> None:
    p = plan("chat", duration_s=10).model_copy(update={"scenario": load_scenario("agent")})
    with pytest.raises(ConfigError) as err:
        RequestSource(p)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg == (
        "scenario 'agent' has agent sessions: the twin cannot screen them yet; "
        "run optimize with --screen 0"
    )
