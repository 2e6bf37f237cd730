"""A real server on a free loopback port, in a thread of the test process, over a given
ensemble (the tests compare its answers with the same ensemble called in process)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import httpx

from core.config import GenerationConfig, Output
from core.serve.runner import serve_in_thread
from core.serve.settings import ServeSettings


@contextlib.contextmanager
def running_server(load, ready: bool = True, **settings) -> Iterator[tuple[str, object]]:
    """Yields the server's base URL (".../v1" not included) and its app, once it listens (and,
    when `ready`, once `load` has returned)."""
    settings.setdefault("log_level", "warning")
    with serve_in_thread(ServeSettings(**settings), load, ready) as (url, app):
        yield url, app


class Bodies:
    """Every JSON body a client sent, read by httpx request hooks (sync and async clients)."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    def _record(self, request) -> None:
        if request.method == "POST":
            self.sent.append(json.loads(request.content))

    async def _arecord(self, request) -> None:
        self._record(request)

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"request": [self._record]}, timeout=120)

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(event_hooks={"request": [self._arecord]}, timeout=120)

    @property
    def last(self) -> dict:
        return self.sent[-1]


def reference(ensemble, body: dict, default_max_tokens: int = 2048) -> Output:
    """What the ensemble writes in process for the request `body` (an OpenAI chat or completion
    body as a client sent it), read field by field here, independently of the server."""
    if "messages" in body:
        messages = [
            {**m, "role": "system" if m["role"] == "developer" else m["role"]}
            for m in body["messages"]
        ]
    else:  # /v1/completions: the prompt is raw text, read with no chat template
        messages = body["prompt"]
    stop = body.get("stop") or ()
    config = GenerationConfig(
        max_new_tokens=body.get("max_completion_tokens")
        or body.get("max_tokens")
        or (default_max_tokens if "messages" in body else 16),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        temperature=body.get("temperature") or 0.0,
        top_p=body.get("top_p") or 1.0,
        seed=body.get("seed"),
        tools=tuple(body.get("tools") or ()),
        tool_choice=body.get("tool_choice") or "auto",
        parallel_tool_calls=body.get("parallel_tool_calls", True),
        response_format=body.get("response_format"),
        raw_prompt="messages" not in body,
        frequency_penalty=body.get("frequency_penalty") or 0.0,
        presence_penalty=body.get("presence_penalty") or 0.0,
    )
    return ensemble.generate(messages, config)


def calls_of(output: Output) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in output.tool_calls]


def responses_reference(ensemble, body: dict, default_max_tokens: int = 2048) -> Output:
    """What the ensemble writes in process for the Responses API request `body`, read field by
    field here: `instructions` as the system message, message items as messages, function
    calls as the assistant's tool calls, their outputs as tool messages."""
    messages = (
        [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    )
    given = body["input"]
    for item in [{"role": "user", "content": given}] if isinstance(given, str) else given:
        kind = item.get("type", "message")
        if kind == "message":
            content = item["content"]
            if isinstance(content, list):
                content = "".join(part["text"] for part in content)
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": content})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}  # fmt: skip
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
    choice = body.get("tool_choice") or "auto"
    if isinstance(choice, dict):
        choice = choice["name"]
    fmt = (body.get("text") or {}).get("format")
    if fmt and fmt["type"] == "json_schema":
        fmt = {"type": "json_schema", "json_schema": {"name": fmt["name"], "schema": fmt["schema"]}}
    config = GenerationConfig(
        max_new_tokens=body.get("max_output_tokens") or default_max_tokens,
        temperature=body.get("temperature") or 0.0,
        top_p=body.get("top_p") or 1.0,
        tools=tuple({k: v for k, v in t.items() if k != "strict"} for t in body.get("tools") or ()),
        tool_choice=choice,
        parallel_tool_calls=body.get("parallel_tool_calls", True),
        response_format=fmt,
    )
    return ensemble.generate(messages, config)
