"""GGUF members and `Local(...)` specs, on tiny GGUF files written here (`tests/gguf_files.py`):
a file loads with the tokenizer and chat template its metadata holds, under any name; a Local
carries one member's own template, stop strings, dtype and name everywhere a path goes; a bad
file fails at load with a project error naming it and the fix."""

from __future__ import annotations

import importlib.util
import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from gguf_files import CHATML, damaged_copy, write_tiny_gguf

from core import (
    ChatTemplateError,
    Ensemble,
    HFMember,
    Local,
    MissingWeightsError,
    ModelLoadError,
)
from core.cli_options import parse_models
from core.gguf import shared_reader
from core.serve.settings import build_settings
from core.shared import configuration_key
from core.sources import model_sources, public_sources
from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM

HELLO = [{"role": "user", "content": "Hi there"}]
BRACKETS = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-chat.gguf")


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    """A GGUF file whose metadata holds no chat template (a base model)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-base.gguf", chat_template=None)


def test_a_gguf_file_loads_with_the_tokenizer_and_template_of_its_metadata(tiny_gguf):
    ens = Ensemble.from_pretrained([str(tiny_gguf)], method="single", device="cpu")
    member = ens.members[0]
    assert member.name == "tiny-chat"  # the file's name without .gguf
    assert member.tokenizer.chat_template == CHATML
    end = member.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end in member.stop_ids and member.tokenizer.is_fast
    assert member.dtype == torch.float32  # dequantized (one weight is Q8_0 in the file)
    ids = member.render([{"role": "user", "content": "the cat"}])
    assert (
        member.tokenizer.decode(ids)
        == "<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n"
    )
    out = ens.generate(HELLO, max_new_tokens=6)
    streamed = "".join(d.text for d in ens.stream(HELLO, max_new_tokens=6))
    assert out.stats.tokens > 0 and streamed == out.text


def test_a_gguf_file_without_the_suffix_is_read_by_its_magic(tiny_gguf, tmp_path):
    blob = tmp_path / "sha256-6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"
    shutil.copy(tiny_gguf, blob)  # how Ollama keeps a model
    member = HFMember.load(blob, device="cpu")
    assert member.tokenizer.chat_template == CHATML


def test_one_load_reads_a_file_once_and_reads_what_ggufs_own_reader_reads(tiny_gguf):
    """While a member loads, transformers' readers of one file are one reader, over a plain
    array view of the file's memory map (the same fields and tensors as gguf's reader), and
    its name maps of one architecture and depth one map."""
    import gguf

    alone = gguf.GGUFReader(tiny_gguf)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 1)
    with shared_reader():
        shared = gguf.GGUFReader(tiny_gguf)
        assert gguf.GGUFReader(str(tiny_gguf)) is shared
        name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 1)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 1) is name_map
        assert name_map.mapping == names.mapping
    assert gguf.GGUFReader(tiny_gguf) is not shared  # the context ended: gguf's own again
    assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 1) is not name_map
    _assert_same_reading(shared, alone)


def _assert_same_reading(ours, theirs) -> None:
    import numpy as np

    assert list(ours.fields) == list(theirs.fields)
    for mine, its in zip(ours.fields.values(), theirs.fields.values(), strict=True):
        assert (mine.offset, mine.types, mine.data) == (its.offset, its.types, its.data)
        for a, b in zip(mine.parts, its.parts, strict=True):
            assert (a.dtype, a.shape) == (b.dtype, b.shape) and np.array_equal(a, b)
    assert ours.data_offset == theirs.data_offset
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    pairs = zip(ours.tensors, theirs.tensors, strict=True)
    assert all(np.array_equal(a.data, b.data) for a, b in pairs)


def test_a_file_whose_weights_do_not_fit_in_free_memory_is_refused_before_loading(
    tiny_gguf, monkeypatch
):
    """Dequantized weights take several times the file (an 8B model's 4.9 GB of Q4_K_M are
    32 GB of float32), and a CPU out of memory kills the process: the load is refused first,
    naming the sizes and bfloat16, or a smaller model where bfloat16 is already asked for."""
    import psutil

    real = psutil.virtual_memory()
    weights = sum(p.numel() for p in HFMember.load(str(tiny_gguf)).model.parameters())

    def free(amount: int):
        monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=amount))

    free(weights * 3)  # room for bfloat16, not for float32
    with pytest.raises(ModelLoadError, match=r"float32 they take .*bfloat16") as refused:
        Ensemble.from_pretrained([str(tiny_gguf)], "single")
    assert str(tiny_gguf) in str(refused.value) and f"{weights:,} weights" in str(refused.value)
    ensemble = Ensemble.from_pretrained([Local(str(tiny_gguf), dtype="bfloat16")], "single")
    assert ensemble.generate("Hi", max_new_tokens=2).text is not None
    free(weights)  # not even for bfloat16
    with pytest.raises(ModelLoadError, match="load a smaller model"):
        Ensemble.from_pretrained([str(tiny_gguf)], "single", dtype="bfloat16")
    free(real.available)
    assert Ensemble.from_pretrained([str(tiny_gguf)], "single").generate("Hi", max_new_tokens=2)


def test_members_that_fit_one_by_one_but_not_together_are_refused_before_any_loads(
    tiny_gguf, monkeypatch
):
    import psutil

    weights = sum(p.numel() for p in HFMember.load(str(tiny_gguf)).model.parameters())
    loads = []
    real_load = HFMember.load

    def counted(*args, **kwargs):
        loads.append(args)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(HFMember, "load", counted)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=weights * 6))
    with pytest.raises(ModelLoadError, match=r"take .* together .* bfloat16.*another device"):
        Ensemble.from_pretrained([str(tiny_gguf), str(tiny_gguf)], "safe")
    assert loads == []  # no member loaded
    ensemble = Ensemble.from_pretrained([str(tiny_gguf), str(tiny_gguf)], "safe", dtype="bfloat16")
    assert len(loads) == 2 and ensemble.generate("Hi", max_new_tokens=2).text is not None


def test_a_checkpoint_directory_that_does_not_fit_is_refused_the_same_way(monkeypatch):
    """A safetensors directory is sized from its files' headers before transformers loads it."""
    import psutil

    from core.testbed import model_paths

    path = str(model_paths()[0])
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=1000))
    with pytest.raises(ModelLoadError, match=r"weights: in float32 they take .* 0\.0 GB free"):
        Ensemble.from_pretrained([path], "single")
    monkeypatch.undo()
    assert Ensemble.from_pretrained([path], "single").generate("Hi", max_new_tokens=2).text


def test_every_kind_of_metadata_array_reads_as_ggufs_own_reader_reads_it(tmp_path):
    """Arrays of every element type (a vocabulary's strings, scores and types read in bulk),
    empty and nested ones, next to single values: the same fields, parts and indices."""
    import gguf
    import numpy as np

    path = tmp_path / "arrays.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    numbers = {
        gguf.GGUFValueType.UINT8: [0, 7, 255],
        gguf.GGUFValueType.INT8: [-128, 0, 127],
        gguf.GGUFValueType.UINT16: [1, 65535],
        gguf.GGUFValueType.INT16: [-2, 3],
        gguf.GGUFValueType.UINT32: [4, 4294967295],
        gguf.GGUFValueType.INT32: [-5, 6, 7],
        gguf.GGUFValueType.FLOAT32: [0.5, -1.25, 3e38],
        gguf.GGUFValueType.UINT64: [2**63],
        gguf.GGUFValueType.INT64: [-(2**40)],
        gguf.GGUFValueType.FLOAT64: [1e-300, 2.5],
        gguf.GGUFValueType.BOOL: [True, False, True],
    }
    for kind, values in numbers.items():
        writer.add_key_value(f"test.{kind.name.lower()}", values, gguf.GGUFValueType.ARRAY, kind)
    writer.add_array("test.strings", ["", "a", "ünï ▁code", "<|im_end|>"])
    writer.add_array("test.empty", [])
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_uint32("test.single", 9)
    writer.add_string("test.text", "plain")
    writer.add_tensor("token_embd.weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    alone = gguf.GGUFReader(path)
    with shared_reader():
        shared = gguf.GGUFReader(path)
    assert shared is not alone
    _assert_same_reading(shared, alone)
    assert shared.fields["test.strings"].contents() == ["", "a", "ünï ▁code", "<|im_end|>"]
    assert shared.fields["test.float32"].contents() == pytest.approx([0.5, -1.25, 3e38])


def test_a_gguf_file_loads_dequantized_in_the_dtype_asked_without_a_false_warning(
    tiny_gguf, caplog
):
    """Dequantized on purpose: transformers' warning about slowing weights it keeps packed
    (and that this costs no memory) would be false here, so it is not logged."""
    with caplog.at_level("WARNING"):
        member = HFMember.load(tiny_gguf, device="cpu", dtype="bfloat16")
    assert member.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in member.model.parameters())
    assert not [r for r in caplog.records if "packed" in r.getMessage()]


def test_a_local_carries_its_own_template_stop_dtype_and_name(tiny_gguf, tmp_path):
    template_file = tmp_path / "brackets.jinja"
    template_file.write_text(BRACKETS)
    spec = Local(
        tiny_gguf,
        chat_template=template_file,
        stop=["<|endoftext|>", "[user]"],
        dtype=torch.bfloat16,
        name="mine",
    )
    assert spec.public_fields() == {
        "path": str(tiny_gguf),
        "chat_template": str(template_file),
        "stop": ["<|endoftext|>", "[user]"],
        "dtype": "bfloat16",
        "name": "mine",
    }
    ens = Ensemble.from_pretrained([spec], method="single", device="cpu", dtype="float32")
    member = ens.members[0]
    assert (member.name, member.dtype) == ("mine", torch.bfloat16)  # the Local's own win
    assert member.tokenizer.chat_template == BRACKETS
    endoftext = member.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert endoftext in member.stop_ids  # one control token: a stop id of this member
    assert member.stop_strings == ("<|endoftext|>", "[user]")
    assert member.tokenizer.decode(member.render(HELLO)) == "[user] Hi there\n[assistant] "


def test_a_member_stop_string_ends_the_response_like_a_request_stop(tiny_gguf):
    free = Ensemble.from_pretrained([str(tiny_gguf)], method="single", device="cpu")
    text = free.generate(HELLO, max_new_tokens=12).text
    cut = text[3:5]
    assert cut and len(text) > 5
    stopped = Ensemble.from_pretrained([Local(tiny_gguf, stop=[cut])], "single", device="cpu")
    out = stopped.generate(HELLO, max_new_tokens=12)
    assert out.finish_reason == "stop" and out.text == text[: text.index(cut)]
    assert out.text == free.generate(HELLO, max_new_tokens=12, stop=[cut]).text


def test_a_base_model_needs_a_template_and_the_error_names_local(tiny_base):
    ens = Ensemble.from_pretrained([str(tiny_base)], method="single", device="cpu")
    with pytest.raises(ChatTemplateError, match=r"Local\(path, chat_template=.*raw_prompt=True"):
        ens.generate(HELLO)
    assert ens.generate("Once upon a time", raw_prompt=True, max_new_tokens=3).stats.tokens
    given = Ensemble.from_pretrained([Local(tiny_base, chat_template=BRACKETS)], "single")
    assert given.generate(HELLO, max_new_tokens=3).stats.tokens


@pytest.mark.parametrize(
    ("how", "error", "fix"),
    [
        ("truncated", MissingWeightsError, "is truncated: its tensors need"),
        ("magic", MissingWeightsError, "it starts with b'FUGG', not b'GGUF'"),
        ("text", MissingWeightsError, "is not a GGUF file"),
        ("empty", MissingWeightsError, "it starts with b'', not b'GGUF'"),
        ("unknown-type", ModelLoadError, "ggml type 99, which the installed gguf package"),
        ("unreadable-type", ModelLoadError, "Q8_1, which the gguf package cannot dequantize"),
    ],
)
def test_a_bad_file_fails_at_load_naming_it_and_the_fix(tiny_gguf, tmp_path, how, error, fix):
    bad = damaged_copy(tiny_gguf, tmp_path / "model.gguf", how)
    for load in (
        lambda: Ensemble.from_pretrained([str(bad)], method="single", device="cpu"),
        lambda: EnsembleLLM(models=[str(bad)], method="single"),  # at construction
    ):
        with pytest.raises(error) as caught:
            load()
        assert type(caught.value) is error
        assert fix in str(caught.value) and str(bad) in str(caught.value)


def test_a_header_cut_short_is_truncated_too(tiny_gguf, tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(tiny_gguf.read_bytes()[:300])  # inside the vocabulary array
    with pytest.raises(MissingWeightsError, match="truncated or damaged: its header ends"):
        HFMember.load(bad)


def test_missing_packages_name_the_extra(tiny_gguf, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a)
    )
    with pytest.raises(ModelLoadError, match=r"needs the gguf package.*llm-ensembling\[gguf\]"):
        HFMember.load(tiny_gguf)


def test_a_local_goes_wherever_a_path_goes(tiny_gguf, tmp_path):
    spec = Local(tiny_gguf, chat_template=BRACKETS, stop=["[user]"], name="mine")
    fields = spec.public_fields()
    assert model_sources([fields, str(tiny_gguf)]) == [spec, str(tiny_gguf)]
    assert public_sources([spec, "org/model"]) == [fields, "org/model"]
    chat = ChatEnsemble(models=[spec], method="single")
    assert chat.model_dump()["models"] == [fields]
    assert ChatEnsemble(**chat.model_dump()).models == [spec]  # a dump loads back
    assert chat.model_name == "ensemble-single:mine"
    llm = EnsembleLLM(models=[fields], method="single")
    assert llm.models == [spec] and json.loads(llm.to_json())["models"] == [fields]
    # serve: a --model JSON object and an ensemble.toml dict are the same member
    flags = parse_models([json.dumps(fields), "org/model"])
    settings = build_settings(ensemble={"members": flags})
    assert model_sources(list(settings.ensemble.members)) == [spec, "org/model"]


def test_the_shared_engine_keys_on_a_locals_options(tiny_gguf, tmp_path):
    path = str(tiny_gguf)
    key = configuration_key([path], "single", {})
    assert configuration_key([Local(path)], "single", {}) == key  # Local(path) is the path
    assert configuration_key([Local(path, stop=["x"])], "single", {}) != key
    template = tmp_path / "t.jinja"
    template.write_text(BRACKETS)
    by_file = configuration_key([Local(path, chat_template=template)], "single", {})
    assert by_file == configuration_key([Local(path, chat_template=BRACKETS)], "single", {})
    assert by_file != configuration_key([Local(path, chat_template=CHATML)], "single", {})
    first = EnsembleLLM(models=[Local(path, name="a")], method="single", device="cpu")
    again = EnsembleLLM(models=[{"path": path, "name": "a"}], method="single", device="cpu")
    other = EnsembleLLM(models=[Local(path, name="b")], method="single", device="cpu")
    assert first.ensemble is again.ensemble and first.ensemble is not other.ensemble
    assert other.ensemble.members[0].name == "b"
