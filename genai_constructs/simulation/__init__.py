"""Fleet simulator: replay a request trace through a synthesized fleet's own scaling rules, before ``cdk deploy``.

Pure Python; never imports aws_cdk: it reads the ``*.template.json`` that ``cdk synth`` writes. See
``docs/fleet-simulator.md`` for what it models (each behaviour with its source) and what it does not.
"""

from genai_constructs.simulation.engine import simulate
from genai_constructs.simulation.errors import (
    ScenarioError,
    SimulationInputError,
    TemplateReadError,
    TraceReadError,
)
from genai_constructs.simulation.report import MinuteSeries, SimulationReport, plot
from genai_constructs.simulation.template import FleetSpec, read_template
from genai_constructs.simulation.trace import SCENARIOS, Trace, Workload, build_workload, read_trace

__all__ = [
    "SCENARIOS",
    "FleetSpec",
    "MinuteSeries",
    "ScenarioError",
    "SimulationInputError",
    "SimulationReport",
    "TemplateReadError",
    "Trace",
    "TraceReadError",
    "Workload",
    "build_workload",
    "plot",
    "read_template",
    "read_trace",
    "simulate",
]
