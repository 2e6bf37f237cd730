"""Checking a model's output against a reference answer: the FINAL answer, compared exactly.

`python -m lab bench --task file.jsonl` scores outputs with `answer_checker(row["answer"])`.
Looking for the answer anywhere in the output would let a multiple-choice "B" match almost any
text, so the checker first extracts the one answer the output commits to, then compares:

- The answer position is right after the LAST "The answer is", "The final answer is" or
  "Answer:" (any case, markdown bold allowed); with no such marker, the end of the output.
- A number (the reference parses as one, "1,234" and "-3.5" included) is compared as a number:
  the first number at the answer position, else the last number in the output.
- A multiple-choice letter (the reference is one letter, optionally "(B)" or "B.") must stand
  as a whole token at the answer position: "The answer is B", "Answer: (B)", "the answer is
  **B**.", or a final line that is only the letter. An uppercase letter only, so the article in
  "the answer is a cat" is not option A.
- Free text is compared after normalising case, spaces, quotes, markdown bold and end
  punctuation: the rest of the marker's line (or its first sentence) must equal the reference;
  with no marker, the final non-empty line must.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_MARKER = re.compile(r"(?:the\s+(?:final\s+)?answer\s+is|answer\s*:)[\s*:]*", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_LETTER_REFERENCE = re.compile(r"\(?([A-Za-z])\)?\.?")
_LETTER_TOKEN = re.compile(r"[(\[]?\**([A-Z])\**[)\]]?(?![A-Za-z0-9])")
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")


def answer_checker(answer: str) -> Callable[[str], bool]:
    """A function telling whether an output's final answer is `answer` (see the module doc)."""
    reference = str(answer).strip()
    number = _as_number(reference)
    if number is not None:
        return lambda text: _final_number(text) == number
    letter = _LETTER_REFERENCE.fullmatch(reference)
    if letter is not None:
        wanted = letter.group(1).upper()
        return lambda text: _final_letter(text) == wanted
    wanted_text = _normalise(reference)
    return lambda text: wanted_text in _final_texts(text)


def _as_number(text: str) -> float | None:
    if _NUMBER.fullmatch(text) is None:
        return None
    return float(text.replace(",", ""))


def _answer_position(text: str) -> str | None:
    """The text after the last answer marker, or None when the output has no marker."""
    markers = list(_MARKER.finditer(text))
    return text[markers[-1].end() :] if markers else None


def _final_number(text: str) -> float | None:
    after = _answer_position(text)
    found = _NUMBER.search(after) if after is not None else None
    if found is None:
        numbers = _NUMBER.findall(text)
        return float(numbers[-1].replace(",", "")) if numbers else None
    return float(found.group().replace(",", ""))


def _final_letter(text: str) -> str | None:
    after = _answer_position(text)
    if after is not None:
        found = _LETTER_TOKEN.match(after)
        return found.group(1) if found else None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    found = re.fullmatch(r"[(\[]?\**([A-Z])\**[)\]]?\.?", lines[-1])
    return found.group(1) if found else None


def _final_texts(text: str) -> set[str]:
    """The normalised candidates for the final answer: the marker's line and its first
    sentence, or the last non-empty line."""
    after = _answer_position(text)
    if after is None:
        lines = [line for line in text.strip().splitlines() if line.strip()]
        return {_normalise(lines[-1])} if lines else set()
    line = after.strip().split("\n", 1)[0] if after.strip() else ""
    first = _SENTENCE_END.search(line)
    sentence = line[: first.start()] if first else line
    return {_normalise(line), _normalise(sentence)}


def _normalise(text: str) -> str:
    text = text.replace("*", "").strip().strip("\"'`“”‘’").strip()
    text = text.rstrip(".!?;:,").strip().strip("\"'`“”‘’")
    return " ".join(text.lower().split())
