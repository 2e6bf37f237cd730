"""What a vLLM server answers, checked before the engine reads it.

A served member trusts its server for numbers only it can compute; it need not trust it for
their form. Every answer is parsed here into plain values or rejected with `BadAnswer` saying
what was wrong: a body that is not JSON or not shaped as asked, a log-prob that is NaN or above
0, a token id outside the vocabulary, more tokens than `max_tokens` allowed, a context length
that is not a positive integer. `core.remote` turns a `BadAnswer` into a `ServerError` naming
the member and the URL, so a faulty or hostile server fails the member, never the text.
"""

from __future__ import annotations

import json
import math
from typing import Any

# float32 log-softmax can land a hair above 0 for a near-certain token; more than this is wrong
_ROUNDING = 1e-4


class BadAnswer(ValueError):
    """A server's answer is not what was asked for; the message says what is wrong."""


def parse(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:  # UnicodeDecodeError included
        raise BadAnswer(f"a body that is not JSON (it starts with {body[:60]!r})") from None
    except RecursionError:
        raise BadAnswer("JSON nested deeper than Python can read") from None


def served_models(data: Any) -> dict[str, dict]:
    """`/v1/models`: served name -> its entry; `max_model_len`, when given, a positive int."""
    entries = _get(data, "data", list, "the model list")
    served = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise BadAnswer(f"a model list entry without a name: {entry!r}")
        window = entry.get("max_model_len")
        if window is not None and (not _is_int(window) or window <= 0):
            raise BadAnswer(
                f"max_model_len={window!r} for {entry['id']!r} (a context length is a positive "
                "number of tokens)"
            )
        root = entry.get("root")
        if root is not None and not isinstance(root, str):
            raise BadAnswer(f"root={root!r} for {entry['id']!r} (a path or hub id)")
        served[entry["id"]] = entry
    return served


def tokens(data: Any) -> list[int]:
    """`/tokenize`: the token ids (any range: ids this side does not know are a tokenizer
    mismatch, which the caller reports as one)."""
    ids = _get(data, "tokens", list, "the tokenization")
    if not all(_is_int(i) and i >= 0 for i in ids):
        raise BadAnswer(f"tokens={_short(ids)} (a list of token ids)")
    return ids


def choices(data: Any, count: int) -> list[dict]:
    """`/v1/completions`: one choice per prompt, in prompt order."""
    items = _get(data, "choices", list, "the completion")
    if len(items) != count or not all(isinstance(c, dict) for c in items):
        raise BadAnswer(f"{len(items)} choices for {count} prompts")
    indices = [c.get("index") for c in items]
    if sorted(i for i in indices if _is_int(i)) != list(range(count)):
        raise BadAnswer(f"choices numbered {indices}, not 0 to {count - 1}")
    return sorted(items, key=lambda c: c["index"])


def logprob(value: Any) -> float:
    if not _is_number(value) or math.isnan(value) or value > _ROUNDING:
        raise BadAnswer(f"a log-prob of {value!r} (log-probs are numbers <= 0)")
    return min(float(value), 0.0)


def token_id(value: Any, size: int) -> int:
    if not _is_int(value) or not 0 <= value < size:
        raise BadAnswer(f"token id {value!r}, outside the vocabulary (0 to {size - 1})")
    return value


def generated_ids(choice: dict, max_tokens: int, size: int) -> list[int] | None:
    """The ids a draft generated (vLLM's `return_token_ids`); None when the server sent none."""
    ids = choice.get("token_ids")
    if ids is None:
        return None
    if not isinstance(ids, list):
        raise BadAnswer(f"token_ids={ids!r} (a list of ids)")
    if len(ids) > max_tokens:
        raise BadAnswer(f"{len(ids)} tokens for max_tokens={max_tokens}")
    return [token_id(i, size) for i in ids]


def top_rows(choice: dict, max_tokens: int, size: int | None) -> list[dict[int, float]]:
    """One {token id: log-prob} row per generated token (vLLM's `top_logprobs`, keyed
    "token_id:N" by `return_tokens_as_token_ids`). `size` None: each row is the full vocabulary,
    so its ids lie below its own length."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        raise BadAnswer(f"logprobs={_short(logprobs)} (log-probs were asked for)")
    rows = logprobs.get("top_logprobs")
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise BadAnswer(f"top_logprobs={_short(rows)} (a list of rows)")
    if len(rows) > max_tokens:
        raise BadAnswer(f"{len(rows)} generated positions for max_tokens={max_tokens}")
    return [_row(row, len(row) if size is None else size) for row in rows]


def next_row(choice: dict, size: int | None) -> dict[int, float]:
    """The next-token row of a one-token completion."""
    rows = top_rows(choice, 1, size)
    if not rows:
        raise BadAnswer("no log-probs for the generated token")
    return rows[0]


def prompt_logprob(choice: dict, position: int, token: int) -> float:
    """The log-prob of prompt token `token` at `position` (vLLM's `prompt_logprobs`)."""
    rows = choice.get("prompt_logprobs")
    if not isinstance(rows, list) or len(rows) <= position:
        raise BadAnswer(f"prompt_logprobs={_short(rows)} (a row per prompt position)")
    entry = rows[position].get(str(token)) if isinstance(rows[position], dict) else None
    if not isinstance(entry, dict) or "logprob" not in entry:
        raise BadAnswer(f"no prompt log-prob for token {token} at position {position}")
    return logprob(entry["logprob"])


def _row(entries: dict, size: int) -> dict[int, float]:
    row = {}
    for key, value in entries.items():
        if not isinstance(key, str) or not key.startswith("token_id:"):
            raise BadAnswer(
                f"log-probs keyed by text ({key!r}), not by token id; remote members need "
                "vLLM's return_tokens_as_token_ids (vLLM >= 0.6)"
            )
        try:
            number = int(key[9:])
        except ValueError:
            raise BadAnswer(f"a log-prob key {key!r} that names no token id") from None
        row[token_id(number, size)] = logprob(value)
    return row


def _get(data: Any, key: str, kind: type, what: str) -> Any:
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, kind):
        raise BadAnswer(f"{what} without its {key!r} {kind.__name__}: {_short(data)}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "…"
