"""A synthetic two-step arithmetic word-problem task with a checkable answer.

One seeded generator, three renderings of the same problems:

- ``cot``: the user asks the question, the assistant reasons step by step.
- ``rag``: the start fact is a retrieval passage, the question a separate query, and the messages
  are exactly what a LlamaIndex query engine sends a chat LLM by default (llama-index-core 0.14).
- ``react``: a ReAct trace with a ``calculator`` tool, in the message lists a LlamaIndex
  ``ReActAgent`` produces when configured with ``REACT_SYSTEM_HEADER``.

The held-out split is decided by a hash of the numbers and operations, so no evaluation problem's
number combination ever occurs in training.
"""

from __future__ import annotations

import ast
import hashlib
import operator
import random
import re
from dataclasses import dataclass

FORMS = ("cot", "rag", "react")
SPLITS = ("train", "test")
TEST_FRACTION_PERCENT = 20  # share of number combinations held out for evaluation

# --------------------------------------------------------------------------- vocabulary

NAMES = {  # name -> subject pronoun
    "Tom": "he", "Mia": "she", "Sam": "he", "Ana": "she", "Ben": "he", "Lily": "she",
    "Max": "he", "Zoe": "she", "Leo": "he", "Emma": "she", "Noah": "he", "Ava": "she",
    "Omar": "he", "Nina": "she", "Ivan": "he", "Sara": "she", "Raj": "he", "Yuki": "she",
    "Carlos": "he", "Grace": "she",
}  # fmt: skip
FOODS = ("apples", "cookies", "oranges", "candies", "muffins", "grapes", "carrots", "eggs")
THINGS = (
    "pencils", "marbles", "stickers", "books", "coins", "cards", "balloons", "shells",
    "stamps", "toys", "buttons", "rocks",
)  # fmt: skip
ADD_VERBS = ("buys", "finds", "gets", "wins", "receives", "picks up", "collects")
SUB_VERBS = ("gives away", "loses", "sells", "donates", "trades away")
FOOD_SUB_VERBS = ("eats",)
QUESTION_ENDINGS = ("have now", "have in the end", "have after that")
TRAIN_SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a helpful assistant. Answer the question.",
    "You are a careful math tutor.",
    "Solve the problem step by step.",
)
SYSTEM_PROMPT_RATE = 0.2  # share of training cot problems that carry a generic system message

# --------------------------------------------------------------------------- LlamaIndex RAG prompt
# Copied from llama_index/core/prompts/chat_prompts.py (CHAT_TEXT_QA_PROMPT, 0.14.25): what the
# default query engine (compact response mode) sends a chat LLM. Retrieved node texts are joined
# with a blank line; the default retriever keeps the top 2 nodes.

RAG_SYSTEM_PROMPT = (
    "You are an expert Q&A system that is trusted around the world.\n"
    "Always answer the query using the provided context information, "
    "and not prior knowledge.\n"
    "Some rules to follow:\n"
    "1. Never directly reference the given context in your answer.\n"
    "2. Avoid statements like 'Based on the context, ...' or "
    "'The context information ...' or anything along "
    "those lines."
)
RAG_USER_TEMPLATE = (
    "Context information is below.\n"
    "---------------------\n"
    "{context_str}\n"
    "---------------------\n"
    "Given the context information and not prior knowledge, "
    "answer the query.\n"
    "Query: {query_str}\n"
    "Answer: "
)
RAG_CONTEXT_SEPARATOR = "\n\n"
RAG_TOP_K = 2
RAG_DISTRACTORS = 3  # distractor passages per problem (for building a real index)

# --------------------------------------------------------------------------- ReAct tool and header
# A LlamaIndex ReActAgent built as in the docstring of core/testbed/__init__.py renders exactly
# these strings: the header is formatted with {tool_desc} and {tool_names} by ReActChatFormatter,
# so literal braces are doubled.

CALCULATOR_NAME = "calculator"
CALCULATOR_DESCRIPTION = "Evaluate an arithmetic expression."
CALCULATOR_ARG = "expression"
# What llama_index's get_react_tool_descriptions() writes for FunctionTool.from_defaults(
#     fn=calculator, name=CALCULATOR_NAME, description=CALCULATOR_DESCRIPTION)
CALCULATOR_TOOL_DESC = (
    f"> Tool Name: {CALCULATOR_NAME}\n"
    f"Tool Description: {CALCULATOR_DESCRIPTION}\n"
    'Tool Args: {"properties": {"expression": {"title": "Expression", "type": "string"}}, '
    '"required": ["expression"], "type": "object"}\n'
)
REACT_SYSTEM_HEADER = """Solve the problem step by step with tools.

## Tools
{tool_desc}
## Format
To use a tool:
Thought: the step to compute
Action: one of {tool_names}
Action Input: the arguments, e.g. {{'expression': '7 + 5'}}
The tool replies:
Observation: the result
To answer:
Thought: I can answer without using any more tools.
Answer: the final number
"""
REACT_FINAL_THOUGHT = "I can answer without using any more tools."
OBSERVATION_ROLE = "user"  # ReActChatFormatter's default observation_role


def react_system_message() -> str:
    """The header as ReActChatFormatter renders it for our one calculator tool."""
    return REACT_SYSTEM_HEADER.format(tool_desc=CALCULATOR_TOOL_DESC, tool_names=CALCULATOR_NAME)


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculator(expression: str) -> str:
    """Evaluate integer +, - and * (no eval()); the observation text is the plain result."""

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


# --------------------------------------------------------------------------- problems


@dataclass(frozen=True)
class Problem:
    """One problem in one form. `messages` is everything before the (first) assistant turn."""

    form: str
    messages: list[dict[str, str]]
    question: str  # the user's question (cot, react) or the retrieval query (rag)
    answer: int
    # the reference assistant text; react: the turns after `messages` (steps and observations)
    solution: str | list[dict[str, str]]
    name: str
    obj: str
    start: int
    steps: tuple[tuple[str, int], ...]  # (("+", 5), ("-", 3))
    passages: tuple[str, ...] = ()  # rag: the relevant passage first, then distractors
    relevant_passage: str = ""


def is_test_combo(start: int, steps: tuple[tuple[str, int], ...]) -> bool:
    """Held-out membership from the numbers and operations only (stable across Python runs)."""
    key = f"{start}" + "".join(f"{op}{n}" for op, n in steps)
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100 < TEST_FRACTION_PERCENT


def _values(start: int, steps: tuple[tuple[str, int], ...]) -> list[int]:
    vals = [start]
    for op, n in steps:
        vals.append(vals[-1] + n if op == "+" else vals[-1] - n)
    return vals


def _sample_numbers(rng: random.Random, split: str, p_add: float) -> tuple[int, tuple]:
    while True:
        start = rng.randint(1, 9)
        steps = tuple(("+" if rng.random() < p_add else "-", rng.randint(1, 9)) for _ in range(2))
        if min(_values(start, steps)) < 0 or is_test_combo(start, steps) != (split == "test"):
            continue
        return start, steps


def _verb(rng: random.Random, op: str, obj: str) -> str:
    return rng.choice(
        ADD_VERBS if op == "+" else SUB_VERBS + (FOOD_SUB_VERBS if obj in FOODS else ())
    )


def _phrase(verb: str, op: str, n: int, obj: str = "") -> str:
    """ "buys 5 more", "gives away 3"; with `obj`: "buys 5 more apples", "gives away 3 apples"."""
    words = [verb, str(n)] + (["more"] if op == "+" else []) + ([obj] if obj else [])
    return " ".join(words)


def _cot_solution(name: str, obj: str, start: int, steps: tuple) -> str:
    vals = _values(start, steps)
    lines = [f"{name} starts with {start} {obj}."]
    for (op, n), before, after in zip(steps, vals, vals[1:], strict=False):
        lines.append(f"{before} {op} {n} = {after}.")
    lines.append(f"The answer is {vals[-1]}.")
    return " ".join(lines)


def _react_turns(name: str, obj: str, start: int, steps: tuple) -> list[dict[str, str]]:
    """Assistant steps (arguments as a Python dict literal, as the agent re-renders them) and
    observations."""
    vals = _values(start, steps)
    turns = []
    for i, ((op, n), before) in enumerate(zip(steps, vals, strict=False)):
        expr = f"{before} {op} {n}"
        thought = (
            f"{name} starts with {start} {obj}. I need to compute {expr}."
            if i == 0
            else f"{name} has {before} {obj} now. I need to compute {expr}."
        )
        turns.append(
            {
                "role": "assistant",
                "content": f"Thought: {thought}\nAction: {CALCULATOR_NAME}\n"
                f"Action Input: { {CALCULATOR_ARG: expr} }",
            }
        )
        turns.append({"role": OBSERVATION_ROLE, "content": f"Observation: {calculator(expr)}"})
    final = f"Thought: {REACT_FINAL_THOUGHT}\nAnswer: {vals[-1]}"
    turns.append({"role": "assistant", "content": final})
    return turns


def agent_rendered(step_text: str) -> str:
    """How ReActAgent re-renders a parsed action step in later prompts (ActionReasoningStep writes
    the arguments with Python's str(dict)). Our targets are already in that form; a JSON-style
    action input from a model is normalised the same way."""
    m = re.fullmatch(
        r"Thought: (.*?)\nAction: (\S+)\nAction Input: \{([\"'])(\w+)\3: ([\"'])(.*)\5\}",
        step_text,
        re.S,
    )
    if not m:
        return step_text
    thought, action, _, key, _, value = m.groups()
    return f"Thought: {thought}\nAction: {action}\nAction Input: { {key: value} }"


def react_steps(problem: Problem) -> list[tuple[list[dict[str, str]], str]]:
    """(messages the agent sends, target assistant text) for each assistant step of a trace."""
    assert problem.form == "react"
    history = list(problem.messages)
    out = []
    for turn in problem.solution:
        if turn["role"] == "assistant":
            out.append((list(history), turn["content"]))
            history.append({"role": "assistant", "content": agent_rendered(turn["content"])})
        else:
            history.append(dict(turn))
    return out


def _make_one(
    rng: random.Random, form_rng: random.Random, form: str, split: str, p_add: float
) -> Problem:
    name = rng.choice(sorted(NAMES))
    pron = NAMES[name]
    obj = rng.choice(FOODS + THINGS)
    start, steps = _sample_numbers(rng, split, p_add)
    (op1, b), (op2, c) = steps
    ending = rng.choice(QUESTION_ENDINGS)
    verb1, verb2 = _verb(rng, op1, obj), _verb(rng, op2, obj)
    v1, v2 = _phrase(verb1, op1, b), _phrase(verb2, op2, c)
    how_many = f"How many {obj} does {name} {ending}?"
    answer = _values(start, steps)[-1]
    base = dict(name=name, obj=obj, start=start, steps=steps, answer=answer)

    if form == "cot":
        question = (
            f"{name} has {start} {obj}. {pron.capitalize()} {v1}. Then {pron} {v2}. {how_many}"
        )
        messages = [{"role": "user", "content": question}]
        if split == "train" and form_rng.random() < SYSTEM_PROMPT_RATE:
            messages.insert(0, {"role": "system", "content": form_rng.choice(TRAIN_SYSTEM_PROMPTS)})
        return Problem(
            form, messages, question, solution=_cot_solution(name, obj, start, steps), **base
        )

    if form == "rag":
        relevant = f"{name} has {start} {obj}."
        others = [n for n in sorted(NAMES) if n != name]
        distractors = []
        for other in form_rng.sample(others, RAG_DISTRACTORS):
            other_obj = obj if form_rng.random() < 0.4 else form_rng.choice(FOODS + THINGS)
            distractors.append(f"{other} has {form_rng.randint(1, 9)} {other_obj}.")
        query = f"{name} {_phrase(verb1, op1, b, obj)} and then {v2}. {how_many}"
        retrieved = [relevant, distractors[0]]
        form_rng.shuffle(retrieved)
        user = RAG_USER_TEMPLATE.format(
            context_str=RAG_CONTEXT_SEPARATOR.join(retrieved), query_str=query
        )
        messages = [
            {"role": "system", "content": RAG_SYSTEM_PROMPT},
            {"role": "user", "content": user},
        ]
        return Problem(
            form,
            messages,
            query,
            solution=_cot_solution(name, obj, start, steps),
            passages=(relevant, *distractors),
            relevant_passage=relevant,
            **base,
        )

    question = f"{name} has {start} {obj}. {pron.capitalize()} {v1}. Then {pron} {v2}. {how_many}"
    messages = [
        {"role": "system", "content": react_system_message()},
        {"role": "user", "content": question},
    ]
    return Problem(form, messages, question, solution=_react_turns(name, obj, start, steps), **base)


def make_problems(
    n: int, seed: int = 1, form: str = "cot", split: str = "test", *, p_add: float = 0.5
) -> list[Problem]:
    """`n` problems; the same (n, seed, split, p_add) gives the same problems in every form.

    `p_add` is the chance that each step adds (training mixes skew it to make members differ).
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"problems/{seed}/{split}/{p_add}")
    form_rng = random.Random(f"form/{seed}/{split}/{p_add}/{form}")
    return [_make_one(rng, form_rng, form, split, p_add) for _ in range(n)]


# --------------------------------------------------------------------------- checking

_ANSWER_RE = re.compile(r"(?:The answer is|Answer:)\s*(-?\d+)")


def extract_answer(text: str) -> int | None:
    """The last "The answer is N" / "Answer: N"; a bare integer (a ReAct agent's final response)."""
    found = _ANSWER_RE.findall(text)
    if found:
        return int(found[-1])
    bare = text.strip().rstrip(".")
    return int(bare) if re.fullmatch(r"-?\d+", bare) else None


def check_answer(text: str, problem: Problem) -> bool:
    return extract_answer(text) == problem.answer


def score(texts: list[str], problems: list[Problem]) -> float:
    """Accuracy of `texts` against `problems` (same order)."""
    if len(texts) != len(problems):
        raise ValueError(f"{len(texts)} texts for {len(problems)} problems")
    return sum(check_answer(t, p) for t, p in zip(texts, problems, strict=True)) / max(
        len(problems), 1
    )
