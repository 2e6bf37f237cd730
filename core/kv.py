"""The keys and values a model computed for a prefix of a sequence, and where they are kept.

`KVPrefix` holds one sequence's keys and values for its first `length` ids; it is never written
in place (a forward pass makes new tensors, a crop makes views), so a request's state can share
it with a snapshot of itself and with other requests. `PrefixPool` keeps finished requests'
prefixes for later requests whose prompts share them. `block_mask` is the attention pattern of a
verify-in-line pass. `common_prefix` is the one way the engine compares two id (or byte)
sequences.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def common_prefix(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two id lists (or two byte strings)."""
    n = min(len(a), len(b))
    if isinstance(a, (bytes, bytearray)):
        x, y, width = a[:n], b[:n], 1
    elif n > 32:  # long id lists: compare machine words in C, not ints in Python
        x, y, width = array("q", a[:n]).tobytes(), array("q", b[:n]).tobytes(), 8
    else:
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i
    lo, hi = 0, n
    while lo < hi:  # the longest equal prefix, by bisection
        mid = (lo + hi + 1) // 2
        if x[: mid * width] == y[: mid * width]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class KVPrefix:
    """Keys and values for the first `length` ids of a sequence. Never written in place: a
    forward pass makes new tensors (concatenation), a crop makes views, so a state can share
    them with a copy of itself and with other requests (prefix reuse) safely."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    length: int
    last_row: torch.Tensor | None = None  # log-probs at position length - 1

    def crop(self, keep: int) -> KVPrefix | None:
        if keep <= 0:
            return None
        if keep >= self.length:
            return self
        layers = tuple((k[..., :keep, :], v[..., :keep, :]) for k, v in self.layers)
        return KVPrefix(layers, keep)

    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() * 2 for k, _ in self.layers)


class PrefixPool:
    """Computed prefixes of finished requests, for later requests whose prompts share them (an
    agent loop or a multi-turn chat resends the whole history). Bounded: least recently used
    out beyond `entries` or `max_bytes`."""

    def __init__(self, entries: int = 16, max_bytes: int = 1 << 30) -> None:
        self.entries, self.max_bytes = entries, max_bytes
        self._items: list[tuple[list[int], KVPrefix]] = []  # most recently used last
        self._lock = threading.Lock()

    def put(self, ids: list[int], kv: KVPrefix) -> None:
        if self.entries <= 0 or kv is None:
            return
        with self._lock:
            self._items = [
                (i, k) for i, k in self._items if common_prefix(i, ids) < min(len(i), k.length)
            ]  # an entry this one extends is superseded
            self._items.append((list(ids[: kv.length]), kv))
            while len(self._items) > self.entries or (
                len(self._items) > 1 and sum(k.nbytes() for _, k in self._items) > self.max_bytes
            ):
                self._items.pop(0)

    def take(self, prompt: list[int]) -> KVPrefix | None:
        """The cached keys of the longest prefix of `prompt` held here (shared, not copied)."""
        with self._lock:
            best, found = 0, None
            for index, (ids, kv) in enumerate(self._items):
                n = min(common_prefix(ids, prompt), kv.length)
                if n > best:
                    best, found = n, index
            if found is None:
                return None
            entry = self._items.pop(found)
            self._items.append(entry)  # most recently used
        # one position is left to compute: the prompt's last row comes from a forward pass
        return entry[1].crop(min(best, len(prompt) - 1))

    def clear(self) -> None:
        with self._lock:
            self._items = []


def block_mask(past: int, visible: int, tail: int, blocks: Sequence[int]) -> torch.Tensor:
    """Which positions each new id of a verify-in-line pass may attend to: [n, past + n].

    The new ids are a `tail` (the uncached end of a shared prefix) followed by blocks of the
    given sizes. Every new id sees the first `visible` cached positions (cached ids beyond them,
    a drafter's own draft, stay hidden) and the whole tail (the tail itself causally); each
    block sees its own earlier ids only, never another block."""
    n = tail + sum(blocks)
    allowed = torch.zeros(n, past + n, dtype=torch.bool)
    allowed[:, :visible] = True
    allowed[:, past : past + tail] = True
    allowed[:tail, past : past + tail] = torch.ones(tail, tail, dtype=torch.bool).tril()
    offset = tail
    for size in blocks:
        at = past + offset
        allowed[offset : offset + size, at : at + size] = torch.ones(size, size).bool().tril()
        offset += size
    return allowed
