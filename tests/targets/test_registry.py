"""The registry: every entry implements the contract's cluster-side protocol."""

from __future__ import annotations

import pytest

from lbtune.errors import ConfigError
from lbtune.targets import TARGETS, balancer, names
from lbtune.targets.base import Balancer


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_entry_is_a_balancer_named_as_registered(name: str) -> None:
    entry = balancer(name)
    assert isinstance(entry, Balancer)
    assert entry.name == name
    assert entry.ansible_module.startswith("lbtune_")


def test_an_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(ConfigError) as exc:
        balancer("haprox")
    assert "'haprox'" in str(exc.value)
    for n in names():
        assert n in str(exc.value)
