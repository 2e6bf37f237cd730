"""Stop strings: the output ends before the stop string, and however the text is chunked, a
partial stop string is never emitted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.stops import StopFilter

ALPHABET = st.sampled_from(list("ab\n#Ob:"))


def _run(stops, chunks):
    f = StopFilter(stops)
    emitted = []
    for chunk in chunks:
        emitted.append(f.feed(chunk))
        if f.found:
            break
    if not f.found:
        emitted.append(f.flush())
    return emitted, f.found


@given(
    text=st.text(ALPHABET, max_size=40),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=3),
    splits=st.lists(st.integers(0, 40), max_size=10),
)
def test_chunking_never_changes_the_output(text, stops, splits):
    points = sorted({min(s, len(text)) for s in splits})
    chunks = [text[i:j] for i, j in zip([0, *points], [*points, len(text)], strict=True)]
    emitted, stopped = _run(stops, chunks)
    hits = [text.find(s) for s in stops if s in text]
    expected = text[: min(hits)] if hits else text
    assert "".join(emitted) == expected
    assert stopped == bool(hits)
    streamed = ""
    for piece in emitted:
        streamed += piece
        # nothing emitted so far contains a stop string
        assert not any(s in streamed for s in stops)


def test_partial_stop_is_held_back_then_released():
    f = StopFilter(["\nObservation:"])
    assert f.feed("Thought: x\nObs") == "Thought: x"
    assert f.feed("cure") == "\nObscure"
    assert f.feed("\nObservation: 12") == ""
    assert f.found


def test_a_stop_that_starts_earlier_but_ends_later_wins():
    """Stops ":" and "O::" over "O::": the output ends where "O::" starts, although ":" is
    complete first, whichever way the text arrives."""
    for chunks in (["O:", ":"], ["O", "::"], ["O::"]):
        emitted, stopped = _run([":", "O::"], chunks)
        assert ("".join(emitted), stopped) == ("", True)
    emitted, stopped = _run([":", "O::"], ["O:"])
    assert ("".join(emitted), stopped) == ("O", True)  # the end: ":" was the stop after all
