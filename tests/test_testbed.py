"""The testbed: task generator and checker (every form, tool use included), tokenizers, shipped
models, random_model."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it: nothing may download

import json  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

from core.chat import normalize_messages, render_prompt  # noqa: E402
from core.testbed import (  # noqa: E402
    MODEL_ORDER,
    TOOL_FUNCTIONS,
    TOOL_SPECS,
    Problem,
    call_tool,
    check_answer,
    check_tool_call,
    extract_answer,
    make_problems,
    model_paths,
    random_model,
    tool_followup,
    tool_steps,
)
from core.testbed.models import load_tokenizer  # noqa: E402
from core.testbed.task import DIRECT_TOOLS, FORMS, TOOL_CALL_ID, is_test_combo, score  # noqa: E402
from core.tool_calls import format_tool_call  # noqa: E402
from lab.testbed.data import (  # noqa: E402
    IGNORE,
    examples,
    prompt_ids,
    tokenizer_corpus,
    trained_specs,
)
from lab.testbed.evaluate import first_tool_call, generate, run_tool  # noqa: E402
from lab.testbed.tokenizers import WS, end_of_turn_ids  # noqa: E402

NAMES = ("tb-gpt2-bpe", "tb-qwen2-spm", "tb-llama-word")
FAMILY = {"tb-gpt2-bpe": "bpe", "tb-qwen2-spm": "spm", "tb-llama-word": "word"}


@pytest.fixture(scope="module")
def toks():
    paths = {p.name: p for p in model_paths()}
    return {name: load_tokenizer(paths[name]) for name in NAMES}


# --------------------------------------------------------------------------- task


def test_generator_is_deterministic_and_seeded():
    assert make_problems(20, seed=3) == make_problems(20, seed=3)
    assert make_problems(20, seed=3) != make_problems(20, seed=4)


def test_forms_share_problems():
    by_form = {f: make_problems(30, seed=2, form=f) for f in FORMS}
    for cot, rag, react, tool in zip(*by_form.values(), strict=True):
        base = (cot.name, cot.obj, cot.start, cot.steps, cot.answer)
        assert (rag.name, rag.obj, rag.start, rag.steps, rag.answer) == base
        assert (react.name, react.obj, react.start, react.steps, react.answer) == base
        assert tool.name == cot.name
        if tool.expected_call is None or tool.expected_call[0] == "calculator":
            assert tool.question == cot.question  # the same two-step problem
            assert (tool.obj, tool.start, tool.steps, tool.answer) == base[1:]


def test_held_out_split_is_disjoint():
    combos = lambda split: {(p.start, p.steps) for p in make_problems(3000, seed=0, split=split)}  # noqa: E731
    train, test = combos("train"), combos("test")
    assert train and test and not train & test
    assert all(is_test_combo(*c) for c in test) and not any(is_test_combo(*c) for c in train)


def test_problems_are_consistent():
    for p in make_problems(200, seed=5, split="train", p_add=0.3):
        vals = [p.start]
        for op, n in p.steps:
            vals.append(vals[-1] + n if op == "+" else vals[-1] - n)
        assert min(vals) >= 0 and p.answer == vals[-1]
        assert check_answer(p.solution, p) and p.messages[-1]["content"] == p.question
    for p in make_problems(50, form="cot", split="test"):
        assert [m["role"] for m in p.messages] == ["user"]  # no system message in evaluation


def test_cot_example():
    p = make_problems(1, seed=1)[0]
    assert isinstance(p, Problem)
    assert re.fullmatch(
        r"\w+ has \d \w+\. .+\. Then .+\. How many \w+ does \w+ have .+\?", p.question
    )
    assert p.solution.endswith(f"The answer is {p.answer}.")


def test_rag_form():
    for p in make_problems(20, form="rag"):
        assert p.passages[0] == p.relevant_passage and len(p.passages) == 4
        system, user = p.messages
        assert system["role"] == "system" and user["content"].startswith(
            "Context information is below."
        )
        context = user["content"].split("---------------------\n")[1].removesuffix("\n")
        retrieved = context.split("\n\n")
        assert len(retrieved) == 2 and p.relevant_passage in retrieved
        assert user["content"].endswith(f"Query: {p.question}\nAnswer: ")


def test_extract_and_check():
    assert extract_answer("x. The answer is 9.") == 9
    assert extract_answer("The answer is 3. no, The answer is 12") == 12
    assert extract_answer("Thought: done.\nAnswer: 7") == 7
    assert extract_answer(" 7 ") == 7 and extract_answer("7.") == 7
    assert extract_answer("no number here") is None and extract_answer("12 apples") is None
    p = make_problems(1)[0]
    assert check_answer(f"The answer is {p.answer}.", p)
    assert not check_answer(f"The answer is {p.answer + 1}.", p)
    assert score([p.solution, "nope"], [p, p]) == 0.5


# --------------------------------------------------------------------------- tool form

# What LangChain's standard tests ask and the tools they bind (langchain-tests 1.1): the tool form
# must teach a generic form, so none of it may appear in the training data.
STANDARD_TEST_TEXT = (
    "magic_function",
    "Apply a magic function",
    "get_weather",
    "weather",
    "my_adder_tool",
    "answer_style",
    "What is the value of",
    "Use the tool",
    "What is 1 + 2",
    "What is 3 + 4",
    "joke",
    "punchline",
    "cats",
    "Hello",
    "San Francisco",
    "customer",
    "你好",
)


def test_tool_problems():
    problems = make_problems(300, seed=4, form="tool")
    assert {p.expected_call[0] if p.expected_call else None for p in problems} == {
        None,
        *TOOL_SPECS,
    }
    assert any(p.response_format for p in problems)
    for p in problems:
        names = [t["function"]["name"] for t in p.tools]
        assert 2 <= len(names) <= 4 and len(set(names)) == len(names)
        assert all(TOOL_SPECS[n] == t for n, t in zip(names, p.tools, strict=True))
        assert p.messages == [{"role": "user", "content": p.question}]
        steps = tool_steps(p)
        if p.expected_call is None:  # no offered tool fits: answered step by step, as cot
            assert set(names) <= set(DIRECT_TOOLS) and p.response_format is None
            assert steps == [(p.messages, p.solution)] and p.solution.endswith(".")
            assert check_answer(p.solution, p)
            continue
        name, arguments = p.expected_call
        assert name in names and check_tool_call(name, arguments, p)
        for value in arguments.values():  # every argument is copied from the question
            words = str(value).split() if name == "calculator" else [str(value)]
            assert all(w in re.findall(r"\w+", p.question) or w in "+-" for w in words)
        assert call_tool(name, arguments) == str(p.answer)
        (first, call_target), (second, final) = steps
        assert first == p.messages and call_target == format_tool_call(name, arguments)
        assert second == [*p.messages, *tool_followup(TOOL_CALL_ID, name, arguments, str(p.answer))]
        assert final == p.solution and check_answer(final, p)
        if p.response_format is None:
            assert final == f"The answer is {p.answer}."
        else:
            (key,) = p.response_format["required"]
            assert final == json.dumps({key: p.answer})
            assert not check_answer(f"The answer is {p.answer}.", p)
            assert not check_answer(json.dumps({key: p.answer + 1}), p)


def test_tool_problems_are_held_out():
    def calls(split: str, n: int) -> set:
        problems = make_problems(n, seed=0, form="tool", split=split)
        return {(p.question, json.dumps(p.expected_call)) for p in problems}

    train, test = calls("train", 3000), calls("test", 300)
    assert test and not {q for q, _ in train} & {q for q, _ in test}
    assert not {c for _, c in train if c != "null"} & {c for _, c in test if c != "null"}


def test_tool_loop_helpers():
    p = next(p for p in make_problems(50, seed=3, form="tool") if p.expected_call)
    name, arguments = p.expected_call
    assistant, result = tool_followup("call_9", name, arguments, "42")
    assert assistant == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }
    assert result == {"role": "tool", "content": "42", "tool_call_id": "call_9", "name": name}
    assert normalize_messages([*p.messages, assistant, result])[1:] == [assistant, result]
    assert check_tool_call(name, json.dumps(arguments), p)
    assert not check_tool_call(name, {**arguments, "extra": 1}, p)
    assert not check_tool_call("no_such_tool", arguments, p)
    assert (
        call_tool("add", {"a": 2, "b": 3}) == "5"
        and call_tool("multiply", {"a": 4, "b": 6}) == "24"
    )
    assert call_tool("calculator", {"expression": "7 - 2 + 4"}) == "9"
    assert call_tool("get_price", {"item": "muffins"}) == str(
        TOOL_FUNCTIONS["get_price"]("muffins")
    )
    assert call_tool("add", {"a": "2", "b": 3}).startswith("Error: add takes")
    assert call_tool("add", {"a": 2}).startswith("Error: add takes")
    assert call_tool("nope", {}) == "Error: no tool named 'nope'"
    text = f"Sure.\n{format_tool_call('add', {'a': 2, 'b': 3})}"
    assert first_tool_call(text) == ("add", {"a": 2, "b": 3})
    assert first_tool_call("The answer is 5.") is None
    assert first_tool_call('<tool_call>\n{"name": "add", "arguments": [1]}\n</tool_call>') is None


def test_no_standard_test_text_in_the_training_data(toks):
    texts = tokenizer_corpus(n=400)
    tok = toks["tb-llama-word"]
    data = examples(tok, {"tool": 300}, seed=1, p_add=0.5)
    texts += [tok.decode(e.ids) for e in data]
    assert any("<tool_call>" in t for t in texts)
    for phrase in STANDARD_TEST_TEXT:
        assert not any(phrase.lower() in t.lower() for t in texts), phrase


@pytest.mark.parametrize("name", NAMES)
def test_tool_training_sequences_are_what_a_member_renders(toks, name):
    """Call, result and answer: one sequence, equal to the prompts `render_prompt` gives a member
    at each turn (tokenized as a member does) and the targets in canonical syntax; loss on the
    assistant's turns only."""
    tok = toks[name]
    eot = end_of_turn_ids(tok)
    problems = [p for p in make_problems(40, seed=2, form="tool", split="train") if p.expected_call]
    data = examples(tok, {"tool": 40}, seed=2, p_add=0.5)
    data = [e for e in data if e.labels.count(IGNORE) != len(e.labels)]

    def member_prompt(messages, p):
        tools = trained_specs(p.tools)
        text = render_prompt(tok, normalize_messages(messages), name, tools, p.response_format)
        return tok(text, add_special_tokens=False).input_ids

    def target(text):
        return tok(text, add_special_tokens=False, split_special_tokens=True).input_ids + eot

    expected = []
    for p in problems:
        (first, call), (second, final) = tool_steps(p)
        assert member_prompt(second, p)[: len(member_prompt(first, p))] == member_prompt(first, p)
        ids = member_prompt(second, p) + target(final)
        prompt = member_prompt(first, p)
        assert ids[: len(prompt) + len(target(call))] == prompt + target(call)
        expected.append(ids)
    merged = [e.ids for e in data if e.form == "tool"]
    assert all(ids in merged for ids in expected)
    example = next(e for e in data if e.ids == expected[0])
    loss_text = tok.decode(
        [i for i, label in zip(example.ids, example.labels, strict=True) if label != IGNORE]
    )
    call, final = (t for _, t in tool_steps(problems[0]))
    assert call in loss_text and final in loss_text and "<tool_response>" not in loss_text


# --------------------------------------------------------------------------- tokenizers

WS_CHARS = "".join(chr(c) for c in range(0x110000) if chr(c).isspace())
TEXT = st.one_of(
    st.text(),
    st.text(alphabet=st.sampled_from(list(" \t\n\r\u00a0\u3000abc12.,!?'é中🙂\x1c"))),
    st.lists(
        st.sampled_from(["Tom", " has", " 12", "  ", "\n", "\t", " apples", ".", "🙂", "é", "7"])
    ).map("".join),
)


def _byte_level_decoder() -> dict[str, int]:
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=False)}


BYTE_LEVEL = _byte_level_decoder()


def surface(tok, family: str, token_id: int) -> bytes:
    """A token's surface bytes, as the engine normalises them across families."""
    t = tok.convert_ids_to_tokens(token_id)
    if token_id in tok.all_special_ids:
        return t.encode()
    if family == "bpe":
        return bytes(BYTE_LEVEL[c] for c in t)
    if re.fullmatch(r"<0x[0-9A-F]{2}>", t):
        return bytes([int(t[3:5], 16)])
    return (t.replace("▁", " ") if family == "spm" else t).encode()


def test_whitespace_class_is_python_isspace():
    assert set(re.findall(f"[{WS}]", "".join(map(chr, range(0x110000))))) == set(WS_CHARS)


@pytest.mark.parametrize("name", NAMES)
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=TEXT)
def test_round_trip(toks, name, text):
    if FAMILY[name] == "spm":
        text = text.replace("▁", "_")  # SentencePiece reads a literal U+2581 as a space
    tok = toks[name]
    ids = tok(text, add_special_tokens=False).input_ids
    assert b"".join(surface(tok, FAMILY[name], i) for i in ids).decode() == text
    assert tok.decode(ids) == text


@pytest.mark.parametrize("name", NAMES)
@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=TEXT)
def test_cuts_at_whitespace_run_starts(toks, name, text):
    tok = toks[name]

    def enc(t: str) -> list[int]:
        return tok(t, add_special_tokens=False).input_ids

    for s in range(1, len(text)):
        if text[s].isspace() and not text[s - 1].isspace():
            assert enc(text) == enc(text[:s]) + enc(text[s:])


def test_numbers_split_differently(toks):
    splits = {
        name: [tok.decode([i]) for i in tok(" 12 + 26", add_special_tokens=False).input_ids]
        for name, tok in toks.items()
    }
    assert splits["tb-gpt2-bpe"] == [" 12", " +", " 2", "6"]  # rarer numbers split
    assert splits["tb-qwen2-spm"] == [" ", "1", "2", " +", " ", "2", "6"]
    assert splits["tb-llama-word"] == [" ", "12", " +", " ", "26"]


def test_chat_templates(toks):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]

    def render(name, m):
        return toks[name].apply_chat_template(m, add_generation_prompt=True, tokenize=False)  # noqa: E731

    assert (
        render("tb-gpt2-bpe", msgs)
        == "<|endoftext|><|system|>\nS<|end|>\n<|user|>\nQ<|end|>\n<|assistant|>\n"
    )
    assert render("tb-qwen2-spm", msgs) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (
        render("tb-llama-word", msgs[1:])
        == "<bos><start_of_turn>user\nQ<end_of_turn>\n<start_of_turn>model\n"
    )
    with pytest.raises(Exception, match="System role not supported"):
        render("tb-llama-word", msgs)
    eos = {name: tok.eos_token for name, tok in toks.items()}
    assert eos == {
        "tb-gpt2-bpe": "<|end|>",
        "tb-qwen2-spm": "<|im_end|>",
        "tb-llama-word": "<end_of_turn>",
    }


# --------------------------------------------------------------------------- models


def test_model_paths_fixed_order():
    paths = model_paths()
    assert [p.name for p in paths] == list(MODEL_ORDER) and sorted(MODEL_ORDER) == sorted(NAMES)
    assert all(p.is_dir() for p in paths)


@pytest.fixture(scope="module")
def report():
    path = model_paths()[0].parent / "report.json"
    if not (model_paths()[0] / "model.safetensors").exists() or not path.exists():
        pytest.skip("models not built yet: python -m lab.testbed.build")
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", NAMES)
def test_shipped_model_loads_offline_and_generates(report, name):
    path = next(p for p in model_paths() if p.name == name)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    # AutoTokenizer rewraps a qwen2 dir's tokenizer.json (transformers 5): load it as saved
    tok = (PreTrainedTokenizerFast if name == "tb-qwen2-spm" else AutoTokenizer).from_pretrained(
        path
    )
    assert model.config.model_type == name.split("-")[1]
    assert model.config.max_position_embeddings >= 2048  # GPT2 maps it to n_positions
    eos = model.generation_config.eos_token_id
    assert (
        tok.eos_token_id in eos
        and tok.convert_ids_to_tokens(end_of_turn_ids(tok)[-1]) == tok.eos_token
    )
    # the report's first cot results reproduce with plain greedy generate
    problems = make_problems(8, seed=1, form="cot")
    right = [check_answer(generate(model, tok, p.messages), p) for p in problems]
    assert right == report["cot_right"][name][:8]
    # and the first tool-use turns (call, tool result, answer)
    problems = make_problems(6, seed=1, form="tool")
    right = [run_tool(model, tok, p)["answer_right"] for p in problems]
    assert right == report["tool_answer_right"][name][:6]


def test_random_model(tmp_path):
    for name in NAMES:
        path = random_model(name, tmp_path / name, seed=1)
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = load_tokenizer(path)
        assert model.config.model_type == name.split("-")[1]
        assert sum(p.numel() for p in model.parameters()) < 200_000
        assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
        ids = torch.tensor([prompt_ids(tok, [{"role": "user", "content": "hi"}])])
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4)
        assert out.shape[1] <= ids.shape[1] + 4
    path = random_model(
        "tb-gpt2-bpe", tmp_path / "g", hidden_size=64, num_layers=3, num_heads=4, max_positions=4096
    )
    config = AutoModelForCausalLM.from_pretrained(path).config
    assert (config.n_embd, config.n_layer, config.n_head, config.n_positions) == (64, 3, 4, 4096)
    path = random_model(
        "tb-qwen2-spm", tmp_path / "q", num_heads=4, num_kv_heads=2, dtype="bfloat16"
    )
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.num_key_value_heads == 2 and model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown testbed model"):
        random_model("nope", tmp_path / "x")
