"""Task text -> token sequences, in the convention the engine uses at inference.

One example = the chat template's prompt (``add_generation_prompt=True``) + the assistant text
tokenized on its own (``add_special_tokens=False``) + the template's end-of-turn token, with loss
on the assistant part only. A multi-turn ReAct trace gives one example per assistant step; where
each step's prompt extends the previous example token for token (it does for all three templates:
the targets are written exactly as the agent re-renders them), the steps share one sequence,
which under causal attention trains exactly the same predictions at a third of the cost.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from transformers import PreTrainedTokenizerFast

from .task import FORMS, make_problems, react_steps
from .tokenizers import end_of_turn_ids

IGNORE = -100  # label of prompt positions (no loss)


def tokenizer_corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """Every text the models will read or write, from training problems of all three forms."""
    out = []
    for form in FORMS:
        for p in make_problems(n, seed=seed, form=form, split="train"):
            out += [m["content"] for m in p.messages]
            out += [t["content"] for t in p.solution] if form == "react" else [p.solution]
    return out


def fold_system(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """For templates without a system role (Gemma): system text + blank line + first user text.
    The engine folds the same way, so the model is trained on what it will be shown."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if system and rest and rest[0]["role"] == "user":
        rest[0]["content"] = "\n\n".join(system) + "\n\n" + rest[0]["content"]
    elif system:
        rest.insert(0, {"role": "user", "content": "\n\n".join(system)})
    return rest


def prompt_ids(tok: PreTrainedTokenizerFast, messages: list[dict[str, str]]) -> list[int]:
    """The template's prompt for the next assistant turn, folding a system message if rejected."""

    def render(msgs: list[dict[str, str]]) -> list[int]:
        return list(
            tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
        )

    try:
        return render(messages)
    except Exception as e:  # jinja2 TemplateError from the template's raise_exception()
        if "System role not supported" not in str(e):
            raise
        return render(fold_system(messages))


@dataclass(frozen=True)
class Example:
    ids: list[int]
    labels: list[int]  # IGNORE on the prompt
    form: str


def encode(
    tok: PreTrainedTokenizerFast,
    messages: list[dict[str, str]],
    target: str,
    eot: list[int],
    form: str,
) -> Example:
    prompt = prompt_ids(tok, messages)
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
            else:
                out.append(encode(tok, p.messages, p.solution, eot, form))
    random.Random(seed).shuffle(out)
    return out
