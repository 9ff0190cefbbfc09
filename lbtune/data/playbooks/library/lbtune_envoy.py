#!/usr/bin/python
"""Ansible module: apply an lbtune parameter set to the Envoy on this host.

The same code as lbtune's direct path (``EnvoyTarget``), through
:func:`lbtune.apply.host.run_module`: the host's ``ansible_python_interpreter`` must be a
Python with lbtune and its envoy extra installed. Run by ``playbooks/target-apply.yml``.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: lbtune_envoy
short_description: Apply an lbtune parameter set to Envoy (EDS live / CDS+RDS validated)
description:
  - Validates the parameters against the Envoy space, renders Envoy's file-based xDS
    (endpoints, clusters, routes), checks the result with C(envoy --mode validate) before
    replacing any live file when clusters or routes change, replaces the changed files by
    rename (Envoy re-reads them - weights in place, clusters and routes swapped without a
    restart) and reads everything back from the admin API (/clusters, /config_dump).
    Idempotent; supports check mode and diff.
options:
  state_dir: {description: lbtune state dir of the balancer (holds endpoints.json and envoy/),
              type: path, required: true}
  params: {description: knob name to value (a subset is fine; the rest stays as it is live),
           type: dict, default: {}}
  rollback: {description: "Target.rollback(); params is then the controller's last known
             good (it becomes this host's first)", type: bool, default: false}
  options: {description: unused, type: dict, default: {}}
requirements: [lbtune with its envoy extra (in ansible_python_interpreter), an lbtune Envoy]
"""

RETURN = r"""
lbtune:
  description: applied (full parameter set read back), diff (knob -> [before, after]),
    reloaded (a structural CDS/RDS change), check, seconds.
  returned: success
  type: dict
"""

# Ansible tells a new-style module (arguments as JSON on stdin) by this import in the
# module's own source; run_module's import inside lbtune does not count.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def main() -> None:
    from lbtune.apply.host import ARGUMENT_SPEC, run_module

    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, "envoy")


if __name__ == "__main__":
    main()
