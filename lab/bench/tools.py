"""Benchmark: tool use, for each single model and each method (`python -m lab bench --form
tool`).

Each held-out tool problem offers a few tools; the right answer is one call (or, for some
questions, no call and a direct answer). A turn is played as a tool loop plays it: generate; if
the response calls a tool, run the tool, send its result back (the assistant's call and a tool
message) and generate the final answer. Scored: the right tool (no call where none is needed),
the right arguments, the right final answer; and for every call written, whether it is
schema-valid (an offered tool, arguments that validate against its parameters, closed as the
grammar closes them).

Two conditions, on the same problems, interleaved: with the grammar (`tool_choice="auto"`:
the engine's grammar keeps every call well-formed and schema-valid), and prompt only (the same
prompt, tools rendered by each member's template, no grammar; the calls are read from the text
by `core.tool_calls`' parser, as `parse_tool_calls` reads them).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config import GenerationConfig, Output
from core.ensemble import Ensemble
from core.errors import InvalidConfigError
from core.json_schema import closed_schema
from core.member import Member
from core.methods import method_class
from core.tool_calls import ToolCall

from .report import write_results
from .setups import Setup, ensemble_for

CONDITIONS = ("grammar", "prompt only")
CALL_ID = "call_1"


@dataclass(frozen=True)
class ToolTask:
    """Tool problems and how to play and score them. A problem has `.messages`, `.tools`
    (OpenAI-style specs), `.response_format` (a JSON schema for the final answer, or None) and
    `.expected_call` ((name, arguments), or None when no tool is needed)."""

    name: str
    problems: Sequence[Any]
    call_tool: Callable[[str, dict], str]  # the tool's result text
    followup: Callable[[str, str, dict, str], list[dict]]  # (id, name, args, result) -> messages
    right_call: Callable[[str, dict, Any], bool]  # (name, arguments, problem)
    right_answer: Callable[[str, Any, bool], bool]  # (final text, problem, cut by the limit)


def testbed_tool_task(n: int, seed: int = 1, real: bool = False) -> ToolTask:
    """The held-out tool-form problems and tools of the tiny testbed, or with `real` of the
    real task (calls compared as a grader would, `check_real_tool_call`; a final answer cut by
    the token limit keeps its last word unread)."""
    from core import testbed

    bed = testbed.testbed(real)
    if not real and "tool" not in getattr(testbed.task, "FORMS", ()):
        raise InvalidConfigError(
            "--form tool needs the testbed's tool form (make_problems(form='tool')), which this "
            "build's testbed does not have; rebuild the testbed with it."
        )
    return ToolTask(
        "real-tool" if real else "arithmetic-tool",
        bed.problems(n, seed, "tool"),
        testbed.call_tool,
        testbed.tool_followup,
        bed.right_call,
        bed.right,
    )


def tool_setups(
    methods: Sequence[str], names: Sequence[str], configs: Sequence[str] = ()
) -> list[Setup]:
    """One `single` per member, one setup per other method at its default options, plus
    `--config` setups."""
    from .setups import parse_setups

    setups = []
    for method in methods:
        method_class(method)
        if method == "single":
            setups += [Setup(f"single {name}", "single", {"member": i}) for i, name in
                       enumerate(names)]  # fmt: skip
        else:
            setups.append(Setup(method, method))
    return setups + parse_setups((), (), len(names), configs, names)


def request_configs(
    problem: Any, max_new_tokens: int, tool_choice: str = "auto"
) -> dict[str, GenerationConfig]:
    """The problem's request with its grammar, and the same request with none (prompt only)."""
    grammar = GenerationConfig(
        max_new_tokens=max_new_tokens,
        tools=problem.tools,
        tool_choice=tool_choice,
        response_format=problem.response_format,
    )
    free = dataclasses.replace(grammar, grammar=False)  # the same prompts, no grammar
    return {"grammar": grammar, "prompt only": free}


def schema_valid(call: Any, tools: Sequence[dict]) -> bool:
    """An offered tool, and arguments valid against its parameters (closed: no extra keys)."""
    import jsonschema

    if not isinstance(call, ToolCall):
        return False
    specs = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    if call.name not in specs:
        return False
    try:
        jsonschema.validate(call.arguments, closed_schema(specs[call.name]))
    except jsonschema.ValidationError:
        return False
    return True


def play(ensemble: Ensemble, problem: Any, config: GenerationConfig, task: ToolTask) -> dict:
    """One tool turn: the first response, the tool run on its first call, the final answer."""
    started = time.perf_counter()
    first = ensemble.generate(problem.messages, config)
    written = [*first.tool_calls, *first.invalid_tool_calls]
    call = first.tool_calls[0] if first.tool_calls else None
    final: Output = first
    if call is not None:
        result = task.call_tool(call.name, call.arguments)
        messages = [*problem.messages, *task.followup(CALL_ID, call.name, call.arguments, result)]
        final = ensemble.generate(messages, config)
    expected = problem.expected_call
    if expected is None:
        tool_right = args_right = not written
    else:
        tool_right = call is not None and call.name == expected[0]
        args_right = call is not None and task.right_call(call.name, call.arguments, problem)
    return {
        "calls": len(written),
        "valid_calls": sum(schema_valid(c, problem.tools) for c in written),
        # a call the token limit cut (the grammar keeps calls valid only where they close)
        "cut_calls": len(first.invalid_tool_calls) if first.finish_reason == "length" else 0,
        "call": None if call is None else {"name": call.name, "arguments": call.arguments},
        "invalid": [c.to_dict() for c in first.invalid_tool_calls],
        "tool_right": tool_right,
        "args_right": args_right,
        "answer_right": bool(
            task.right_answer(final.text, problem, final.finish_reason == "length")
        ),
        "final": final.text,
        "seconds": time.perf_counter() - started,  # both turns (the tool's run is instant)
    }


def summarise(setups: Sequence[Setup], records: dict[tuple[str, str], list[dict]]) -> list[dict]:
    rows = []
    for setup in setups:
        row: dict[str, Any] = {"label": setup.label, "method": setup.method}
        for condition in CONDITIONS:
            rs = records[setup.label, condition]
            n = max(len(rs), 1)
            calls = sum(r["calls"] for r in rs)
            row[condition] = {
                "problems": len(rs),
                "right_tool": sum(r["tool_right"] for r in rs) / n,
                "right_arguments": sum(r["args_right"] for r in rs) / n,
                "right_answer": sum(r["answer_right"] for r in rs) / n,
                "calls": calls,
                "cut_calls": sum(r["cut_calls"] for r in rs),
                "schema_valid": sum(r["valid_calls"] for r in rs) / calls if calls else None,
                "seconds_per_problem": sum(r["seconds"] for r in rs) / n,
            }
        rows.append(row)
    return rows


def markdown(result: dict) -> str:
    lines = []
    lines += [
        f"{result['problems']} held-out problems ({result['task']}: "
        f"{result['needs_call']} need one call, the others none), greedy, max_new_tokens="
        f"{result['max_new_tokens']}; load average {result['load_before'][0]:.2f} before, "
        f'{result["load_after"][0]:.2f} after. Grammar: tool_choice="{result["tool_choice"]}"; '
        "prompt only: the same prompt, no grammar, calls parsed from the text. A call cut off "
        "by the token limit counts as not schema-valid.",
        "",
        "| configuration | right tool | right arguments | right answer | schema-valid calls "
        "| prompt only: right tool | right arguments | right answer | schema-valid calls "
        "| s/problem (grammar / prompt only) |",
        "|" + "---|" * 10,
    ]

    def pct(value) -> str:
        return "–" if value is None else f"{100 * value:.1f} %"

    for r in result["rows"]:
        cells = [r["label"]]
        for condition in CONDITIONS:
            c = r[condition]
            cut = f", {c['cut_calls']} cut off" if c["cut_calls"] else ""
            valid = f"{pct(c['schema_valid'])} of {c['calls']}{cut}"
            cells += [pct(c["right_tool"]), pct(c["right_arguments"]), pct(c["right_answer"]),
                      valid]  # fmt: skip
        seconds = [r[condition]["seconds_per_problem"] for condition in CONDITIONS]
        cells.append(" / ".join(f"{s:.1f}" for s in seconds))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(
    *,
    members: Sequence[Member],
    setups: Sequence[Setup],
    task: ToolTask,
    max_new_tokens: int = 160,
    tool_choice: str = "auto",
    out: str | Path = "bench-out/tool",
    progress: bool = True,
    command: str = "",
) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ensembles = {s.label: ensemble_for(members, s) for s in setups}
    records: dict[tuple[str, str], list[dict]] = {
        (s.label, c): [] for s in setups for c in CONDITIONS
    }
    load_before = os.getloadavg()
    steps = range(len(task.problems))
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="problems", unit="problem")
    pairs = [(s, c) for s in setups for c in CONDITIONS]
    for index in steps:
        problem = task.problems[index]
        configs = request_configs(problem, max_new_tokens, tool_choice)
        turn = index % len(pairs)
        for setup, condition in pairs[turn:] + pairs[:turn]:
            record = play(ensembles[setup.label], problem, setup.config(configs[condition]), task)
            records[setup.label, condition].append({"problem": index, **record})
    rows = summarise(setups, records)
    result = {
        "command": command,
        "task": task.name,
        "problems": len(task.problems),
        "needs_call": sum(p.expected_call is not None for p in task.problems),
        "max_new_tokens": max_new_tokens,
        "tool_choice": tool_choice,
        "members": [m.name for m in members],
        "load_before": list(load_before),
        "load_after": list(os.getloadavg()),
        "rows": rows,
        "per_problem": {f"{label} / {condition}": rs for (label, condition), rs in records.items()},
    }
    result = write_results(out, result, markdown(result))
    return result
