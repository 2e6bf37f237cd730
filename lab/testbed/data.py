"""Task text -> token sequences, in the convention the engine uses at inference.

One example = the prompt exactly as a member renders it (``core.chat.render_prompt``, tools and
response format included, tokenized with ``add_special_tokens=False``) + the assistant text
tokenized on its own (``add_special_tokens=False``) + the template's end-of-turn token, with loss
on the assistant part only. A multi-turn ReAct or tool trace gives one example per assistant step;
where each step's prompt extends the previous example token for token (it does for all three
templates: the targets are written exactly as the history re-renders them), the steps share one
sequence, which under causal attention trains exactly the same predictions at less cost.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerFast

from core.chat import (
    normalize_messages,
    render_prompt,
    response_format_instruction,
    tool_response_text,
    tools_system_block,
)
from core.testbed.task import FORMS, make_problems, react_steps, tool_steps
from core.tools import ToolSpec

from .tokenizers import end_of_turn_ids

IGNORE = -100  # label of prompt positions (no loss)


TOOL_CORPUS_SHARE = 4  # tool problems in the tokenizer corpus: 1 / this of the other forms'


def _tool_texts(n: int, seed: int) -> list[str]:
    """The tool form's texts as the models read and write them: tool lists, instructions,
    questions, calls, results and answers."""
    out = []
    for p in make_problems(n, seed=seed, form="tool", split="train"):
        out.append(tools_system_block(trained_specs(p.tools)))
        if p.response_format is not None:
            out.append(response_format_instruction(p.response_format))
        out += [m["content"] for m in p.messages]
        for messages, target in tool_steps(p):
            out.append(target)
            out += [tool_response_text(m["content"]) for m in messages if m["role"] == "tool"]
    return out


def trained_specs(tools: Sequence[Mapping[str, Any]] | None) -> tuple[ToolSpec, ...]:
    """The testbed's OpenAI tool dicts as the models were trained to read them: each spec's
    parameters in their own key order ("properties" first; a spec checked by `core.tools` puts
    "type" first, so requests through the engine show the same schema with "type" first)."""
    functions = [tool["function"] for tool in tools or ()]
    return tuple(ToolSpec(f["name"], f["description"], f["parameters"]) for f in functions)


def tokenizer_corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """Every text the models will read or write, from training problems of all forms."""
    out = []
    for form in FORMS:
        if form == "tool":
            out += _tool_texts(n // TOOL_CORPUS_SHARE, seed)
            continue
        for p in make_problems(n, seed=seed, form=form, split="train"):
            out += [m["content"] for m in p.messages]
            out += [t["content"] for t in p.solution] if form == "react" else [p.solution]
    return out


def prompt_ids(
    tok: PreTrainedTokenizerFast,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    response_format: Mapping[str, Any] | None = None,
) -> list[int]:
    """The prompt for the next assistant turn exactly as a member sees it: normalised, rendered
    with its own template (system folded where the template rejects it, tools and tool use
    written as `core.chat` writes them), tokenized without added special tokens."""
    text = render_prompt(
        tok, normalize_messages(messages), "testbed", trained_specs(tools), response_format
    )
    return tok(text, add_special_tokens=False).input_ids


@dataclass(frozen=True)
class Example:
    ids: list[int]
    labels: list[int]  # IGNORE on the prompt
    form: str


def encode(
    tok: PreTrainedTokenizerFast,
    messages: list[dict[str, Any]],
    target: str,
    eot: list[int],
    form: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    response_format: Mapping[str, Any] | None = None,
) -> Example:
    prompt = prompt_ids(tok, messages, tools, response_format)
    answer = tok(target, add_special_tokens=False, split_special_tokens=True).input_ids + eot
    return Example(prompt + answer, [IGNORE] * len(prompt) + answer, form)


def merge_steps(steps: list[Example]) -> list[Example]:
    """One sequence for a multi-turn trace when every step's prompt extends the one before."""
    ids, labels = list(steps[0].ids), list(steps[0].labels)
    for step in steps[1:]:
        n = len(ids)
        if step.ids[:n] != ids or any(x != IGNORE for x in step.labels[:n]):
            return steps
        ids += step.ids[n:]
        labels += step.labels[n:]
    return [Example(ids, labels, steps[0].form)]


def examples(
    tok: PreTrainedTokenizerFast, n: dict[str, int], *, seed: int, p_add: float
) -> list[Example]:
    """Training examples: `n[form]` problems of each form (react: one example per step)."""
    eot = end_of_turn_ids(tok)
    out = []
    for form, count in n.items():
        for p in make_problems(count, seed=seed, form=form, split="train", p_add=p_add):
            if form == "react":
                out += merge_steps([encode(tok, m, t, eot, form) for m, t in react_steps(p)])
            elif form == "tool":
                out += merge_steps(
                    [
                        encode(tok, m, t, eot, form, p.tools, p.response_format)
                        for m, t in tool_steps(p)
                    ]
                )
            else:
                out.append(encode(tok, p.messages, p.solution, eot, form))
    random.Random(seed).shuffle(out)
    return out
