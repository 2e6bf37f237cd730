"""The next-token rows a request has already computed in one member, by the ids they follow.

A method asks a member for the same distribution more than once: SAFE's verifier reads a draft,
then proposes a word from a boundary inside it, then scores the proposals (its own word's rows,
and the drafter's word it has just read); the drafter drafts again over text it drafted before
the ensemble decided a word. Each of those is a forward pass, and on a model with a large output
head (Gemma's 262,144 rows) a pass costs more than a drafter step. A row is a function of the
prompt and the response ids before it, so a member keeps the rows it computed, keyed by those
ids, and serves a repeated request from them: the same numbers, with no pass.

Bounded by bytes (least recently used rows go first), and per request: `Member.start` clears it,
and a request's view (`Member.spawn`) starts with an empty one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

BUDGET_BYTES = 64 * 2**20  # per member view: 64 rows of Gemma-3's vocabulary in float32
MIN_ROWS = 8


class RowMemo:
    """Rows by the response ids they follow (least recently used dropped past the budget)."""

    def __init__(self, budget_bytes: int = BUDGET_BYTES) -> None:
        self.budget = budget_bytes
        self.capacity: int | None = None  # rows kept, set by the first row's size
        self._rows: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def __eq__(self, other: object) -> bool:  # two request states compare by what they hold
        if not isinstance(other, RowMemo):
            return NotImplemented
        mine, theirs = self._rows, other._rows
        return mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)

    __hash__ = None  # mutable

    def get(self, ids: Sequence[int]) -> torch.Tensor | None:
        key = tuple(ids)
        row = self._rows.get(key)
        if row is not None:
            self._rows.move_to_end(key)
        return row

    def put(self, ids: Sequence[int], row: torch.Tensor) -> None:
        if self.capacity is None:
            size = row.numel() * row.element_size()
            self.capacity = max(MIN_ROWS, self.budget // max(size, 1))
        if row.untyped_storage().nbytes() > row.numel() * row.element_size():
            row = row.clone()  # a row of a larger result: keep only the row
        key = tuple(ids)
        self._rows[key] = row
        self._rows.move_to_end(key)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)

    def clear(self) -> None:
        self._rows.clear()
