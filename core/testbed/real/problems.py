"""The real task's problems: short questions with one checkable answer, for small chat models.

Three forms, each seeded and deterministic (the first k of n problems are the k problems):

- ``qa``: seven kinds, each block of seven problems holding one of each in a seeded order:
  arithmetic, word problems, facts (capitals, opposites, plurals, colours, the order of days and
  months, animal sounds), unit conversions, number and letter sequences, JSON extraction from a
  sentence, and a question over three short passages in the prompt.
- ``rag``: the passage question as a LlamaIndex query engine sends it (its default chat QA
  prompt, holding the relevant passage and one distractor); ``passages`` are the documents to
  index (the relevant one first, then three distractors).
- ``tool``: tools of ``core.testbed.tool_set`` offered as OpenAI-style specs; the right first
  turn is one call with arguments taken from the question (``expected_call``), the right final
  answer follows from the tool's result. One kind in seven needs no tool (a fact question).

Held-out splits: every finite pool (facts, names, cities, jobs, goods) and every number
combination is split by a hash of its key into a reporting part and a tuning part. Seed 1 is the
reporting seed (``REPORT_SEED``): its problems use the reporting part only. Every other seed
(seed 2 is the one to tune on) uses the tuning part only, so no tuning problem shares a fact, a
person, a place, a good or a number combination with a reported one. Within one seed no item
repeats; asking for more problems than a part holds is an error.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from ...errors import InvalidConfigError
from .kinds import arithmetic, conversions, facts, json_extraction, sequences, word_problems
from .passages import passages_qa, passages_rag
from .problem import REPORT_SEED, Draws, PartPools, RealProblem, UsedUp, part_of_seed
from .tool_problems import tool_problems

FORMS = ("qa", "rag", "tool")
QA_KINDS = ("arithmetic", "word_problem", "fact", "conversion", "sequence", "json", "passage")


def _streams(form: str, rng: random.Random, part: str) -> dict[str, Iterator[RealProblem]]:
    split, draws = PartPools(part), Draws(part)
    if form == "rag":
        return {"passage": passages_rag(rng, draws, split)}
    if form == "tool":
        return {"tool": tool_problems(rng, draws, split)}
    return {
        "arithmetic": arithmetic(rng, draws),
        "word_problem": word_problems(rng, draws, split),
        "fact": facts(rng, split),
        "conversion": conversions(rng, part),
        "sequence": sequences(rng, draws),
        "json": json_extraction(rng, draws, split),
        "passage": passages_qa(rng, draws, split),
    }


def make_real_problems(n: int, seed: int = REPORT_SEED, form: str = "qa") -> list[RealProblem]:
    """`n` problems of `form` ("qa", "rag" or "tool"); the same (n, seed, form) gives the same
    problems, and the first k of them are `make_real_problems(k, seed, form)`.

    Seed 1 draws from the reporting part of every pool, every other seed from the tuning part.
    """
    if form not in FORMS:
        raise InvalidConfigError(f"form must be one of {FORMS}, got {form!r}.")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidConfigError(f"n must be a count of problems (an int >= 0), got {n!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidConfigError(f"seed must be an int (1 reports, others tune), got {seed!r}.")
    part = part_of_seed(seed)
    rng = random.Random(f"real-task/{form}/{seed}")
    streams = _streams(form, rng, part)
    problems: list[RealProblem] = []
    while len(problems) < n:
        kinds = list(streams)
        rng.shuffle(kinds)
        for kind in kinds[: n - len(problems)]:
            try:
                problems.append(next(streams[kind]))
            except UsedUp:
                raise InvalidConfigError(
                    f"seed {seed} draws from the {part} part, which holds no more distinct "
                    f"{kind!r} problems after {len(problems)} {form!r} problems; ask for at most "
                    f"{len(problems)}."
                ) from None
    return problems
