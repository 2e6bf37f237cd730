"""LangChain messages -> the engine's role/content dicts (pure functions, no state).

Only the role mapping happens here, plus the tool calls an AI message made and the call a tool
result answers, in the engine's OpenAI-style form. Everything template-related happens in the
core, once per member with ITS OWN chat template: consecutive same-role messages are merged, a
system message is folded into the first user turn where a template rejects the system role, a
tool result becomes a user turn where a template knows no `tool` role, and no trailing human
message is required. A message's `name` is passed on; each template renders it or ignores it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from core.errors import InvalidMessagesError

# ChatMessage roles other frameworks use, in the engine's vocabulary (the core knows the rest).
_CHAT_ROLES = {"developer": "system", "model": "assistant", "bot": "assistant"}


def message_role(message: BaseMessage) -> str:
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, HumanMessage):
        return "user"
    if isinstance(message, AIMessage):
        return "assistant"
    if isinstance(message, (ToolMessage, FunctionMessage)):
        return "tool"
    if isinstance(message, ChatMessage):
        return _CHAT_ROLES.get(message.role, message.role)
    raise InvalidMessagesError(
        f"cannot send a {type(message).__name__} to the ensemble; use SystemMessage, "
        "HumanMessage, AIMessage, ToolMessage or ChatMessage."
    )


def _calls_made(message: AIMessage) -> list[tuple[str | None, str, Any]]:
    """(id, name, args) of the calls an AI message made: its parsed `tool_calls`, or else the
    `tool_use` blocks of Anthropic-style list content (a message built without parsing them)."""
    if message.tool_calls:
        return [(call.get("id"), call["name"], call["args"]) for call in message.tool_calls]
    if not isinstance(message.content, list):
        return []
    return [
        (block.get("id"), block["name"], block.get("input", {}))
        for block in message.content
        if isinstance(block, dict) and block.get("type") == "tool_use" and "name" in block
    ]


def core_tool_call(call_id: str | None, name: str, args: Any) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
    return {"id": call_id, **call} if call_id else call


def to_core_message(message: BaseMessage) -> dict[str, Any]:
    """One message as {"role", "content"[, "name"][, "tool_calls" | "tool_call_id"]}.

    An AI message contributes its text and its tool calls (reasoning blocks are not part of
    what the members are prompted with); other messages keep their content as given, so the
    core rejects non-text parts (images, files) with a clear error instead of dropping them.
    (A tool result without a name gets its call's tool from the core.)
    """
    role = message_role(message)
    content = message.text if role == "assistant" else message.content
    out: dict[str, Any] = {"role": role, "content": content}
    if message.name:
        out["name"] = message.name
    if isinstance(message, AIMessage):
        calls = _calls_made(message)
        if calls:
            out["tool_calls"] = [core_tool_call(*call) for call in calls]
    elif isinstance(message, ToolMessage):
        out["tool_call_id"] = message.tool_call_id
    return out


def to_core_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    return [to_core_message(m) for m in messages]
