"""The two testbeds behind one shape, so a demo, an example or a benchmark runs on either: the
shipped tiny models with the task they were trained on, or the real pair (SmolLM2-135M-Instruct
and Gemma-3-270M base, GGUF files of the `real` extra) with the real task.

    from core.testbed.testbeds import testbed
    bed = testbed(real=True)
    members = bed.members()                       # paths, or Local(...) specs for the real pair
    problems = bed.problems(20, seed=1, form="tool")
    bed.right(out.text, problems[0], cut=out.finish_reason == "length")
    bed.right_call(name, arguments, problems[0])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidConfigError


@dataclass(frozen=True)
class Testbed:
    """Members, problems and checkers of one testbed. `forms`: the problem forms it has, the
    question form first (cot for the tiny task, qa for the real one)."""

    real: bool

    @property
    def name(self) -> str:
        return "real" if self.real else "tiny"

    @property
    def forms(self) -> tuple[str, ...]:
        return ("qa", "rag", "tool") if self.real else ("cot", "rag", "react", "tool")

    def members(self) -> list[Any]:
        """The members in their fixed order (the first drafts by default). The real pair needs
        the `real` extra: without it, a `ModelNotFoundError` that names it."""
        if self.real:
            from .real_models import real_members

            return list(real_members())
        from .models import model_paths

        return [str(path) for path in model_paths()]

    def problems(self, n: int, seed: int = 1, form: str | None = None) -> list[Any]:
        """`n` held-out problems of `form` (default: the question form) of `seed`."""
        form = form or self.forms[0]
        if form not in self.forms:
            raise InvalidConfigError(
                f"the {self.name} testbed has the forms {', '.join(self.forms)}, not {form!r}."
            )
        if self.real:
            from .real import make_real_problems

            return make_real_problems(n, seed=seed, form=form)
        from .task import make_problems

        return make_problems(n, seed=seed, form=form, split="test")

    def right(self, text: str, problem: Any, cut: bool = False) -> bool:
        """Whether `text` answers `problem`. `cut`: the reply stopped at the token limit, so the
        real task's checker leaves its unfinished last word unread."""
        if self.real:
            from .real import check_real_answer

            return check_real_answer(text, problem, cut=cut)
        from .task import check_answer

        return check_answer(text, problem)

    def right_call(self, name: str, arguments: Any, problem: Any) -> bool:
        """Whether a tool call is the one `problem` needs (as the testbed's grader compares)."""
        if self.real:
            from .real import check_real_tool_call

            return check_real_tool_call(name, arguments, problem)
        from .task import check_tool_call

        return check_tool_call(name, arguments, problem)


def testbed(real: bool = False) -> Testbed:
    """The real pair's testbed (`real=True`) or the shipped tiny models'."""
    return Testbed(real=bool(real))
