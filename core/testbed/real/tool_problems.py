"""The `tool` form: the testbed's tools offered as OpenAI-style specs; the right first turn is
one call with arguments taken from the question, the right final answer follows from the tool's
result (as JSON where `response_format` asks for it). One kind in seven is a fact question that
none of the offered tools fits."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import replace

from ..task import ANSWER_KEYS, answer_schema
from ..tool_set import TOOL_SPECS, call_tool
from .problem import (
    NUMBER_ONLY,
    Deck,
    Draws,
    PartPools,
    RealProblem,
    fact_problem,
    number_answer_problem,
    shows_answer,
)

TOOL_KINDS = ("add", "subtract", "multiply", "calculator", "price", "stock", "direct")
RESPONSE_FORMAT_RATE = 0.3  # share of tool calls whose final answer must be JSON


def tool_problems(rng: random.Random, draws: Draws, split: PartPools) -> Iterator[RealProblem]:
    r = rng.randint
    goods = {tool: Deck(split.goods, rng) for tool in ("get_price", "get_stock")}
    facts = Deck(split.facts, rng)

    def arithmetic(tool: str, symbol: str, operands: Callable[[], tuple[int, int]]):
        def one():
            def sample():
                a, b = operands()
                if int(call_tool(tool, {"a": a, "b": b})) in (a, b):
                    return None
                return f"tool/{tool}/{a}/{b}", (a, b)

            key, (a, b) = draws.draw(sample)
            return key, f"What is {a} {symbol} {b}?", {"a": a, "b": b}

        return one

    def subtraction() -> tuple[int, int]:
        a = r(200, 999)
        return a, r(100, a - 1)

    def calculator():
        def sample():
            expression = f"{r(11, 30)} * {r(3, 9)} {rng.choice('+-')} {r(10, 99)}"
            if shows_answer(expression, int(call_tool("calculator", {"expression": expression}))):
                return None
            return f"tool/calculator/{expression}", expression

        key, expression = draws.draw(sample)
        return key, f"What is {expression}?", {"expression": expression}

    def lookup(tool: str, question: str):
        def one():
            item = goods[tool].draw()
            return f"tool/{tool}/{item}", question.format(item=item), {"item": item}

        return one

    calls = {  # kind -> (tool, draw (key, question, arguments))
        "add": ("add", arithmetic("add", "+", lambda: (r(100, 999), r(100, 999)))),
        "subtract": ("subtract", arithmetic("subtract", "-", subtraction)),
        "multiply": ("multiply", arithmetic("multiply", "*", lambda: (r(11, 99), r(11, 99)))),
        "calculator": ("calculator", calculator),
        "price": ("get_price", lookup("get_price", "How many coins do {item} cost at the shop?")),
        "stock": ("get_stock", lookup("get_stock", "How many {item} does the shop have in stock?")),
    }  # fmt: skip
    while True:
        kinds = list(TOOL_KINDS)
        rng.shuffle(kinds)
        for kind in kinds:
            if kind == "direct":
                offered = rng.sample(sorted(TOOL_SPECS), r(2, 3))
                problem = fact_problem("tool", "direct", facts.draw(), rng)
                yield replace(problem, tools=[TOOL_SPECS[t] for t in offered])
                continue
            tool, draw = calls[kind]
            key, question, arguments = draw()
            answer = int(call_tool(tool, arguments))
            others = [t for t in sorted(TOOL_SPECS) if t != tool]
            offered = [tool, *rng.sample(others, r(1, 3))]
            rng.shuffle(offered)
            question = f"{question} {NUMBER_ONLY}"
            problem = number_answer_problem("tool", kind, tool, question, answer, key)
            response_format = None
            if rng.random() < RESPONSE_FORMAT_RATE:
                response_format = answer_schema(rng.choice(ANSWER_KEYS))
                (answer_key,) = response_format["required"]
                problem = replace(problem, solution=json.dumps({answer_key: answer}))
            yield replace(
                problem,
                tools=[TOOL_SPECS[t] for t in offered],
                response_format=response_format,
                expected_call=(tool, arguments),
            )
