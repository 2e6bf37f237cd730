"""LlamaIndex messages -> the core's plain messages, which each member renders with its OWN chat
template (never LlamaIndex's generic `messages_to_prompt` flattening).

Role folding that templates need (system into user, tool into user, same-role merging) is done
by the core for every adapter; here we only map roles, keep the text of each message, and carry
tool calls: an assistant message's `ToolCallBlock`s become its `tool_calls`, and a tool result
keeps the id of the call it answers (`additional_kwargs["tool_call_id"]`, as `FunctionAgent`
writes it) and the tool's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)

from core import InvalidMessagesError

from .tools import core_tool_call

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}
# Blocks that are not part of the text: the model's own earlier reasoning, and tool calls
# (carried as the message's `tool_calls`, or written into the text by a ReAct agent).
_NOT_TEXT = (ThinkingBlock, ToolCallBlock)


def _text(message: ChatMessage, index: int) -> str:
    parts = []
    for block in message.blocks:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif not isinstance(block, _NOT_TEXT):
            raise InvalidMessagesError(
                f"message {index} has a {type(block).__name__}; the ensemble's models read text "
                "only, so pass text content (TextBlock) or describe the file in words."
            )
    return "\n".join(parts)  # as ChatMessage.content joins text blocks


def to_core_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, ChatMessage):  # LlamaIndex accepts dicts in its events too
            message = ChatMessage.model_validate(message)
        role = _ROLES[MessageRole(message.role)]
        core: dict[str, Any] = {"role": role, "content": _text(message, index)}
        calls = [b for b in message.blocks if isinstance(b, ToolCallBlock)]
        if role == "assistant" and calls:
            core["tool_calls"] = [core_tool_call(block) for block in calls]
        call_id = message.additional_kwargs.get("tool_call_id")
        if role == "tool" and isinstance(call_id, str):
            core["tool_call_id"] = call_id  # (the core names the tool from its call)
            name = message.additional_kwargs.get("name")
            if isinstance(name, str) and name:
                core["name"] = name
        out.append(core)
    return out


def completion_messages(prompt: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    """A completion prompt is one user turn (plus the LLM's system prompt), so `complete` and
    `stream_complete` see exactly what `chat` would with the same text."""
    if not isinstance(prompt, str):
        raise InvalidMessagesError(
            f"complete() takes a prompt string, got {type(prompt).__name__}; use chat() for "
            "a list of messages."
        )
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, {"role": "user", "content": prompt}]
