"""The bad requests `llm-ensembling serve` refuses, each with the status and error it answers.

One table, used twice: `tests/test_serve_errors.py` sends every row to a real server and checks
status, error type, code and param; `python -m lab.scripts.serve_error_table` sends them too and
writes the answers into the README (the test checks that the README shows exactly what the server
says).

The server the rows go to: key "sk-test", and small limits (`LIMITS`) so a row can reach each
one. A row's `setup` names a state the test arranges first: "busy" (the one slot taken and no
queue), "loading" and "draining" (a second, keyless server), "keyless" (that same server once
ready).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from serve_helpers import running_server

from core.serve.settings import Limits
from core.testbed import TOOL_SPECS

KEY = "sk-test"
LIMITS = {
    "max_body_bytes": 64 << 10,
    "max_messages": 8,
    "max_tools": 4,
    "max_schema_bytes": 2048,
    "max_tokens": 256,
    "max_stop": 4,
}
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
USER = {"role": "user", "content": "Tom has 7 apples and buys 5 more. How many does he have?"}
ADD = TOOL_SPECS["add"]
_DROP = object()


def chat(**changes: Any) -> dict[str, Any]:
    """A valid chat body with `changes` (a value of `_DROP` removes the field)."""
    body: dict[str, Any] = {"model": "ensemble", "messages": [USER], "max_tokens": 16}
    for name, value in changes.items():
        if value is _DROP:
            body.pop(name, None)
        else:
            body[name] = value
    return body


def response(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "ensemble", "input": USER["content"], "max_output_tokens": 16}
    body.update(changes)
    return body


_CALLED = {
    "role": "assistant",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 7}'}}
    ],
}


def completion(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "ensemble", "prompt": USER["content"], "max_tokens": 16}
    body.update(changes)
    return body


def tool(name: str = "add", parameters: Any = None, kind: str = "function") -> dict[str, Any]:
    spec = json.loads(json.dumps(ADD))
    spec["type"] = kind
    spec["function"]["name"] = name
    if parameters is not None:
        spec["function"]["parameters"] = parameters
    return spec


@dataclass(frozen=True)
class Row:
    case: str
    status: int
    code: str | None
    param: str | None = None
    body: dict[str, Any] | bytes | None = None
    path: str = CHAT
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)  # over the key and JSON type
    setup: str | None = None

    def content(self) -> bytes | None:
        if self.body is None or isinstance(self.body, bytes):
            return self.body
        return json.dumps(self.body).encode()


_LONG = "Tom has seven apples and then buys five more apples at the shop. " * 500
_NESTED = b'{"model": "ensemble", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
_BIG_SCHEMA = {
    "type": "object",
    "properties": {f"field_{i}": {"type": "string", "description": "x" * 40} for i in range(40)},
}

ROWS: list[Row] = [
    # the body itself
    Row("malformed JSON", 400, "invalid_json", body=b'{"model": "ensemble", "messages": ['),
    Row("a JSON array, not an object", 400, "invalid_json", body=b"[1, 2]"),
    Row("NaN as a number", 400, "invalid_json", body=b'{"model": "ensemble", "temperature": NaN}'),
    Row("JSON nested 5,000 deep", 400, "invalid_json", body=_NESTED),
    Row("a body that is not UTF-8", 400, "invalid_encoding", body=b'{"model": "\xff\xfe"}'),
    Row(
        "a body over --max-body-bytes",
        413,
        "request_too_large",
        body=json.dumps(chat(messages=[{"role": "user", "content": "x" * (70 << 10)}])).encode(),
    ),
    Row(
        "not sent as application/json",
        415,
        "unsupported_media_type",
        body=chat(),
        headers={"content-type": "text/plain"},
    ),
    # who may call
    Row("no API key", 401, "missing_api_key", body=chat(), headers={"authorization": ""}),
    Row(
        "a wrong API key",
        401,
        "invalid_api_key",
        body=chat(),
        headers={"authorization": "Bearer sk-wrong"},
    ),
    Row(
        "the key in a Basic header",
        401,
        "missing_api_key",
        body=chat(),
        headers={"authorization": "Basic c2stdGVzdA=="},
    ),
    Row(
        "a keyless server asked under another host name",
        403,
        "host_not_allowed",
        body=chat(),
        headers={"host": "attacker.example"},
        setup="keyless",
    ),
    # the model
    Row("no model", 400, None, "model", body=chat(model=_DROP)),
    Row("model is not a string", 400, None, "model", body=chat(model=["ensemble"])),
    Row("an unknown model", 404, "model_not_found", "model", body=chat(model="gpt-4o")),
    Row("a path as the model", 404, "model_not_found", "model", body=chat(model="/etc/passwd")),
    # messages
    Row("no messages", 400, None, "messages", body=chat(messages=_DROP)),
    Row("messages is not an array", 400, None, "messages", body=chat(messages="hi")),
    Row("no message at all", 400, None, "messages", body=chat(messages=[])),
    Row("a message that is a string", 400, None, "messages[0]", body=chat(messages=["hi"])),
    Row(
        "an unknown role",
        400,
        "invalid_messages",
        "messages",
        body=chat(messages=[{"role": "wizard", "content": "hi"}]),
    ),
    Row(
        "content that is a number",
        400,
        None,
        "messages[0].content",
        body=chat(messages=[{"role": "user", "content": 42}]),
    ),
    Row(
        "an image content part",
        422,
        "unsupported",
        "messages[0].content",
        body=chat(
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        ),
    ),
    Row(
        "text with a lone surrogate",
        400,
        "invalid_messages",
        "messages",
        body=b'{"model": "ensemble", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
    ),
    Row(
        "tool-call arguments that are not JSON",
        400,
        "invalid_messages",
        "messages",
        body=chat(
            messages=[
                USER,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "add", "arguments": "{"},
                        }
                    ],
                },
            ]
        ),
    ),
    Row(
        "more messages than --max-messages",
        413,
        "too_many_messages",
        "messages",
        body=chat(messages=[USER] * 9),
    ),  # fmt: skip
    Row(
        "a prompt longer than the context window",
        400,
        "context_length_exceeded",
        "messages",
        body=chat(messages=[{"role": "user", "content": _LONG[: 60 << 10]}]),
    ),
    # what the ensemble cannot do
    Row("n = 2", 422, "unsupported", "n", body=chat(n=2)),
    Row("n = 0", 400, None, "n", body=chat(n=0)),
    Row("logprobs asked", 422, "unsupported", "logprobs", body=chat(logprobs=True)),
    Row("top_logprobs asked", 422, "unsupported", "top_logprobs", body=chat(top_logprobs=5)),
    Row(
        "a presence penalty above 2",
        400,
        None,
        "presence_penalty",
        body=chat(presence_penalty=2.5),
    ),  # fmt: skip
    Row(
        "a frequency penalty that is a string",
        400,
        None,
        "frequency_penalty",
        body=chat(frequency_penalty="high"),
    ),  # fmt: skip
    Row("a logit bias", 422, "unsupported", "logit_bias", body=chat(logit_bias={"50256": -100})),
    Row(
        "the deprecated functions field",
        422,
        "unsupported",
        "functions",
        body=chat(functions=[ADD["function"]]),
    ),  # fmt: skip
    Row("store asked", 422, "unsupported", "store", body=chat(store=True)),
    # sampling and length
    Row("temperature is a string", 400, None, "temperature", body=chat(temperature="hot")),
    Row("temperature above 2", 400, None, "temperature", body=chat(temperature=3)),
    Row("top_p = 0", 400, None, "top_p", body=chat(top_p=0)),
    Row("seed is a string", 400, None, "seed", body=chat(seed="abc")),
    Row("max_tokens = 0", 400, None, "max_tokens", body=chat(max_tokens=0)),
    Row("max_tokens is not whole", 400, None, "max_tokens", body=chat(max_tokens=1.5)),
    Row("max_tokens over --max-tokens", 400, None, "max_tokens", body=chat(max_tokens=100000)),
    Row(
        "max_tokens and max_completion_tokens differ",
        400,
        None,
        "max_tokens",
        body=chat(max_completion_tokens=8),
    ),
    Row("stop is a number", 400, None, "stop", body=chat(stop=[1])),
    Row("more stop sequences than --max-stop", 400, None, "stop", body=chat(stop=list("abcde"))),
    Row("stream is a string", 400, None, "stream", body=chat(stream="yes")),
    Row(
        "stream_options without stream",
        400,
        None,
        "stream_options",
        body=chat(stream_options={"include_usage": True}),
    ),  # fmt: skip
    Row("an unknown field", 400, None, "frobnicate", body=chat(frobnicate=1)),
    # tools and structured output
    Row("tools is an object", 400, None, "tools", body=chat(tools=ADD)),
    Row(
        "a tool that is not a function",
        422,
        "unsupported",
        "tools",
        body=chat(tools=[tool(kind="retrieval")]),
    ),  # fmt: skip
    Row("a tool name with a space", 422, "unsupported", "tools", body=chat(tools=[tool("a b")])),
    Row("two tools with one name", 422, "unsupported", "tools", body=chat(tools=[ADD, ADD])),
    Row(
        "more tools than --max-tools",
        413,
        "too_many_tools",
        "tools",
        body=chat(tools=[tool(f"t{i}") for i in range(5)]),
    ),  # fmt: skip
    Row(
        "a tool schema over --max-schema-bytes",
        413,
        "schema_too_large",
        "tools[0].function.parameters",
        body=chat(tools=[tool(parameters=_BIG_SCHEMA)]),
    ),
    Row(
        "a tool schema the grammar cannot enforce (uniqueItems)",
        422,
        "unsupported",
        "tools",
        body=chat(
            tools=[
                tool(
                    parameters={
                        "type": "object",
                        "properties": {"xs": {"type": "array", "uniqueItems": True}},
                    }
                )
            ]
        ),
    ),  # fmt: skip
    Row(
        "tool_choice names no given tool",
        400,
        None,
        "tool_choice",
        body=chat(tools=[ADD], tool_choice={"type": "function", "function": {"name": "mul"}}),
    ),  # fmt: skip
    Row(
        "tool_choice required without tools",
        400,
        None,
        "tool_choice",
        body=chat(tool_choice="required"),
    ),  # fmt: skip
    Row(
        "parallel_tool_calls is a string",
        400,
        None,
        "parallel_tool_calls",
        body=chat(tools=[ADD], parallel_tool_calls="no"),
    ),  # fmt: skip
    Row(
        "response_format of an unknown type",
        400,
        None,
        "response_format.type",
        body=chat(response_format={"type": "xml"}),
    ),  # fmt: skip
    Row(
        "json_schema without its schema",
        422,
        "unsupported",
        "response_format",
        body=chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
    ),
    Row(
        "a schema with a look-ahead pattern",
        422,
        "unsupported",
        "response_format",
        body=chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?=a)b"}},
            }
        ),
    ),  # fmt: skip
    Row(
        "a tool schema with a lone surrogate",
        400,
        None,
        "tools[0].function.parameters",
        body=b'{"model": "ensemble", "messages": [{"role": "user", "content": "hi"}], "tools": '
        b'[{"type": "function", "function": {"name": "add", "parameters": {"type": "object", '
        b'"properties": {"a\\ud800": {"type": "integer"}}}}}]}',
    ),
    Row(
        "a response_format with a lone surrogate",
        400,
        None,
        "response_format",
        body=b'{"model": "ensemble", "messages": [{"role": "user", "content": "hi"}], '
        b'"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": '
        b'{"type": "string", "enum": ["\\ud800"]}}}}',
    ),
    Row(
        "a schema whose $ref only refers to itself",
        422,
        "unsupported",
        None,
        body=chat(
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {
                        "type": "object",
                        "properties": {"a": {"$ref": "#/$defs/x"}},
                        "required": ["a"],
                        "$defs": {"x": {"$ref": "#/$defs/x"}},
                    },
                },
            }
        ),
    ),
    Row(
        "a tool message without a tool_call_id",
        400,
        None,
        "messages[2].tool_call_id",
        body=chat(messages=[USER, _CALLED, {"role": "tool", "content": "12"}]),
    ),
    Row(
        "a tool message answering no call",
        400,
        None,
        "messages[2].tool_call_id",
        body=chat(
            messages=[USER, _CALLED, {"role": "tool", "tool_call_id": "c9", "content": "12"}]
        ),
    ),
    # the Responses API
    Row(
        "previous_response_id on a stateless server",
        400,
        "previous_response_not_found",
        "previous_response_id",
        body=response(previous_response_id="resp_123"),
        path=RESPONSES,
    ),
    Row(
        "a function_call_output answering no call",
        400,
        None,
        "input[0].call_id",
        body=response(input=[{"type": "function_call_output", "call_id": "c9", "output": "1"}]),
        path=RESPONSES,
    ),
    Row(
        "an input image",
        422,
        "unsupported",
        "input[0].content",
        body=response(input=[{"role": "user", "content": [{"type": "input_image"}]}]),
        path=RESPONSES,
    ),
    Row(
        "a built-in tool",
        422,
        "unsupported",
        "tools",
        body=response(tools=[{"type": "web_search"}]),
        path=RESPONSES,
    ),
    Row(
        "store asked of the Responses API",
        422,
        "unsupported",
        "store",
        body=response(store=True),
        path=RESPONSES,
    ),  # fmt: skip
    Row(
        "an unknown Responses field",
        400,
        None,
        "messages",
        body=response(messages=[USER]),
        path=RESPONSES,
    ),
    # completions
    Row(
        "a completion prompt of token ids",
        422,
        "unsupported",
        "prompt",
        body=completion(prompt=[1, 2, 3]),
        path=COMPLETIONS,
    ),  # fmt: skip
    Row(
        "a completion without a prompt",
        400,
        None,
        "prompt",
        body={"model": "ensemble"},
        path=COMPLETIONS,
    ),  # fmt: skip
    Row("echo asked", 422, "unsupported", "echo", body=completion(echo=True), path=COMPLETIONS),
    Row(
        "best_of = 2", 422, "unsupported", "best_of", body=completion(best_of=2), path=COMPLETIONS
    ),  # fmt: skip
    Row(
        "suffix asked", 422, "unsupported", "suffix", body=completion(suffix="!"), path=COMPLETIONS
    ),  # fmt: skip
    # routes and states
    Row("GET on the chat endpoint", 405, "method_not_allowed", None, method="GET"),
    Row("an unknown path", 404, "unknown_url", None, body=chat(), path="/v1/embeddings"),
    Row("the queue is full", 429, "queue_full", None, body=chat(), setup="busy"),
    Row("while the models load", 503, "loading", None, body=chat(), setup="loading"),
    Row("while draining after SIGTERM", 503, "draining", None, body=chat(), setup="draining"),
]


def markdown(rows: list[Row], answers: list[tuple[int, dict]]) -> str:
    """The table as the README shows it: each case with the status and error the server gave."""
    lines = [
        "| # | request | status | type | code | param | message |",
        "|---|---|---|---|---|---|---|",
    ]
    for number, (row, (status, body)) in enumerate(zip(rows, answers, strict=True), 1):
        error = body.get("error", {})
        message = str(error.get("message", "")).replace("|", "\\|").replace("\n", " ")
        cells = [error.get("type"), error.get("code"), error.get("param")]
        shown = " | ".join(f"`{c}`" if c else "" for c in cells)
        lines.append(f"| {number} | {row.case} | {status} | {shown} | {message} |")
    return "\n".join(lines)


class Servers:
    """The servers the rows go to, over one loaded ensemble (at most one request at a time, no
    queue, so a single slow request makes the next one a 429)."""

    def __init__(self, ensemble) -> None:
        self.ensemble = ensemble
        self._stack = contextlib.ExitStack()
        self.url, _ = self._stack.enter_context(
            running_server(lambda: ensemble, api_keys=(KEY,), limits=Limits(**LIMITS))
        )

    def close(self) -> None:
        self._stack.close()

    def answer(self, row: Row) -> tuple[int, dict, httpx.Headers]:
        """The status, JSON body and headers the server answers `row` with."""
        if row.setup in ("keyless", "loading", "draining"):
            with self._keyless(row.setup) as url:
                return _send(url, row, key=None)
        if row.setup == "busy":
            with self._busy():
                return _send(self.url, row, key=KEY)
        return _send(self.url, row, key=KEY)

    @contextlib.contextmanager
    def _keyless(self, state: str) -> Iterator[str]:
        loaded = threading.Event()

        def load():
            loaded.wait(60)
            return self.ensemble

        if state != "loading":
            loaded.set()
        try:
            with running_server(load, ready=state != "loading") as (url, app):
                if state == "draining":
                    app.drain()
                yield url
        finally:
            loaded.set()

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        """The one slot held by a slow streaming request until the block ends."""
        hook = self.ensemble.members[0].model.register_forward_pre_hook(lambda *_: time.sleep(0.02))
        holding = threading.Event()
        release = threading.Event()

        def hold() -> None:
            body = chat(max_tokens=200, response_format={"type": "json_object"}, stream=True)
            headers = {"authorization": f"Bearer {KEY}"}
            with httpx.stream("POST", self.url + CHAT, json=body, headers=headers, timeout=60) as r:
                for _ in r.iter_lines():
                    holding.set()
                    if release.is_set():
                        break

        thread = threading.Thread(target=hold, daemon=True)
        thread.start()
        try:
            holding.wait(60)
            yield
        finally:
            release.set()
            thread.join(60)
            hook.remove()
            deadline = time.monotonic() + 60
            while self.ensemble.admission.running and time.monotonic() < deadline:
                time.sleep(0.01)


def _send(url: str, row: Row, key: str | None) -> tuple[int, dict, httpx.Headers]:
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    headers.update(row.headers)
    headers = {k: v for k, v in headers.items() if v}
    response = httpx.request(
        row.method, url + row.path, content=row.content(), headers=headers, timeout=120
    )
    return response.status_code, response.json(), response.headers
