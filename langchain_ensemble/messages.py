"""LangChain messages -> the engine's role/content dicts (pure functions, no state).

Only the role mapping happens here. Everything template-related happens in the core, once per
member with ITS OWN chat template: consecutive same-role messages are merged, a system message is
folded into the first user turn where a template rejects the system role, a tool result becomes
a user turn where a template knows no `tool` role, and no trailing human message is required.
A message's `name` is passed on; each template renders it or ignores it.
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


def to_engine_message(message: BaseMessage) -> dict[str, Any]:
    """One message as {"role", "content"[, "name"]}.

    An AI message contributes its text only (reasoning or tool-call blocks are not part of what
    the members are prompted with); other messages keep their content as given, so the core
    rejects non-text parts (images, files) with a clear error instead of dropping them."""
    role = message_role(message)
    content = message.text if role == "assistant" else message.content
    out: dict[str, Any] = {"role": role, "content": content}
    if message.name:
        out["name"] = message.name
    return out


def to_engine_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    return [to_engine_message(m) for m in messages]
