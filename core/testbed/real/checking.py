"""Checking a free-text reply against a real-task problem, the way a fair grader reads it.

A reply is read paragraph by paragraph (blank lines apart); the first paragraph that commits to
an answer is the one graded, so a base model that answers and then rambles on is graded on its
answer. Within that paragraph, the text after the last "The answer is" / "Answer:" / "####" is
read where the reply has such a marker.

- A number: after a marker, the first number there; without one, the last number of the
  paragraph (the end of "7 + 5 = 12", of "2 meters is 2 * 100 = 200 centimeters"). Numbers that
  repeat the question (`problem.echoes`) are skipped, so "2, 4, 6, 8, 10" answers 10. Number
  words ("twelve") count as numbers.
- A word: the first of the problem's answer forms and wrong options named, as a whole word and
  in any case, so "The capital of France is Paris." answers Paris.
- A JSON object: the first object parsed from the reply (a code fence or words around it do not
  matter); keys exactly, strings in any case, singular or plural and with or without an
  article ("coat" or "The coats" for "coats"), numbers as numbers (or their digits as a string).

Not lenient toward a reply that lists several candidates: an answer joined to another one by
",", "/", ";", "or", "and" or "to" ("10 or 12", "Paris, Rome"), a reply that anywhere names a
wrong answer the prompt itself offers (`problem.rivals`: another passage's city), or a second,
different JSON object with the same keys, fails; so does a reply that copies the prompt's
framing (`problem.framing`: "Passage 1:"), which finds the answer only by copying the passages.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidConfigError
from ..tool_set import calculator
from .problem import RealProblem, numbers_in

_MARKER = re.compile(r"(?:the\s+(?:final\s+)?answer\s+is|answer\s*:|####)[\s*:]*", re.IGNORECASE)
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_JOINER = re.compile(r"\s*(?:(?:,|/|;|-|–)\s*)?(?:(?:or|and|to)\s+)?(?:maybe\s+|perhaps\s+)?")

_UNITS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
]  # fmt: skip
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_NUMBER_WORDS = {w: i for i, w in enumerate(_UNITS) if w != "one"}  # "one" is a pronoun too
_NUMBER_WORDS |= {w: 20 + 10 * i for i, w in enumerate(_TENS)}
_NUMERAL = re.compile(
    r"(?<![\w.])(?P<digits>-?\d+(?:,\d{3})*(?:\.\d+)?)"
    rf"|\b(?P<tens>{'|'.join(_TENS)})(?:[- ](?P<unit>{'|'.join(_UNITS[1:10])}))?\b"
    rf"|\b(?P<word>{'|'.join(_NUMBER_WORDS)})\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class _Found:
    value: Any
    start: int
    end: int


def _paragraphs(text: str) -> list[str]:
    return [p for p in _PARAGRAPH_BREAK.split(text.strip()) if p.strip()]


def _region(paragraph: str) -> tuple[str, bool]:
    """The part of a paragraph that holds its answer, and whether a marker introduced it."""
    markers = list(_MARKER.finditer(paragraph))
    return (paragraph[markers[-1].end() :], True) if markers else (paragraph, False)


def _joined(text: str, left: _Found, right: _Found) -> tuple[bool, bool]:
    """Whether two found answers are joined as a list, and whether the joiner says "or"."""
    between = text[left.end : right.start]
    listed = _JOINER.fullmatch(between) is not None
    return listed, listed and re.search(r"\bor\b", between, re.IGNORECASE) is not None


# --------------------------------------------------------------------------- numbers


def _numerals(text: str) -> list[_Found]:
    found = []
    for m in _NUMERAL.finditer(text):
        if m["digits"]:
            digits = m["digits"].replace(",", "")
            value: float = float(digits) if "." in digits else int(digits)
        elif m["tens"]:
            value = _NUMBER_WORDS[m["tens"].lower()]
            value += _UNITS.index(m["unit"].lower()) if m["unit"] else 0
        else:
            value = _NUMBER_WORDS[m["word"].lower()]
        found.append(_Found(value, m.start(), m.end()))
    return found


def final_number(text: str, echoes: Sequence[int] = (), rivals: Sequence[Any] = ()) -> Any:
    """The number a reply commits to (see the module doc), or None."""
    for paragraph in _paragraphs(text):
        region, marked = _region(paragraph)
        numerals = _numerals(region)
        candidates = [n for n in numerals if n.value not in echoes]
        if not candidates:
            continue
        chosen = candidates[0] if marked else candidates[-1]
        at = numerals.index(chosen)
        for other in numerals[max(at - 1, 0) : at] + numerals[at + 1 : at + 2]:
            left, right = sorted((chosen, other), key=lambda n: n.start)
            listed, says_or = _joined(region, left, right)
            if other.value != chosen.value and listed and (other in candidates or says_or):
                return None
        if any(n.value in rivals for n in _numerals(text)):
            return None
        return chosen.value
    return None


# --------------------------------------------------------------------------- words


@functools.lru_cache(maxsize=4096)
def _whole_words(words: frozenset[str]) -> re.Pattern[str] | None:
    """One pattern for any of `words` as a whole word, in any case (longest first)."""
    if not words:
        return None
    ordered = sorted(words, key=len, reverse=True)
    return re.compile(
        "|".join(rf"(?<![\w'’-]){re.escape(w)}(?![\w-])" for w in ordered), re.IGNORECASE
    )


def final_word(text: str, accepted: Sequence[str], options: Sequence[str], rivals=()) -> Any:
    """The answer form or wrong option a reply commits to (lower case), or None."""
    pattern = _whole_words(frozenset(w.lower() for w in (*accepted, *options)))
    if pattern is None:
        return None
    accepted_set = {a.lower() for a in accepted}
    rival_pattern = _whole_words(frozenset(str(r).lower() for r in rivals))
    for paragraph in _paragraphs(text):
        region, _ = _region(paragraph)
        hits = [_Found(m.group().lower(), m.start(), m.end()) for m in pattern.finditer(region)]
        if not hits:
            continue
        first = hits[0]
        if len(hits) > 1:
            second = hits[1]
            same = first.value == second.value or {first.value, second.value} <= accepted_set
            if not same and _joined(region, first, second)[0]:
                return None
        if rival_pattern is not None and rival_pattern.search(text):
            return None
        return first.value
    return None


# --------------------------------------------------------------------------- JSON


def json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects written in `text`, in order (nested ones inside their parent only)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (start := text.find("{", at)) != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            at = start + 1
            continue
        if isinstance(value, dict):
            found.append(value)
        at = end
    return found


def _same_value(found: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or isinstance(found, bool):
        return found is expected
    if isinstance(expected, int):
        if isinstance(found, str) and re.fullmatch(r"\s*-?\d+\s*", found):
            return int(found) == expected
        return isinstance(found, int | float) and found == expected
    if isinstance(expected, str):
        return isinstance(found, str) and bool(_forms(found) & _forms(expected))
    return found == expected


def _forms(text: str) -> set[str]:
    """A string in any case and spacing, without a leading article, with the singulars its
    plural may stand for ("knives": "knife"), so "coat" or "The coats" extracted from "The
    coats cost 9 dollars." counts."""
    word = re.sub(r"^(?:the|an?)\s+", "", " ".join(text.split()).casefold())
    forms = {word}
    if word.endswith("s"):
        forms.add(word[:-1])
    if word.endswith("es"):
        forms.add(word[:-2])
    if word.endswith("ies"):
        forms.add(word[:-3] + "y")
    if word.endswith("ves"):
        forms |= {word[:-3] + "f", word[:-3] + "fe"}
    return forms


def json_matches(found: Any, expected: dict[str, Any]) -> bool:
    """The same keys, and each value the expected one (see the module doc)."""
    return (
        isinstance(found, dict)
        and set(found) == set(expected)
        and all(_same_value(found[k], v) for k, v in expected.items())
    )


def _json_answer(text: str, expected: dict[str, Any]) -> bool:
    objects = json_objects(text)
    if not objects or not json_matches(objects[0], expected):
        return False
    return not any(set(o) == set(expected) and not json_matches(o, expected) for o in objects[1:])


# --------------------------------------------------------------------------- per problem


def check_real_answer(text: str, problem: RealProblem, *, cut: bool = False) -> bool:
    """Whether `text` gives the problem's answer (the final answer, for a tool problem).

    `cut`: the reply stopped at the token limit (finish reason "length"), so its last word or
    number may be unfinished ("= 14" of "= 14000") and is not read."""
    if not isinstance(text, str):
        raise InvalidConfigError(f"check_real_answer takes the reply's text, got {type(text)}.")
    if cut:
        text = re.sub(r"[\w.,-]*\w$", "", text)
    if any(frame in text for frame in problem.framing):
        return False
    if problem.response_format is not None:
        (key,) = problem.response_format["required"]
        return _json_answer(text, {key: problem.answer})
    if isinstance(problem.answer, dict):
        return _json_answer(text, problem.answer)
    if isinstance(problem.answer, int):
        return final_number(text, problem.echoes, problem.rivals) == problem.answer
    accepted = (problem.answer, *problem.aliases)
    word = final_word(text, accepted, problem.options, problem.rivals)
    return word is not None and word in {a.lower() for a in accepted}


def check_real_tool_call(name: str, arguments: dict[str, Any] | str, problem: RealProblem) -> bool:
    """Whether a call is the one the problem needs: the same tool, and the same arguments as a
    fair grader compares them (add and multiply either way round; a calculator expression with
    the question's numbers and the same value; an item's name in any case)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return False
    if problem.expected_call is None or not isinstance(arguments, dict):
        return False
    tool, expected = problem.expected_call
    if name != tool or set(arguments) != set(expected):
        return False
    if tool == "calculator":
        given = arguments["expression"]
        return (
            isinstance(given, str)
            and sorted(numbers_in(given)) == sorted(numbers_in(expected["expression"]))
            and calculator(given) == calculator(expected["expression"])
        )
    if tool in ("get_price", "get_stock"):
        given = arguments["item"]
        return isinstance(given, str) and given.strip().casefold() == expected["item"].casefold()
    given = (arguments["a"], arguments["b"])
    if not all(type(x) is int for x in given):
        return False
    wanted = (expected["a"], expected["b"])
    return given == wanted or (tool in ("add", "multiply") and given == wanted[::-1])


def score_real(texts: Sequence[str], problems: Sequence[RealProblem]) -> float:
    """The share of `texts` that answer their problems (same order)."""
    if len(texts) != len(problems):
        raise InvalidConfigError(f"{len(texts)} texts for {len(problems)} problems.")
    right = sum(check_real_answer(t, p) for t, p in zip(texts, problems, strict=True))
    return right / max(len(problems), 1)
