"""Checks for the settings a user passes: one function per kind of value.

Each raises `InvalidConfigError` naming the setting, the bad value, what is accepted and a good
value to copy, and returns the value in its plain Python form (a numpy integer becomes an `int`,
a 1 given for a real becomes `1.0`). Generation settings, method options and remote settings all
call these, so one mistake reads the same wherever it is made, and a value that would only fail
deep inside torch (a NaN temperature, a seed past 64 bits) fails at the call instead.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

from .errors import InvalidConfigError

SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes 0..2**64-1 (a uint64)


def check_int(
    name: str,
    value: Any,
    *,
    low: int | None = None,
    high: int | None = None,
    example: int,
) -> int:
    """An integer in [low, high]. A bool is refused: `True` is almost always a slip (a flag
    passed for a count), and Python would otherwise read it as 1."""
    accepted = _accepted("an integer", _bounds(low, high))
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
        if (low is None or value >= low) and (high is None or value <= high):
            return value
        _fail(name, value, accepted, example)
    _fail(name, value, accepted, example, kind="an integer")


def check_real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    example: float,
    note: str = "",
) -> float:
    """A finite real number in the range given (`low_open`/`high_open` exclude the bound).
    NaN and infinities are refused: they pass every `<` test they should fail and surface
    later as a sampling error with no setting named."""
    kind = f"a finite number{note and '; ' + note}"
    accepted = _accepted(kind, _bounds(low, high, low_open, high_open))
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        _fail(name, value, accepted, example, kind="a number")
    number = float(value)
    if math.isnan(number):
        _fail(name, value, accepted, example, problem="not a number")
    if math.isinf(number):
        _fail(name, value, accepted, example, problem="not finite")
    too_low = low is not None and (number <= low if low_open else number < low)
    too_high = high is not None and (number >= high if high_open else number > high)
    if too_low or too_high:
        _fail(name, value, accepted, example)
    return number


def check_bool(name: str, value: Any) -> bool:
    """True or False exactly: a string such as "no" is truthy, so it would silently mean True."""
    if isinstance(value, bool):
        return value
    raise InvalidConfigError(
        f"{name} must be True or False, got {value!r}{_kind_of(value)}; pass {name}=True or "
        f"{name}=False."
    )


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """One of `choices`, returned as the listed value. A bool never stands in for 0/1 (or the
    reverse), though Python finds them equal."""
    for choice in choices:
        if isinstance(value, bool) is isinstance(choice, bool) and _equal(value, choice):
            return choice
    raise InvalidConfigError(
        f"{name}={value!r} is not supported; use one of {', '.join(map(repr, choices))}."
    )


def check_seed(name: str, value: Any, *, example: int = 1234) -> int | None:
    """None (a fresh seed per request) or an integer torch's generators accept."""
    if value is None:
        return None
    accepted = _accepted("an integer", _bounds(0, SEED_MAX)) + " or None"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if 0 <= value <= SEED_MAX:
            return int(value)
        _fail(name, value, accepted, example)
    _fail(name, value, accepted, example, kind="an integer")


def check_strings(name: str, value: Any, *, example: Sequence[str]) -> tuple[str, ...]:
    """None, one string, or a sequence of non-empty strings; returned as a tuple. A single
    string is one entry, never its characters."""
    fix = f"pass e.g. {name}={list(example)!r}."
    if value is None:
        return ()
    if isinstance(value, str):
        value = (value,)
    elif isinstance(value, (bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise InvalidConfigError(
            f"{name} must be a string or a list of strings, got {value!r}{_kind_of(value)}; {fix}"
        )
    strings = tuple(value)
    for i, entry in enumerate(strings):
        if not isinstance(entry, str) or not entry:
            what = "an empty string" if entry == "" else f"{entry!r}{_kind_of(entry)}"
            raise InvalidConfigError(
                f"{name} must hold non-empty strings, but entry {i} is {what}; {fix}"
            )
    return strings


def json_depth(value: Any) -> int:
    """How deeply lists and dicts nest in `value`, counted without recursion (so that data too
    deep for `json.dumps` or `copy.deepcopy` is measured, then refused, rather than crashing)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack.extend(
                (x, level + 1) for x in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


# --- wording ---------------------------------------------------------------------------------


def _fail(
    name: str,
    value: Any,
    accepted: str,
    example: Any,
    *,
    kind: str = "",
    problem: str = "",
) -> NoReturn:
    """Raise the one message shape: what is accepted, what came, how to fix it. `kind` is the
    type expected, named when `value` is of another type."""
    if kind and isinstance(value, str):
        problem, fix = "a string", f"pass {kind}, not a string, e.g. {name}={example!r}."
    else:
        problem = problem or (_kind_of(value)[2:] if kind else "")
        fix = f"pass e.g. {name}={example!r}."
    got = f"{value!r}, {problem}" if problem else repr(value)
    raise InvalidConfigError(f"{name} must be {accepted}, got {got}; {fix}")


def _accepted(kind: str, bounds: str) -> str:
    return f"{bounds} ({kind})" if bounds else kind


def _bounds(low, high, low_open: bool = False, high_open: bool = False) -> str:
    """'>= 1', 'in (0, 1]', 'in 0..2**64-1' (integers, both ends included), or '' for none."""
    if low is not None and high is not None:
        if isinstance(low, int) and isinstance(high, int) and not (low_open or high_open):
            return f"in {_number(low)}..{_number(high)}"
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        return f"in {left}{_number(low)}, {_number(high)}{right}"
    if low is not None:
        return f"{'>' if low_open else '>='} {_number(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {_number(high)}"
    return ""


def _number(x: float) -> str:
    """A bound as a user would write it: 2**64-1 rather than its twenty digits."""
    if isinstance(x, int) and x >= 2**31 - 1 and (x + 1) & x == 0:
        return f"2**{(x + 1).bit_length() - 1}-1"
    return repr(x)


def _kind_of(value: Any) -> str:
    """', a bool' for values whose repr hides a wrong type; '' for None."""
    if value is None:
        return ""
    kind = {str: "string", bytes: "bytes object"}.get(type(value), type(value).__name__)
    return f", {'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an array or tensor compared elementwise is simply not a choice
        return False
