"""Random JSON schemas for the grammar and structured-output tests: nested objects, arrays,
enums, bounded numbers, optional fields, unicode strings.

`schemas(bounded=True)` draws only schemas whose language is finite (bounded strings, integers
and arrays, no free numbers), so a response always ends within a budget and schema-valid output
can be asserted, not only hoped for."""

from __future__ import annotations

from hypothesis import strategies as st

TEXT = st.characters(exclude_categories=("Cs",))  # text, not lone UTF-16 surrogates
KEYS = st.sampled_from(["a", "b", "name", "größe", "値", "x_1", "items", "type"])


def leaves(bounded: bool) -> st.SearchStrategy[dict]:
    finite = [
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.integers(0, 6).map(lambda n: {"type": "string", "maxLength": n}),
        st.tuples(st.integers(-50, 0), st.integers(1, 500)).map(
            lambda b: {"type": "integer", "minimum": b[0], "maximum": b[1]}
        ),
        st.lists(st.text(TEXT, max_size=5), min_size=1, max_size=4, unique=True).map(
            lambda values: {"enum": values}
        ),
    ]
    if bounded:
        return st.one_of(finite)
    free = [
        st.just({"type": "string"}),
        st.just({"type": "integer"}),
        st.just({"type": "number"}),
        st.tuples(st.integers(-100, 0), st.integers(1, 1000)).map(
            lambda b: {"type": "number", "minimum": b[0], "maximum": b[1]}
        ),
    ]
    return st.one_of(finite + free)


def objects(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    """Objects of 1-3 properties drawn from `children`, some of them optional."""

    def build(props: dict, optional: set) -> dict:
        required = [name for name in props if name not in optional]
        return {"type": "object", "properties": props, "required": required}

    return st.dictionaries(KEYS, children, min_size=1, max_size=3).flatmap(
        lambda props: st.sets(st.sampled_from(sorted(props))).map(lambda o: build(props, o))
    )


def schemas(bounded: bool, max_leaves: int = 6) -> st.SearchStrategy[dict]:
    return st.recursive(
        leaves(bounded),
        lambda children: st.one_of(
            objects(children),
            st.builds(
                lambda item, n: {"type": "array", "items": item, "maxItems": n},
                children,
                st.integers(0, 3),
            ),
        ),
        max_leaves=max_leaves,
    )
