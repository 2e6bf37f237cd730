"""Messages in, one prompt string per member: each member renders with ITS OWN chat template.

Real templates differ in what they accept (Gemma rejects a system role, Mistral insists that
roles alternate, few know a `tool` role), so messages are first normalised (roles checked,
consecutive same-role messages merged; an optional `name` is kept and passed to the template,
which renders or ignores it) and a template that refuses a system or tool message gets
it folded into a user turn instead of failing the request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ChatTemplateError, InvalidMessagesError

ROLES = ("system", "user", "assistant", "tool")
_ROLE_ALIASES = {"human": "user", "ai": "assistant", "model": "assistant", "function": "tool"}

Message = dict[str, str]


def _content_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # OpenAI-style content parts: keep the text ones
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                raise InvalidMessagesError(
                    f"message {index} has a non-text content part {part!r}; these models read "
                    "text only, so pass plain strings or {'type': 'text', 'text': ...} parts."
                )
        return "".join(parts)
    raise InvalidMessagesError(
        f"message {index} has content of type {type(content).__name__}; pass a string."
    )


def normalize_messages(messages: str | Sequence[Mapping[str, Any]]) -> list[Message]:
    """Validate roles and content, and merge consecutive messages of the same role."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not messages:
        raise InvalidMessagesError(
            "messages is empty; pass at least one message, e.g. "
            "[{'role': 'user', 'content': 'Hello'}] or a plain string."
        )
    out: list[Message] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise InvalidMessagesError(
                f"message {index} is {message!r}; each message must be a dict with 'role' and "
                "'content' keys."
            )
        role = _ROLE_ALIASES.get(str(message["role"]), str(message["role"]))
        if role not in ROLES:
            raise InvalidMessagesError(
                f"message {index} has unknown role {message['role']!r}; use one of "
                f"{', '.join(ROLES)}."
            )
        content = _content_text(message.get("content", ""), index)
        name = message.get("name")  # a speaker name: passed on, each template decides
        name = name if isinstance(name, str) else None
        if out and out[-1]["role"] == role:
            merged = {"role": role, "content": f"{out[-1]['content']}\n\n{content}"}
            if name and out[-1].get("name") == name:  # merged turns keep only a shared name
                merged["name"] = name
            out[-1] = merged
        else:
            out.append({"role": role, "content": content, **({"name": name} if name else {})})
    return out


def _fold_system(messages: list[Message]) -> list[Message]:
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if not system:
        return rest
    for m in rest:
        if m["role"] == "user":
            m["content"] = f"{system}\n\n{m['content']}"
            return rest
    return [{"role": "user", "content": system}, *rest]


def _tools_as_user(messages: list[Message]) -> list[Message]:
    mapped = [
        {"role": "user", "content": m["content"]} if m["role"] == "tool" else m for m in messages
    ]
    return normalize_messages(mapped)


def _starts_with_user(messages: list[Message]) -> list[Message]:
    """Templates that demand alternation starting with a user turn get an empty user turn."""
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), None)
    if first is not None and messages[first]["role"] == "assistant":
        return [*messages[:first], {"role": "user", "content": ""}, *messages[first:]]
    return messages


def render_prompt(tokenizer, messages: list[Message], member: str) -> str:
    """The member's prompt text, ending with its assistant header (generation prompt)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            f"member {member!r} has no chat template; use a chat/instruct model, or give the "
            "model directory one (chat_template.jinja, or 'chat_template' in "
            "tokenizer_config.json)."
        )
    attempts = [messages]
    for fix in (_fold_system, _tools_as_user, _starts_with_user):
        attempts.append(fix(attempts[-1]))
    first_error: Exception | None = None
    for attempt in attempts:
        try:
            return tokenizer.apply_chat_template(
                attempt, tokenize=False, add_generation_prompt=True
            )
        except Exception as error:  # jinja raise_exception / TemplateError: try the next form
            first_error = first_error or error
    raise ChatTemplateError(
        f"member {member!r}'s chat template rejected these messages ({first_error}); even with "
        "system and tool messages folded into user turns it failed. Check the roles and order "
        "of the messages."
    )
