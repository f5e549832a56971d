"""The simulator's errors: each one sentence naming the input, the value, and the fix (the library's family)."""

from __future__ import annotations

from genai_constructs.errors import GenaiConstructsError


class SimulationInputError(GenaiConstructsError):
    """Base of the simulator's bad-input errors; the CLI prints the message alone and exits 2."""


class TemplateReadError(SimulationInputError):
    """A file that is not a synthesized template, or a template without an inference fleet in it."""


class TraceReadError(SimulationInputError):
    """A trace file that cannot be read: missing columns, unparseable or negative values, no rows."""


class ScenarioError(SimulationInputError):
    """An unknown scenario name, or a rate scale or duration that is not a positive finite number."""
