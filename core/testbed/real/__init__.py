"""A task of the project's own for real chat models: short questions with one checkable answer.

    from core.testbed.real import make_real_problems, check_real_answer
    problems = make_real_problems(400, seed=1, form="qa")   # "qa" | "rag" | "tool"
    check_real_answer(reply_text, problems[0])

See `problems` for the forms, kinds and the held-out splits, and `checking` for how a reply is
read.
"""

from .checking import (
    check_real_answer,
    check_real_tool_call,
    final_number,
    final_word,
    json_objects,
    score_real,
)
from .problems import (
    FORMS,
    QA_KINDS,
    REPORT_SEED,
    TOOL_KINDS,
    RealProblem,
    make_real_problems,
    part_of,
    part_of_seed,
)

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
