#!/usr/bin/python
"""Ansible module: apply an lbtune parameter set to the nginx lbtune runs on this host.

The same code as lbtune's direct path (``NginxTarget.apply``: render, ``nginx -t``,
graceful reload, read-back from the live file), through
:func:`lbtune.apply.host.run_module`: the host's ``ansible_python_interpreter`` must be a
Python with lbtune installed. Run by ``playbooks/target-apply.yml``.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: lbtune_nginx
short_description: Apply an lbtune parameter set to nginx (validated graceful reload)
description:
  - Validates the parameters against the nginx space, renders nginx.conf, checks it with
    C(nginx -t) before replacing the live file, reloads gracefully (SIGHUP: streams in
    flight finish on the old workers) and reads every knob back from the live file.
    Idempotent; supports check mode and diff.
options:
  state_dir:
    description: lbtune state dir of the balancer (holds endpoints.json).
    required: true
    type: path
  params:
    description: Knob name to value (a subset is fine; the rest stays as it is live).
    type: dict
    default: {}
  rollback: {description: "Target.rollback(); params is then the controller's last known
             good (it becomes this host's first)", type: bool, default: false}
  options: {description: "test hooks: template_overrides (template variables forced after
            the knobs are mapped)", type: dict, default: {}}
requirements: [lbtune (in ansible_python_interpreter), nginx started by lbtune]
"""

RETURN = r"""
lbtune:
  description: applied (full parameter set read back), diff (knob -> [before, after]),
    reloaded, check, seconds.
  returned: always
  type: dict
"""

# Ansible tells a new-style module (arguments as JSON on stdin) by this import in the
# module's own source; run_module's import inside lbtune does not count.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def main() -> None:
    from collections.abc import Mapping
    from typing import Any

    from lbtune.apply.host import ARGUMENT_SPEC, run_module
    from lbtune.records.endpoints import Endpoints
    from lbtune.targets.nginx.balancer import site_of
    from lbtune.targets.nginx.target import NginxTarget

    def make(ep: Endpoints, options: Mapping[str, Any]) -> NginxTarget:
        return NginxTarget(site_of(ep), template_overrides=options.get("template_overrides") or {})

    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, "nginx", make)


if __name__ == "__main__":
    main()
