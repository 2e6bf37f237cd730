"""Generation settings and what a request returns (text, finish reason, stats, events)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidConfigError
from .events import Event
from .grammar import Constraint, build_constraint
from .penalties import LIMIT as PENALTY_LIMIT
from .penalties import SETTINGS as PENALTY_SETTINGS
from .penalties import Penalties
from .tool_calls import InvalidToolCall, ToolCall
from .tools import ToolSpec, normalize_response_format, normalize_tool_choice, normalize_tools
from .validate import check_bool, check_int, check_real, check_seed, check_strings


@dataclass(frozen=True)
class GenerationConfig:
    """Greedy by default; `temperature > 0` samples, reproducibly when `seed` is set.

    Tools and structured output: `tools` (`core.tools.ToolSpec`s, or OpenAI-style function
    specs, which become ToolSpecs here), `tool_choice` ("auto",
    "none", "required" or a tool name), `parallel_tool_calls`, and `response_format` (a JSON
    schema, {"type": "json_object"} or OpenAI's {"type": "json_schema", ...}). They are checked
    and normalised here (`core.tools`), and together they make the request's grammar
    (`constraint`, None when there is nothing to constrain), which every method honours;
    `grammar=False` only shows them to the members (the prompt-only baseline).

    `raw_prompt=True`: the prompt is one string that every member reads as it is, with no chat
    template (few-shot text, a completion prompt, a base model's own format): tokenized as the
    member's tokenizer reads a plain text, its BOS token added where the tokenizer adds one.
    Tools need a template to reach the members, so they are refused with it; a
    `response_format` still constrains the answer (the prompt must ask for it itself).

    `frequency_penalty` and `presence_penalty` are OpenAI's (-2..2, 0 = none): each member
    lowers the log-probs of the tokens it has already written in this response, by its own
    tokenization of the response (`core.penalties`), before any method reads its rows."""

    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    grammar: bool = True  # False: tools and schema reach the prompts only (calls still parsed)
    raw_prompt: bool = False  # True: the prompt is text every member reads as is, no template
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    constraint: Constraint | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Every field checked and normalised here, so a bad value fails where it is written
        (also through `dataclasses.replace`, which per-call overrides use)."""
        checked = {
            "max_new_tokens": check_int("max_new_tokens", self.max_new_tokens, low=1, example=256),
            "stop": check_strings("stop", self.stop, example=["\nUser:"]),
            "temperature": check_real(
                "temperature", self.temperature, low=0, example=0.7, note="0 = greedy"
            ),
            "top_p": check_real("top_p", self.top_p, low=0, high=1, low_open=True, example=0.9),
            "seed": check_seed("seed", self.seed),
            "tools": normalize_tools(self.tools),
            "parallel_tool_calls": check_bool("parallel_tool_calls", self.parallel_tool_calls),
            "response_format": normalize_response_format(self.response_format),
            "grammar": check_bool("grammar", self.grammar),
            "raw_prompt": check_bool("raw_prompt", self.raw_prompt),
            **{
                name: check_real(
                    name, getattr(self, name), low=-PENALTY_LIMIT, high=PENALTY_LIMIT, example=0.5
                )
                for name in PENALTY_SETTINGS
            },
        }
        checked["tool_choice"] = normalize_tool_choice(self.tool_choice, checked["tools"])
        if checked["raw_prompt"] and checked["tools"]:
            raise InvalidConfigError(
                "raw_prompt=True sends the prompt text as it is, with no chat template, so the "
                "members would never see the tools; pass messages (raw_prompt=False) to call "
                "tools."
            )
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # frozen: normalised once, here
        constraint = build_constraint(
            self.tools, self.tool_choice, self.parallel_tool_calls, self.response_format
        )  # built (and so checked) either way
        object.__setattr__(self, "constraint", constraint if self.grammar else None)

    @property
    def calls_tools(self) -> bool:
        """The answer may contain tool calls."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def penalties(self) -> Penalties:
        """The penalties every member applies to its own rows (falsy when both are 0)."""
        return Penalties(self.frequency_penalty, self.presence_penalty)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Stats:
    """Per-request numbers. `tokens` counts output tokens in the committed tokenization:
    the drafter's for `single`/`safe`, one per ensembled step for `token`, the winners' for
    `specem` and `rerank`.

    `ensembled_tokens` counts the output tokens an ensemble decision chose: SAFE's ensemble
    points and `token`'s ensembled steps (one token each, a stop included), every token of
    a SpecEM round whose candidates were scored and voted on, and every token of a `rerank`
    answer chosen by a vote. E/T (`ensemble_rate`) is their share of `tokens`, for every
    method. `ensembled_rounds` counts those SpecEM rounds and rerank votes (SpecEM's rounds
    are in `counts["rounds"]`: ensembled_rounds / rounds is the share it voted on)."""

    tokens: int = 0
    ensembled_tokens: int = 0
    ensembled_rounds: int = 0
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    member_seconds: dict[str, float] = field(default_factory=dict)
    member_calls: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)  # SpecEM's voting weights at the end
    member_weights: dict[str, float] = field(default_factory=dict)  # the trust it started with
    seconds: float = 0.0
    first_delta_seconds: float | None = None
    failed: dict[str, str] = field(default_factory=dict)  # member -> why it left the request
    prefilled: dict[str, int] = field(default_factory=dict)  # ids fed (prefix reuse saves some)
    cache_bytes: int = 0  # key/value bytes the request's members held at its end
    # the method as this request ran it, recorded when it started: `Ensemble.summary()` then,
    # with the drafter, members and member weights this request used
    method_summary: dict[str, Any] = field(default_factory=dict)

    @property
    def input_tokens(self) -> int:
        """The prompt length reported as "input tokens" for the whole ensemble: the first active
        member's count (the facade starts members in `method.active` order, so a method lists its
        drafter first). Every member's own count is in `prompt_tokens`; the adapters use this."""
        return next(iter(self.prompt_tokens.values()), 0)

    @property
    def ensemble_rate(self) -> float:
        """E/T: the share of output tokens an ensemble decision chose."""
        return self.ensembled_tokens / self.tokens if self.tokens else 0.0

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def usage(self) -> dict[str, int]:
        """OpenAI-style token usage (LlamaIndex's `raw["usage"]`), the same numbers LangChain's
        usage_metadata reports: `input_tokens` and `tokens`."""
        return {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.tokens,
            "total_tokens": self.input_tokens + self.tokens,
        }

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "ensembled_tokens": self.ensembled_tokens,
            "ensembled_rounds": self.ensembled_rounds,
            "ensemble_rate": round(self.ensemble_rate, 6),
            "prompt_tokens": dict(self.prompt_tokens),
            "member_seconds": {k: round(v, 6) for k, v in self.member_seconds.items()},
            "member_calls": dict(self.member_calls),
            "counts": dict(self.counts),
            "weights": {k: round(v, 6) for k, v in self.weights.items()},
            "member_weights": {k: round(v, 6) for k, v in self.member_weights.items()},
            "seconds": round(self.seconds, 6),
            "first_delta_seconds": (
                None if self.first_delta_seconds is None else round(self.first_delta_seconds, 6)
            ),
            "failed": dict(self.failed),
            "prefilled": dict(self.prefilled),
            "cache_bytes": self.cache_bytes,
        }


@dataclass(frozen=True)
class Delta:
    """One streamed piece: new text (possibly empty when only events happened), the events
    since the previous delta, and the tool calls whose text closed in it (whole calls; a call
    cut by max_new_tokens arrives as an `InvalidToolCall` on the last delta). The last delta
    carries `finish_reason` and the final `stats`."""

    text: str
    events: tuple[Event, ...] = ()
    finish_reason: str | None = None
    stats: Stats | None = None
    tool_calls: tuple[ToolCall | InvalidToolCall, ...] = ()


@dataclass
class Output:
    text: str  # the content outside tool calls
    finish_reason: str  # "stop" | "length" | "tool_calls"
    stats: Stats
    events: list[Event] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = field(default_factory=list)

    @classmethod
    def from_deltas(cls, deltas) -> Output:
        """A request's whole output from its deltas (what `generate` returns for `stream`)."""
        parts, events, calls, last = [], [], [], None
        for delta in deltas:
            parts.append(delta.text)
            events.extend(delta.events)
            calls.extend(delta.tool_calls)
            last = delta
        valid = [c for c in calls if isinstance(c, ToolCall)]
        invalid = [c for c in calls if isinstance(c, InvalidToolCall)]
        return cls("".join(parts), last.finish_reason, last.stats, events, valid, invalid)
