"""The defaults are what the README says they are: the core's, and both adapters' (which follow
the core's), and the papers' configurations one preset away."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from core import Ensemble
from core.methods import DEFAULT_METHOD
from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_default() -> dict:
    """The options in the README's sentence "The default configuration is `method=..., ...`"."""
    found = re.search(r"The default\s+configuration\s+is\s+`([^`]*)`", README.read_text())
    assert found, "the README states the default configuration"
    call = ast.parse(f"f({found.group(1)})", mode="eval").body
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def test_the_core_default_is_what_the_readme_says(tiny_members):
    stated = _readme_default()
    method = stated.pop("method")
    assert method == DEFAULT_METHOD
    ensemble = Ensemble(tiny_members)
    assert ensemble.method == method
    summary = ensemble.summary()
    for option, value in stated.items():
        assert summary[option] == value, option


def test_the_adapters_default_to_the_core_default():
    for adapter in (ChatEnsemble, EnsembleLLM):  # the method's own defaults: no options
        fields = adapter.model_fields
        assert fields["method"].default == DEFAULT_METHOD
        assert fields["method_options"].default_factory() == {}


def test_the_papers_are_one_preset_away(tiny_members):
    """SAFE's paper preset turns our extensions off; the default turns on what the README
    says it does."""
    paper = Ensemble(tiny_members, "safe", preset="paper").summary()
    assert paper["heal"] is False and paper["max_lookahead"] == paper["lookahead"]
    assert (paper["stop_check"], paper["remap"], paper["subtoken"]) == (
        "mass",
        "likeliest",
        "first",
    )
    authors = Ensemble(tiny_members, "safe", preset="authors").summary()
    assert (authors["heal"], authors["stop_check"], authors["remap"], authors["subtoken"]) == (
        False,
        "text",
        "as-aligned",
        "nonblank",
    )
    specem = Ensemble(tiny_members, "specem", preset="paper").summary()
    assert (specem["draft_temperature"], specem["draft_top_p"], specem["schedule"]) == (
        0.6,
        0.9,
        "rounds",
    )
