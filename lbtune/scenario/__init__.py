"""Scenarios: validated traffic descriptions, their request sequence and load plan.

``load_scenario("longctx")`` reads ``lbtune/data/scenarios/longctx.yaml``;
``build_workload(scenario).request(i)`` gives request ``i`` identically in every
process (for an ``agent:`` scenario an :class:`AgentWorkload`, whose ``session(s)`` is
a :class:`SessionPlan` of causal calls); ``plan_load(scenario)`` gives the users over
time (closed loop) or every send time (open loop). See ``docs/scenarios.md`` for the
YAML reference.
"""

from __future__ import annotations

from lbtune.scenario.agent import AgentWorkload
from lbtune.scenario.loader import builtin_names, list_scenarios, load_scenario, scenario_from_dict
from lbtune.scenario.models import (
    AgentPrefix,
    AgentSessions,
    PrefixGroups,
    Scenario,
    Sessions,
    Slo,
    SubAgents,
    TrafficClass,
)
from lbtune.scenario.plan import LoadPlan, Stage, plan_load
from lbtune.scenario.request import RequestSpec
from lbtune.scenario.sessionplan import (
    MAX_SESSION_CALLS,
    Call,
    SessionPlan,
    SessionSource,
    call_index,
    split,
)
from lbtune.scenario.workload import Workload, build_workload

__all__ = [
    "MAX_SESSION_CALLS",
    "AgentPrefix",
    "AgentSessions",
    "AgentWorkload",
    "Call",
    "LoadPlan",
    "PrefixGroups",
    "RequestSpec",
    "Scenario",
    "SessionPlan",
    "SessionSource",
    "Sessions",
    "Slo",
    "Stage",
    "SubAgents",
    "TrafficClass",
    "Workload",
    "build_workload",
    "builtin_names",
    "call_index",
    "list_scenarios",
    "load_scenario",
    "plan_load",
    "scenario_from_dict",
    "split",
]
