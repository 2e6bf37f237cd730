"""Stop strings with OpenAI semantics, for streams.

The output ends just before the first stop string; text that might be the start of a stop string
is held back until the next piece shows it is not, so a partial stop string is never streamed.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopFilter:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held_back = ""  # text that may be the start of a stop string
        self.found = False  # a stop string was found: the output ended before it

    def feed(self, text: str) -> str:
        """The part of `held_back + text` that is safe to emit now."""
        if self.found:
            return ""
        buffer = self.held_back + text
        hit = first_hit(buffer, self.stops)
        # A stop string that starts before the first hit may still complete (stops "O::" and
        # ":", text "O:" so far): the output would then end at its start, so hold from there.
        pending = unfinished_start(buffer, self.stops, len(buffer) if hit is None else hit)
        if pending is not None:
            self.held_back = buffer[pending:]
            return buffer[:pending]
        self.held_back = ""
        if hit is not None:
            self.found = True
            return buffer[:hit]
        return buffer

    def flush(self) -> str:
        """At the end of generation nothing more can complete a stop string: what is held back
        is emitted up to the first stop string it holds."""
        held_back, self.held_back = self.held_back, ""
        hit = None if self.found else first_hit(held_back, self.stops)
        if hit is not None:
            self.found = True
            return held_back[:hit]
        return held_back


def first_hit(buffer: str | bytes, stops: Sequence[str] | Sequence[bytes]) -> int | None:
    """Where the first complete stop string in `buffer` starts (text, or bytes and byte
    strings)."""
    hits = [i for i in (buffer.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def unfinished_start(buffer: str, stops: Sequence[str], before: int) -> int | None:
    """The first position before `before` from which the rest of `buffer` is a proper prefix
    of a stop string: where a stop string may be starting."""
    longest = max((len(s) for s in stops), default=0)
    for start in range(max(0, len(buffer) - longest + 1), before):
        tail = buffer[start:]
        if any(len(tail) < len(s) and s.startswith(tail) for s in stops):
            return start
    return None


def partial_suffix(buffer: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `buffer` that is a proper prefix of one of `markers`: the
    text a stream must hold back until it knows whether a marker starts there."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(buffer)), best, -1):
            if buffer.endswith(marker[:n]):
                best = n
                break
    return best
