"""The testbed's tools: small arithmetic and shop look-ups, each an OpenAI-style spec plus the
Python function a tool loop runs.

The ``tool`` form offers two to four of them per prompt; the models learn to pick the one the
question needs and to copy its arguments from the question. The specs are ordinary JSON-schema
function specs, so whatever tools a user binds reach the models in the same shape.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
from collections.abc import Callable, Mapping
from typing import Any, get_type_hints

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    # integer +, - and * only, without eval(); the result text is the plain number

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"unsupported expression: {expression!r}")

    try:
        return str(ev(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError) as e:
        return f"Error: {e}"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def subtract(a: int, b: int) -> int:
    """Subtract b from a."""
    return a - b


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def _item_hash(item: str) -> int:
    return int(hashlib.sha256(item.strip().lower().encode()).hexdigest(), 16)


def get_price(item: str) -> int:
    """Look up the price of an item in coins."""
    return 1 + _item_hash(item) % 9  # fixed per item name, 1-9


def get_stock(item: str) -> int:
    """Look up how many of an item the shop has."""
    return 10 + (_item_hash(item) // 9) % 40  # fixed per item name, 10-49


TOOL_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "add": add,
    "subtract": subtract,
    "multiply": multiply,
    "calculator": calculator,
    "get_price": get_price,
    "get_stock": get_stock,
}
_JSON_TYPES = {int: "integer", str: "string"}


def _spec(function: Callable[..., Any]) -> dict[str, Any]:
    """The function's spec, key for key as LangChain's `convert_to_openai_tool` writes it (the
    docstring as description), so tools a user binds from these functions reach the models
    exactly as they were trained."""
    hints = get_type_hints(function)
    hints.pop("return", None)
    types = {param: _JSON_TYPES[kind] for param, kind in hints.items()}
    return {
        "type": "function",
        "function": {
            "name": function.__name__,
            "description": function.__doc__,
            "parameters": {
                "properties": {p: {"type": t} for p, t in types.items()},
                "required": list(types),
                "type": "object",
            },
        },
    }


TOOL_SPECS: dict[str, dict[str, Any]] = {name: _spec(f) for name, f in TOOL_FUNCTIONS.items()}


def call_tool(name: str, arguments: Mapping[str, Any]) -> str:
    """Run tool `name` and return its result as the text a tool message carries; a wrong name or
    wrong arguments give an "Error: ..." text, as a tool loop would report them."""
    function = TOOL_FUNCTIONS.get(name)
    if function is None:
        return f"Error: no tool named {name!r}"
    params = TOOL_SPECS[name]["function"]["parameters"]["properties"]
    kinds = {"integer": int, "string": str}
    if set(arguments) != set(params) or any(
        type(arguments[p]) is not kinds[schema["type"]] for p, schema in params.items()
    ):
        return f"Error: {name} takes {json.dumps({p: s['type'] for p, s in params.items()})}"
    return str(function(**arguments))
