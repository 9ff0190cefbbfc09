#!/usr/bin/python
"""Ansible module: apply an lbtune parameter set to the HAProxy on this host.

The same code as lbtune's direct path (``HaproxyTarget``), through
:func:`lbtune.apply.host.run_module`: the host's ``ansible_python_interpreter`` must be a
Python with lbtune installed. Run by ``playbooks/target-apply.yml``.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: lbtune_haproxy
short_description: Apply an lbtune parameter set to HAProxy (runtime API / validated reload)
description:
  - Validates the parameters against the HAProxy space, renders haproxy.cfg, validates it
    with C(haproxy -c) before replacing the live file, reloads hitlessly through the master
    socket when a structural knob changed, sets weights/maxconn through the runtime API and
    reads everything back. Idempotent; supports check mode and diff.
options:
  state_dir: {description: lbtune state dir of the balancer (holds endpoints.json), type: path,
              required: true}
  params: {description: knob name to value (a subset is fine; the rest stays as it is live),
           type: dict, default: {}}
  rollback: {description: "Target.rollback(); params is then the controller's last known
             good (it becomes this host's first)", type: bool, default: false}
  options: {description: "test hooks: template_overrides (template variables forced after
            the knobs are mapped)", type: dict, default: {}}
requirements: [lbtune (in ansible_python_interpreter), HAProxy master-worker]
"""

RETURN = r"""
lbtune:
  description: applied (full parameter set read back), diff (knob -> [before, after]),
    reloaded, check, seconds.
  returned: success
  type: dict
"""


from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def main() -> None:
    from collections.abc import Mapping
    from typing import Any

    from lbtune.apply.host import ARGUMENT_SPEC, run_module
    from lbtune.records.endpoints import Endpoints
    from lbtune.targets.haproxy.target import HaproxyTarget

    def make(ep: Endpoints, options: Mapping[str, Any]) -> HaproxyTarget:
        return HaproxyTarget(ep, template_overrides=options.get("template_overrides") or {})

    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, "haproxy", make)


if __name__ == "__main__":
    main()
