"""One error family for the whole library.

Every error the library raises on bad input derives from :class:`GenaiConstructsError`
(itself a ``ValueError``), and its message names the field, the value given, what is
allowed and the fix, so a user never has to read a jsii stack trace.
"""

from __future__ import annotations


class GenaiConstructsError(ValueError):
    """Base of every error raised by genai-constructs on bad input."""


class UnknownPresetError(GenaiConstructsError):
    """A model preset name that the library does not know."""


class UnknownInstanceTypeError(GenaiConstructsError):
    """An EC2 instance type that is not in the accelerator catalog."""


class ModelDoesNotFitError(GenaiConstructsError):
    """The model's weights and minimum KV cache exceed the accelerator memory."""


class LatencyTargetUnreachableError(GenaiConstructsError):
    """No instance in the catalog meets the traffic's latency target."""


class DeadlineUnreachableError(GenaiConstructsError):
    """No instance count in the catalog finishes the batch before its deadline."""


class ServerStartupError(GenaiConstructsError):
    """Server settings that the model server (vLLM) would refuse at start-up, found before synthesis.

    The message lists every problem at once, each with its numbers and the fix.
    """


class ConfigurationError(GenaiConstructsError):
    """Construct properties that are invalid or conflict with each other.

    Raised before synthesis, with every problem found listed at once.
    """

    def __init__(self, construct: str, problems: list[str]) -> None:
        self.construct = construct
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{construct}: {len(self.problems)} problem(s) with the properties given:\n{lines}")


class UnknownRegionError(GenaiConstructsError):
    """An AWS Region that no price or availability source of the library knows; the message names the closest."""


class InstanceTypeNotOfferedError(GenaiConstructsError):
    """An instance type that neither availability source lists in the Region asked for.

    The message names the Regions that offer it and the sizes of the same family offered in that Region.
    """


class PriceUnknownError(GenaiConstructsError):
    """A cost was asked for an instance type with no published price there (e.g. p5e.48xlarge: capacity blocks
    only), or no Spot estimate where Spot was asked for."""
