"""The `models` argument: one normaliser (`core.sources.model_sources`) behind the shared-engine
cache and both adapters, with a clear error for anything that is not a member source."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from core import InvalidConfigError, Remote
from core.sources import model_sources
from core.testbed import MODEL_ORDER
from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM

SERVED = Remote("http://127.0.0.1:8000/v1", tokenizer="tok")


def test_every_accepted_form_becomes_a_list_of_sources(tmp_path):
    assert model_sources("org/model") == ["org/model"]
    assert model_sources(tmp_path) == [str(tmp_path)]
    assert model_sources(SERVED) == [SERVED]
    assert model_sources((tmp_path, "org/model", SERVED)) == [str(tmp_path), "org/model", SERVED]
    as_dict = {"base_url": "http://127.0.0.1:8000/v1", "tokenizer": "tok"}
    assert model_sources([as_dict]) == [SERVED]
    assert model_sources([]) == []  # emptiness is the caller's to report, with its own fix


@pytest.mark.parametrize(
    ("models", "match"),
    [
        (3, r"models is 3 of type int; pass a local model directory, a .gguf file, a hub id"),
        (None, r"models is None; pass"),
        ({"base_url": "http://h:1/v1"}, r"models is \{.*\} of type dict; .*or a list of them"),
        (["org/model", 3], r"models\[1\] is 3 of type int; each member is"),
        ([b"org/model"], r"models\[0\] is b'org/model' of type bytes"),
        ([""], r"models\[0\] is an empty string"),
        (
            [{"base_url": "http://h:1/v1", "url": "x"}],
            r"models\[0\] is a dict for Remote\(...\) with unknown field\(s\) url;",
        ),
        (
            [{"path": "m.gguf", "template": "t"}],
            r"models\[0\] is a dict for Local\(...\) with unknown field\(s\) template; it takes",
        ),
        (
            [{"model": "m"}],
            r"models\[0\] is a dict with neither path nor base_url; a dict with path",
        ),
        ([{"path": "m", "base_url": "http://h:1/v1"}], r"a dict with both path and base_url"),
    ],
)
def test_anything_else_is_a_clear_error(models, match):
    with pytest.raises(InvalidConfigError, match=match):
        model_sources(models)


def test_both_adapters_normalise_alike_and_reject_alike(tiny_dirs):
    paths = [tiny_dirs[name] for name in MODEL_ORDER[:2]]
    chat = ChatEnsemble(models=[Path(p) for p in paths], method="token")
    llm = EnsembleLLM(models=[Path(p) for p in paths], method="token")
    assert chat.models == llm.models == paths
    assert ChatEnsemble(models=Path(paths[0]), method="single").models == paths[:1]
    assert EnsembleLLM(models=Path(paths[0]), method="single").models == paths[:1]
    with pytest.raises(ValidationError, match=r"models\[1\] is 3 of type int"):
        ChatEnsemble(models=[paths[0], 3], method="token")
    with pytest.raises(InvalidConfigError, match=r"models\[1\] is 3 of type int"):
        EnsembleLLM(models=[paths[0], 3], method="token")


def test_a_path_and_its_string_share_one_loaded_engine(tiny_dirs):
    paths = [tiny_dirs[name] for name in MODEL_ORDER[:2]]
    by_path = EnsembleLLM(models=[Path(p) for p in paths], method="token", device="cpu")
    by_text = EnsembleLLM(models=paths, method="token", device="cpu")
    assert by_path.ensemble is by_text.ensemble


@pytest.mark.parametrize("spec", ["tb-gpt2-bpe", Remote(base_url="http://x:1/v1", model="m")])
def test_the_constructor_takes_loaded_members_and_names_from_pretrained(spec):
    from core import Ensemble

    with pytest.raises(InvalidConfigError, match=r"Ensemble\.from_pretrained"):
        Ensemble([spec], "single")
