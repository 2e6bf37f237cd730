"""LlamaIndex tools and tool calls <-> the engine's (pure functions, no state).

LlamaIndex tools describe themselves as OpenAI tool dicts (`tool.metadata.to_openai_tool()`),
which the core turns into checked `ToolSpec`s (`core.tools.tool_spec`), once. A call the engine
made becomes a `ToolCallBlock` in the assistant message (what `FunctionAgent` keeps in its
history) and a `ToolSelection` for `get_tool_calls_from_response`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatResponse, ToolCallBlock
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.tools.types import BaseTool

from core.errors import InvalidConfigError
from core.tool_calls import ToolCall
from core.tools import ToolSpec, tool_spec


def tool_specs(tools: Any) -> tuple[ToolSpec, ...]:
    """`BaseTool`s, OpenAI tool dicts and specs already made, each as a checked `ToolSpec`."""
    if isinstance(tools, (str, bytes, dict)) or not isinstance(tools, Sequence):
        raise InvalidConfigError(
            f"tools must be a list of LlamaIndex tools or OpenAI tool dicts, not a "
            f"{type(tools).__name__}; wrap a single tool in a list."
        )
    return tuple(
        tool_spec(
            tool.metadata.to_openai_tool(skip_length_check=True)
            if isinstance(tool, BaseTool)
            else tool,
            index,
        )
        for index, tool in enumerate(tools)
    )


def tool_call_block(call: ToolCall) -> ToolCallBlock:
    return ToolCallBlock(tool_call_id=call.id, tool_name=call.name, tool_kwargs=call.arguments)


def tool_call_blocks(response: ChatResponse) -> list[ToolCallBlock]:
    return [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]


def tool_selections(response: ChatResponse) -> list[ToolSelection]:
    return [
        ToolSelection(
            tool_id=block.tool_call_id or block.tool_name,
            tool_name=block.tool_name,
            tool_kwargs=block.tool_kwargs if isinstance(block.tool_kwargs, dict) else {},
        )
        for block in tool_call_blocks(response)
    ]


def core_tool_call(block: ToolCallBlock) -> dict[str, Any]:
    """A call of an assistant turn in the history, in the engine's message form."""
    call: dict[str, Any] = {
        "type": "function",
        "function": {"name": block.tool_name, "arguments": block.tool_kwargs},
    }
    return {"id": block.tool_call_id, **call} if block.tool_call_id else call
