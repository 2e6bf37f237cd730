"""Bad settings, tried as a user would through the public API: each fails at the call with an
error of the expected type whose message names the problem and the fix.

One table, one row per mistake. A row is `row(id, call, error, fix)`: `call` receives an `Env`
(the shipped model directories, a scratch directory, and ensembles over the shipped members),
`error` is the exact type raised and `fix` a substring the message must contain. Add a row for
every new setting; the small builders below (`config`, `pretrained`, `generate`, ...) keep rows
to one line each.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf_files import damaged_copy, write_tiny_gguf
from pydantic import ValidationError

from core import (
    ContextWindowError,
    Ensemble,
    GenerationConfig,
    InvalidConfigError,
    InvalidMessagesError,
    Local,
    MissingWeightsError,
    ModelLoadError,
    ModelNotFoundError,
)
from core.testbed import model_paths
from core.validate import SEED_MAX, check_choice, check_real
from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM

NAN, INF = float("nan"), float("inf")
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}}  # fmt: skip


@dataclass(frozen=True)
class Env:
    paths: list[str]
    tmp: Path
    ensemble: Callable[..., Ensemble]  # make_ensemble(method, **options): shared members

    @property
    def config_file(self) -> str:
        """A file inside a model directory (a common slip: passing config.json itself)."""
        return f"{self.paths[0]}/config.json"

    def damaged_model(self, how: str) -> str:
        """A copy of a shipped model whose weights are damaged, or a pickle that runs code."""
        folder = self.tmp / how
        shutil.copytree(self.paths[0], folder)
        weights = folder / "model.safetensors"
        if how == "truncated":
            weights.write_bytes(weights.read_bytes()[:1000])
        elif how == "pickle":
            weights.unlink()
            torch.save({"x": _RunsCode()}, folder / "pytorch_model.bin")
        return str(folder)

    @property
    def lone_file(self) -> str:
        """A weights file that is in no model directory (and is no GGUF file)."""
        path = self.tmp / "pytorch_model.bin"
        path.write_bytes(b"PK\x03\x04")
        return str(path)

    def gguf(self, how: str = "", **options: Any) -> str:
        """A tiny GGUF model file (`tests/gguf_files.py`), damaged as `how` says ("" whole)."""
        path = write_tiny_gguf(self.tmp / "tiny.gguf", **options)
        return str(damaged_copy(path, self.tmp / f"{how}.gguf", how) if how else path)


class _RunsCode:
    """Unpickled, it would run a shell command: a hostile pickled checkpoint."""

    def __reduce__(self):
        return (os.system, ("echo unpickled",))


def _nested(levels: int) -> dict:
    """An object schema `levels` objects deep."""
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _deep_call(levels: int) -> list[dict]:
    arguments: dict = {}
    for _ in range(levels):
        arguments = {"a": arguments}
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": arguments}}
    return [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [call]}]


Call = Callable[[Env], Any]


def row(id: str, call: Call, error: type[Exception], fix: str):
    return pytest.param(call, error, fix, id=id)


# --- builders: one per public entry point -----------------------------------------------------


def config(**settings: Any) -> Call:
    return lambda env: GenerationConfig(**settings)


def pretrained(models: Callable[[Env], Any], **kwargs: Any) -> Call:
    kwargs.setdefault("method", "single")
    kwargs.setdefault("device", "cpu")
    return lambda env: Ensemble.from_pretrained(models(env), **kwargs)


def first_model(env: Env) -> list[str]:
    return env.paths[:1]


def generate(**overrides: Any) -> Call:
    return lambda env: env.ensemble("single").generate("Hi", **overrides)


def stream(**overrides: Any) -> Call:
    """Only the call, never `next()`: bad settings must fail before the first delta."""
    return lambda env: env.ensemble("single").stream("Hi", **overrides)


def method(name: str, **options: Any) -> Call:
    return lambda env: env.ensemble(name, **options)


def chat(**fields: Any) -> Call:
    return lambda env: ChatEnsemble(models=env.paths, **fields)


def chat_call(**kwargs: Any) -> Call:
    return lambda env: ChatEnsemble(models=env.paths).invoke("Hi", **kwargs)


def llm(**fields: Any) -> Call:
    fields.setdefault("device", "cpu")
    return lambda env: EnsembleLLM(models=env.paths, **fields)


def llm_call(**kwargs: Any) -> Call:
    return lambda env: EnsembleLLM(ensemble=env.ensemble("single")).complete("Hi", **kwargs)


# --- the table --------------------------------------------------------------------------------

GENERATION_CONFIG = [
    row("temperature-nan", config(temperature=NAN), InvalidConfigError,
        "got nan, not a number; pass e.g. temperature=0.7"),
    row("temperature-inf", config(temperature=INF), InvalidConfigError,
        "got inf, not finite; pass e.g. temperature=0.7"),
    row("temperature-string", config(temperature="0.7"), InvalidConfigError,
        "pass a number, not a string, e.g. temperature=0.7"),
    row("temperature-negative", config(temperature=-0.5), InvalidConfigError,
        "temperature must be >= 0 (a finite number; 0 = greedy), got -0.5"),
    row("temperature-bool", config(temperature=True), InvalidConfigError,
        "got True, a bool; pass e.g. temperature=0.7"),
    row("top_p-nan", config(top_p=NAN), InvalidConfigError,
        "top_p must be in (0, 1] (a finite number), got nan"),
    row("top_p-inf", config(top_p=INF), InvalidConfigError,
        "got inf, not finite; pass e.g. top_p=0.9"),
    row("top_p-minus-inf", config(top_p=-INF), InvalidConfigError, "got -inf, not finite"),
    row("top_p-zero", config(top_p=0), InvalidConfigError, "got 0; pass e.g. top_p=0.9"),
    row("top_p-above-one", config(top_p=1.5), InvalidConfigError, "got 1.5; pass e.g. top_p=0.9"),
    row("top_p-string", config(top_p="0.9"), InvalidConfigError,
        "pass a number, not a string, e.g. top_p=0.9"),
    row("frequency_penalty-above-two", config(frequency_penalty=2.5), InvalidConfigError,
        "frequency_penalty must be in -2..2 (a finite number), got 2.5"),
    row("presence_penalty-nan", config(presence_penalty=NAN), InvalidConfigError,
        "got nan, not a number; pass e.g. presence_penalty=0.5"),
    row("max_new_tokens-bool", config(max_new_tokens=True), InvalidConfigError,
        "got True, a bool; pass e.g. max_new_tokens=256"),
    row("max_new_tokens-zero", config(max_new_tokens=0), InvalidConfigError,
        "max_new_tokens must be >= 1 (an integer), got 0"),
    row("max_new_tokens-float", config(max_new_tokens=256.0), InvalidConfigError,
        "got 256.0, a float; pass e.g. max_new_tokens=256"),
    row("max_new_tokens-string", config(max_new_tokens="256"), InvalidConfigError,
        "pass an integer, not a string, e.g. max_new_tokens=256"),
    row("seed-past-64-bits", config(seed=2**70), InvalidConfigError,
        "seed must be in 0..2**64-1 (an integer) or None"),
    row("seed-string", config(seed="abc"), InvalidConfigError,
        "pass an integer, not a string, e.g. seed=1234"),
    row("seed-negative", config(seed=-1), InvalidConfigError, "got -1; pass e.g. seed=1234"),
    row("seed-float", config(seed=1.5), InvalidConfigError, "got 1.5, a float"),
    row("stop-int", config(stop=5), InvalidConfigError,
        "stop must be a string or a list of strings, got 5, an int; pass e.g. stop="),
    row("stop-empty-string", config(stop=["\n", ""]), InvalidConfigError,
        "entry 1 is an empty string"),
    row("stop-non-string-entry", config(stop=["ok", 3]), InvalidConfigError,
        "stop must hold non-empty strings, but entry 1 is 3, an int"),
    row("stop-bytes", config(stop=b"\n"), InvalidConfigError, "a bytes object; pass e.g. stop="),
]  # fmt: skip

FROM_PRETRAINED = [
    row("path-is-config-file", pretrained(lambda env: [env.config_file]), ModelNotFoundError,
        "is a file, not a model directory; a model is the directory that holds config.json"),
    row("path-is-lone-weights-file", pretrained(lambda env: [env.lone_file]), ModelNotFoundError,
        "a single .bin or .safetensors file cannot be loaded on its own"),
    row("gguf-truncated", pretrained(lambda env: [env.gguf("truncated")]), MissingWeightsError,
        "is truncated: its tensors need 30,528 bytes and the file has 15,264"),
    row("gguf-magic-flipped", pretrained(lambda env: [env.gguf("magic")]), MissingWeightsError,
        "is not a GGUF file (it starts with b'FUGG', not b'GGUF')"),
    row("gguf-not-gguf", pretrained(lambda env: [env.gguf("text")]), MissingWeightsError,
        "is not a GGUF file (it starts with b'<htm'"),
    row("gguf-architecture-unsupported",
        pretrained(lambda env: [env.gguf(architecture="deepseek2")]), ModelLoadError,
        "holds a 'deepseek2' model, an architecture transformers cannot load from GGUF"),
    row("gguf-quantization-unreadable", pretrained(lambda env: [env.gguf("unreadable-type")]),
        ModelLoadError, "as Q8_1, which the gguf package cannot dequantize"),
    row("gguf-quantization-unknown", pretrained(lambda env: [env.gguf("unknown-type")]),
        ModelLoadError, "as ggml type 99, which the installed gguf package does not know"),
    row("local-chat_template-no-file", pretrained(lambda env: [Local(env.paths[0],
        chat_template="gemma.jinja")]), InvalidConfigError,
        "is neither Jinja text (it has no '{{' or '{%') nor an existing file"),
    row("local-stop-empty", pretrained(lambda env: [Local(env.paths[0], stop=[""])]),
        InvalidConfigError, "Local stop must hold non-empty strings, but entry 0 is an empty"),
    row("local-dict-without-path", pretrained(lambda env: [{"chat_template": "{{ x }}"}]),
        InvalidConfigError, "a dict with neither path nor base_url; a dict with path stands "
        "for Local(...)"),
    row("path-missing", pretrained(lambda env: [str(env.tmp / "nope")]), ModelNotFoundError,
        "does not exist; pass an existing local directory"),
    row("path-misspelt", pretrained(lambda env: [env.paths[0][:-1] + "x"]), ModelNotFoundError,
        "(did you mean '"),
    row("path-empty", pretrained(lambda env: [""]), InvalidConfigError,
        "models[0] is an empty string; each member is a local model directory"),
    row("model-not-a-path", pretrained(lambda env: [42]), InvalidConfigError,
        "models[0] is 42 of type int; each member is a local model directory"),
    row("models-empty", pretrained(lambda env: []), InvalidConfigError,
        "models is empty; pass one or more"),
    row("device-unknown", pretrained(first_model, device="gpu"), InvalidConfigError,
        "use 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    row("dtype-integer", pretrained(first_model, dtype="int8"), InvalidConfigError,
        "not a floating-point dtype"),
    row("dtype-unknown", pretrained(first_model, dtype="float33"), InvalidConfigError,
        "use 'auto', 'float32', 'bfloat16' or 'float16'"),
    row("attn_implementation-unknown", pretrained(first_model, attn_implementation="magic"),
        InvalidConfigError, "use 'sdpa' or 'eager', or None for the model's default"),
    row("use_safetensors-string", pretrained(first_model, use_safetensors="yes"),
        InvalidConfigError, "pass use_safetensors=True or use_safetensors=False"),
    row("method-unknown", pretrained(first_model, method="magic"), InvalidConfigError,
        "unknown method 'magic'; use one of"),
    row("method-option-unknown", pretrained(first_model, colour="red"), InvalidConfigError,
        "its options are: member"),
    row("method-needs-two", pretrained(first_model, method="safe"), InvalidConfigError,
        "pass more models, or use method='single'"),
    row("prefix_reuse-string", pretrained(first_model, prefix_reuse="no"), InvalidConfigError,
        "pass prefix_reuse=True or prefix_reuse=False"),
    row("weights-damaged", pretrained(lambda env: [env.damaged_model("truncated")]),
        MissingWeightsError, "model.safetensors' is damaged (SafetensorError"),
    row("weights-pickle-that-runs-code", pretrained(lambda env: [env.damaged_model("pickle")],
        use_safetensors=False), MissingWeightsError,
        "pytorch_model.bin' could not be loaded as plain tensors (Trying to load unsupported "
        "GLOBAL posix.system"),
]  # fmt: skip

GENERATE = [
    row("generate-temperature-nan", generate(temperature=NAN), InvalidConfigError,
        "pass e.g. temperature=0.7"),
    row("generate-seed-past-64-bits", generate(seed=2**70), InvalidConfigError,
        "0..2**64-1"),
    row("generate-max_new_tokens-bool", generate(max_new_tokens=True), InvalidConfigError,
        "got True, a bool"),
    row("generate-top_p-string", generate(top_p="1"), InvalidConfigError,
        "pass a number, not a string"),
    row("generate-unknown-setting", generate(max_tokens=5), InvalidConfigError,
        "unknown generation setting(s) max_tokens; use"),
    row("stream-top_p-nan", stream(top_p=NAN), InvalidConfigError, "pass e.g. top_p=0.9"),
    row("stream-stop-empty", stream(stop=""), InvalidConfigError, "entry 0 is an empty string"),
    row("on_event-not-callable", stream(on_event="print"), InvalidConfigError,
        "on_event must be a function that takes one event, or None; got 'print' (a str)"),
]  # fmt: skip

METHOD_OPTIONS = [
    row("safe-lookahead-zero", method("safe", lookahead=0), InvalidConfigError,
        "lookahead must be >= 1 (an integer), got 0; pass e.g. lookahead=5"),
    row("safe-top_k-string", method("safe", top_k="3"), InvalidConfigError,
        "pass an integer, not a string, e.g. top_k=10"),
    row("safe-threshold-nan", method("safe", threshold=NAN), InvalidConfigError,
        "threshold must be in [0, 1)"),
    row("safe-max_lookahead-below-lookahead", method("safe", max_lookahead=2), InvalidConfigError,
        "max_lookahead must be >= 5 (an integer), got 2; pass e.g. max_lookahead=20"),
    row("safe-drafter-out-of-range", method("safe", drafter=7), InvalidConfigError,
        "use an index 0..2 or a name"),
    row("safe-aggregator-unknown", method("safe", aggregator="mean"), InvalidConfigError,
        "use one of 'unite', 'gac'"),
    row("safe-sharpen-unknown", method("safe", sharpen="sharp"), InvalidConfigError,
        "use one of 'heuristic', 'geometric', None"),
    row("safe-heal-unknown", method("safe", heal="all"), InvalidConfigError,
        "use one of False, True, 'oov'"),
    row("safe-heal-zero", method("safe", heal=0), InvalidConfigError,
        "heal=0 is not supported; use one of False, True, 'oov'"),
    row("safe-preset-unknown", method("safe", preset="arxiv"), InvalidConfigError,
        "use one of 'paper', 'authors'"),
    row("specem-segment_tokens-bool", method("specem", segment_tokens=True), InvalidConfigError,
        "got True, a bool; pass e.g. segment_tokens=10"),
    row("specem-lr-nan", method("specem", lr=NAN), InvalidConfigError, "pass e.g. lr=1.0"),
    row("specem-feedback-string", method("specem", feedback="yes"), InvalidConfigError,
        "feedback=True or feedback=False"),
    row("specem-score-unknown", method("specem", score="vote"), InvalidConfigError,
        "use one of 'logprob', 'prob', 'logit'"),
    row("specem-one-drafter", method("specem", drafters=[0]), InvalidConfigError,
        "drafters needs at least 2 members"),
    row("single-member-unknown", method("single", member="gpt"), InvalidConfigError,
        "use an index 0..2 or a name ('tb-gpt2-bpe'"),
    row("token-mean-unknown", method("token", mean="median"), InvalidConfigError,
        "use one of 'arithmetic', 'geometric'"),
    row("token-top_k-zero", method("token", top_k=0), InvalidConfigError,
        "top_k must be >= 1 (an integer), got 0"),
    row("token-weights-short", method("token", weights=[1.0]), InvalidConfigError,
        "weights has 1 entries for 3 members; pass one per member"),
    row("token-weights-negative", method("token", weights=[1, -1, 1]), InvalidConfigError,
        "weights[1] must be >= 0"),
]  # fmt: skip

ENSEMBLE_SETTINGS = [
    row("on_member_failure-unknown", method("single", on_member_failure="skip"),
        InvalidConfigError, "use 'raise' (a failing member ends the request) or 'drop'"),
    row("max_concurrency-zero", method("single", max_concurrency=0), InvalidConfigError,
        "max_concurrency=0 is too small; e.g. max_concurrency=8"),
    row("max_queue-string", method("single", max_queue="8"), InvalidConfigError,
        "max_queue='8' must be a positive integer or None"),
    row("queue_timeout-negative", method("single", queue_timeout=-1), InvalidConfigError,
        "queue_timeout=-1 must be seconds > 0, or None"),
    row("prefix_reuse-no", method("single", prefix_reuse="no"), InvalidConfigError,
        "prefix_reuse must be True or False, got 'no', a string"),
    row("loading-option-to-Ensemble", method("single", dtype="float32"), InvalidConfigError,
        "dtype is an option for loading the members, which Ensemble.from_pretrained does"),
    row("chat-max_queue-string", chat(max_queue="8"), ValidationError,
        "max_queue='8' must be a positive integer or None"),
    row("llm-on_member_failure-unknown", llm(on_member_failure="skip"), ValidationError,
        "use 'raise' (a failing member ends the request) or 'drop'"),
]  # fmt: skip

MESSAGES = [
    row("content-lone-surrogate", lambda env: env.ensemble("single").stream("caf\ud800"),
        InvalidMessagesError, "lone surrogate"),
    row("message-unknown-role", lambda env: env.ensemble("single").stream(
        [{"role": "robot", "content": "Hi"}]), InvalidMessagesError, "use one of system, user"),
    row("stream-prompt-too-long", lambda env: env.ensemble("single").stream("7 + " * 5000),
        ContextWindowError, "shorten the messages"),
    row("astream-prompt-too-long", lambda env: env.ensemble("single").astream("7 + " * 5000),
        ContextWindowError, "shorten the messages"),
    row("tool-call-malformed", lambda env: env.ensemble("single").stream([
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]},
    ]), InvalidMessagesError, "name"),
    row("tool-call-arguments-2000-deep",
        lambda env: env.ensemble("single").stream(_deep_call(2000)), InvalidMessagesError,
        "has arguments nested 2001 levels deep; at most 64 are read"),
    row("raw_prompt-messages", lambda env: env.ensemble("single").stream(
        [{"role": "user", "content": "Hi"}], raw_prompt=True), InvalidMessagesError,
        "raw_prompt=True takes the prompt as one string"),
    row("raw_prompt-empty", lambda env: env.ensemble("single").stream("", raw_prompt=True),
        InvalidMessagesError, "the raw prompt is empty"),
    row("raw_prompt-with-tools", config(raw_prompt=True, tools=[ADD]), InvalidConfigError,
        "the members would never see the tools; pass messages (raw_prompt=False)"),
    row("raw_prompt-string", config(raw_prompt="yes"), InvalidConfigError,
        "pass raw_prompt=True or raw_prompt=False"),
]  # fmt: skip

TOOLS = [
    row("tool-schema-not-json-schema", config(tools=[
        {"type": "function", "function": {"name": "t", "parameters": {"type": "frobnicate"}}}]),
        InvalidConfigError, "tool 't'"),
    row("tool-choice-unknown-tool", config(tools=[ADD], tool_choice="subtract"),
        InvalidConfigError, "'subtract', which is not among the tools given ('add'); use one"),
    row("tool-choice-without-tools", config(tool_choice="required"), InvalidConfigError,
        "no tools were given; pass tools"),
    row("tool-name-invalid", config(tools=[{"name": "add two"}]), InvalidConfigError,
        "a tool name must be 1 to 64 letters"),
    row("tools-not-a-list", config(tools=ADD), InvalidConfigError, "wrap a single tool in a list"),
    row("response_format-unsupported-keyword",
        config(response_format={"type": "object", "not": {"required": ["a"]}}),
        InvalidConfigError, "keyword 'not'"),
    row("response_format-unknown-format",
        config(response_format={"type": "string", "format": "color"}), InvalidConfigError,
        "string format 'color'"),
    row("response_format-string", config(response_format="json"), InvalidConfigError,
        "for a pydantic model pass Model.model_json_schema()"),
    row("parallel_tool_calls-string", config(tools=[ADD], parallel_tool_calls="no"),
        InvalidConfigError, "parallel_tool_calls=True or parallel_tool_calls=False"),
    row("generate-tool-choice-unknown", generate(tools=[ADD], tool_choice="mul"),
        InvalidConfigError, "'mul', which is not among the tools"),
    row("response_format-500-deep", config(response_format=_nested(500)), InvalidConfigError,
        "response_format: the schema nests 1001 levels deep; constrained decoding reads schemas "
        "up to 128 levels"),
    row("tool-parameters-500-deep", config(tools=[{"name": "t", "parameters": _nested(500)}]),
        InvalidConfigError, "the parameters of tool 't': the schema nests 1001 levels deep"),
]  # fmt: skip

# ChatEnsemble checks its settings in a pydantic model validator, and pydantic re-raises a
# ValueError raised there (InvalidConfigError is one) as its ValidationError.
CHAT_ENSEMBLE = [
    row("chat-temperature-nan", chat(temperature=NAN), ValidationError,
        "pass e.g. temperature=0.7"),
    row("chat-seed-past-64-bits", chat(seed=2**70), ValidationError, "0..2**64-1"),
    row("chat-stop-empty", chat(stop=[""]), ValidationError, "entry 0 is an empty string"),
    row("chat-call-top_p-nan", chat_call(top_p=NAN), InvalidConfigError,
        "pass e.g. top_p=0.9"),
    row("chat-call-seed-string", chat_call(seed="abc"), InvalidConfigError,
        "pass an integer, not a string"),
    row("chat-frequency_penalty-string", chat(frequency_penalty="high"), ValidationError,
        "frequency_penalty"),
    row("chat-call-presence_penalty-below-two", chat_call(presence_penalty=-3), InvalidConfigError,
        "presence_penalty must be in -2..2"),
    row("chat-path-is-file",
        lambda env: ChatEnsemble(models=[env.config_file], method="single").invoke("Hi"),
        ModelNotFoundError, "is a file, not a model directory"),
]  # fmt: skip

ENSEMBLE_LLM = [
    row("llm-temperature-nan", llm(temperature=NAN), InvalidConfigError,
        "pass e.g. temperature=0.7"),
    row("llm-seed-negative", llm(seed=-1), InvalidConfigError, "got -1; pass e.g. seed=1234"),
    row("llm-top_p-inf", llm(top_p=INF), InvalidConfigError, "got inf, not finite"),
    row("llm-path-is-file", lambda env: EnsembleLLM(models=[env.config_file], method="single"),
        ModelNotFoundError, "is a file, not a model directory"),
    row("llm-call-seed-string", llm_call(seed="abc"), InvalidConfigError,
        "pass an integer, not a string, e.g. seed=1234"),
    row("llm-call-frequency_penalty-inf", llm_call(frequency_penalty=INF), InvalidConfigError,
        "got inf, not finite; pass e.g. frequency_penalty=0.5"),
    row("llm-call-max_tokens-bool", llm_call(max_tokens=True), InvalidConfigError,
        "got True, a bool"),
]  # fmt: skip

ROWS = (
    GENERATION_CONFIG
    + FROM_PRETRAINED
    + GENERATE
    + METHOD_OPTIONS
    + ENSEMBLE_SETTINGS
    + MESSAGES
    + TOOLS
    + CHAT_ENSEMBLE
    + ENSEMBLE_LLM
)


@pytest.fixture
def env(make_ensemble, tmp_path) -> Env:
    return Env([str(p) for p in model_paths()], tmp_path, make_ensemble)


@pytest.mark.parametrize(("call", "error", "fix"), ROWS)
def test_bad_input_fails_at_the_call_naming_the_fix(env, call, error, fix):
    with pytest.raises(error) as caught:
        call(env)
    assert type(caught.value) is error
    assert fix in str(caught.value), str(caught.value)


def test_good_values_of_other_numeric_types_are_kept_as_plain_python(env):
    config = GenerationConfig(
        max_new_tokens=np.int64(3), temperature=1, top_p=np.float32(0.5), seed=np.uint64(SEED_MAX)
    )
    assert (config.max_new_tokens, config.temperature, config.top_p) == (3, 1.0, 0.5)
    assert type(config.max_new_tokens) is int and type(config.temperature) is float
    assert config.seed == SEED_MAX and type(config.seed) is int
    assert GenerationConfig(stop="\n").stop == ("\n",) and GenerationConfig(stop=None).stop == ()
    # the largest seed accepted is one torch's generator takes: a sampled request runs with it
    ens = env.ensemble("single")
    first, again = (ens.generate("Tom has 3 apples.", config) for _ in range(2))
    assert first.stats.tokens > 0 and first.text == again.text


def test_a_choice_is_matched_by_value_and_kind():
    assert check_choice("heal", "oov", (False, True, "oov")) == "oov"
    assert check_choice("heal", False, (False, True, "oov")) is False
    with pytest.raises(InvalidConfigError, match="heal=0 is not supported; use one of False"):
        check_choice("heal", 0, (False, True, "oov"))
    with pytest.raises(InvalidConfigError, match="k=True is not supported"):
        check_choice("k", True, (1, 2))
    assert check_real("threshold", 0, low=0, high=1, high_open=True, example=0.1) == 0.0
    with pytest.raises(InvalidConfigError, match=r"threshold must be in \[0, 1\) .*got 1;"):
        check_real("threshold", 1, low=0, high=1, high_open=True, example=0.1)


def test_a_tiny_temperature_samples_like_greedy(env):
    ens = env.ensemble("single")
    greedy = ens.generate("Tom has 3 apples.", max_new_tokens=8)
    tiny = ens.generate("Tom has 3 apples.", max_new_tokens=8, temperature=1e-300, seed=1)
    assert tiny.text == greedy.text


def _readme_table() -> list[tuple[str, list[str]]]:
    """(what you pass, the tests named) for each row of the README's bad-input table."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### What a bad input gets", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]  # no header
    return [(row.split(" | ")[0], re.findall(r"`([^`]+)`", row.split(" | ")[-1])) for row in rows]


def test_the_readme_table_names_every_row_and_only_tests_that_exist():
    """The README's "what you pass -> what you get" table is this table, and the tests it
    names elsewhere exist: a row without a test, or a test without a row, fails here."""
    ids = [p.id for p in ROWS]
    covered: set[str] = set()
    root = Path(__file__).resolve().parent.parent
    for passed, tests in _readme_table():
        assert tests, f"README row {passed!r} names no test"
        for name in tests:
            if "::" in name:
                path, function = name.split("::")
                source = (root / path).read_text()
                assert re.search(rf"^(async )?def {function}\(", source, re.M), name
            else:
                matched = fnmatch.filter(ids, name)
                assert matched, f"README names {name!r}, which matches no row here"
                covered |= set(matched)
    assert not set(ids) - covered, f"rows missing from the README: {sorted(set(ids) - covered)}"
