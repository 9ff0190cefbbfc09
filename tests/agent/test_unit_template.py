"""The systemd unit template renders with its defaults and reloads by SIGHUP."""

from __future__ import annotations

import jinja2

from lbtune.resources import templates_dir

TEMPLATES = templates_dir()


def test_unit_renders_with_defaults_and_overrides() -> None:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined
    )
    unit = env.get_template("lbtune-agent.service.j2").render()
    assert (
        "ExecStart=/opt/lbtune/.venv/bin/python -m lbtune agent run --config /etc/lbtune/agent.yaml"
        in unit
    )
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit
    assert "SupplementaryGroups=haproxy" in unit
    custom = env.get_template("lbtune-agent.service.j2").render(
        lbtune_agent_config="/srv/agent.json", lbtune_agent_user="lb"
    )
    assert "--config /srv/agent.json" in custom and "User=lb" in custom
