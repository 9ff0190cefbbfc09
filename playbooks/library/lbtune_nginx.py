#!/usr/bin/python
"""Ansible module: apply an lbtune parameter set to the nginx lbtune runs on this host.

It calls the same code as lbtune's direct path (``NginxTarget.apply``: render, ``nginx -t``,
graceful reload, read-back from the live file), so the host's
``ansible_python_interpreter`` must be a Python with lbtune installed.
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
    required: true
    type: dict
  template_overrides:
    description: Template variables forced after the knobs are mapped (tests only).
    type: dict
    default: {}
requirements: [lbtune (in ansible_python_interpreter), nginx started by lbtune]
"""

RETURN = r"""
lbtune:
  description: applied (full parameter set read back), diff (knob -> [before, after]),
    reloaded, check, seconds.
  returned: always
  type: dict
"""

from pathlib import Path  # noqa: E402
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
        from lbtune.targets.nginx.balancer import site_of
        from lbtune.targets.nginx.target import NginxTarget
    except ImportError as exc:
        module.fail_json(msg=f"lbtune is not importable by {module._name}'s Python: {exc}")
        return
    try:
        ep = read_endpoints(StatePaths(Path(module.params["state_dir"])))
        if ep is None:
            module.fail_json(msg=f"no endpoints.json in {module.params['state_dir']}")
            return
        target = NginxTarget(site_of(ep), template_overrides=module.params["template_overrides"])
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
