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
        hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.found, self.held_back = True, ""
            return buffer[: min(hits)]
        keep = partial_suffix(buffer, self.stops)
        self.held_back = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """At the end of generation nothing more can complete a stop string."""
        held_back, self.held_back = self.held_back, ""
        return held_back


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
