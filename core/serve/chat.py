"""The Chat Completions and Completions APIs: a request body in (`chat_job`,
`completion_job`), its answer out (`ChatAnswer`: SSE chunks, or the whole completion).

Every field OpenAI defines for the two endpoints is either honoured, accepted at the value that
means "nothing asked" (`n: 1`, `logprobs: false`, penalties 0), or refused with a 422 that says
why; a field OpenAI does not define is a 400, as OpenAI answers it, so a typo never passes
silently. A completion prompt is raw text, as OpenAI's and vLLM's /v1/completions read it:
every member continues it with no chat template (a chat goes through /v1/chat/completions).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from core.config import Delta, Output
from core.events import Event
from core.penalties import SETTINGS as PENALTY_SETTINGS
from core.tool_calls import InvalidToolCall, ToolCall

from . import fields
from .errors import APIError, bad_request, unsupported
from .job import Job, ensemble_details
from .settings import Limits

_COMMON = {
    "model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options",
    "n", "logprobs", "top_logprobs", *PENALTY_SETTINGS, "logit_bias",
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


# ------------------------------------------------------------------------------ requests


def _nothing_asked(body: dict, completion: bool) -> None:
    """Fields accepted only at the value that asks for nothing this ensemble cannot do."""
    n = fields.integer(body, "n", 1, 128)
    if n not in (None, 1):
        raise unsupported(
            f"n={n}: the ensemble writes one answer per request; send {n} requests instead "
            "(with temperature > 0 and different seeds for different answers).",
            "n",
        )
    if completion:
        best = fields.integer(body, "best_of", 1, 128)
        if best not in (None, 1):
            raise unsupported(
                "best_of > 1 is not supported; send one request per answer.", "best_of"
            )
        if fields.boolean(body, "echo"):
            raise unsupported("echo is not supported: the prompt is not repeated.", "echo")
        if body.get("suffix") not in (None, ""):
            raise unsupported("suffix (fill-in-the-middle) is not supported.", "suffix")
        logprobs = fields.integer(body, "logprobs", 0, 20)
    else:
        logprobs = fields.boolean(body, "logprobs")
    top = fields.integer(body, "top_logprobs", 0, 20)
    if logprobs or top:
        raise unsupported(
            "log-probabilities are not reported: a committed piece of an ensemble's text is "
            "not one model's token, so no single distribution describes it.",
            "logprobs" if logprobs else "top_logprobs",
        )
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


def _stream(body: dict) -> tuple[bool, bool]:
    stream = bool(fields.boolean(body, "stream"))
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
    include = fields.boolean(options, "include_usage")
    return stream, bool(include)


def _tool_schema(tool: dict, index: int) -> tuple[Any, str]:
    function = tool.get("function")
    if isinstance(function, dict) and function.get("parameters") is not None:
        return function["parameters"], f"tools[{index}].function.parameters"
    return None, ""


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
    return fields.schema_format(fmt, limits, "response_format")


def _content(message: dict, where: str) -> str | list[dict[str, str]]:
    content = message.get("content")
    if isinstance(content, list):
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "refusal"):
                raise unsupported(
                    f"{where} has a content part of type {kind!r}; the members read text only.",
                    f"{where}.content",
                )
        return [{"type": "text", "text": p.get("text", p.get("refusal", ""))} for p in content]
    if content is not None and not isinstance(content, str):
        raise bad_request(
            f"{where}.content must be a string or an array of parts.", f"{where}.content"
        )
    return "" if content is None else content


def _answered_call(message: dict, where: str, open_calls: set[str]) -> None:
    """A tool message answers a call of the assistant message before it, by its id (OpenAI
    refuses one that answers no call)."""
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(
            f"Missing required parameter: '{where}.tool_call_id' (a tool message answers a "
            "call by its id).",
            f"{where}.tool_call_id",
        )
    if call_id not in open_calls:
        raise bad_request(
            f"{where} answers the tool call {call_id!r}, which no assistant message before it "
            "made; a message with role 'tool' must answer a call of the preceding assistant "
            "message's 'tool_calls' (its id).",
            f"{where}.tool_call_id",
        )


def _messages(body: dict, limits: Limits) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise bad_request("Missing required parameter: 'messages'.", "messages")
    if not isinstance(messages, list):
        raise bad_request(
            f"'messages' must be an array, not {fields.type_name(messages)}.", "messages"
        )
    if not messages:
        raise bad_request("'messages' is empty; send at least one message.", "messages")
    fields.message_count(messages, limits, "messages", "messages")
    out = []
    open_calls: set[str] = set()  # the ids of the last assistant message's calls
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad_request(f"{where} must be an object.", where)
        role = message.get("role")
        if not isinstance(role, str):
            raise bad_request(f"{where}.role must be a string.", f"{where}.role")
        if role == "assistant":
            calls = message.get("tool_calls") or []
            open_calls = {c.get("id") for c in calls if isinstance(c, dict)} - {None}
        elif role == "tool":
            _answered_call(message, where, open_calls)
        role = "system" if role == "developer" else role  # OpenAI's newer name for it
        out.append({**message, "role": role, "content": _content(message, where)})
    return out


def chat_job(body: dict, names: Sequence[str], limits: Limits) -> Job:
    fields.known_fields(body, CHAT_FIELDS, _REPLACED)
    model = fields.model(body, names)
    _nothing_asked(body, completion=False)
    stream, usage = _stream(body)
    messages = _messages(body, limits)
    tokens = fields.max_tokens(
        body, limits, limits.max_tokens, ("max_completion_tokens", "max_tokens")
    )
    specs = fields.function_tools(body.get("tools"), limits, _tool_schema)
    choice = fields.tool_choice(body.get("tool_choice"), specs)
    parallel = fields.boolean(body, "parallel_tool_calls")
    fmt = _response_format(body, limits)
    config = fields.generation_config(
        body, limits, tokens, specs, choice, True if parallel is None else parallel, fmt
    )
    return Job("chat", model, messages, config, stream, usage)


def completion_job(body: dict, names: Sequence[str], limits: Limits) -> Job:
    fields.known_fields(body, COMPLETION_FIELDS, _REPLACED)
    model = fields.model(body, names)
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
    tokens = fields.max_tokens(body, limits, COMPLETION_DEFAULT_MAX_TOKENS, ("max_tokens",))
    config = replace(fields.generation_config(body, limits, tokens), raw_prompt=True)
    return Job("completions", model, prompt, config, stream, usage)


# ------------------------------------------------------------------------------ answers


def openai_call(call: ToolCall | InvalidToolCall) -> dict[str, Any]:
    """A call as OpenAI writes it; a call cut by the token limit with its partial arguments."""
    if isinstance(call, InvalidToolCall):
        name, arguments = call.name or "", call.partial_arguments
    else:
        name, arguments = call.name, json.dumps(call.arguments, ensure_ascii=False)
    return {"id": call.id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _shown(calls: Sequence[ToolCall | InvalidToolCall]) -> list[ToolCall | InvalidToolCall]:
    """The calls an OpenAI answer shows: whole ones, and one cut by the token limit."""
    return [c for c in calls if isinstance(c, ToolCall) or c.cut]


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


class ChatAnswer:
    """One job's answer on the Chat Completions or Completions API: `whole` (the response
    body), or the stream as SSE bytes: `opening`, then `step` for each (merged) delta, the last
    of which ends the stream (finish chunk with the `ensemble` details, the usage chunk when
    asked, `[DONE]`), or `failure` for an error mid-stream.

    A text delta is the hot path (one per committed piece): its chunk is two fixed byte strings
    around the JSON of the text, made once per answer."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.chat = job.api == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.calls = 0  # tool calls sent so far (their stream index)
        self.events: list[Event] = []
        head = json.dumps(self._base(), ensure_ascii=False)[:-1]
        if self.chat:
            self._text_head = (head + ', "choices": [{"index": 0, "delta": {"content": ').encode()
            self._text_tail = b'}, "logprobs": null, "finish_reason": null}]}\n\n'
        else:
            self._text_head = (head + ', "choices": [{"index": 0, "text": ').encode()
            self._text_tail = b', "logprobs": null, "finish_reason": null}]}\n\n'
        self._text_head = b"data: " + self._text_head

    def _base(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.job.model}

    def _choice(self, delta: dict[str, Any] | str, finish: str | None) -> dict[str, Any]:
        if self.chat:
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}

    def opening(self) -> bytes:
        """The chat stream opens with the role, as OpenAI's does."""
        if not self.chat:
            return b""
        role = {"role": "assistant", "content": ""}
        return _sse({**self._base(), "choices": [self._choice(role, None)]})

    def step(self, delta: Delta) -> bytes:
        out = []
        if delta.text:
            text = json.dumps(delta.text, ensure_ascii=False).encode()
            out.append(self._text_head + text + self._text_tail)
        self.events.extend(delta.events)
        calls = _shown(delta.tool_calls) if self.chat else []
        if calls:
            entries = [{"index": self.calls + i, **openai_call(c)} for i, c in enumerate(calls)]
            self.calls += len(calls)
            choice = self._choice({"tool_calls": entries}, None)
            out.append(_sse({**self._base(), "choices": [choice]}))
        if delta.finish_reason is not None:
            finish = {
                **self._base(),
                "choices": [self._choice({} if self.chat else "", delta.finish_reason)],
            }
            invalid = [c for c in delta.tool_calls if isinstance(c, InvalidToolCall)]
            finish["ensemble"] = ensemble_details(delta.stats, self.events, invalid)
            out.append(_sse(finish))
            if self.job.include_usage:
                out.append(_sse({**self._base(), "choices": [], "usage": delta.stats.usage()}))
            out.append(b"data: [DONE]\n\n")
        return b"".join(out)

    def failure(self, error: APIError) -> bytes:
        return _sse(error.body())

    def whole(self, output: Output) -> dict[str, Any]:
        base = self._base()
        base["object"] = "chat.completion" if self.chat else "text_completion"
        calls = _shown([*output.tool_calls, *output.invalid_tool_calls])
        text, finish = output.text, output.finish_reason
        if self.chat:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text if text or not calls else None,
                "refusal": None,
            }
            if calls:
                message["tool_calls"] = [openai_call(c) for c in calls]
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        details = ensemble_details(output.stats, output.events, output.invalid_tool_calls)
        return {**base, "choices": [choice], "usage": output.stats.usage(), "ensemble": details}
