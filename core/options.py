"""Every ensemble option, declared once.

An ensemble option sets the ensemble as a whole: how its members load, what a member that fails
does, how many requests run at once, how the member trust learns. A method's own options
(SAFE's `lookahead`, ...) are not here: each method's signature declares them.

Each option is one `Option` in `OPTIONS`: its name, the kind of value it takes (type, bounds or
choices), its default, a good value to suggest, its help text, and its group (loading the
members, or one of the groups about running requests). Every front end is made from this table
and checks a value with the option's `check`, so a mistake reads the same wherever it is made:

- `Ensemble(members, ...)` takes the running options and `Ensemble.from_pretrained(...)` all of
  them; their signatures and docstrings list them (`takes_options`);
- `ChatEnsemble` and `EnsembleLLM` offer each as a field (`core.integration.option_fields`);
- `llm-ensembling serve` offers each as a flag and an `ensemble.toml` key, and `generate` the
  ones that matter to one request (`core.cli_options.add_option_flags`).

So a new option is one `Option(...)` here, and the code that reads it
(`ensemble.options.<name>`).
"""

from __future__ import annotations

import argparse
import inspect
import math
import numbers
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import InvalidConfigError
from .validate import check_bool, check_int, check_real

# Groups: what an option concerns. Only the loading options need the members' sources; the
# others set how requests run, and `Ensemble(members)` takes those alone.
LOADING = "loading"
REQUESTS = "requests"
CONCURRENCY = "concurrency"
TRUST = "trust"
RUNNING = (REQUESTS, CONCURRENCY, TRUST)
GROUPS = (LOADING, *RUNNING)
GROUP_TITLES = {
    LOADING: "loading the members",
    REQUESTS: "each request",
    CONCURRENCY: "requests at once",
    TRUST: "member trust",
}


# --- kinds of value: each checks a value, and says how a front end declares it -----------------


@dataclass(frozen=True)
class Flag:
    """True or False exactly."""

    annotation = bool
    cli = {"action": argparse.BooleanOptionalAction}

    def check(self, name: str, value: Any, example: Any) -> bool:
        return check_bool(name, value)


@dataclass(frozen=True)
class Choice:
    """One of a few strings; `meanings` says what each does (error messages list them)."""

    meanings: Mapping[str, str]
    annotation = str

    @property
    def cli(self) -> dict[str, Any]:
        return {"choices": list(self.meanings)}

    def check(self, name: str, value: Any, example: Any) -> str:
        if isinstance(value, str) and value in self.meanings:
            return value
        listed = [f"{choice!r} ({meaning})" for choice, meaning in self.meanings.items()]
        use = " or ".join([", ".join(listed[:-1]), listed[-1]] if len(listed) > 1 else listed)
        raise InvalidConfigError(f"{name}={value!r} is not supported; use {use}.")


@dataclass(frozen=True)
class Count:
    """A whole number from `low` (0 or 1) up, or None (the help says what None means)."""

    low: int
    annotation = int | None
    cli = {"type": int}

    def check(self, name: str, value: Any, example: Any) -> int | None:
        if value is None:
            return None
        accepted = "a positive integer or None" + ("" if self.low else ", or 0")
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise InvalidConfigError(f"{name}={value!r} must be {accepted}; e.g. {name}={example}.")
        if value < self.low:
            raise InvalidConfigError(
                f"{name}={value!r} is too small; e.g. {name}={example} ({accepted})."
            )
        return int(value)


@dataclass(frozen=True)
class Seconds:
    """A duration in seconds, more than 0, or None (no limit)."""

    annotation = float | None
    cli = {"type": float}

    def check(self, name: str, value: Any, example: Any) -> float | None:
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not value > 0
            or not math.isfinite(value)
        ):
            raise InvalidConfigError(
                f"{name}={value!r} must be seconds > 0, or None (no limit); e.g. {name}={example}."
            )
        return float(value)


@dataclass(frozen=True)
class Real:
    """A finite number within bounds (`low_open`/`high_open` exclude the bound)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    annotation = float
    cli = {"type": float}

    def check(self, name: str, value: Any, example: Any) -> float:
        return check_real(
            name,
            value,
            low=self.low,
            high=self.high,
            low_open=self.low_open,
            high_open=self.high_open,
            example=example,
        )


@dataclass(frozen=True)
class Integer:
    """A whole number from `low` up."""

    low: int
    annotation = int
    cli = {"type": int}

    def check(self, name: str, value: Any, example: Any) -> int:
        return check_int(name, value, low=self.low, example=example)


@dataclass(frozen=True)
class Text:
    """A non-empty string, or None."""

    annotation = str | None
    cli = {"type": str}

    def check(self, name: str, value: Any, example: Any) -> str | None:
        if value is None or (isinstance(value, str) and value):
            return value
        raise InvalidConfigError(
            f"{name} must be a non-empty string or None, got {value!r}; pass e.g. "
            f"{name}={example!r}."
        )


@dataclass(frozen=True)
class EachMember:
    """One value for every member, or a list with one per member; `entry` checks each value
    (None: the loader checks it, and names the fix)."""

    annotation: Any
    entry: Text | None = None
    cli = {"action": "append"}  # repeated once per member, or given once for all

    def check(self, name: str, value: Any, example: Any) -> Any:
        if self.entry is None:
            return value
        one = example[0] if isinstance(example, (list, tuple)) else example
        if isinstance(value, (list, tuple)):
            return [self.entry.check(f"{name}[{i}]", v, one) for i, v in enumerate(value)]
        return self.entry.check(name, value, one)


Kind = Flag | Choice | Count | Seconds | Real | Integer | Text | EachMember


@dataclass(frozen=True)
class Option:
    """One ensemble option: everything every front end needs to offer it and check it."""

    name: str
    kind: Kind
    default: Any
    group: str
    help: str
    example: Any  # a good value other than the default: error messages suggest it
    flag: str = ""  # its command-line flag; "--" + name with dashes unless given

    @property
    def annotation(self) -> Any:
        """The type front ends declare: signatures and the adapters' fields."""
        return self.kind.annotation

    @property
    def command_line(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> Any:
        """The value in its plain form, or InvalidConfigError naming the option and the fix."""
        return self.kind.check(self.name, value, self.example)


OPTIONS: tuple[Option, ...] = (
    Option(
        "device", EachMember(str | list[str]), "auto", LOADING, example="cpu",
        help="where in-process members run: 'auto' (a GPU if one is visible), 'cpu', 'cuda' or "
        "'cuda:N'; one for all members, or one per member",
    ),
    Option(
        "dtype", EachMember(str | list[str]), "auto", LOADING, example="float32",
        help="in-process members' weights: 'auto' (bfloat16 or float16 on a GPU, float32 on "
        "CPU), 'float32', 'bfloat16' or 'float16'; one for all members, or one per member",
    ),
    Option(
        "names", EachMember(list[str] | None, Text()), None, LOADING,
        example=["drafter", "judge"], flag="--member-name",
        help="member names in events and stats, one per member (None: each model's directory "
        "or model name)",
    ),
    Option(
        "use_safetensors", Flag(), True, LOADING, example=False,
        help="load .safetensors weights only; False also allows .bin checkpoints (read as "
        "plain tensors: a pickle holding code is refused)",
    ),
    Option(
        "attn_implementation", Text(), None, LOADING, example="sdpa",
        help="in-process members' attention: 'sdpa', 'eager', ... (None: the model's default)",
    ),
    Option(
        "progress", Flag(), False, LOADING, example=True,
        help="show a progress bar while the members load",
    ),
    Option(
        "on_member_failure",
        Choice({
            "raise": "a failing member ends the request",
            "drop": "the request goes on with the other members",
        }),
        "raise", REQUESTS, example="drop",
        help="what a member that fails mid-request does; a member_failed event says who and "
        "why either way",
    ),
    Option(
        "prefix_reuse", Flag(), True, REQUESTS, example=False,
        help="reuse the keys and values an earlier request computed for a prefix of this "
        "request's prompt (the same text either way)",
    ),
    Option(
        "max_concurrency", Count(low=1), None, CONCURRENCY, example=8,
        help="requests run at once (None: as many as half the free memory holds keys and "
        "values for, at most 64)",
    ),
    Option(
        "max_queue", Count(low=0), None, CONCURRENCY, example=32,
        help="requests that may wait for a slot; one more is refused with EnsembleBusyError "
        "(None: 4 x max_concurrency)",
    ),
    Option(
        "queue_timeout", Seconds(), None, CONCURRENCY, example=30.0,
        help="seconds a request may wait for a slot, then EnsembleBusyError (None: no limit)",
    ),
    Option(
        "self_preference",
        Choice({
            "auto": "the method's own: 'builtin' for rerank's mean log-prob vote, else 'off'",
            "off": "each judge's scores as they are",
            "builtin": "measured on the built-in calibration prompts when the ensemble is built",
        }),
        "auto", TRUST, example="builtin",
        help="SpecEM's and rerank's votes: 'builtin' measures, when the ensemble is built, how "
        "far each member favours its own answers as a judge (calibrate()'s self-preference, on "
        "the built-in prompts; the weights stay as they are; kept on disk per set of member "
        "files, so a later build reads it), and each vote evens it out; 'off': each judge's "
        "scores as they are; 'auto' (the default): 'builtin' for rerank with score='logprob' "
        "(its default score), 'off' for every other method and score",
    ),
    Option(
        "learn_weights", Flag(), False, TRUST, example=True,
        help="learn the member weights from the ensemble's own decisions, across requests "
        "(False: they stay as they are, and a request's text depends on that request alone)",
    ),
    Option(
        "weight_lr", Real(low=0, low_open=True), 0.1, TRUST, example=0.5,
        help="the step of each weight update: larger learns and forgets faster, not further",
    ),
    Option(
        "weight_floor", Real(low=0, high=1, high_open=True), 0.2, TRUST, example=0.1,
        help="a member whose weight is below this times an equal share is not run (0: every "
        "member always runs)",
    ),
    Option(
        "probe_every", Integer(low=1), 10, TRUST, example=5,
        help="every N-th request also runs the members under the floor, so they can recover "
        "(learning trust only)",
    ),
)  # fmt: skip

BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def options_in(groups: Iterable[str]) -> list[Option]:
    wanted = set(groups)
    return [option for option in OPTIONS if option.group in wanted]


class Options(Mapping[str, Any]):
    """Checked option values by name, every option of the groups asked for present (the
    default where none was given), in the table's order. Read it as a mapping (`**options`)
    or by attribute (`options.max_queue`)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"{name!r} is not an ensemble option here") from None

    def __repr__(self) -> str:
        return f"Options({self._values!r})"

    def of(self, groups: Iterable[str]) -> Options:
        """The options of these groups only."""
        return Options({o.name: self[o.name] for o in options_in(groups) if o.name in self})

    def for_members(self, name: str, n: int) -> list[Any]:
        """The value of a per-member option for each of `n` members: one given for all, or
        the list given, which must have one entry per member."""
        value = self[name]
        if not isinstance(value, (list, tuple)):
            return [value] * n
        if len(value) != n:
            alone = "" if BY_NAME[name].default is None else ", or a single value for all"
            raise InvalidConfigError(
                f"{name} has {len(value)} entries for {n} models; pass one per model{alone}."
            )
        return list(value)

    def check_members(self, n: int) -> None:
        """Every per-member option has one entry per member (or one value for all)."""
        for option in OPTIONS:
            if option.name in self and isinstance(option.kind, EachMember):
                self.for_members(option.name, n)


def split_options(
    given: Mapping[str, Any],
    groups: Iterable[str] = GROUPS,
    defaults: Mapping[str, Any] | None = None,
) -> tuple[Options, dict[str, Any]]:
    """The ensemble options of `groups` among `given`, checked, with `defaults` (else the
    table's default) for those not given; and the rest of `given`, the method's options. An
    option of another group is refused, naming the call that takes it."""
    groups = tuple(groups)
    values: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for name, value in {**(defaults or {}), **given}.items():  # a front end's defaults checked too
        option = BY_NAME.get(name)
        if option is None:
            rest[name] = value
        elif option.group not in groups:  # a loading option, given to Ensemble(members)
            raise InvalidConfigError(
                f"{name} is an option for {GROUP_TITLES[option.group]}, which "
                "Ensemble.from_pretrained does; Ensemble(members) takes members already loaded."
            )
        else:
            values[name] = option.check(value)
    values = {o.name: values.get(o.name, o.default) for o in options_in(groups)}
    return Options(values), rest


def check_options(
    given: Mapping[str, Any],
    groups: Iterable[str] = GROUPS,
    defaults: Mapping[str, Any] | None = None,
) -> Options:
    """`split_options` where every key must be an ensemble option."""
    options, unknown = split_options(given, groups, defaults)
    if unknown:
        raise InvalidConfigError(
            f"unknown ensemble option(s) {', '.join(map(repr, sorted(unknown)))}; the options "
            f"are: {', '.join(o.name for o in options_in(groups))}."
        )
    return options


def option_values(holder: Any) -> dict[str, Any]:
    """Every option's value read from an object that has each as an attribute (an adapter)."""
    return {name: getattr(holder, name) for name in NAMES}


def describe(groups: Iterable[str] = GROUPS) -> str:
    """The options of `groups` as text: name=default and help, one paragraph per group."""
    groups = tuple(groups)
    lines: list[str] = []
    for group in groups:
        lines += ["", f"Ensemble options, {GROUP_TITLES[group]}:"]
        for o in options_in([group]):
            text = f"{o.name}={o.default!r}: {o.help}."
            lines.append(textwrap.fill(text, 96, initial_indent="    ", subsequent_indent=" " * 8))
    return "\n".join(lines)


F = TypeVar("F", bound=Callable[..., Any])


def takes_options(*groups: str) -> Callable[[F], F]:
    """For a function that takes the options of `groups` through its `**options` (with a
    method's options): its signature and docstring list them, each with its default and type,
    so `help()` and `inspect.signature` show every option without it being written twice."""

    def decorate(function: F) -> F:
        signature = inspect.signature(function)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        rest = [p for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD]
        listed = [
            inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default,
                              annotation=o.annotation)
            for o in options_in(groups)
        ]  # fmt: skip
        function.__signature__ = signature.replace(parameters=[*own, *listed, *rest])
        function.__doc__ = inspect.cleandoc(function.__doc__ or "") + "\n" + describe(groups)
        return function

    return decorate
