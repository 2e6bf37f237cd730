"""Messages in, one prompt string per member: each member renders with ITS OWN chat template.

Real templates differ in what they accept (Gemma rejects a system role, Mistral insists that
roles alternate, few know a `tool` role), so messages are first normalised (roles checked,
consecutive same-role messages merged; an optional `name` is kept and passed to the template,
which renders or ignores it) and a template that refuses a system or tool message gets
it folded into a user turn instead of failing the request.

Tool use follows the same idea. Each member gets the tools through its own template
(`apply_chat_template(..., tools=...)`) where the template renders them, and as a system block
(the tools' JSON) where it ignores them; either way the same short instruction states the one
canonical call syntax of `core.tool_calls`. Past calls and tool results go to a template natively
when it knows tool calls; otherwise the calls become their canonical text in the assistant turn
and each result a `<tool_response>` block in a user turn. The instruction texts live here, in
one place, because the testbed models are trained on exactly this rendering.

A member's prompt ids come from `prompt_ids`: only the template's own markup becomes control
tokens, so text in a message that spells `<|im_end|>` stays that text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .errors import ChatTemplateError, InvalidConfigError, InvalidMessagesError
from .tool_calls import MAX_ARGUMENT_DEPTH, format_tool_call, format_tool_calls
from .tools import ToolSpec
from .validate import json_depth

ROLES = ("system", "user", "assistant", "tool")
_ROLE_ALIASES = {"human": "user", "ai": "assistant", "model": "assistant", "function": "tool"}

Message = dict[str, Any]  # role, content[, name][, tool_calls (assistant)][, tool_call_id (tool)]

# --------------------------------------------------------------------------- instruction texts

TOOLS_INSTRUCTION = "To call a tool, reply with the call in this form:\n" + format_tool_call(
    "tool_name", {"argument": "value"}
)
TOOLS_HEADER = "You can use these tools:"
RESPONSE_FORMAT_INSTRUCTION = "Write the final answer as JSON only, following this JSON schema:"
TOOL_RESPONSE_OPEN = "<tool_response>\n"
TOOL_RESPONSE_CLOSE = "\n</tool_response>"
TOOL_RESPONSE_SEPARATOR = "\n"  # between consecutive results folded into one user turn


def tools_system_block(tools: Sequence[ToolSpec]) -> str:
    """What a member whose template ignores `tools` reads: one JSON line per tool (the function
    part of its OpenAI spec), then the call instruction."""
    lines = [json.dumps(tool.to_openai()["function"], ensure_ascii=False) for tool in tools]
    return "\n".join([TOOLS_HEADER, *lines]) + "\n\n" + TOOLS_INSTRUCTION


def response_format_instruction(schema: Mapping[str, Any]) -> str:
    """The request for a JSON reply, with the schema on one line."""
    return f"{RESPONSE_FORMAT_INSTRUCTION}\n{json.dumps(schema, ensure_ascii=False)}"


def tool_response_text(content: str) -> str:
    """One tool result as a template without a tool role reads it (the Qwen/Hermes wrapping)."""
    return f"{TOOL_RESPONSE_OPEN}{content}{TOOL_RESPONSE_CLOSE}"


# --------------------------------------------------------------------------- normalisation


def _utf8(text: str, what: str) -> str:
    """Tokenizers crash on text that has no UTF-8 form (a lone surrogate): say so here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidMessagesError(
            f"{what} cannot be encoded as UTF-8: {text[error.start]!r} at position "
            f"{error.start} is a lone surrogate. Decode the source text properly, or replace such "
            "characters, e.g. text.encode('utf-8', 'replace').decode('utf-8')."
        ) from None
    return text


def _content_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return _utf8(content, f"message {index}'s content")
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
        return _utf8("".join(parts), f"message {index}'s content")
    raise InvalidMessagesError(
        f"message {index} has content of type {type(content).__name__}; pass a string."
    )


_CALL_SHAPE = (
    "write each call as {'id': 'call_1', 'type': 'function', 'function': {'name': 'add', "
    "'arguments': {'a': 1}}} (arguments a dict or a JSON object string)"
)


def _tool_calls(raw: Any, index: int) -> list[dict[str, Any]]:
    """An assistant message's calls, OpenAI style, arguments parsed to a dict (templates write
    them with `tojson`, so a string would be encoded twice)."""
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise InvalidMessagesError(
            f"message {index} has tool_calls of type {type(raw).__name__}; pass a list: "
            f"{_CALL_SHAPE}."
        )
    calls = []
    for k, call in enumerate(raw):
        where = f"message {index}'s tool call {k}"
        function = call.get("function") if isinstance(call, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            raise InvalidMessagesError(f"{where} has no function name; {_CALL_SHAPE}.")
        if call.get("type", "function") != "function":
            raise InvalidMessagesError(
                f"{where} has type {call['type']!r}; only 'function' calls exist: {_CALL_SHAPE}."
            )
        arguments = function.get("arguments")
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            arguments = {}
        elif isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError) as error:  # too deep, or too many digits too
                raise InvalidMessagesError(
                    f"{where} ({name!r}) has arguments that are not valid JSON ({error}); "
                    f"{_CALL_SHAPE}."
                ) from None
        if not isinstance(arguments, Mapping):
            raise InvalidMessagesError(
                f"{where} ({name!r}) has arguments {arguments!r}; they must be a JSON object "
                f"(a dict): {_CALL_SHAPE}."
            )
        if json_depth(arguments) > MAX_ARGUMENT_DEPTH:
            raise InvalidMessagesError(
                f"{where} ({name!r}) has arguments nested {json_depth(arguments)} levels deep; "
                f"at most {MAX_ARGUMENT_DEPTH} are read."
            )
        try:
            _utf8(name + json.dumps(arguments, ensure_ascii=False), where)
        except TypeError as error:
            raise InvalidMessagesError(
                f"{where} ({name!r}) has arguments that are not JSON data ({error}); {_CALL_SHAPE}."
            ) from None
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise InvalidMessagesError(f"{where} has id {call_id!r}; pass a string id or none.")
        entry: dict[str, Any] = {"id": call_id} if call_id is not None else {}
        entry.update(type="function", function={"name": name, "arguments": dict(arguments)})
        calls.append(entry)
    return calls


def _one_message(message: Any, index: int) -> Message:
    if not isinstance(message, Mapping) or "role" not in message:
        raise InvalidMessagesError(
            f"message {index} is {message!r}; each message must be a dict with 'role' and "
            "'content' keys."
        )
    role = _ROLE_ALIASES.get(str(message["role"]), str(message["role"]))
    if role not in ROLES:
        raise InvalidMessagesError(
            f"message {index} has unknown role {message['role']!r}; use one of {', '.join(ROLES)}."
        )
    raw_calls = message.get("tool_calls") if role == "assistant" else None
    calls = _tool_calls(raw_calls, index) if raw_calls else []
    content = message.get("content", "")
    content = _content_text("" if content is None and calls else content, index)
    out: Message = {"role": role, "content": content}
    name = message.get("name")  # a speaker name: passed on, each template decides
    if isinstance(name, str) and name:
        out["name"] = _utf8(name, f"message {index}'s name")
    if calls:
        out["tool_calls"] = calls
    call_id = message.get("tool_call_id") if role == "tool" else None
    if call_id is not None:
        if not isinstance(call_id, str):
            raise InvalidMessagesError(
                f"message {index} has tool_call_id {call_id!r}; pass the id (a string) of the "
                "call this result answers."
            )
        out["tool_call_id"] = call_id
    return out


def _merge(previous: Message, message: Message) -> Message:
    merged: Message = {
        "role": message["role"],
        "content": f"{previous['content']}\n\n{message['content']}",
    }
    name = message.get("name")
    if name and previous.get("name") == name:  # merged turns keep only a shared name
        merged["name"] = name
    calls = previous.get("tool_calls", []) + message.get("tool_calls", [])
    if calls:
        merged["tool_calls"] = calls
    return merged


def normalize_messages(messages: str | Sequence[Mapping[str, Any]]) -> list[Message]:
    """Validate roles, content and tool calls; merge consecutive messages of the same role,
    except tool results, which stay one message each (each answers its own call). A tool
    result that names no tool is given the name of the call it answers (by `tool_call_id`)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not messages:
        raise InvalidMessagesError(
            "messages is empty; pass at least one message, e.g. "
            "[{'role': 'user', 'content': 'Hello'}] or a plain string."
        )
    out: list[Message] = []
    tool_names: dict[str, str] = {}  # call id -> its tool, for a result that names no tool
    for index, raw in enumerate(messages):
        message = _one_message(raw, index)
        for call in message.get("tool_calls", ()):
            if call.get("id"):
                tool_names[call["id"]] = call["function"]["name"]
        if message["role"] == "tool" and not message.get("name"):
            name = tool_names.get(message.get("tool_call_id") or "")
            if name:
                message = {**message, "name": name}
        if out and out[-1]["role"] == message["role"] != "tool":
            out[-1] = _merge(out[-1], message)
        else:
            out.append(message)
    return out


# --------------------------------------------------------------------------- fallbacks


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


def tool_use_as_text(messages: list[Message]) -> list[Message]:
    """For templates that know no tool calls: each call as its canonical text in the assistant
    turn, and each run of tool results as one user turn of `<tool_response>` blocks."""
    out: list[Message] = []
    in_results = False  # the last turn of `out` holds tool results
    for m in messages:
        if m["role"] == "tool":
            block = tool_response_text(m["content"])
            if in_results:
                out[-1] = {
                    "role": "user",
                    "content": out[-1]["content"] + TOOL_RESPONSE_SEPARATOR + block,
                }
            else:
                out.append({"role": "user", "content": block})
            in_results = True
            continue
        in_results = False
        if m.get("tool_calls"):
            calls = format_tool_calls(
                [(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
            )
            text = f"{m['content']}\n{calls}" if m["content"] else calls
            out.append({k: v for k, v in m.items() if k != "tool_calls"} | {"content": text})
        else:
            out.append(m)
    return normalize_messages(out)


def _starts_with_user(messages: list[Message]) -> list[Message]:
    """Templates that demand alternation starting with a user turn get an empty user turn."""
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), None)
    if first is not None and messages[first]["role"] == "assistant":
        return [*messages[:first], {"role": "user", "content": ""}, *messages[first:]]
    return messages


def _with_system_text(messages: list[Message], text: str) -> list[Message]:
    """`text` appended to the leading system message (or as one); folding places it later."""
    if messages[0]["role"] == "system":
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{text}" if first["content"] else text
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


# --------------------------------------------------------------------------- tools and schemas


_PROBE_CALL = {"name": "probe_tool", "arguments": {"probe_argument": "probe-value"}}
_PROBE = [
    {"role": "user", "content": "probe-question"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "probe-id", "type": "function", "function": _PROBE_CALL}],
    },
    {"role": "tool", "content": "probe-result", "tool_call_id": "probe-id", "name": "probe_tool"},
]


def knows_tool_calls(tokenizer) -> bool:
    """Whether the template writes an assistant's `tool_calls` and a `tool` result: one that
    drops them (a generic ChatML template) or raises on them gets `tool_use_as_text`."""
    try:
        text = tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
    except Exception:  # jinja raise_exception / TemplateError
        return False
    return all(s in text for s in ("probe_tool", "probe-value", "probe-result"))


def _has_tool_use(messages: list[Message]) -> bool:
    return any(m["role"] == "tool" or m.get("tool_calls") for m in messages)


# --------------------------------------------------------------------------- rendering


def _render(tokenizer, messages: list[Message], member: str, tools: list | None = None) -> str:
    return _fitted(tokenizer, messages, member, tools)[1]


def _fitted(
    tokenizer, messages: list[Message], member: str, tools: list | None = None
) -> tuple[list[Message], str]:
    """The first form of the messages the template accepts, and its rendering."""
    attempts = [messages]
    for fix in (_fold_system, tool_use_as_text, _starts_with_user):
        attempts.append(fix(attempts[-1]))
    first_error: Exception | None = None
    for attempt in attempts:
        try:
            return attempt, tokenizer.apply_chat_template(
                attempt, tools=tools, tokenize=False, add_generation_prompt=True
            )
        except Exception as error:  # jinja raise_exception / TemplateError: try the next form
            first_error = first_error or error
    raise ChatTemplateError(
        f"member {member!r}'s chat template rejected these messages ({first_error}); even with "
        "system and tool messages folded into user turns it failed. Check the roles and order "
        "of the messages."
    )


def _prepared(
    tokenizer,
    messages: list[Message],
    member: str,
    tools: Sequence[ToolSpec],
    response_format: Mapping[str, Any] | None,
) -> tuple[list[Message], list[dict[str, Any]] | None]:
    """The messages with the tool and answer instructions added, and the tools to hand the
    template as OpenAI-style dicts (None where it does not render them: they are in the system
    text then)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            f"member {member!r} has no chat template (a base model, or a GGUF file whose "
            "metadata holds none); give it one: Local(path, chat_template=<Jinja text or a "
            "file>, stop=[<its end-of-turn marker>]), or chat_template.jinja in its model "
            "directory. To send text as it is, with no template: raw_prompt=True."
        )
    specs = [tool.to_openai() for tool in tools]
    if _has_tool_use(messages) and not knows_tool_calls(tokenizer):
        messages = tool_use_as_text(messages)
    native = bool(specs) and _render(tokenizer, messages, member, specs) != _render(
        tokenizer, messages, member
    )
    extra = []
    if specs:
        extra.append(TOOLS_INSTRUCTION if native else tools_system_block(tools))
    if response_format is not None:
        extra.append(response_format_instruction(response_format))
    if extra:
        messages = _with_system_text(messages, "\n\n".join(extra))
    return messages, specs if native else None


def render_prompt(
    tokenizer,
    messages: list[Message],
    member: str,
    tools: Sequence[ToolSpec] = (),
    response_format: Mapping[str, Any] | None = None,
) -> str:
    """The member's prompt text, ending with its assistant header (generation prompt).

    `tools` and `response_format` (a JSON schema the reply should follow) as
    `GenerationConfig` checked them: the template gets the tools as OpenAI-style dicts."""
    messages, native_tools = _prepared(tokenizer, messages, member, tools, response_format)
    return _render(tokenizer, messages, member, native_tools)


def prompt_ids(
    tokenizer,
    messages: list[Message],
    member: str,
    tools: Sequence[ToolSpec] = (),
    response_format: Mapping[str, Any] | None = None,
) -> list[int]:
    """The member's prompt as token ids (the text `render_prompt` gives), where only the chat
    template's own markup becomes control tokens.

    A control token's text inside a message, a tool or a schema (a tool result or a retrieved
    document holding `<|im_end|><|im_start|>user`) is encoded as plain text, so it cannot end a
    turn or open one. This is transformers' `sanitize_control_tokens`: the tokenizer's special
    tokens, and the added tokens the template itself writes (Qwen's `<tool_call>`), are marked
    in every string value before rendering and encoded as text after. Dict keys are not
    marked, so a key holding a control token is refused here."""
    messages, native_tools = _prepared(tokenizer, messages, member, tools, response_format)
    messages, _ = _fitted(tokenizer, messages, member, native_tools)
    _check_keys(tokenizer, member, messages, native_tools)
    try:
        return list(
            tokenizer.apply_chat_template(
                messages,
                tools=native_tools,
                tokenize=True,
                sanitize_control_tokens=True,
                return_dict=False,
                add_generation_prompt=True,
            )
        )
    except ValueError as error:  # a control token the vocabulary also spells from plain text
        raise ChatTemplateError(
            f"member {member!r}: the messages hold text its tokenizer cannot keep apart from "
            f"its chat template's control tokens ({error}); remove that text from the messages."
        ) from None


def _keys(value: Any) -> Iterator[str]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key)
            yield from _keys(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _keys(item)


def _check_keys(tokenizer, member: str, messages: list[Message], tools: list | None) -> None:
    """Refuse a dict key (a tool call's argument name, a tool's parameter name) holding a
    control token (a special token, or an added token the template writes): keys reach the
    template as they are, unmarked."""
    template = str(tokenizer.chat_template)
    control = [
        t.content
        for t in tokenizer.added_tokens_decoder.values()
        if t.content.strip() and (t.special or t.content in template)
    ]
    arguments = [c["function"]["arguments"] for m in messages for c in m.get("tool_calls", ())]
    for what, value, error in (
        ("a tool call's arguments", arguments, InvalidMessagesError),
        ("a tool's parameters", tools, InvalidConfigError),
    ):
        for key in _keys(value):
            token = next((t for t in control if t in key), None)
            if token is not None:
                raise error(
                    f"{what} use the key {key!r}, which holds {token!r}, a control token of "
                    f"member {member!r}'s tokenizer; rename the key."
                )


# --------------------------------------------------------------------------- raw prompts


def raw_prompt_text(prompt: Any) -> str:
    """The prompt of a `raw_prompt=True` request: one non-empty string, as every member reads
    it."""
    if not isinstance(prompt, str):
        raise InvalidMessagesError(
            f"raw_prompt=True takes the prompt as one string (the exact text every member "
            f"reads), got {type(prompt).__name__}; pass the text, or messages with "
            "raw_prompt=False."
        )
    if not prompt:
        raise InvalidMessagesError(
            "the raw prompt is empty; a model needs at least one token to continue from."
        )
    return _utf8(prompt, "the raw prompt")


def raw_prompt_ids(tokenizer, text: str) -> list[int]:
    """A raw prompt's ids: the text as the tokenizer reads a plain prompt, with no chat
    template, its BOS token added where the tokenizer adds one (once, also when the text
    spells it). Control-token text is read as those tokens: markup in a raw prompt is the
    caller's own, as in a completions API."""
    ids = list(tokenizer(text)["input_ids"])
    bos = tokenizer.bos_token_id
    if bos is not None and len(ids) > 1 and ids[0] == ids[1] == bos:
        ids = ids[1:]
    return ids
