"""Greedy accuracy of one model with plain `model.generate`, one problem at a time (no padding,
so the numbers are what a single-model run of the engine should reproduce)."""

from __future__ import annotations

import re

import torch

from .data import prompt_ids
from .task import CALCULATOR_ARG, CALCULATOR_NAME, Problem, agent_rendered, calculator, check_answer

MAX_NEW_TOKENS = 80


@torch.no_grad()
def generate(
    model, tok, messages: list[dict[str, str]], max_new_tokens: int = MAX_NEW_TOKENS
) -> str:
    ids = torch.tensor([prompt_ids(tok, messages)])
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


def answers(model, tok, problems: list[Problem]) -> list[str]:
    """The model's greedy answer text per problem (react: the agent loop's final answer, or "")."""
    return [
        run_react(model, tok, p)[0] if p.form == "react" else generate(model, tok, p.messages)
        for p in problems
    ]


def accuracy(model, tok, problems: list[Problem]) -> tuple[float, list[bool]]:
    """Share of `problems` answered right, and which ones."""
    right = [
        check_answer(t, p) for t, p in zip(answers(model, tok, problems), problems, strict=True)
    ]
    return sum(right) / max(len(right), 1), right
