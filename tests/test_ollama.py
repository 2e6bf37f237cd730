"""Models Ollama has pulled, named as Ollama names them ('ollama:NAME[:TAG]'), on a models
directory laid out here as Ollama lays it out (manifests by host, namespace, model and tag;
content-addressed blobs): the member loads the GGUF blob with the stop strings of its
parameters, under the name the user wrote, everywhere a path goes; a name Ollama has not pulled,
a missing blob, a LoRA adapter and a manifest without weights fail with the fix."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from gguf_files import CHATML, write_tiny_gguf

from core import Ensemble, Local, ModelLoadError, ModelNotFoundError
from core.cli_options import parse_models
from core.ollama import find_model, manifest_parts
from core.serve.settings import build_settings
from core.sources import source_label
from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM

HELLO = [{"role": "user", "content": "Hi there"}]
MODEL = "application/vnd.ollama.image.model"
PARAMS = "application/vnd.ollama.image.params"
TEMPLATE = "application/vnd.ollama.image.template"


def _blob(root: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def pull(root: Path, name: tuple[str, str, str, str], layers: dict[str, bytes]) -> None:
    """A manifest under `root` for host/namespace/model/tag, each layer's bytes in a blob."""
    entries = [{"mediaType": kind, **_blob(root, data)} for kind, data in layers.items()]
    manifest = root / "manifests" / Path(*name)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": entries}))


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> bytes:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf").read_bytes()


@pytest.fixture
def models(tmp_path, monkeypatch, tiny_bytes) -> Path:
    """An Ollama models directory with 'tiny:1b' (weights, a Go template, stop parameters)."""
    root = tmp_path / "ollama-models"
    go_template = b"{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>{{ end }}"
    params = json.dumps({"stop": ["<|im_end|>", "\nUser:"], "temperature": 0.7}).encode()
    pull(
        root,
        ("registry.ollama.ai", "library", "tiny", "1b"),
        {MODEL: tiny_bytes, TEMPLATE: go_template, PARAMS: params},
    )
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    return root


def test_a_pulled_model_loads_by_its_ollama_name_with_its_stop_parameters(models):
    ens = Ensemble.from_pretrained(["ollama:tiny:1b"], method="single", device="cpu")
    member = ens.members[0]
    assert member.name == "tiny:1b"
    assert member.tokenizer.chat_template == CHATML  # the GGUF file's own, not the Go template
    assert member.stop_texts == ("\nUser:",)  # "<|im_end|>" is a control token: a stop id
    assert member.tokenizer.convert_tokens_to_ids("<|im_end|>") in member.stop_ids
    out = ens.generate(HELLO, max_new_tokens=6)
    assert "".join(d.text for d in ens.stream(HELLO, max_new_tokens=6)) == out.text


def test_a_local_spec_keeps_its_own_stops_template_and_name_over_ollamas(models):
    spec = Local("ollama:tiny:1b", stop=["###"], name="mine", chat_template="{{ 'x' }}")
    member = Ensemble.from_pretrained([spec], method="single", device="cpu").members[0]
    assert (member.name, member.stop_texts) == ("mine", ("###",))
    assert member.tokenizer.chat_template == "{{ 'x' }}"


def test_an_ollama_name_goes_where_a_path_goes(models):
    """Both adapters name the member as written; LlamaIndex's checks sources at construction,
    LangChain's at the first call."""
    chat = ChatEnsemble(models=["ollama:tiny:1b"], method="single", device="cpu", max_tokens=4)
    assert chat.model_name == "ensemble-single:tiny:1b"
    assert isinstance(chat.invoke("Hi there").content, str)
    assert source_label("ollama:tiny:1b") == "tiny:1b"
    with pytest.raises(ModelNotFoundError, match="ollama pull tiny:7b"):
        EnsembleLLM(models=["ollama:tiny:7b"], method="single")
    served = build_settings(
        ensemble={"members": parse_models(["ollama:tiny:1b"]), "method": "single"}
    )
    assert [m.name for m in served.ensemble.load().members] == ["tiny:1b"]  # serve --model


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("llama3.2", ("registry.ollama.ai", "library", "llama3.2", "latest")),
        ("llama3.2:1b", ("registry.ollama.ai", "library", "llama3.2", "1b")),
        ("user/model:v1", ("registry.ollama.ai", "user", "model", "v1")),
        ("hf.co/owner/Repo-GGUF:Q4_K_M", ("hf.co", "owner", "Repo-GGUF", "Q4_K_M")),
    ],
)
def test_names_are_read_as_ollama_reads_them(name, parts):
    assert manifest_parts(name) == parts


@pytest.mark.parametrize("name", ["", ":1b", "tiny:", "a/b/c/d:1", "a//b"])
def test_a_malformed_name_is_refused_with_examples(name):
    with pytest.raises(ModelNotFoundError, match="ollama:llama3.2:1b"):
        find_model(f"ollama:{name}")


def test_names_match_ignoring_case_and_a_missing_tag_means_latest(models, tiny_bytes):
    pull(models, ("hf.co", "Owner", "Repo", "latest"), {MODEL: tiny_bytes})
    found = find_model("ollama:hf.co/owner/repo")
    assert found.name == "hf.co/owner/repo" and found.stop == ()
    assert found.path.read_bytes() == tiny_bytes


def test_a_model_not_pulled_names_the_pull_the_directory_and_what_is_there(models):
    with pytest.raises(ModelNotFoundError) as error:
        Ensemble.from_pretrained(["ollama:qwen3"], method="single")
    message = str(error.value)
    assert "ollama pull qwen3:latest" in message and str(models) in message
    assert "pulled: tiny:1b" in message and "OLLAMA_MODELS" in message


def test_a_missing_blob_and_an_unreadable_manifest_ask_for_the_pull_again(models):
    shutil.rmtree(models / "blobs")
    with pytest.raises(ModelNotFoundError, match="run `ollama pull tiny:1b` again"):
        find_model("ollama:tiny:1b")
    (models / "manifests/registry.ollama.ai/library/tiny/1b").write_text("{not json")
    with pytest.raises(ModelLoadError, match="manifest of 'tiny:1b'.*could not be read"):
        find_model("ollama:tiny:1b")


def test_a_damaged_blob_is_named_as_a_bad_gguf_file(models, tiny_bytes):
    pull(models, ("registry.ollama.ai", "library", "broken", "latest"), {MODEL: b"XXXX" * 64})
    with pytest.raises(ModelLoadError, match="is not a GGUF file"):
        Ensemble.from_pretrained(["ollama:broken"], method="single")


def test_an_adapter_or_a_manifest_without_gguf_weights_is_refused(models, tiny_bytes):
    adapter = "application/vnd.ollama.image.adapter"
    pull(
        models,
        ("registry.ollama.ai", "library", "lora", "latest"),
        {MODEL: tiny_bytes, adapter: b"lora"},
    )
    with pytest.raises(ModelLoadError, match="LoRA adapter"):
        Ensemble.from_pretrained(["ollama:lora"], method="single")
    tensor = "application/vnd.ollama.image.tensor; name=w; dtype=F16; shape=1"
    pull(models, ("registry.ollama.ai", "library", "split", "latest"), {tensor: b"w"})
    with pytest.raises(ModelLoadError, match="no GGUF weights layer"):
        Ensemble.from_pretrained(["ollama:split"], method="single")
