#!/usr/bin/python
"""Ansible module: apply an lbtune parameter set to the HAProxy on this host.

It calls the same code as lbtune's direct path (``HaproxyTarget.apply``), so the host's
``ansible_python_interpreter`` must be a Python with lbtune installed.
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
  state_dir:
    description: lbtune state dir of the balancer (holds endpoints.json).
    required: true
    type: path
  params:
    description: Knob name to value (a subset is fine; the rest stays as it is live).
    required: true
    type: dict
  template_overrides:
    description: Template variables forced after the knobs are mapped (tests only).
    type: dict
    default: {}
requirements: [lbtune (in ansible_python_interpreter), HAProxy master-worker]
"""

RETURN = r"""
lbtune:
  description: applied (full parameter set read back), diff (knob -> [before, after]),
    reloaded, check, seconds.
  returned: always
  type: dict
"""

from typing import Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def _yaml(d: dict[str, Any]) -> str:
    return "".join(f"{k}: {v}\n" for k, v in sorted(d.items()))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state_dir": {"type": "path", "required": True},
            "params": {"type": "dict", "required": True},
            "template_overrides": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    try:
        from lbtune.cluster.state import StatePaths, read_endpoints
        from lbtune.errors import LbtuneError
        from lbtune.targets.haproxy.target import HaproxyTarget
    except ImportError as exc:
        module.fail_json(msg=f"lbtune is not importable by {module._name}'s Python: {exc}")
        return
    try:
        ep = read_endpoints(StatePaths(__import__("pathlib").Path(module.params["state_dir"])))
        if ep is None:
            module.fail_json(msg=f"no endpoints.json in {module.params['state_dir']}")
            return
        target = HaproxyTarget(ep, template_overrides=module.params["template_overrides"])
        result = target.apply(module.params["params"], check=module.check_mode)
    except LbtuneError as exc:
        module.fail_json(msg=f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__)
        return
    diff = {k: [b, a] for k, (b, a) in result.diff.items()}
    module.exit_json(
        changed=result.changed,
        diff={
            "before": _yaml({k: v[0] for k, v in diff.items()}),
            "after": _yaml({k: v[1] for k, v in diff.items()}),
            "before_header": "live",
            "after_header": "requested",
        },
        lbtune={
            "applied": result.applied,
            "diff": diff,
            "reloaded": result.reloaded,
            "check": result.check,
            "seconds": result.seconds,
        },
    )


if __name__ == "__main__":
    main()
