"""Scenarios: validated traffic descriptions, their request sequence and load plan.

``load_scenario("longctx")`` reads ``lbtune/data/scenarios/longctx.yaml``;
``build_workload(scenario).request(i)`` gives request ``i`` identically in every
process; ``plan_load(scenario)`` gives the users over time (closed loop) or every
send time (open loop). See ``docs/scenarios.md`` for the YAML reference.
"""

from __future__ import annotations

from lbtune.scenario.loader import builtin_names, list_scenarios, load_scenario, scenario_from_dict
from lbtune.scenario.models import PrefixGroups, Scenario, Sessions, Slo, TrafficClass
from lbtune.scenario.plan import LoadPlan, Stage, plan_load
from lbtune.scenario.request import RequestSpec
from lbtune.scenario.workload import Workload, build_workload

__all__ = [
    "LoadPlan",
    "PrefixGroups",
    "RequestSpec",
    "Scenario",
    "Sessions",
    "Slo",
    "Stage",
    "TrafficClass",
    "Workload",
    "build_workload",
    "builtin_names",
    "list_scenarios",
    "load_scenario",
    "plan_load",
    "scenario_from_dict",
]
