"""OpenAI requests in, the engine's messages and `GenerationConfig` out; deltas in, OpenAI
chunks and responses out. Nothing else: the ensemble does the work, this only translates.

Every field OpenAI defines for the two endpoints is either honoured, accepted at the value that
means "nothing asked" (`n: 1`, `logprobs: false`, penalties 0), or refused with a 422 that says
why; a field OpenAI does not define is a 400, as OpenAI answers it, so a typo never passes
silently. A completion prompt is sent as one user turn: the members are chat models and each
renders it with its own chat template.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from core.config import Delta, GenerationConfig, Stats
from core.errors import InvalidConfigError
from core.tool_calls import InvalidToolCall, ToolCall
from core.tools import normalize_response_format, normalize_tool_choice, normalize_tools

from .errors import APIError, bad_request, from_engine, unsupported
from .settings import Limits

_COMMON = {
    "model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options",
    "n", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias",
    "user", "metadata", "store", "service_tier",
}  # fmt: skip
CHAT_FIELDS = _COMMON | {
    "messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls",
    "response_format", "modalities",
}  # fmt: skip
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "suffix", "best_of"}
_REPLACED = {
    "functions": "tools",
    "function_call": "tool_choice",
}  # OpenAI's deprecated names, refused with the name that replaced them
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True)
class Request:
    """One translated request: what the engine needs, and how to answer."""

    model: str
    messages: list[dict[str, Any]] | str  # a string: a raw prompt (/v1/completions)
    config: GenerationConfig
    stream: bool
    include_usage: bool
    chat: bool


# ------------------------------------------------------------------------------ field checks


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _integer(body: dict, name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer, not {_type_name(value)}.", name)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise bad_request(f"'{name}' is {value}; it must be {bound}.", name)
    return value


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a number, not {_type_name(value)}.", name)
    if not low <= value <= high:
        raise bad_request(f"'{name}' is {value}; it must be between {low:g} and {high:g}.", name)
    return float(value)


def _boolean(body: dict, name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean, not {_type_name(value)}.", name)
    return value


def _known_fields(body: dict, known: set[str]) -> None:
    for name in body:
        if name in _REPLACED and name not in known:
            raise unsupported(
                f"'{name}' is OpenAI's deprecated form; send '{_REPLACED[name]}' instead.", name
            )
        if name not in known:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name)


def _nothing_asked(body: dict, completion: bool) -> None:
    """Fields accepted only at the value that asks for nothing this ensemble cannot do."""
    n = _integer(body, "n", 1, 128)
    if n not in (None, 1):
        raise unsupported(
            f"n={n}: the ensemble writes one answer per request; send {n} requests instead "
            "(with temperature > 0 and different seeds for different answers).",
            "n",
        )
    if completion:
        best = _integer(body, "best_of", 1, 128)
        if best not in (None, 1):
            raise unsupported(
                "best_of > 1 is not supported; send one request per answer.", "best_of"
            )
        if _boolean(body, "echo"):
            raise unsupported("echo is not supported: the prompt is not repeated.", "echo")
        if body.get("suffix") not in (None, ""):
            raise unsupported("suffix (fill-in-the-middle) is not supported.", "suffix")
        logprobs = _integer(body, "logprobs", 0, 20)
    else:
        logprobs = _boolean(body, "logprobs")
    top = _integer(body, "top_logprobs", 0, 20)
    if logprobs or top:
        raise unsupported(
            "log-probabilities are not reported: a committed piece of an ensemble's text is "
            "not one model's token, so no single distribution describes it.",
            "logprobs" if logprobs else "top_logprobs",
        )
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, -2.0, 2.0):
            raise unsupported(f"'{name}' is not supported; leave it at 0.", name)
    bias = body.get("logit_bias")
    if bias is not None and not isinstance(bias, dict):
        raise bad_request("'logit_bias' must be an object.", "logit_bias")
    if bias:
        raise unsupported(
            "logit_bias is not supported: token ids differ from member to member.", "logit_bias"
        )
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad_request("'user' must be a string.", "user")
    if body.get("store"):
        raise unsupported("store is not supported: nothing is kept after a request.", "store")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise unsupported("only text output exists here: send modalities ['text'].", "modalities")


def _model(body: dict, names: Sequence[str]) -> str:
    model = body.get("model")
    if model is None:
        raise bad_request("you must provide a model parameter ('model').", "model")
    if not isinstance(model, str):
        raise bad_request(f"'model' must be a string, not {_type_name(model)}.", "model")
    if model not in names:
        raise APIError(
            404,
            f"The model {model!r} does not exist here; this server serves "
            f"{', '.join(repr(n) for n in names)}.",
            param="model",
            code="model_not_found",
        )
    return model


def _stop(body: dict, limits: Limits) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or an array of strings.", "stop")
    if len(stops) > limits.max_stop:
        raise bad_request(
            f"'stop' has {len(stops)} sequences; at most {limits.max_stop} are allowed.", "stop"
        )
    if any(not s for s in stops):
        raise bad_request("'stop' has an empty string; every stop sequence needs text.", "stop")
    return tuple(stops)


def _stream(body: dict) -> tuple[bool, bool]:
    stream = bool(_boolean(body, "stream"))
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise bad_request(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
        )
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object.", "stream_options")
    unknown = sorted(set(options) - {"include_usage", "include_obfuscation"})
    if unknown:
        raise bad_request(f"Unrecognized stream option(s): {', '.join(unknown)}", "stream_options")
    include = _boolean(options, "include_usage")
    return stream, bool(include)


def _schema_size(schema: Any, limits: Limits, param: str) -> None:
    size = len(json.dumps(schema, ensure_ascii=False).encode())
    if size > limits.max_schema_bytes:
        raise APIError(
            413,
            f"the JSON schema in '{param}' is {size} bytes; at most {limits.max_schema_bytes} "
            "are allowed (the server's --max-schema-bytes).",
            param=param,
            code="schema_too_large",
        )


def _tools(body: dict, limits: Limits):
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request(f"'tools' must be an array, not {_type_name(tools)}.", "tools")
    tools = tools or []
    if len(tools) > limits.max_tools:
        raise APIError(
            413,
            f"'tools' has {len(tools)} tools; at most {limits.max_tools} are allowed (the "
            "server's --max-tools).",
            param="tools",
            code="too_many_tools",
        )
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise bad_request(f"tools[{index}] must be an object.", f"tools[{index}]")
        function = tool.get("function")
        if isinstance(function, dict) and function.get("parameters") is not None:
            _schema_size(function["parameters"], limits, f"tools[{index}].function.parameters")
    try:
        specs = normalize_tools(tools)
    except InvalidConfigError as error:
        raise from_engine(error, "tools") from None
    try:
        choice = normalize_tool_choice(body.get("tool_choice"), specs)
    except InvalidConfigError as error:
        raise APIError(400, str(error), param="tool_choice") from None
    parallel = _boolean(body, "parallel_tool_calls")
    return specs, choice, True if parallel is None else parallel


def _response_format(body: dict, limits: Limits) -> dict[str, Any] | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad_request("'response_format' must be an object.", "response_format")
    kind = fmt.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise bad_request(
            f"response_format type {kind!r} is not one of 'text', 'json_object', 'json_schema'.",
            "response_format.type",
        )
    _schema_size(fmt, limits, "response_format")
    try:
        return normalize_response_format(fmt)
    except InvalidConfigError as error:
        raise from_engine(error, "response_format") from None


def _messages(body: dict, limits: Limits) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise bad_request("Missing required parameter: 'messages'.", "messages")
    if not isinstance(messages, list):
        raise bad_request(f"'messages' must be an array, not {_type_name(messages)}.", "messages")
    if not messages:
        raise bad_request("'messages' is empty; send at least one message.", "messages")
    if len(messages) > limits.max_messages:
        raise APIError(
            413,
            f"'messages' has {len(messages)} messages; at most {limits.max_messages} are "
            "allowed (the server's --max-messages).",
            param="messages",
            code="too_many_messages",
        )
    out = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad_request(f"{where} must be an object.", where)
        role = message.get("role")
        if not isinstance(role, str):
            raise bad_request(f"{where}.role must be a string.", f"{where}.role")
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in ("text", "refusal"):
                    raise unsupported(
                        f"{where} has a content part of type {kind!r}; the members read text only.",
                        f"{where}.content",
                    )
            content = [
                {"type": "text", "text": p.get("text", p.get("refusal", ""))} for p in content
            ]
        elif content is not None and not isinstance(content, str):
            raise bad_request(
                f"{where}.content must be a string or an array of parts.", f"{where}.content"
            )
        role = "system" if role == "developer" else role  # OpenAI's newer name for it
        out.append({**message, "role": role, "content": "" if content is None else content})
    return out


def _max_tokens(body: dict, limits: Limits, default: int, names: tuple[str, ...]) -> int:
    given = [(n, _integer(body, n, 1)) for n in names]
    given = [(n, v) for n, v in given if v is not None]
    if len({v for _, v in given}) > 1:
        raise bad_request(
            "'max_tokens' and 'max_completion_tokens' differ; send one of them.", given[1][0]
        )
    if not given:
        return min(default, limits.max_tokens)
    name, value = given[0]
    if value > limits.max_tokens:
        raise bad_request(
            f"'{name}' is {value}; this server allows at most {limits.max_tokens} (its "
            "--max-tokens).",
            name,
        )
    return value


def _config(body: dict, limits: Limits, max_tokens: int, tools=((), "auto", True), fmt=None):
    specs, choice, parallel = tools
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0:
        raise bad_request("'top_p' is 0; it must be above 0 (1 keeps every token).", "top_p")
    seed = _integer(body, "seed", -(2**63), 2**63 - 1)
    try:
        return GenerationConfig(
            max_new_tokens=max_tokens,
            stop=_stop(body, limits),
            temperature=0.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            seed=seed,
            tools=specs,
            tool_choice=choice,
            parallel_tool_calls=parallel,
            response_format=fmt,
        )
    except InvalidConfigError as error:
        raise from_engine(error) from None


def chat_request(body: dict, names: Sequence[str], limits: Limits) -> Request:
    _known_fields(body, CHAT_FIELDS)
    model = _model(body, names)
    _nothing_asked(body, completion=False)
    stream, usage = _stream(body)
    messages = _messages(body, limits)
    max_tokens = _max_tokens(
        body, limits, limits.max_tokens, ("max_completion_tokens", "max_tokens")
    )
    tools = _tools(body, limits)
    config = _config(body, limits, max_tokens, tools, _response_format(body, limits))
    return Request(model, messages, config, stream, usage, chat=True)


def completion_request(body: dict, names: Sequence[str], limits: Limits) -> Request:
    _known_fields(body, COMPLETION_FIELDS)
    model = _model(body, names)
    _nothing_asked(body, completion=True)
    stream, usage = _stream(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        raise unsupported(
            "'prompt' is token ids; members tokenize differently, so send the text.", "prompt"
        )
    if isinstance(prompt, list) and len(prompt) > 1:
        raise unsupported("'prompt' has several prompts; send one request per prompt.", "prompt")
    if not isinstance(prompt, str):
        raise bad_request("'prompt' must be a string.", "prompt")
    max_tokens = _max_tokens(body, limits, COMPLETION_DEFAULT_MAX_TOKENS, ("max_tokens",))
    # A completion prompt is raw text, as OpenAI's and vLLM's /v1/completions read it: every
    # member continues it with no chat template (chat goes through /v1/chat/completions).
    config = replace(_config(body, limits, max_tokens), raw_prompt=True)
    return Request(model, prompt, config, stream, usage, False)


# ------------------------------------------------------------------------------ answers


def merged(deltas: Sequence[Delta]) -> Delta:
    """Consecutive deltas as one (a batch the engine wrote while the last chunk was sent)."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    return Delta(
        "".join(d.text for d in deltas),
        tuple(e for d in deltas for e in d.events),
        last.finish_reason,
        last.stats,
        tuple(c for d in deltas for c in d.tool_calls),
    )


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)


def openai_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": json.dumps(call.arguments, ensure_ascii=False),
        },
    }


class Answer:
    """Builds one request's chunks (streaming) or its whole response, from its deltas."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.id = new_id(request.chat)
        self.created = int(time.time())
        self.calls = 0  # tool calls sent so far (their stream index)

    def _base(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.request.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.request.model}

    def _choice(self, delta: dict[str, Any] | str, finish: str | None) -> dict[str, Any]:
        if self.request.chat:
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}

    def first_chunk(self) -> dict[str, Any] | None:
        """The chat stream opens with the role, as OpenAI's does."""
        if not self.request.chat:
            return None
        return {
            **self._base(),
            "choices": [self._choice({"role": "assistant", "content": ""}, None)],
        }

    def chunks(self, delta: Delta, details: dict | None) -> list[dict[str, Any]]:
        """The chunks for one delta; the last delta also gives the finish chunk (with the
        `ensemble` details) and, when asked, the usage chunk."""
        out = []
        if delta.text:
            piece = {"content": delta.text} if self.request.chat else delta.text
            out.append({**self._base(), "choices": [self._choice(piece, None)]})
        calls = [c for c in delta.tool_calls if isinstance(c, ToolCall)]
        if calls and self.request.chat:
            entries = [{"index": self.calls + i, **openai_call(c)} for i, c in enumerate(calls)]
            self.calls += len(calls)
            out.append({**self._base(), "choices": [self._choice({"tool_calls": entries}, None)]})
        if delta.finish_reason is not None:
            finish = {
                **self._base(),
                "choices": [self._choice({} if self.request.chat else "", delta.finish_reason)],
            }
            finish["ensemble"] = details
            out.append(finish)
            if self.request.include_usage:
                out.append({**self._base(), "choices": [], "usage": delta.stats.usage()})
        return out

    def whole(self, text: str, finish: str, stats: Stats, calls: list, details: dict) -> dict:
        base = self._base()
        base["object"] = "chat.completion" if self.request.chat else "text_completion"
        valid = [c for c in calls if isinstance(c, ToolCall)]
        if self.request.chat:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text if text or not valid else None,
                "refusal": None,
            }
            if valid:
                message["tool_calls"] = [openai_call(c) for c in valid]
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {**base, "choices": [choice], "usage": stats.usage(), "ensemble": details}


def invalid_calls(calls: Sequence[Any]) -> list[dict[str, Any]]:
    """Calls cut off at the token limit: reported in the `ensemble` details, not as calls."""
    return [c.to_dict() for c in calls if isinstance(c, InvalidToolCall)]
