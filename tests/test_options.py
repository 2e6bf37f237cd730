"""Every ensemble option is declared once (`core.options`) and reaches every front end: the
`Ensemble` signatures, `ChatEnsemble` and `EnsembleLLM` fields, `serve` flags and
`ensemble.toml` keys, and `generate` flags for the options that matter to one request. A value
given at each front end arrives at `Ensemble.from_pretrained` as given; and adding an option to
the table, and nothing else, makes every front end offer it."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core import Ensemble, InvalidConfigError
from core.cli import GENERATE_GROUPS, build_parser, main
from core.methods import METHOD_NAMES, method_class
from core.options import OPTIONS, RUNNING, Option
from core.serve.command import serve_settings
from core.serve.settings import build_settings, read_config
from core.testbed import model_paths
from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM

ROOT = Path(__file__).resolve().parents[1]
IDS = [o.name for o in OPTIONS]


class Arrived(Exception):
    """Raised in place of loading: the arguments `Ensemble.from_pretrained` was called with."""

    def __init__(self, models, method, kwargs) -> None:
        super().__init__("arrived")
        self.models, self.method, self.kwargs = models, method, kwargs


@pytest.fixture
def arrivals(monkeypatch):
    """`Ensemble.from_pretrained` records its call and loads nothing."""

    def record(cls, models, method="safe", **kwargs):
        raise Arrived(models, method, kwargs)

    monkeypatch.setattr(Ensemble, "from_pretrained", classmethod(record))


def _models() -> list[str]:
    return [str(p) for p in model_paths()[:2]]


def _flags(option: Option, value) -> list[str]:
    """The value as a command line gives it."""
    if isinstance(value, bool):
        return [option.command_line if value else "--no-" + option.command_line[2:]]
    values = value if isinstance(value, list) else [value]
    return [arg for v in values for arg in (option.command_line, str(v))]


def _arrived(call) -> dict:
    with pytest.raises(Arrived) as arrived:
        call()
    return arrived.value.kwargs


def test_the_table_is_sound():
    """Names are unique; each default and example passes its own check, and they differ (the
    example is what the tests below give); no method has an option of the same name."""
    assert len(IDS) == len(set(IDS))
    for option in OPTIONS:
        assert option.check(option.default) == option.default, option.name
        assert option.check(option.example) == option.example, option.name
        assert option.example != option.default, option.name
        assert option.help and option.group
    for name in METHOD_NAMES:
        own = inspect.signature(method_class(name).__init__).parameters
        assert not set(own) & set(IDS), name


@pytest.mark.parametrize("option", OPTIONS, ids=IDS)
def test_ensemble_signatures_list_every_option(option):
    pretrained = inspect.signature(Ensemble.from_pretrained).parameters
    assert pretrained[option.name].default == option.default
    assert pretrained[option.name].kind is inspect.Parameter.KEYWORD_ONLY
    assert f"{option.name}={option.default!r}" in inspect.getdoc(Ensemble.from_pretrained)
    built = inspect.signature(Ensemble).parameters
    assert (option.name in built) is (option.group in RUNNING)


def test_ensemble_keeps_its_running_options_and_refuses_loading_ones(shipped_members):
    given = {o.name: o.example for o in OPTIONS if o.group in RUNNING}
    ens = Ensemble(list(shipped_members), "token", **given)
    assert dict(ens.options) == given and ens.method_options == {}
    assert ens.admission.max_concurrency == given["max_concurrency"]
    assert ens.trust.floor == given["weight_floor"] and ens.learn_weights is True
    assert dict(Ensemble(list(shipped_members), "token").options) == {
        o.name: o.default for o in OPTIONS if o.group in RUNNING
    }
    with pytest.raises(InvalidConfigError, match="which Ensemble.from_pretrained does"):
        Ensemble(list(shipped_members), "token", dtype="float32")


@pytest.mark.parametrize("option", OPTIONS, ids=IDS)
def test_every_front_end_passes_an_option_on_as_given(option, arrivals, tmp_path):
    models, value = _models(), option.example
    fronts = {
        "ChatEnsemble": lambda: ChatEnsemble(models=models, **{option.name: value}).ensemble,
        "EnsembleLLM": lambda: EnsembleLLM(models=models, **{option.name: value}).ensemble,
    }
    for front, call in fronts.items():
        assert _arrived(call)[option.name] == value, front

    members = [arg for m in models for arg in ("--model", m)]
    args = build_parser().parse_args(["serve", *members, *_flags(option, value)])
    assert _arrived(serve_settings(args).ensemble.load)[option.name] == value, "serve flag"

    config = tmp_path / "ensemble.toml"
    config.write_text(f"members = {json.dumps(models)}\n{option.name} = {json.dumps(value)}\n")
    spec = build_settings(read_config(str(config))).ensemble
    assert getattr(spec, option.name) == value
    assert _arrived(spec.load)[option.name] == value, "ensemble.toml"

    generate = ["generate", *members, *_flags(option, value), "Hi"]
    if option.group in GENERATE_GROUPS:
        assert _arrived(lambda: main(generate))[option.name] == value, "generate flag"
    else:
        with pytest.raises(SystemExit):  # argparse: a flag generate does not offer
            build_parser().parse_args(generate)


@pytest.mark.parametrize("option", OPTIONS, ids=IDS)
def test_adapter_fields_declare_the_option_once(option):
    for adapter in (ChatEnsemble, EnsembleLLM):
        declared = adapter.model_fields[option.name]
        assert declared.default == option.default and declared.description == option.help


def test_defaults_reach_from_pretrained_unless_a_front_end_has_its_own(arrivals):
    """Adapters pass the table's defaults; serve waits 60 s for a slot; generate shows a
    progress bar and leaves the rest to `from_pretrained`'s defaults."""
    defaults = {o.name: o.default for o in OPTIONS}
    models = _models()
    assert _arrived(lambda: ChatEnsemble(models=models).ensemble) == defaults
    assert _arrived(lambda: EnsembleLLM(models=models).ensemble) == defaults
    args = build_parser().parse_args(["serve", "--model", models[0], "--model", models[1]])
    assert _arrived(serve_settings(args).ensemble.load) == {**defaults, "queue_timeout": 60.0}
    generate = ["generate", "--model", models[0], "--model", models[1], "x"]
    assert _arrived(lambda: main(generate)) == {"progress": True}


def test_a_bad_value_fails_the_same_way_at_every_front_end(tmp_path, capsys):
    needle = "max_queue='8' must be a positive integer or None"
    models = _models()
    with pytest.raises(InvalidConfigError, match=needle):
        Ensemble.from_pretrained(models, max_queue="8")
    with pytest.raises(ValueError, match=needle):  # pydantic's ValidationError is one
        ChatEnsemble(models=models, max_queue="8")
    with pytest.raises(ValueError, match=needle):
        EnsembleLLM(models=models, max_queue="8")
    config = tmp_path / "ensemble.toml"
    config.write_text(f'members = {json.dumps(models)}\nmax_queue = "8"\n')
    assert main(["serve", "--config", str(config)]) == 2
    assert needle in capsys.readouterr().err


def test_wrapping_an_engine_takes_its_options_and_refuses_others(shipped_members):
    ens = Ensemble(list(shipped_members), "token", max_queue=3, on_member_failure="drop")
    chat = ChatEnsemble.from_ensemble(ens, max_tokens=4)
    llm = EnsembleLLM(ensemble=ens)
    for adapter in (chat, llm):
        assert adapter.max_queue == 3 and adapter.on_member_failure == "drop"
        assert adapter.ensemble is ens
    with pytest.raises(InvalidConfigError, match="not both"):
        ChatEnsemble.from_ensemble(ens, max_queue=5)
    with pytest.raises(InvalidConfigError, match="pass either ensemble= or device, not both"):
        EnsembleLLM(ensemble=ens, device="cpu")


# A new option, written into the table's source and nowhere else.
NEW_OPTION = """
    Option(
        "colour", Choice({"red": "the usual", "blue": "the other"}), "red", REQUESTS,
        example="blue", help="a colour no front end has heard of",
    ),
"""

PROBE = """
import importlib.abc, importlib.util, inspect, json, sys, tempfile
from pathlib import Path

source = Path("core/options.py").read_text()
marker = "\\n)  # fmt: skip\\n"
assert source.count(marker) == 1
source = source.replace(marker, NEW_OPTION + marker)

class Edited(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "core.options":
            return importlib.util.spec_from_loader(name, self, origin="core/options.py")
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        exec(compile(source, "core/options.py", "exec"), module.__dict__)

sys.meta_path.insert(0, Edited())

from core import Ensemble, HFMember, InvalidConfigError
from core.cli import build_parser
from core.serve.command import serve_settings
from core.serve.settings import build_settings, read_config
from core.testbed import model_paths
from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM

found = {}
found["Ensemble"] = inspect.signature(Ensemble).parameters["colour"].default
found["from_pretrained"] = inspect.signature(Ensemble.from_pretrained).parameters["colour"].default
paths = [str(p) for p in model_paths()[:2]]
member = HFMember.load(paths[0], device="cpu")
found["built"] = Ensemble([member], "single", colour="blue").options.colour
try:
    Ensemble([member], "single", colour="green")
except InvalidConfigError as error:
    found["refused"] = str(error)
found["ChatEnsemble"] = ChatEnsemble(models=paths, colour="blue").colour
found["EnsembleLLM"] = EnsembleLLM(models=paths, colour="blue").colour
args = build_parser().parse_args(["serve", "--model", paths[0], "--colour", "blue"])
found["serve"] = serve_settings(args).ensemble.colour
config = Path(tempfile.mkdtemp()) / "ensemble.toml"
config.write_text('colour = "blue"\\n')
found["toml"] = build_settings(read_config(str(config))).ensemble.colour
found["generate"] = build_parser().parse_args(["generate", "--colour", "blue", "x"]).colour
print(json.dumps(found))
"""


def test_a_new_option_is_one_entry_in_the_table():
    """core/options.py with one more `Option(...)` in `OPTIONS`, and no other file changed:
    every front end offers it, with its default, and checks it."""
    script = f"NEW_OPTION = {NEW_OPTION!r}\n" + textwrap.dedent(PROBE)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found.pop("refused") == (
        "colour='green' is not supported; use 'red' (the usual) or 'blue' (the other)."
    )
    assert found == {
        "Ensemble": "red",
        "from_pretrained": "red",
        "built": "blue",
        "ChatEnsemble": "blue",
        "EnsembleLLM": "blue",
        "serve": "blue",
        "toml": "blue",
        "generate": "blue",
    }
