"""A task of the project's own for real chat models: short questions with one checkable answer.

    from core.testbed.real import make_real_problems, check_real_answer
    problems = make_real_problems(400, seed=1, form="qa")   # "qa" | "rag" | "tool"
    check_real_answer(reply_text, problems[0])

`problems` makes them (the forms and kinds), `problem` holds a problem and the held-out splits,
`kinds`, `passages` and `tool_problems` write the questions, `pools` lists the facts and words,
and `checking` reads a reply.
"""

from .checking import (
    check_real_answer,
    check_real_tool_call,
    final_number,
    final_word,
    json_objects,
    score_real,
)
from .problem import REPORT_SEED, RealProblem, part_of, part_of_seed
from .problems import FORMS, QA_KINDS, make_real_problems
from .tool_problems import TOOL_KINDS

__all__ = [
    "FORMS",
    "QA_KINDS",
    "REPORT_SEED",
    "TOOL_KINDS",
    "RealProblem",
    "check_real_answer",
    "check_real_tool_call",
    "final_number",
    "final_word",
    "json_objects",
    "make_real_problems",
    "part_of",
    "part_of_seed",
    "score_real",
]
