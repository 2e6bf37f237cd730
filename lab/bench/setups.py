"""What a benchmark runs: the task's problems, the configurations (`Setup`s), and the members
they share (loaded once per run: the given models, the shipped ones, or random weights of a real
shape)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from core.cli_options import parse_value
from core.config import GenerationConfig
from core.ensemble import Ensemble
from core.errors import InvalidConfigError
from core.hf_member import HFMember
from core.member import Member
from core.methods import METHOD_NAMES, method_class
from core.penalties import SETTINGS as PENALTY_SETTINGS

from .answers import answer_checker

# Random-weight shapes of real models, on the testbed tokenizers (speed only: accuracy is
# meaningless for random weights). Keys are testbed model names.
SHAPES: dict[str, dict[str, dict[str, int]]] = {
    "tiny": {},  # 2 layers, hidden 32: the structural tests' models
    "testbed": {},  # the shipped models' own shapes
    "1b": {  # GPT-2 large, Qwen2.5-1.5B, Llama-3.2-1B
        "tb-gpt2-bpe": dict(hidden_size=1280, num_layers=36, num_heads=20, intermediate_size=5120),
        "tb-qwen2-spm": dict(
            hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2, intermediate_size=8960
        ),
        "tb-llama-word": dict(
            hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8, intermediate_size=8192
        ),
    },
    "3b": {  # GPT-2 XL, Qwen2.5-3B, Llama-3.2-3B
        "tb-gpt2-bpe": dict(hidden_size=1600, num_layers=48, num_heads=25, intermediate_size=6400),
        "tb-qwen2-spm": dict(
            hidden_size=2048, num_layers=36, num_heads=16, num_kv_heads=2, intermediate_size=11008
        ),
        "tb-llama-word": dict(
            hidden_size=3072, num_layers=28, num_heads=24, num_kv_heads=8, intermediate_size=8192
        ),
    },
}


# A checker reads a reply's text; `cut` says the reply stopped at the token limit (finish reason
# "length"), so a checker that can tell may leave its unfinished last word unread.
Check = Callable[..., bool]  # (text, cut=False) -> right?

# The task sources `--task` names (besides a JSONL file), the forms each one has, its default.
TASK_FORMS = {"arithmetic": ("cot", "rag", "tool"), "real": ("qa", "rag", "tool")}


@dataclass(frozen=True)
class Task:
    """Problems as (messages, checker) pairs: the tiny testbed's, the real task's, or a JSONL
    file's."""

    name: str
    items: list[tuple[list[dict], Check]]


def task_form(task: str, form: str | None) -> str:
    """The form a run uses: the one given, checked against the task, or the task's first."""
    forms = TASK_FORMS.get(task)
    if forms is None:  # a JSONL file: one form, its prompts as they are
        if form not in (None, "cot"):
            raise InvalidConfigError(
                f"--form {form} belongs to the built-in tasks; a JSONL file's prompts are sent "
                "as they are: drop --form."
            )
        return "cot"
    if form is None:
        return forms[0]
    if form not in forms:
        raise InvalidConfigError(
            f"--task {task} has the forms {', '.join(forms)}, not {form!r}: pick one of them."
        )
    return form


def default_models(task: str) -> list:
    """The members a task runs on unless --model says: the real pair for the real task
    (`core.testbed.real_models.real_members()`), the shipped tiny models otherwise."""
    from core.testbed import testbed

    return testbed(task == "real").members()


def load_task(task: str, n: int, seed: int = 1, form: str | None = None) -> Task:
    """The testbed's arithmetic problems, the real task's short questions
    (`core.testbed.make_real_problems`, checked by `check_real_answer`, which leaves a cut
    reply's unfinished last word unread), or a JSONL file of {"prompt", "answer"} lines whose
    outputs are checked by their FINAL answer (`lab.bench.answers.answer_checker`: the number, the
    multiple-choice letter or the text after the last "The answer is"/"Answer:", compared
    exactly; never a match anywhere in the output)."""
    form = task_form(task, form)
    if task in TASK_FORMS:
        from core.testbed import testbed

        bed = testbed(task == "real")
        return Task(
            f"{task}-{form}",
            [
                (p.messages, lambda text, cut=False, p=p: bed.right(text, p, cut))
                for p in bed.problems(n, seed, form)
            ],
        )
    path = Path(task)
    if not path.is_file():
        raise InvalidConfigError(
            f"--task {task!r} is neither 'arithmetic', 'real' nor a JSONL file of "
            '{"prompt": ..., "answer": ...} lines.'
        )
    items = []
    for where, row in jsonl_rows(path, '{"prompt": ..., "answer": ...}'):
        if "prompt" not in row or "answer" not in row:
            raise InvalidConfigError(f"{where} needs 'prompt' and 'answer' fields.")
        answer = str(row["answer"]).strip()
        if not answer:
            raise InvalidConfigError(f"{where} has an empty 'answer'; give the answer.")
        check = answer_checker(answer)
        items.append(
            ([{"role": "user", "content": row["prompt"]}], lambda text, cut=False, c=check: c(text))
        )
        if len(items) == n:
            break
    return Task(path.stem, items)


def jsonl_rows(path: Path, shape: str) -> Iterator[tuple[str, dict]]:
    """Each non-empty line of a JSONL file as ("file:line", object); a line that is not a JSON
    object is a clear error that shows the `shape` each line needs."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise InvalidConfigError(
                f"{path}:{number} is not JSON ({error.msg}); write one {shape} object per line."
            ) from error
        if not isinstance(row, dict):
            raise InvalidConfigError(f"{path}:{number} is not an object; write {shape}.")
        yield f"{path}:{number}", row


# `--config` keys that are generation settings of every request, not options of the method
GENERATION_KEYS = PENALTY_SETTINGS
CONFIG_HELP = (
    "label=method:key=value,... (the method's options; members=0+1; "
    f"{' and '.join(GENERATION_KEYS)} for its requests)"
)


@dataclass
class Setup:
    """One configuration to measure: a label, a method, its options, the members it uses, and
    generation settings its requests add (`GENERATION_KEYS`)."""

    label: str
    method: str
    options: dict[str, Any] = field(default_factory=dict)
    members: list[int] | None = None  # indices into the loaded members; None = all
    served_twin_of: str | None = None  # --remote: the in-process setup this one mirrors
    generation: dict[str, Any] = field(default_factory=dict)

    def config(self, config: GenerationConfig) -> GenerationConfig:
        """A request's settings with this configuration's generation settings added."""
        return replace(config, **self.generation) if self.generation else config

    def chosen(self, n_members: int) -> list[int]:
        return list(self.members) if self.members is not None else list(range(n_members))

    def drafter(self, n_members: int) -> int:
        """The member whose speed alone is this configuration's reference."""
        chosen = self.chosen(n_members)
        if self.method == "single":
            return chosen[self.options.get("member", 0)]
        return chosen[self.options.get("drafter", 0)] if self.method == "safe" else chosen[0]


def parse_setups(
    methods: Sequence[str],
    aggregators: Sequence[str],
    n_members: int,
    configs: Sequence[str] = (),
    names: Sequence[str] = (),
) -> list[Setup]:
    """`--methods single,token,safe,specem` expands to one single per member and one token/safe
    per aggregator; `--config label=method:key=value,...` adds exact configurations."""
    setups: list[Setup] = []
    for method in methods:
        method_class(method)  # unknown or unavailable methods fail here
        if method == "single":
            for i in range(n_members):
                label = f"single {names[i] if names else i}"
                setups.append(Setup(label, "single", {"member": i}))
        elif method in ("token", "safe"):
            for aggregator in aggregators:
                setups.append(Setup(f"{method} {aggregator}", method, {"aggregator": aggregator}))
        else:
            setups.append(Setup(method, method))
    for spec in configs:
        label, _, rest = spec.partition("=")
        method, _, opts = rest.partition(":")
        if not label or method not in METHOD_NAMES:
            raise InvalidConfigError(
                f"--config {spec!r}: use label=method[:key=value,...] with a method of "
                f"{', '.join(METHOD_NAMES)}."
            )
        options: dict[str, Any] = {}
        generation: dict[str, Any] = {}
        members = None
        for pair in filter(None, opts.split(",")):
            key, _, value = pair.partition("=")
            if key == "members":
                members = [int(v) for v in value.split("+")]
            else:
                (generation if key in GENERATION_KEYS else options)[key] = parse_value(value)
        setups.append(Setup(label, method, options, members, generation=generation))
    return setups


def method_setups(
    methods: Sequence[str], n_members: int, configs: Sequence[str] = (), names: Sequence[str] = ()
) -> list[Setup]:
    """One setup per method at its default options (`single` on the first member, labelled with
    its name), plus `--config` setups: what the concurrency, soak, grammar and tool benchmarks
    compare."""
    setups = []
    for method in methods:
        method_class(method)  # unknown or unavailable methods fail here
        label = f"single {names[0]}" if method == "single" and names else method
        setups.append(Setup(label, method))
    return setups + parse_setups((), (), n_members, configs, names)


def without_generation(setups: list[Setup]) -> list[Setup]:
    """The setups of a benchmark that writes its requests' settings itself: a `--config` that
    adds generation settings is refused rather than run without them."""
    for setup in setups:
        if setup.generation:
            raise InvalidConfigError(
                f"--config {setup.label!r}: {', '.join(setup.generation)} reach the requests of "
                "the accuracy, headroom, tool, speed and LangChain-suite benchmarks only; drop it "
                "here."
            )
    return setups


def shipped_model_paths() -> list[str]:
    from core.testbed import model_paths

    return [str(p) for p in model_paths()]


def load_members(
    models: Sequence[Any] | None,
    device: str = "cpu",
    dtype: str = "auto",
    shape: str | None = None,
    ignore_stop: bool = False,
) -> list[HFMember]:
    """In-process members, loaded once (every configuration of a run shares their weights): the
    given models (paths or `Local(...)` specs), the shipped ones by default, or random weights of
    a `shape`. `ignore_stop`: they never end their turn (fixed-length speed runs; random weights
    may stop at any time)."""
    if shape is not None:
        members = shape_members(shape, device, dtype)
    else:
        models = models or shipped_model_paths()
        members = [HFMember.load(p, device=device, dtype=dtype) for p in models]
    if ignore_stop:
        for member in members:
            member.stop_ids = frozenset()
    return members


def ensemble_for(members: Sequence[Member], setup: Setup, **settings: Any) -> Ensemble:
    """The setup's ensemble over the loaded members (`settings`: admission, failure policy).
    Prefix reuse is off unless asked for: every request computes its whole prompt, so no
    configuration profits from a prefix another one left behind."""
    chosen = [members[i] for i in setup.chosen(len(members))]
    settings.setdefault("prefix_reuse", False)
    return Ensemble(chosen, setup.method, **settings, **setup.options)


def weight_bytes(member: Member) -> int:
    """Bytes of an in-process member's weights (0 for a member served elsewhere)."""
    model = getattr(member, "model", None)
    if model is None or not hasattr(model, "parameters"):
        return 0
    return sum(p.numel() * p.element_size() for p in model.parameters())


def shape_members(shape: str, device: str, dtype: str) -> list[HFMember]:
    """Random-weight members of real shapes on the testbed tokenizers, built in memory on the
    device (nothing downloaded, nothing written)."""
    from transformers import AutoModelForCausalLM

    from core.loading import resolve_device, resolve_dtype
    from core.testbed import MODEL_ORDER
    from core.testbed.models import (
        MEMBERS,
        MODELS_DIR,
        TINY,
        generation_config,
        load_tokenizer,
        make_config,
    )

    if shape not in SHAPES:
        raise InvalidConfigError(f"--shape {shape!r}: use one of {', '.join(SHAPES)}.")
    target = resolve_device(device)
    members = []
    for seed, name in enumerate(MODEL_ORDER):
        spec, tok = MEMBERS[name], load_tokenizer(MODELS_DIR / name)
        if shape == "testbed":
            sizes = dict(spec.shape)
        else:
            sizes = SHAPES[shape].get(name) or {
                k: v
                for k, v in TINY.items()
                if not (k == "num_kv_heads" and spec.model_type == "gpt2")
            }
        torch.manual_seed(seed)
        with target:
            model = AutoModelForCausalLM.from_config(
                make_config(spec.model_type, tok, **sizes), dtype=resolve_dtype(dtype, target)
            )
        model.generation_config = generation_config(spec, tok)
        members.append(HFMember(f"{name}-{shape}", model.eval(), tok))
    return members
