#!/usr/bin/python
"""Ansible module: apply an lbtune parameter set to the Envoy on this host.

It calls the same code as lbtune's direct path (``EnvoyTarget.apply``, built through the
registry), so the host's ``ansible_python_interpreter`` must be a Python with lbtune
installed (``pip install 'lbtune[envoy]'``).
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: lbtune_envoy
short_description: Apply an lbtune parameter set to Envoy (EDS live / CDS+RDS validated)
description:
  - Validates the parameters against the Envoy space, renders Envoy's file-based xDS
    (endpoints, clusters, routes), checks the result with C(envoy --mode validate) before
    replacing any live file, replaces the changed files by rename (Envoy re-reads them:
    weights in place, clusters and routes swapped without a restart) and reads everything
    back from the admin API (/clusters, /config_dump). Idempotent; supports check mode and diff.
options:
  state_dir:
    description: lbtune state dir of the balancer (holds endpoints.json and envoy/).
    required: true
    type: path
  params:
    description: Knob name to value (a subset is fine; the rest stays as it is live).
    required: true
    type: dict
  rollback:
    description: Re-apply the last known good recorded in state_dir instead of params.
    type: bool
    default: false
requirements: [lbtune with its envoy extra (in ansible_python_interpreter), an lbtune Envoy]
"""

RETURN = r"""
lbtune:
  description: applied (full parameter set read back), diff (knob -> [before, after]),
    reloaded (a structural CDS/RDS change), check, seconds.
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
            "rollback": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    try:
        from lbtune.cluster.state import StatePaths, read_endpoints
        from lbtune.errors import LbtuneError
        from lbtune.targets import get_target
    except ImportError as exc:
        module.fail_json(msg=f"lbtune is not importable by {module._name}'s Python: {exc}")
        return
    try:
        ep = read_endpoints(StatePaths(Path(module.params["state_dir"])))
        if ep is None:
            module.fail_json(msg=f"no endpoints.json in {module.params['state_dir']}")
            return
        target = get_target("envoy", ep)
        if module.params["rollback"]:
            result = target.rollback(check=module.check_mode)
        else:
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
