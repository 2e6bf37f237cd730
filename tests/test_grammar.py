"""Grammar-constrained decoding over the shared text, on each member tokenizer's own ids: random
JSON schemas and instances, the tool-call languages, and the matcher kept in step through
retractions and interruptions."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import shutil
import sys
import threading
import weakref
from collections.abc import Iterator

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from json_schemas import objects, schemas
from llguidance import LLMatcher

from core.errors import InvalidConfigError
from core.grammar import (
    ConstraintError,
    GrammarViolation,
    Matcher,
    build_constraint,
    constrain,
)
from core.json_schema import closed_schema
from core.loading import load_tokenizer
from core.testbed import model_paths
from core.tool_calls import format_tool_call, format_tool_calls
from core.tools import normalize_tools
from core.vocab import Vocab


def _member_view(path) -> tuple[Vocab, frozenset[int]]:
    """The vocabulary and stop ids exactly as `HFMember` builds them (no weights needed)."""
    from transformers import AutoConfig, GenerationConfig

    tokenizer = load_tokenizer(str(path))
    config = AutoConfig.from_pretrained(path)
    vocab = Vocab(tokenizer, model_vocab_size=config.get_text_config().vocab_size)
    eos = GenerationConfig.from_pretrained(path).eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    return vocab, frozenset(vocab.special_ids) | frozenset(eos)


def _dummy_prefix_copy(path, root):
    """The spm testbed tokenizer turned into a Llama-2 / Phi-3 style one, whose first token
    carries a space that is not part of the text."""
    target = root / "spm-dummy-prefix"
    shutil.copytree(path, target, ignore=shutil.ignore_patterns("*.safetensors"))
    spec = json.loads((target / "tokenizer.json").read_text())
    spec["pre_tokenizer"]["pretokenizers"][0]["prepend_scheme"] = "first"
    spec["decoder"]["decoders"].append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    (target / "tokenizer.json").write_text(json.dumps(spec))
    return target


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory) -> dict[str, tuple[Vocab, frozenset[int]]]:
    views = {path.name: _member_view(path) for path in model_paths()}
    dummy = _member_view(_dummy_prefix_copy(model_paths()[1], tmp_path_factory.mktemp("tok")))
    assert dummy[0].dummy_prefix and not any(v.dummy_prefix for v, _ in views.values())
    views["spm-dummy-prefix"] = dummy
    return views


TOOLS = normalize_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "add_numbers",
                "description": "Add two integers.",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            },
        },
        {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
        {"name": "get_time", "description": "The time now."},
    ]
)
ADD = ("add_numbers", {"a": 7, "b": 5})
WEATHER = ("get_weather", {"city": "Zürich 中文", "unit": "celsius"})
NO_ARGS = ("get_time", {})


def _matches(vocab, stops, constraint, text: str) -> bool:
    """Does the whole text belong to the language, read through this member's canonical ids?"""
    matcher = Matcher(constraint, vocab, stops)
    try:
        matcher.follow(vocab.encode(text))
    except GrammarViolation:
        return False
    return matcher.accepting()


def _walk_canonical(vocab, stops, constraint, text: str) -> Matcher:
    """Follow the canonical ids of `text` one by one: each is allowed, stop ids only where the
    grammar may end, and the end is accepting."""
    matcher = Matcher(constraint, vocab, stops)
    ids = vocab.encode(text)
    stop_list = sorted(stops)
    for k, token in enumerate(ids):
        matcher.follow(ids[:k])
        allowed = matcher.allowed()
        assert allowed[token], (k, vocab.decode_bytes(ids[: k + 1]))
        assert bool(allowed[stop_list].any()) == matcher.accepting()
    matcher.follow(ids)
    assert matcher.accepting(), text
    assert bool(matcher.allowed()[stop_list].all())
    return matcher


# --------------------------------------------------------------------------------------------
# Random JSON schemas and their instances.

SCHEMAS = schemas(bounded=False)
OBJECT_SCHEMAS = objects(SCHEMAS)


def _instances(schema):
    """Instances of a generated schema. Leaves come from hypothesis-jsonschema; objects and
    arrays are assembled here, because hypothesis-jsonschema 0.23's object strategy calls a
    Hypothesis internal (`many.more`) that current Hypothesis no longer has. Keys come in the
    schema's order, which the grammar fixes."""
    if schema.get("type") == "object":
        props, required = schema["properties"], set(schema["required"])
        return st.fixed_dictionaries(
            {k: _instances(v) for k, v in props.items() if k in required},
            optional={k: _instances(v) for k, v in props.items() if k not in required},
        ).map(lambda found: {k: found[k] for k in props if k in found})
    if schema.get("type") == "array":
        return st.lists(_instances(schema["items"]), max_size=schema["maxItems"])
    return from_schema(schema)


def _writable(value, schema) -> bool:
    """False where llguidance departs from json.dumps (documented in core.grammar): exponents in
    bounded numbers, a raw DEL character in a string."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return all(_writable(v, props.get(k, {})) for k, v in value.items()) and all(
            "\x7f" not in k for k in value
        )
    if isinstance(value, list):
        return all(_writable(v, schema.get("items", {})) for v in value)
    if isinstance(value, str):
        return "\x7f" not in value
    if isinstance(value, float):
        bounded = "minimum" in schema or "maximum" in schema
        return math.isfinite(value) and not (bounded and "e" in repr(value))
    return True


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(schema=st.one_of(SCHEMAS, OBJECT_SCHEMAS), data=st.data())
def test_random_schemas_accept_their_instances_on_every_tokenizer(vocabs, schema, data):
    instance = data.draw(_instances(schema))
    jsonschema.validate(instance, closed_schema(schema))
    assume(_writable(instance, schema))
    text = json.dumps(instance, ensure_ascii=False)
    constraint = build_constraint((), "auto", True, schema)
    for vocab, stops in vocabs.values():
        _walk_canonical(vocab, stops, constraint, text)
        if isinstance(instance, dict):  # an extra key is rejected
            extra = json.dumps({**instance, "zz_extra": 1}, ensure_ascii=False)
            assert not _matches(vocab, stops, constraint, extra)


@pytest.mark.parametrize(
    "schema,good,bad",
    [
        ({"type": "object", "properties": {"n": {"type": "integer"}}}, {"n": 3}, {"n": "3"}),
        ({"type": "object", "properties": {"n": {"type": "integer"}}}, {}, {"n": 3, "m": 4}),
        ({"type": "integer", "minimum": 1, "maximum": 9}, 9, 10),
        ({"type": "number", "exclusiveMaximum": 1.5}, 1.25, 1.5),
        ({"type": "array", "items": {"type": "string"}, "maxItems": 2}, ["a"], ["a", "b", "c"]),
        ({"enum": ["rouge", "vert"]}, "vert", "bleu"),
        ({"type": "object", "additionalProperties": True}, {"any": [1, {}]}, [1]),
        (  # a pydantic-style nested model, through $defs and $ref: closed too
            {
                "$defs": {"In": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                "type": "object",
                "properties": {"inner": {"$ref": "#/$defs/In"}},
            },
            {"inner": {"x": 1}},
            {"inner": {"x": 1, "y": 2}},
        ),
        (  # optional, as pydantic writes `X | None`
            {
                "type": "object",
                "properties": {"p": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
            },
            {"p": None},
            {"p": 3},
        ),
    ],
)
def test_invalid_instances_are_rejected(vocabs, schema, good, bad):
    constraint = build_constraint((), "none", True, schema)
    for vocab, stops in vocabs.values():
        assert _matches(vocab, stops, constraint, json.dumps(good, ensure_ascii=False))
        assert not _matches(vocab, stops, constraint, json.dumps(bad, ensure_ascii=False))


def test_json_layout_is_fixed_to_json_dumps(vocabs):
    constraint = build_constraint(
        (), "auto", True, {"type": "object", "additionalProperties": True}
    )
    for vocab, stops in vocabs.values():
        assert _matches(vocab, stops, constraint, '{"a": [1, 2], "b": {"c": null}}')
        for other in ('{"a":[1,2]}', '{"a": [1,2]}', '{ "a": 1}', '{"a": 1}\n', ' {"a": 1}'):
            if vocab.decode_bytes(vocab.encode(other)) != other.encode():
                continue  # a dummy-prefix tokenizer cannot keep a leading space apart
            assert not _matches(vocab, stops, constraint, other), other


def test_unsupported_schema_features_name_the_feature():
    cases = [
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "'not'"),
        ({"type": "array", "uniqueItems": True}, "'uniqueItems'"),
        ({"type": "string", "format": "color"}, "'color'"),
        ({"type": "string", "pattern": "(?=a)b"}, "look-ahead"),
    ]
    for schema, named in cases:
        with pytest.raises(InvalidConfigError, match=named):
            build_constraint((), "auto", True, schema)


def test_tools_too_large_together_are_refused_naming_the_largest(vocabs):
    """Six tools that each compile, together past the compiler's symbol limit: a clear error
    (not the compiler's assertion as it is) that names the largest tool."""
    arrays = {f"s{i}": {"type": "array", "items": {"type": "integer"}, "minItems": 1,
                        "maxItems": 1000} for i in range(400)}  # fmt: skip
    tools = normalize_tools(
        [
            {"name": f"t{i}", "parameters": {"type": "object", "properties": arrays}}
            for i in range(6)
        ]
    )
    constraint = build_constraint(tools, "required", True, None)
    vocab, stops = next(iter(vocabs.values()))
    with pytest.raises(InvalidConfigError) as refused:
        Matcher(constraint, vocab, stops)
    message = str(refused.value)
    assert message.startswith("the tools make a grammar too large for the grammar compiler")
    assert "offer fewer tools or smaller schemas; the largest is tool 't" in message
    assert "panic" not in message


def test_a_schema_with_no_valid_value_is_refused_when_compiled(vocabs):
    cycle = {"$ref": "#/$defs/x", "$defs": {"x": {"$ref": "#/$defs/x"}}}
    constraint = build_constraint((), "auto", True, cycle)
    for vocab, stops in vocabs.values():
        if vocab.dummy_prefix:  # its optional leading space is text: the request's first step
            continue  # fails instead (the server answers 422 either way)
        with pytest.raises(InvalidConfigError, match="response_format admits no text at all"):
            Matcher(constraint, vocab, stops)


# --------------------------------------------------------------------------------------------
# The tool-call languages.


def test_nothing_to_constrain_is_none():
    assert build_constraint((), "auto", True, None) is None
    assert build_constraint(TOOLS, "none", True, {"type": "integer"}) is not None


def test_none_allows_any_text_but_a_call(vocabs):
    constraint = build_constraint(TOOLS, "none", True, None)
    for name, (vocab, stops) in vocabs.items():
        _walk_canonical(vocab, stops, constraint, "It is sunny; </tool_call> is just text.")
        assert not _matches(vocab, stops, constraint, format_tool_call(*ADD)), name


def test_auto_accepts_text_text_and_calls_or_calls_only(vocabs):
    constraint = build_constraint(TOOLS, "auto", True, None)
    good = [
        "",
        "It is sunny; no tool needed. <tool_ is not a tag, nor </tool_call>.",
        "Let me add.\n" + format_tool_calls([ADD, WEATHER]),
        format_tool_call(*NO_ARGS),
    ]
    bad = [
        "text <tool_call> text",  # the tag is only ever the start of a call
        format_tool_call(*ADD) + "\nand some text after",  # nothing after the calls
        format_tool_call("add_numbers", {"a": 7}),  # a required argument is missing
        format_tool_call("add_numbers", {"a": 7, "b": "5"}),  # the wrong type
        format_tool_call("get_time", {"x": 1}),  # a tool without parameters takes exactly {}
        format_tool_call("send_email", {}),  # not a tool
        format_tool_call(*ADD).replace(", ", ","),  # JSON layout is json.dumps'
    ]
    for name, (vocab, stops) in vocabs.items():
        for text in good:
            _walk_canonical(vocab, stops, constraint, text)
        for text in bad:
            assert not _matches(vocab, stops, constraint, text), (name, text)


def test_required_named_and_single_call(vocabs):
    required = build_constraint(TOOLS, "required", True, None)
    named = build_constraint(TOOLS, "get_weather", True, None)
    single = build_constraint(TOOLS, "required", False, None)
    two = format_tool_calls([ADD, WEATHER])
    for vocab, stops in vocabs.values():
        assert not _matches(vocab, stops, required, "The answer is 12.")
        assert not _matches(vocab, stops, required, "")
        _walk_canonical(vocab, stops, required, two)
        _walk_canonical(vocab, stops, named, format_tool_calls([WEATHER, WEATHER]))
        assert not _matches(vocab, stops, named, format_tool_call(*ADD))
        _walk_canonical(vocab, stops, single, format_tool_call(*NO_ARGS))
        assert not _matches(vocab, stops, single, two)


def test_auto_without_parallel_calls_allows_one_call(vocabs):
    constraint = build_constraint(TOOLS, "auto", False, None)
    for vocab, stops in vocabs.values():
        _walk_canonical(vocab, stops, constraint, "Adding.\n" + format_tool_call(*ADD))
        assert not _matches(vocab, stops, constraint, format_tool_calls([ADD, ADD]))


def test_caches_do_not_keep_a_vocabulary_alive(tmp_path):
    vocab, stops = _member_view(model_paths()[0])
    matcher = Matcher(build_constraint(TOOLS, "auto", True, None), vocab, stops)
    matcher.follow(vocab.encode("<tool_call>\n"))
    assert matcher.forced() == '{"name": "'
    gone = weakref.ref(vocab)
    del vocab, matcher
    gc.collect()
    assert gone() is None


def test_tools_with_a_response_format_allow_the_answer_or_calls(vocabs):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    both = build_constraint(TOOLS, "auto", True, schema)
    for vocab, stops in vocabs.values():
        _walk_canonical(vocab, stops, both, '{"answer": 12}')
        _walk_canonical(vocab, stops, both, format_tool_call(*ADD))
        assert not _matches(vocab, stops, both, "12")
        assert not _matches(vocab, stops, both, "Sure.\n" + format_tool_call(*ADD))


def test_forced_text_completes_a_unique_name(vocabs):
    required = build_constraint(TOOLS, "required", True, None)
    named = build_constraint(TOOLS, "get_weather", True, None)
    for vocab, stops in vocabs.values():
        matcher = Matcher(required, vocab, stops)
        assert matcher.forced() == '<tool_call>\n{"name": "'
        matcher.follow(vocab.encode('<tool_call>\n{"name": "get_w'))
        assert matcher.forced() == 'eather", "arguments": {"city": "'
        matcher.follow(vocab.encode('<tool_call>\n{"name": "get_t'))
        assert matcher.forced() == 'ime", "arguments": {}}\n</tool_call>'
        fresh = Matcher(named, vocab, stops)
        assert fresh.forced() == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "'


def test_forced_text_is_whole_characters(vocabs):
    constraint = build_constraint((), "auto", True, {"const": "é☃x"})
    for vocab, stops in vocabs.values():
        matcher = Matcher(constraint, vocab, stops)
        assert matcher.forced() == '"é☃x"'
        ids = vocab.encode('"é☃x"')
        for k in range(len(ids)):
            matcher.follow(ids[:k])
            text = vocab.decode_bytes(ids[:k]).decode("utf-8", errors="ignore")
            assert text + matcher.forced() == '"é☃x"'


# --------------------------------------------------------------------------------------------
# Keeping in step: retractions, violations, interruptions, validation without moving.

PIECES = ["Let me add. ", format_tool_call(*ADD), "\n", format_tool_call(*WEATHER), "é", " "]


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 5)), min_size=1, max_size=8))
def test_retractions_keep_masks_equal_to_a_fresh_matcher(vocabs, steps):
    constraint = build_constraint(TOOLS, "auto", True, None)
    text = "Let me add.\n" + format_tool_calls([ADD, WEATHER, NO_ARGS])
    for vocab, stops in vocabs.values():
        ids = vocab.encode(text)
        matcher = Matcher(constraint, vocab, stops)
        for cut, split in steps:
            cut %= len(ids) + 1
            # another tokenization of the same text: the prefix re-encoded in two pieces
            head = vocab.decode_bytes(ids[:cut]).decode("utf-8", errors="ignore")
            at = len(head) * split // 5
            other = vocab.encode(head[:at]) + (
                vocab.encode(head[at:]) if not vocab.dummy_prefix or not at else []
            )
            for seq in (ids[:cut], other):  # any tokenization of valid text is accepted
                matcher.follow(seq)
                fresh = Matcher(constraint, vocab, stops)
                fresh.follow(seq)
                assert torch.equal(matcher.allowed(), fresh.allowed())
                assert matcher.accepting() == fresh.accepting()
                assert matcher.forced() == fresh.forced()


def test_violation_names_the_first_rejected_id(vocabs):
    constraint = build_constraint(TOOLS, "required", True, None)
    for vocab, stops in vocabs.values():
        good = vocab.encode('<tool_call>\n{"name": "get_time", "arguments": {}}')
        bad = vocab.encode('<tool_call>\n{"name": "get_time", "arguments": {"x')
        k = next(i for i, (a, b) in enumerate(zip(good, bad, strict=False)) if a != b)
        matcher = Matcher(constraint, vocab, stops)
        with pytest.raises(GrammarViolation) as caught:
            matcher.follow(bad)
        assert caught.value.index >= k and matcher.followed == tuple(bad[: caught.value.index])
        assert not Matcher(constraint, vocab, stops).valid_prefix(bad) > caught.value.index
        matcher.follow(good)  # and it carries on from there
        assert matcher.forced() == "\n</tool_call>"
        with pytest.raises(GrammarViolation) as caught:  # an id outside the vocabulary
            matcher.follow(good + [vocab.size])
        assert caught.value.index == len(good) and matcher.followed == tuple(good)
        assert matcher.valid_prefix([-1]) == 0


def test_valid_prefix_does_not_move_the_state(vocabs):
    constraint = build_constraint(TOOLS, "required", False, None)
    text = format_tool_call(*NO_ARGS)
    for vocab, stops in vocabs.values():
        ids = vocab.encode(text)
        stop = min(stops)
        matcher = Matcher(constraint, vocab, stops)
        matcher.follow(ids[:3])
        before = matcher.allowed().clone()
        assert matcher.valid_prefix(ids[3:]) == len(ids) - 3
        assert matcher.valid_prefix(ids[3:] + [stop, ids[0]]) == len(ids) - 2
        assert matcher.valid_prefix(ids[3:-1] + [stop]) == len(ids) - 4  # not the end yet
        assert matcher.valid_prefix(vocab.encode("no")) == 0
        assert matcher.followed == tuple(ids[:3])
        assert torch.equal(matcher.allowed(), before)
        matcher.follow(ids)
        assert matcher.valid_prefix([stop]) == 1


@contextlib.contextmanager
def interrupt_native(method: str, after: bool) -> Iterator[list[bool]]:
    """A KeyboardInterrupt at the first call of a native grammar matcher's `method`, before it
    runs or after it ran, where a Ctrl-C could land: raised by a profile hook, which sees every
    call into native code. Yields a list that holds True once it fired."""
    fired: list[bool] = []
    event = "c_return" if after else "c_call"

    def hook(frame, what, arg) -> None:
        native = isinstance(getattr(arg, "__self__", None), LLMatcher)
        if not fired and what == event and native and arg.__name__ == method:
            fired.append(True)
            raise KeyboardInterrupt

    sys.setprofile(hook)
    try:
        yield fired
    finally:
        sys.setprofile(None)


@pytest.mark.parametrize("method", ["rollback", "try_consume_tokens", "compute_bitmask"])
@pytest.mark.parametrize("after", [False, True])
def test_an_interrupted_call_leaves_the_next_one_correct(vocabs, method, after):
    constraint = build_constraint(TOOLS, "auto", True, None)
    vocab, stops = vocabs["tb-gpt2-bpe"]
    ids = vocab.encode("Let me add.\n" + format_tool_call(*ADD))
    matcher = Matcher(constraint, vocab, stops)
    matcher.follow(ids[:20])
    with pytest.raises(KeyboardInterrupt), interrupt_native(method, after) as fired:
        matcher.follow(ids[:10])  # the first call that uses `method` is interrupted
        matcher.follow(ids[:12])
        matcher.allowed()
    assert fired
    for target in (ids[:15], ids):
        matcher.follow(target)
        fresh = Matcher(constraint, vocab, stops)
        fresh.follow(target)
        assert matcher.followed == tuple(target)
        assert torch.equal(matcher.allowed(), fresh.allowed())
        assert matcher.forced() == fresh.forced()


def test_matchers_are_built_from_several_threads(vocabs):
    constraint = build_constraint(TOOLS, "required", True, None)
    text = format_tool_calls([ADD, WEATHER])
    results, errors = [], []

    def work(vocab, stops):
        try:
            matcher = Matcher(constraint, vocab, stops)
            matcher.follow(vocab.encode(text))
            results.append(matcher.accepting())
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=v) for v in list(vocabs.values()) * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == [True] * len(threads)


# --------------------------------------------------------------------------------------------


def test_constrain_renormalises_over_the_allowed_ids():
    logprobs = torch.log_softmax(torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]]), -1)
    allowed = torch.tensor([True, False, True, False])
    out = constrain(logprobs, allowed)
    assert torch.isneginf(out[:, [1, 3]]).all()
    assert torch.allclose(out.logsumexp(-1), torch.zeros(2))
    assert torch.allclose(out[1, [0, 2]].exp(), torch.tensor([0.5, 0.5]))
    assert torch.allclose(constrain(logprobs[0], allowed), out[0])
    with pytest.raises(ConstraintError, match="no allowed token"):
        constrain(logprobs, torch.zeros(4, dtype=torch.bool))


def test_a_non_special_added_tag_token_counts_as_its_text():
    """Qwen-style vocabularies have `<tool_call>` as one added, non-special token: it is text,
    allowed where the grammar expects the tag, and the whole call follows through it."""
    from tokenizers import AddedToken

    constraint = build_constraint(TOOLS, "required", True, None)
    for path in model_paths():
        tokenizer = load_tokenizer(str(path))
        tokenizer.add_tokens(
            [AddedToken(t, special=False) for t in ("<tool_call>", "</tool_call>")]
        )
        vocab = Vocab(tokenizer)
        stops = frozenset(vocab.special_ids)
        tag = vocab.string_to_id["<tool_call>"]
        text = format_tool_calls([ADD, NO_ARGS])
        assert tag in vocab.encode(text) and tag not in vocab.special_ids
        matcher = _walk_canonical(vocab, stops, constraint, text)
        matcher.follow([])
        assert matcher.allowed()[tag]
        assert Matcher(constraint, vocab, stops).valid_prefix([tag, tag]) == 1
