"""The one tool-call syntax of the shared response text, whatever the members' families.

Members of different families do not agree on how to write a tool call (Qwen: tags around JSON,
Llama 3: bare JSON with "parameters", Phi-3 and Gemma: none), so ensembling their text naively
would mix formats. The ensemble's text uses one canonical form, the most common trained one
(Hermes / Qwen style), one call per region, regions separated by a newline:

    <tool_call>
    {"name": "add", "arguments": {"a": 7, "b": 5}}
    </tool_call>

The JSON is written as `json.dumps` writes it (", " and ": " separators, non-ASCII kept), so the
grammar, the prompts that teach the form and the parser agree byte for byte.
"""

from __future__ import annotations

import json
from typing import Any

TOOL_CALL_OPEN = "<tool_call>\n"
TOOL_CALL_CLOSE = "\n</tool_call>"
TOOL_CALL_SEPARATOR = "\n"  # between two calls of one turn


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The canonical text of one call."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"


def format_tool_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The canonical text of several calls of one assistant turn."""
    return TOOL_CALL_SEPARATOR.join(format_tool_call(name, args) for name, args in calls)
