"""LlamaIndex messages -> the core's plain messages, which each member renders with its OWN chat
template (never LlamaIndex's generic `messages_to_prompt` flattening).

Role folding that templates need (system into user, tool into user, same-role merging) is done
by the core for every adapter; here we only map roles and keep the text of each message.
"""

from __future__ import annotations

from collections.abc import Sequence

from llama_index.core.base.llms.types import (
    ChatMessage,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)

from core import InvalidMessagesError

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
# Blocks a text-only model can do without: its own earlier reasoning and structured tool calls
# (a ReAct agent writes its tool calls into the text).
_SKIPPED = (ThinkingBlock, ToolCallBlock)


def _text(message: ChatMessage, index: int) -> str:
    parts = []
    for block in message.blocks:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif not isinstance(block, _SKIPPED):
            raise InvalidMessagesError(
                f"message {index} has a {type(block).__name__}; the ensemble's models read text "
                "only, so pass text content (TextBlock) or describe the file in words."
            )
    return "\n".join(parts)  # as ChatMessage.content joins text blocks


def to_core_messages(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, ChatMessage):  # LlamaIndex accepts dicts in its events too
            message = ChatMessage.model_validate(message)
        out.append({"role": _ROLES[MessageRole(message.role)], "content": _text(message, index)})
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
