"""Greedy accuracy of one model with plain `model.generate`, one problem at a time (no padding,
so the numbers are what a single-model run of the engine should reproduce)."""

from __future__ import annotations

import re
from typing import Any

import torch

from core.testbed.task import (
    CALCULATOR_ARG,
    CALCULATOR_NAME,
    TOOL_CALL_ID,
    Problem,
    agent_rendered,
    calculator,
    check_answer,
    check_tool_call,
    tool_followup,
)
from core.testbed.tool_set import call_tool
from core.tool_calls import parse_tool_calls

from .data import prompt_ids

MAX_NEW_TOKENS = 80


@torch.no_grad()
def generate(
    model,
    tok,
    messages: list[dict[str, Any]],
    max_new_tokens: int = MAX_NEW_TOKENS,
    tools: list[dict[str, Any]] | None = None,
    response_format: dict[str, Any] | None = None,
) -> str:
    ids = torch.tensor([prompt_ids(tok, messages, tools, response_format)])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
    )
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def run_react(model, tok, problem: Problem, max_steps: int = 4) -> tuple[str, list[str]]:
    """Play the ReAct agent loop: generate a step, run the calculator, feed the observation back.
    Returns (final answer text or "", the steps the model wrote)."""
    messages, steps = list(problem.messages), []
    for _ in range(max_steps):
        text = generate(model, tok, messages)
        steps.append(text)
        if "Answer:" in text and "Action:" not in text:
            return text[text.index("Answer:") + len("Answer:") :].strip(), steps
        m = re.search(
            rf"Action: {CALCULATOR_NAME}\nAction Input: \{{[\"']{CALCULATOR_ARG}[\"']: "
            r"[\"']([^\"']*)[\"']\}",
            text,
        )
        if not m:
            return "", steps
        expression = m.group(1)
        messages += [
            {"role": "assistant", "content": agent_rendered(text)},
            {"role": "user", "content": f"Observation: {calculator(expression)}"},
        ]
    return "", steps


def first_tool_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """The first well-formed call in `text` as (name, arguments), or None (the engine's parser,
    `core.tool_calls.parse_tool_calls`)."""
    _, calls, _ = parse_tool_calls(text)
    return (calls[0].name, calls[0].arguments) if calls else None


def run_tool(model, tok, problem: Problem) -> dict[str, Any]:
    """Play one tool turn: generate; if the model called a tool, run it, feed the result back and
    generate the final answer. Returns the call (or None), the final text and three verdicts:
    the right decision and tool (no call where none is needed), also the right arguments, and
    the right final answer."""
    options = dict(tools=problem.tools, response_format=problem.response_format)
    first = generate(model, tok, problem.messages, **options)
    call = first_tool_call(first)
    final = first
    if call is not None:
        name, arguments = call
        followup = tool_followup(TOOL_CALL_ID, name, arguments, call_tool(name, arguments))
        final = generate(model, tok, [*problem.messages, *followup], **options)
    if problem.expected_call is None:
        tool_right = args_right = call is None
    else:
        tool_right = call is not None and call[0] == problem.expected_call[0]
        args_right = call is not None and check_tool_call(*call, problem)
    return {
        "call": call,
        "final": final,
        "tool_right": tool_right,
        "args_right": args_right,
        "answer_right": check_answer(final, problem),
    }


def answers(model, tok, problems: list[Problem]) -> list[str]:
    """The model's greedy answer text per problem (react: the agent loop's final answer, or "";
    tool: the answer after the tool's result, or the direct answer)."""
    out = []
    for p in problems:
        if p.form == "react":
            out.append(run_react(model, tok, p)[0])
        elif p.form == "tool":
            out.append(run_tool(model, tok, p)["final"])
        else:
            out.append(generate(model, tok, p.messages))
    return out


def accuracy(model, tok, problems: list[Problem]) -> tuple[float, list[bool]]:
    """Share of `problems` answered right, and which ones."""
    right = [
        check_answer(t, p) for t, p in zip(answers(model, tok, problems), problems, strict=True)
    ]
    return sum(right) / max(len(right), 1), right
