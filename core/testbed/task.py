"""A synthetic two-step arithmetic word-problem task with a checkable answer.

One seeded generator, four renderings of the same problems:

- ``cot``: the user asks the question, the assistant reasons step by step.
- ``rag``: the start fact is a retrieval passage, the question a separate query, and the messages
  are exactly what a LlamaIndex query engine sends a chat LLM by default (llama-index-core 0.14).
- ``react``: a ReAct trace with a ``calculator`` tool, in the message lists a LlamaIndex
  ``ReActAgent`` produces when configured with ``REACT_SYSTEM_HEADER``.
- ``tool``: native tool use. Two to four tools of ``tool_set`` are offered (``Problem.tools``,
  rendered by ``core.chat.render_prompt`` as at inference); the assistant answers with one call
  in the canonical syntax of ``core.tool_calls``, then, given the result, with the final answer (as
  JSON when ``Problem.response_format`` asks for it). A share of questions needs none of the
  offered tools and is answered directly, step by step as in ``cot``.

The held-out split is decided by a hash of the numbers and operations (and of the item, for the
tool form's look-ups), so no evaluation problem's number combination ever occurs in training.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from ..tool_calls import format_tool_call
from .tool_set import TOOL_SPECS, calculator, call_tool

FORMS = ("cot", "rag", "react", "tool")
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


# --------------------------------------------------------------------------- tool use
# Which question a tool problem asks, and how often. The one-step questions and the look-ups
# have their own numbers (and items), held out by the same hash rule as the two-step problems.

TOOL_KINDS = {  # kind -> (the tool it needs, or None: answered directly; share)
    "add": ("add", 0.14),
    "subtract": ("subtract", 0.14),
    "multiply": ("multiply", 0.14),
    "calculator": ("calculator", 0.16),
    "price": ("get_price", 0.1),
    "stock": ("get_stock", 0.1),
    "direct": (None, 0.22),
}
DIRECT_TOOLS = ("multiply", "get_price", "get_stock")  # offered when no tool fits the question
CONTAINERS = ("bags", "boxes", "baskets", "jars")
LOOKUP_ITEMS = tuple(o for o in FOODS + THINGS if o != "coins")
RESPONSE_FORMAT_RATE = 0.3  # share of tool calls whose final answer must be JSON
ANSWER_KEYS = ("answer", "result", "total", "value", "count")
TOOL_CALL_ID = "call_1"  # the id the training traces give their one call


def answer_schema(key: str) -> dict[str, Any]:
    """The response_format of a tool problem: one required integer."""
    return {
        "type": "object",
        "properties": {key: {"type": "integer"}},
        "required": [key],
    }


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
    # tool: the offered tools (OpenAI specs), the JSON schema the final answer follows (or
    # None), and the one right call (name, arguments), None when no tool is needed
    tools: list[dict[str, Any]] = field(default_factory=list)
    response_format: dict[str, Any] | None = None
    expected_call: tuple[str, dict[str, Any]] | None = None


def _held_out(key: str) -> bool:
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100 < TEST_FRACTION_PERCENT


def is_test_combo(start: int, steps: tuple[tuple[str, int], ...]) -> bool:
    """Held-out membership from the numbers and operations only (stable across Python runs)."""
    return _held_out(f"{start}" + "".join(f"{op}{n}" for op, n in steps))


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
    two_steps = f"{name} has {start} {obj}. {pron.capitalize()} {v1}. Then {pron} {v2}. {how_many}"

    if form == "cot":
        messages = [{"role": "user", "content": two_steps}]
        if split == "train" and form_rng.random() < SYSTEM_PROMPT_RATE:
            messages.insert(0, {"role": "system", "content": form_rng.choice(TRAIN_SYSTEM_PROMPTS)})
        return Problem(
            form, messages, two_steps, solution=_cot_solution(name, obj, start, steps), **base
        )

    if form == "tool":
        return _tool_problem(form_rng, split, p_add, two_steps, base)

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

    messages = [
        {"role": "system", "content": react_system_message()},
        {"role": "user", "content": two_steps},
    ]
    return Problem(
        form, messages, two_steps, solution=_react_turns(name, obj, start, steps), **base
    )


def _one_step(rng: random.Random, split: str, op: str) -> tuple[int, int]:
    """Numbers of a one-step question (a op b), in the split, never below zero."""
    low = 2 if op == "*" else 1
    while True:
        a, b = rng.randint(low, 9), rng.randint(low, 9)
        if (op != "-" or a >= b) and is_test_combo(a, ((op, b),)) == (split == "test"):
            return a, b


def _tool_problem(
    rng: random.Random, split: str, p_add: float, two_steps: str, base: dict[str, Any]
) -> Problem:
    """One `tool` problem: the base problem's person and object, a question of a drawn kind, the
    tools offered (the needed one among them), and the targets."""
    name, obj = base["name"], base["obj"]
    pron = NAMES[name].capitalize()
    kinds = dict(TOOL_KINDS)
    add_share = kinds["add"][1] + kinds["subtract"][1]  # split by the mix's share of additions
    kinds["add"], kinds["subtract"] = (
        ("add", add_share * p_add),
        ("subtract", add_share - add_share * p_add),
    )
    kind = rng.choices(list(kinds), weights=[w for _, w in kinds.values()])[0]
    tool, ending = kinds[kind][0], rng.choice(QUESTION_ENDINGS)
    fields: dict[str, Any] = dict(base)
    if kind in ("add", "subtract"):
        op = "+" if kind == "add" else "-"
        a, b = _one_step(rng, split, op)
        phrase = _phrase(_verb(rng, op, obj), op, b)
        question = f"{name} has {a} {obj}. {pron} {phrase}. How many {obj} does {name} {ending}?"
        arguments: dict[str, Any] = {"a": a, "b": b}
        fields.update(start=a, steps=((op, b),), answer=a + b if op == "+" else a - b)
    elif kind == "multiply":
        a, b = _one_step(rng, split, "*")
        container = rng.choice(CONTAINERS)
        question = (
            f"{name} has {a} {container} with {b} {obj} in each. "
            f"How many {obj} does {name} have in all?"
        )
        arguments = {"a": a, "b": b}
        fields.update(start=a, steps=(("*", b),), answer=a * b)
    elif kind in ("price", "stock"):
        item = rng.choice(
            [i for i in LOOKUP_ITEMS if _held_out(f"lookup/{i}") == (split == "test")]
        )
        if kind == "price":
            question = rng.choice(
                (
                    f"What is the price of {item} at the shop, in coins?",
                    f"{name} wants to buy {item}. How many coins do {item} cost at the shop?",
                )
            )
        else:
            question = rng.choice(
                (
                    f"How many {item} does the shop have in stock?",
                    f"{name} asks the shop about {item}. How many {item} does the shop have?",
                )
            )
        arguments = {"item": item}
        fields.update(obj=item, start=0, steps=())
    else:  # calculator, direct: the two-step question of the other forms
        question = two_steps
        start, ((op1, b), (op2, c)) = base["start"], base["steps"]
        arguments = {"expression": f"{start} {op1} {b} {op2} {c}"}

    if tool is None:
        offered = rng.sample(DIRECT_TOOLS, rng.randint(2, len(DIRECT_TOOLS)))
        expected_call, response_format = None, None
        solution = _cot_solution(name, obj, base["start"], base["steps"])
    else:
        others = [t for t in TOOL_SPECS if t != tool]
        offered = [tool, *rng.sample(others, rng.randint(1, 3))]
        rng.shuffle(offered)
        expected_call = (tool, arguments)
        fields["answer"] = int(call_tool(tool, arguments))
        response_format = None
        solution = f"The answer is {fields['answer']}."
        if rng.random() < RESPONSE_FORMAT_RATE:
            key = rng.choice(ANSWER_KEYS)
            response_format = answer_schema(key)
            solution = json.dumps({key: fields["answer"]})
    messages = [{"role": "user", "content": question}]
    if split == "train" and rng.random() < SYSTEM_PROMPT_RATE:
        messages.insert(0, {"role": "system", "content": rng.choice(TRAIN_SYSTEM_PROMPTS)})
    return Problem(
        "tool",
        messages,
        question,
        solution=solution,
        tools=[TOOL_SPECS[t] for t in offered],
        response_format=response_format,
        expected_call=expected_call,
        **fields,
    )


def tool_followup(
    call_id: str, name: str, arguments: dict[str, Any], result: str
) -> list[dict[str, Any]]:
    """The messages that follow a call: the assistant's call (OpenAI style) and its result."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": result, "tool_call_id": call_id, "name": name},
    ]


def tool_steps(problem: Problem) -> list[tuple[list[dict[str, Any]], str]]:
    """(messages, target) for each assistant turn of a `tool` problem: the canonical call, then
    the final answer after the tool's result; a direct problem has one turn. Render each with
    `problem.tools` and `problem.response_format`."""
    assert problem.form == "tool"
    if problem.expected_call is None:
        return [(list(problem.messages), problem.solution)]
    name, arguments = problem.expected_call
    followup = tool_followup(TOOL_CALL_ID, name, arguments, call_tool(name, arguments))
    return [
        (list(problem.messages), format_tool_call(name, arguments)),
        ([*problem.messages, *followup], problem.solution),
    ]


def check_tool_call(name: str, arguments: dict[str, Any] | str, problem: Problem) -> bool:
    """Whether a call is the one the problem needs: same tool, same arguments (JSON values)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return False
    return problem.expected_call is not None and (name, arguments) == problem.expected_call


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
    """Right final answer; where the problem asks for JSON, exactly the schema's one key."""
    if problem.response_format is not None:
        (key,) = problem.response_format["required"]
        try:
            return json.loads(text) == {key: problem.answer}
        except ValueError:
            return False
    return extract_answer(text) == problem.answer


def score(texts: list[str], problems: list[Problem]) -> float:
    """Accuracy of `texts` against `problems` (same order)."""
    if len(texts) != len(problems):
        raise ValueError(f"{len(texts)} texts for {len(problems)} problems")
    return sum(check_answer(t, p) for t, p in zip(texts, problems, strict=True)) / max(
        len(problems), 1
    )
