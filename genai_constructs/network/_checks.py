"""Argument checks every public construct runs before ``super().__init__``.

A wrong type that reaches CDK fails inside jsii (a ``TypeError`` from its runtime type checks, or an
``AttributeError`` on our own attribute access) after the construct has already been added to the tree, leaving a
half-built construct in the stack. These checks run first and turn every such mistake into one sentence for a
``ConfigurationError``: the argument, the value given, what is allowed and the fix.

They live in ``network`` because it is the layer the fleets and the monitoring constructs already import.
Each returns True when the value is usable, so the caller skips the checks that would crash on a bad type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from aws_cdk import Token


def is_token(value: object) -> bool:
    """A CDK token (a deploy-time value, e.g. a ``CfnParameter``'s ``value_as_number``): never checked here."""
    if isinstance(value, float) and not math.isfinite(value):
        return False  # nan and inf cannot cross to jsii (JSON has no such numbers), and are never tokens
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and Token.is_unresolved(value)


def whole_number(problems: list[str], argument: str, value: object, *, minimum: int | None,
                 maximum: int | None = None, fix: str, optional: bool = False) -> bool:
    """An ``int`` (not a bool, a float such as 2.5 or 2.0, or a string such as "2") in [minimum, maximum];
    ``minimum=None``: the type only (the caller checks the range with its own message)."""
    if value is None and optional:
        return True
    if is_token(value):
        return True
    if minimum is None:
        bounds = ""
    else:
        bounds = f" >= {minimum}" if maximum is None else f" between {minimum} and {maximum}"
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "a bool" if isinstance(value, bool) else f"a {type(value).__name__}"
        problems.append(f"{argument} ({value!r}) must be a whole number{bounds}, not {kind}: {fix}")
        return False
    if minimum is not None and (value < minimum or (maximum is not None and value > maximum)):
        problems.append(f"{argument} ({value!r}) must be a whole number{bounds}: {fix}")
        return False
    return True


def finite_number(problems: list[str], argument: str, value: object, *, minimum: float, maximum: float | None = None,
                  fix: str, optional: bool = False, inclusive_minimum: bool = True) -> bool:
    """An ``int`` or ``float`` (not a bool, nan or inf) in range."""
    if value is None and optional:
        return True
    if is_token(value):
        return True
    low = f">= {minimum:g}" if inclusive_minimum else f"> {minimum:g}"
    bounds = low if maximum is None else f"{low} and <= {maximum:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a bool" if isinstance(value, bool) else f"a {type(value).__name__}"
        problems.append(f"{argument} ({value!r}) must be a finite number {bounds}, not {kind}: {fix}")
        return False
    if not math.isfinite(value):
        problems.append(f"{argument} ({value!r}) must be a finite number {bounds}: {fix}")
        return False
    if value < minimum or (value == minimum and not inclusive_minimum) or (maximum is not None and value > maximum):
        problems.append(f"{argument} ({value!r}) must be a finite number {bounds}: {fix}")
        return False
    return True


def flag(problems: list[str], argument: str, value: object, *, optional: bool = False) -> bool:
    """``True`` or ``False`` (not 1, 0 or "yes": a truthy string would silently turn a feature on)."""
    if (value is None and optional) or isinstance(value, bool):
        return True
    allowed = "True, False or None" if optional else "True or False"
    problems.append(f"{argument} ({value!r}) must be {allowed}, not {_article(type(value).__name__)}: write "
                    f"{argument}=True or {argument}=False")
    return False


def text(problems: list[str], argument: str, value: object, *, fix: str, optional: bool = False,
         empty: bool = False) -> bool:
    """A ``str`` (tokens allowed), non-empty unless ``empty``."""
    if value is None and optional:
        return True
    if not isinstance(value, str):
        problems.append(f"{argument} ({value!r}) must be a string, not {_article(type(value).__name__)}: {fix}")
        return False
    if not value and not empty:
        problems.append(f"{argument} ('') must not be empty: {fix}")
        return False
    return True


def _article(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


def id_in_use(problems: list[str], scope: object, id: object, *, construct: str) -> None:
    """An id ``scope`` already holds: a construct would raise a bare ``RuntimeError`` ("There is already a
    Construct with name ...") from inside its ``__init__``, half-built; named here with the fix instead."""
    node = getattr(scope, "node", None)
    if isinstance(id, str) and node is not None and hasattr(node, "try_find_child") and node.try_find_child(id):
        problems.append(f"id ({id!r}) is already used by another construct in {node.path or 'the app'!r}: give this "
                        f"{construct} an id of its own, e.g. {construct}(stack, {id + '2'!r}, ...)")


def instance_of(problems: list[str], argument: str, value: object, expected: type | tuple[type, ...], *,
                allowed: str, fix: str, optional: bool = False) -> bool:
    """An instance of a concrete class (a construct, a jsii enum or struct, a pydantic model)."""
    if (value is None and optional) or isinstance(value, expected):
        return True
    problems.append(f"{argument} ({_short(value)}) must be {allowed}, not {_article(type(value).__name__)}: {fix}")
    return False


def cdk_interface(problems: list[str], argument: str, value: object, *, attributes: Sequence[str], allowed: str,
                  fix: str, optional: bool = True) -> bool:
    """An object implementing a jsii interface (``ec2.IVpc``, ``sns.ITopic``, ...).

    jsii interfaces are typing Protocols that ``isinstance`` cannot test, so this checks for the interface's
    defining attributes (``vpc_id`` and ``select_subnets`` for a VPC), which a wrong object lacks.
    """
    if value is None and optional:
        return True
    if value is not None and not isinstance(value, (str, int, float, bool, list, tuple, dict)) and all(
            hasattr(type(value), name) or hasattr(value, name) for name in attributes):
        return True
    problems.append(f"{argument} ({_short(value)}) must be {allowed}, not {_article(type(value).__name__)}: {fix}")
    return False


def string_list(problems: list[str], argument: str, value: object, *, example: str, optional: bool = False) -> bool:
    """A list or tuple of strings; one string is refused (it would be split into characters)."""
    if value is None and optional:
        return True
    if isinstance(value, str):
        problems.append(f"{argument} ({value!r}) is one string, which would be read character by character: pass a "
                        f"list, e.g. {example}")
        return False
    if not isinstance(value, Sequence) or not all(isinstance(item, str) for item in value):
        problems.append(f"{argument} ({_short(value)}) must be a list of strings: e.g. {example}")
        return False
    return True


def string_map(problems: list[str], argument: str, value: object, *, example: str, optional: bool = True) -> bool:
    """A mapping of strings to strings (tokens allowed)."""
    if value is None and optional:
        return True
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in value.items()):
        problems.append(f"{argument} ({_short(value)}) must be a mapping of strings to strings: e.g. {example}")
        return False
    return True


def _short(value: object) -> str:
    """``repr`` for small values; the type and construct path for constructs (their repr is an address)."""
    node = getattr(value, "node", None)
    path = getattr(node, "path", None) if node is not None else None
    if isinstance(path, str):
        return f"the {type(value).__name__} at {path!r}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
