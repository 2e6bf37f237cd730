"""The Responses API (`POST /v1/responses`): a request body in (`responses_job`), its answer
out (`ResponsesAnswer`: the typed SSE events, or the whole response object).

Stateless: the conversation comes with each request (`input` as a string, or items: messages,
`function_call` and `function_call_output`), nothing is kept after it (`store` is false), and
`previous_response_id` is refused with a 400 that says to send the whole conversation. Tools are
Responses-style function tools, structured output is `text.format` (`json_schema`,
`json_object`). A response cut by `max_output_tokens` ends `incomplete`, as OpenAI's does,
with a call it was writing returned with the arguments written so far.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

from core.config import Delta, Output, Stats
from core.events import Event
from core.tool_calls import InvalidToolCall, ToolCall

from . import fields
from .errors import APIError, bad_request, unsupported
from .job import Job, ensemble_details
from .settings import Limits

RESPONSES_FIELDS = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
    "max_output_tokens", "temperature", "top_p", "stream", "stream_options", "store",
    "previous_response_id", "conversation", "metadata", "user", "safety_identifier",
    "prompt_cache_key", "prompt_cache_retention", "service_tier", "truncation", "include",
    "reasoning", "top_logprobs", "max_tool_calls", "background", "prompt", "context_management",
}  # fmt: skip
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


# ------------------------------------------------------------------------------ requests


def _nothing_asked(body: dict) -> None:
    """Fields accepted only at the value that asks for nothing this server cannot do."""
    if body.get("previous_response_id") is not None:
        raise bad_request(
            "previous_response_id is not supported: this server keeps no responses (it is "
            "stateless, store is false); send the whole conversation in 'input' (ChatOpenAI: "
            "leave use_previous_response_id off).",
            "previous_response_id",
            code="previous_response_not_found",
        )
    if body.get("conversation") is not None:
        raise unsupported(
            "conversation is not supported: this server keeps no conversations; send the whole "
            "conversation in 'input'.",
            "conversation",
        )
    if fields.boolean(body, "store"):
        raise unsupported(
            "store is not supported: nothing is kept after a request; send store false (or "
            "leave it out).",
            "store",
        )
    if fields.boolean(body, "background"):
        raise unsupported("background responses are not supported: nothing is kept.", "background")
    for name in ("prompt", "context_management"):
        if body.get(name) is not None:
            raise unsupported(f"'{name}' is not supported by this server.", name)
    if fields.integer(body, "top_logprobs", 0, 20):
        raise unsupported(
            "log-probabilities are not reported: a committed piece of an ensemble's text is "
            "not one model's token, so no single distribution describes it.",
            "top_logprobs",
        )
    include = body.get("include")
    if include is not None and (
        not isinstance(include, list) or not all(isinstance(i, str) for i in include)
    ):
        raise bad_request("'include' must be an array of strings.", "include")
    if include and "message.output_text.logprobs" in include:
        raise unsupported("log-probabilities are not reported.", "include")
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise bad_request("'reasoning' must be an object.", "reasoning")
    if reasoning and any(v not in (None, "none") for v in reasoning.values()):
        raise unsupported(
            "reasoning is not supported: the members write no reasoning; leave it out.",
            "reasoning",
        )
    if body.get("truncation") not in (None, "disabled"):
        raise unsupported(
            "truncation 'auto' is not supported: the input is never cut; send "
            "truncation 'disabled' (or leave it out).",
            "truncation",
        )
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad_request("'metadata' must be an object.", "metadata")
    for name in ("user", "safety_identifier", "prompt_cache_key", "service_tier"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise bad_request(f"'{name}' must be a string.", name)
    fields.integer(body, "max_tool_calls", 0)


def _text_of(content: Any, where: str) -> str:
    """An item's content as text: a string, or text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(
            f"{where}.content must be a string or an array of parts.", f"{where}.content"
        )
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise unsupported(
                f"{where}.content[{index}] has type {kind!r}; the members read text only "
                "(input_text, output_text).",
                f"{where}.content",
            )
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise bad_request(
                f"{where}.content[{index}] has no text.", f"{where}.content[{index}].text"
            )
        texts.append(text)
    return "".join(texts)


def _string(item: dict, name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise bad_request(f"Missing required parameter: '{where}.{name}'.", f"{where}.{name}")
    return value


def _messages(body: dict, limits: Limits) -> list[dict[str, Any]]:
    """The conversation in the engine's messages: `instructions` as the system message, each
    message item as a message, function calls as the assistant's tool calls, their outputs as
    tool messages (each answering a call made before it, by `call_id`)."""
    given = body.get("input")
    if given is None:
        raise bad_request("Missing required parameter: 'input'.", "input")
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    if not isinstance(items, list):
        raise bad_request(
            f"'input' must be a string or an array of items, not {fields.type_name(given)}.",
            "input",
        )
    if not items:
        raise bad_request("'input' is empty; send at least one item.", "input")
    fields.message_count(items, limits, "input", "items")
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("'instructions' must be a string.", "instructions")
        out.append({"role": "system", "content": instructions})
    calls: set[str] = set()
    for index, item in enumerate(items):
        where = f"input[{index}]" if not isinstance(given, str) else "input"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object.", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad_request(
                    f"{where}.role is {role!r}; use user, assistant, system or developer.",
                    f"{where}.role",
                )
            role = "system" if role == "developer" else role
            out.append({"role": role, "content": _text_of(item.get("content"), where)})
        elif kind == "function_call":
            call_id = _string(item, "call_id", where)
            name = _string(item, "name", where)
            arguments = item.get("arguments")
            if not isinstance(arguments, str):
                raise bad_request(
                    f"{where}.arguments must be a string (the call's JSON arguments).",
                    f"{where}.arguments",
                )
            call = {"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments}}  # fmt: skip
            if out and out[-1]["role"] == "assistant":  # one assistant turn: text, then calls
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            calls.add(call_id)
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            if call_id not in calls:
                raise bad_request(
                    f"No tool call found for function call output with call_id {call_id!r} "
                    f"({where}); send the function_call item before its output.",
                    f"{where}.call_id",
                )
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, where)
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            raise unsupported(
                f"{where} has type {kind!r}; this server reads message, function_call and "
                "function_call_output items.",
                f"{where}.type",
            )
    return out


def _tool_schema(tool: dict, index: int) -> tuple[Any, str]:
    if tool.get("type", "function") != "function":
        raise unsupported(
            f"tools[{index}] has type {tool.get('type')!r}; only function tools are supported "
            '({"type": "function", "name", "description", "parameters"}).',
            "tools",
        )
    return tool.get("parameters"), f"tools[{index}].parameters"


def _tool_choice(body: dict) -> Any:
    """Responses' tool_choice in the engine's words."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") == "function" and isinstance(choice.get("name"), str):
            return choice["name"]
        raise unsupported(
            f"tool_choice {choice!r} is not supported; use 'auto', 'none', 'required' or "
            '{"type": "function", "name": ...}.',
            "tool_choice",
        )
    return choice


def _text_format(body: dict, limits: Limits) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """`text.format` as a response_format, and the `text` the response repeats."""
    text = body.get("text")
    if text is None:
        return None, {"format": {"type": "text"}}
    if not isinstance(text, dict):
        raise bad_request("'text' must be an object.", "text")
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        raise bad_request(f"Unrecognized text option(s): {', '.join(unknown)}", "text")
    if text.get("verbosity") not in (None, "medium"):
        raise unsupported(
            "text.verbosity is not supported: leave it out (or 'medium').", "text.verbosity"
        )
    fmt = text.get("format") or {"type": "text"}
    if not isinstance(fmt, dict):
        raise bad_request("'text.format' must be an object.", "text.format")
    kind = fmt.get("type")
    if kind == "json_schema":
        inner = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        engine = {"type": "json_schema", "json_schema": inner}
    elif kind in ("text", "json_object"):
        engine = {"type": kind}
    else:
        raise bad_request(
            f"text.format type {kind!r} is not one of 'text', 'json_object', 'json_schema'.",
            "text.format.type",
        )
    return fields.schema_format(engine, limits, "text.format"), {"format": fmt}


def responses_job(body: dict, names: Sequence[str], limits: Limits) -> Job:
    fields.known_fields(body, RESPONSES_FIELDS, {})
    model = fields.model(body, names)
    _nothing_asked(body)
    stream = bool(fields.boolean(body, "stream"))
    messages = _messages(body, limits)
    tokens = fields.max_tokens(body, limits, limits.max_tokens, ("max_output_tokens",))
    specs = fields.function_tools(body.get("tools"), limits, _tool_schema)
    choice = fields.tool_choice(_tool_choice(body), specs)
    parallel = fields.boolean(body, "parallel_tool_calls")
    parallel = True if parallel is None else parallel
    fmt, text = _text_format(body, limits)
    config = fields.generation_config(body, limits, tokens, specs, choice, parallel, fmt)
    echo = {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": parallel,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "text": text,
        "tool_choice": choice if choice in ("auto", "none", "required") else
        {"type": "function", "name": choice},
        "tools": [
            {"type": "function", "name": s.name, "description": s.description,
             "parameters": s.parameters, "strict": True} for s in specs
        ],
        "user": body.get("user"),
    }  # fmt: skip
    return Job("responses", model, messages, config, stream, echo=echo)


# ------------------------------------------------------------------------------ answers


def _usage(stats: Stats) -> dict[str, Any]:
    n_in, n_out = stats.input_tokens, stats.tokens
    return {
        "input_tokens": n_in,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n_in + n_out,
    }


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": content}  # fmt: skip


def _call_item(call: ToolCall | InvalidToolCall, status: str, arguments: str) -> dict[str, Any]:
    return {"id": "fc_" + call.id.removeprefix("call_"), "type": "function_call",
            "status": status, "call_id": call.id, "name": call.name or "",
            "arguments": arguments}  # fmt: skip


def _arguments(call: ToolCall | InvalidToolCall) -> str:
    if isinstance(call, InvalidToolCall):
        return call.partial_arguments
    return json.dumps(call.arguments, ensure_ascii=False)


def _shown(calls: Sequence[ToolCall | InvalidToolCall]) -> list[ToolCall | InvalidToolCall]:
    """The calls a response shows: whole ones, and one cut by the token limit."""
    return [c for c in calls if isinstance(c, ToolCall) or c.cut]


class ResponsesAnswer:
    """One job's answer on the Responses API: `whole` (the response object), or the stream of
    typed events as SSE bytes (`opening`: created and in_progress; `step` per merged delta:
    output items opened, text and argument deltas, items done; the last step: completed or
    incomplete; `failure`: error and failed), each with its `sequence_number`.

    The text delta event is the hot path: two fixed byte strings around the JSON of the text
    and the sequence number, made once per message item."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.id = "resp_" + secrets.token_hex(16)
        self.created = int(time.time())
        self.sequence = 0
        self.events: list[Event] = []
        self.output: list[dict[str, Any]] = []  # items done, in order
        self._message: dict[str, Any] | None = None  # the message item being written
        self._text: list[str] = []
        self._delta_head = b""

    # --- the response object ------------------------------------------------------------

    def _response(self, status: str, stats: Stats | None = None, invalid=()) -> dict[str, Any]:
        length = status == "incomplete"
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if length else None,
            "model": self.job.model,
            "output": list(self.output),
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "truncation": "disabled",
            **self.job.echo,
            "usage": None if stats is None else _usage(stats),
        }
        if stats is not None:
            body["ensemble"] = ensemble_details(stats, self.events, invalid)
        return body

    def whole(self, output: Output) -> dict[str, Any]:
        calls = _shown([*output.tool_calls, *output.invalid_tool_calls])
        if output.text or not calls:
            self.output.append(_message_item(_item_id(), output.text, "completed"))
        for call in calls:
            status = "incomplete" if isinstance(call, InvalidToolCall) else "completed"
            self.output.append(_call_item(call, status, _arguments(call)))
        self.events = list(output.events)
        status = "incomplete" if output.finish_reason == "length" else "completed"
        return self._response(status, output.stats, output.invalid_tool_calls)

    # --- the stream -----------------------------------------------------------------------

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        data = {"type": kind, **data, "sequence_number": self.sequence}
        self.sequence += 1
        payload = json.dumps(data, ensure_ascii=False)
        return f"event: {kind}\ndata: {payload}\n\n".encode()

    def opening(self) -> bytes:
        snapshot = self._response("in_progress")
        return self._event("response.created", {"response": snapshot}) + self._event(
            "response.in_progress", {"response": snapshot}
        )

    def _open_message(self) -> bytes:
        index = len(self.output)
        self._message = _message_item(_item_id(), "", "in_progress")
        self._message["content"] = []
        self._text = []
        where = {"item_id": self._message["id"], "output_index": index, "content_index": 0}
        head = json.dumps({"type": "response.output_text.delta", **where})[:-1]
        self._delta_head = f"event: response.output_text.delta\ndata: {head}, ".encode()
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return self._event(
            "response.output_item.added", {"output_index": index, "item": self._message}
        ) + self._event("response.content_part.added", {**where, "part": part})

    def _text_delta(self, text: str) -> bytes:
        self._text.append(text)
        number = self.sequence
        self.sequence += 1
        return b"".join((
            self._delta_head, b'"delta": ', json.dumps(text, ensure_ascii=False).encode(),
            b', "logprobs": [], "sequence_number": ', str(number).encode(), b"}\n\n",
        ))  # fmt: skip

    def _close_message(self) -> bytes:
        if self._message is None:
            return b""
        index = len(self.output)
        text = "".join(self._text)
        item = _message_item(self._message["id"], text, "completed")
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        part = item["content"][0]
        out = (
            self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
            + self._event("response.content_part.done", {**where, "part": part})
            + self._event("response.output_item.done", {"output_index": index, "item": item})
        )
        self.output.append(item)
        self._message = None
        return out

    def _call(self, call: ToolCall | InvalidToolCall) -> bytes:
        index = len(self.output)
        arguments = _arguments(call)
        status = "incomplete" if isinstance(call, InvalidToolCall) else "completed"
        item = _call_item(call, status, arguments)
        where = {"item_id": item["id"], "output_index": index}
        out = (
            self._event(
                "response.output_item.added",
                {"output_index": index, "item": {**item, "status": "in_progress", "arguments": ""}},
            )
            + self._event("response.function_call_arguments.delta", {**where, "delta": arguments})
            + self._event(
                "response.function_call_arguments.done",
                {**where, "name": item["name"], "arguments": arguments},
            )
            + self._event("response.output_item.done", {"output_index": index, "item": item})
        )
        self.output.append(item)
        return out

    def step(self, delta: Delta) -> bytes:
        out = []
        if delta.text:
            if self._message is None:
                out.append(self._open_message())
            out.append(self._text_delta(delta.text))
        self.events.extend(delta.events)
        calls = _shown(delta.tool_calls)
        if calls:
            out.append(self._close_message())
            out.extend(self._call(call) for call in calls)
        if delta.finish_reason is not None:
            if self._message is None and not self.output:  # an empty answer is a message too
                out.append(self._open_message())
            out.append(self._close_message())
            status = "incomplete" if delta.finish_reason == "length" else "completed"
            invalid = [c for c in delta.tool_calls if isinstance(c, InvalidToolCall)]
            response = self._response(status, delta.stats, invalid)
            out.append(self._event(f"response.{status}", {"response": response}))
        return b"".join(out)

    def failure(self, error: APIError) -> bytes:
        failed = self._response("failed")
        failed["error"] = {"code": error.code or "server_error", "message": error.message}
        return self._event(
            "error", {"code": error.code, "message": error.message, "param": error.param}
        ) + self._event("response.failed", {"response": failed})


def _item_id() -> str:
    return "msg_" + secrets.token_hex(16)
