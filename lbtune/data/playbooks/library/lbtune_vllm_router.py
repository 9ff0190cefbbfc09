#!/usr/bin/python
"""Ansible module: apply an lbtune parameter set to the vllm-router on this host.

The same code as lbtune's direct path (``VllmRouterTarget``), through
:func:`lbtune.apply.host.run_module`. Run by ``playbooks/target-apply.yml``.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: lbtune_vllm_router
short_description: Apply an lbtune parameter set to vllm-router (restart with new flags)
description:
  - Validates the parameters against the vllm-router space; with a difference, restarts the
    router with the new flags, waits for /health and reads the flags back from the running
    process (a failed restart or read-back restarts the previous flags and fails). The same
    parameters again restart nothing. Supports check mode and diff.
options:
  state_dir: {description: lbtune state dir of the router (holds endpoints.json), type: path,
              required: true}
  params: {description: knob name to value (a subset is fine), type: dict, default: {}}
  rollback: {description: "Target.rollback(); params is then the controller's last known
             good (it becomes this host's first)", type: bool, default: false}
  options: {description: unused, type: dict, default: {}}
requirements: [lbtune (in ansible_python_interpreter), vllm-router]
"""

RETURN = r"""
lbtune:
  description: applied, diff (knob -> [before, after]), reloaded (restarted), check, seconds.
  returned: success
  type: dict
"""


from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def main() -> None:
    from lbtune.apply.host import ARGUMENT_SPEC, run_module

    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, "vllm-router")


if __name__ == "__main__":
    main()
