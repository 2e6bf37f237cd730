"""Loading one member's model and tokenizer from a local directory or a hub id, with clear errors
(a GGUF file loads through `core.gguf`).

This is the same `from_pretrained` path users take with real models; the shipped testbed models
are just local directories. Two traps are handled here: safetensors/`trust_remote_code=False` by
default, and transformers 5's habit of re-wrapping `tokenizer.json` in a model family's own
tokenizer pipeline (for `qwen2` directories), which silently changes token ids.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
from difflib import get_close_matches
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .errors import (
    InvalidConfigError,
    MissingWeightsError,
    ModelLoadError,
    ModelNotFoundError,
    NotCausalLMError,
    TokenizerMismatchError,
)
from .gguf import check_file, looks_like_gguf, shared_reader, translated
from .ollama import find_model, is_ollama_name
from .validate import check_bool

TOKENIZER_PROBE = "Tom has 7 apples.\nHe buys 15 more:  7 + 15 = 22. Caf\u00e9 \u2603 <tag> done."


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device in (None, "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise InvalidConfigError(
            f"device {device!r} is not a torch device; use 'auto', 'cpu', 'cuda' or 'cuda:N'."
        ) from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise InvalidConfigError(
            f"device {device!r} asked for CUDA but no GPU is visible; use 'cpu' or 'auto'."
        )
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype in (None, "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    resolved = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise InvalidConfigError(
            f"dtype {dtype!r} is not a torch dtype; use 'auto', 'float32', 'bfloat16' or 'float16'."
        )
    if not resolved.is_floating_point:  # transformers refuses it, after reading the config
        raise InvalidConfigError(
            f"dtype {dtype!r} is not a floating-point dtype, and a model's weights are loaded in "
            "one; use 'auto', 'float32', 'bfloat16' or 'float16'."
        )
    return resolved


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _looks_like_path(spec: str) -> bool:
    return not _HUB_ID.match(spec) or os.path.exists(spec)


def check_model_source(spec: str | os.PathLike, use_safetensors: bool = True) -> str:
    """Fail early, with the fix in the message, for the mistakes users actually make."""
    check_bool("use_safetensors", use_safetensors)
    if not isinstance(spec, (str, os.PathLike)):
        raise InvalidConfigError(
            f"a model must be given as a local directory or a hub id (a string or a path), got "
            f"{spec!r} ({type(spec).__name__}); pass e.g. 'Qwen/Qwen2.5-0.5B-Instruct'."
        )
    spec = os.fspath(spec)
    if not spec.strip():
        raise ModelNotFoundError(
            "a model path is empty; pass a local directory (with config.json and weights) or a "
            "hub id like 'Qwen/Qwen2.5-0.5B-Instruct'."
        )
    if is_ollama_name(spec):
        return str(find_model(spec).path)
    path = Path(spec).expanduser()
    if looks_like_gguf(path):
        check_file(path)
        return str(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{spec!r} is a directory but has no config.json; point to the directory that "
                "holds the model's config.json and weights (what save_pretrained writes)."
            )
        patterns = ["*.safetensors"] if use_safetensors else ["*.safetensors", "*.bin"]
        if not any(any(path.glob(p)) for p in patterns):
            extra = " (only .bin found: pass use_safetensors=False to allow it)" * bool(
                list(path.glob("*.bin"))
            )
            raise MissingWeightsError(
                f"{spec!r} has a config.json but no model weights (*.safetensors){extra}; "
                "copy the weights next to config.json or save the model with save_pretrained."
            )
        return str(path)
    if path.exists():
        raise ModelNotFoundError(_not_a_directory(spec, path))
    if _looks_like_path(spec):
        raise ModelNotFoundError(
            f"model path {spec!r} does not exist{_near_miss(path)}; pass an existing local "
            "directory (with config.json and weights) or a hub id like "
            "'Qwen/Qwen2.5-0.5B-Instruct'."
        )
    return spec  # a hub id: from_pretrained resolves it (from the local cache when offline)


def _not_a_directory(spec: str, path: Path) -> str:
    """A model is a directory (config.json, weights, tokenizer files), never one file: name the
    directory to pass when the file sits in one."""
    found = f"model path {spec!r} is a file, not a model directory"
    if (path.parent / "config.json").is_file():
        return (
            f"{found}; a model is the directory that holds config.json, the weights and the "
            f"tokenizer files: pass {str(path.parent)!r}."
        )
    return (
        f"{found}; a model is a directory with config.json, the weights (*.safetensors) and the "
        "tokenizer files, as save_pretrained writes it, or one GGUF file (a single .bin or "
        ".safetensors file cannot be loaded on its own): pass that directory, a .gguf file, or "
        "a hub id like 'Qwen/Qwen2.5-0.5B-Instruct'."
    )


def _near_miss(path: Path) -> str:
    """' (did you mean ...?)' when a sibling directory is spelled almost like the path."""
    try:
        siblings = [p.name for p in path.parent.iterdir() if p.is_dir()]
    except OSError:
        return ""
    close = get_close_matches(path.name, siblings, n=1)
    return f" (did you mean {str(path.parent / close[0])!r}?)" if close else ""


# Encoder families that transformers can wrap in a causal head only when configured as decoders.
_ENCODERS = {"bert", "roberta", "xlm-roberta", "electra", "camembert", "ernie", "megatron-bert"}


def _is_causal(config, causal_types) -> bool:
    if config.model_type not in causal_types:
        return False
    architectures = getattr(config, "architectures", None) or []
    if architectures:
        return any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures)
    return config.model_type not in _ENCODERS or bool(getattr(config, "is_decoder", False))


def load_config(source: str):
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ModelNotFoundError(
            f"could not load a model config for {source!r} ({error}). For a hub id, check the "
            "spelling and that it is in the local cache when offline (HF_HUB_OFFLINE=1); or "
            "pass a local directory."
        ) from error
    check_causal(config, source)
    return config


def check_causal(config, source: str) -> None:
    """Refuse a model that does not generate text token by token (an encoder, a seq2seq)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not _is_causal(config, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        raise NotCausalLMError(
            f"{source!r} is a {config.model_type!r} model, which is not a causal (decoder-only) "
            "language model; ensembling needs models that generate text token by token, e.g. "
            "Llama, Qwen2, GPT-2, Mistral or Gemma checkpoints."
        )


def load_model(
    source: str,
    device: torch.device,
    dtype: torch.dtype,
    use_safetensors: bool = True,
    attn_implementation: str | None = None,
):
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": dtype, "trust_remote_code": False, "use_safetensors": use_safetensors}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except (SafetensorError, pickle.UnpicklingError, EOFError) as error:
        raise _unreadable_weights(source, error) from error
    except RuntimeError as error:
        if "PytorchStreamReader" not in str(error):  # torch.load on a damaged zip checkpoint
            raise
        raise _unreadable_weights(source, error) from error
    except OSError as error:
        raise MissingWeightsError(
            f"could not load weights for {source!r} ({error}); check the weight files, or pass "
            "use_safetensors=False for a checkpoint that only has .bin files."
        ) from error
    except ValueError as error:
        if attn_implementation and "attn_implementation" in str(error):
            raise InvalidConfigError(
                f"attn_implementation={attn_implementation!r} is not available for {source!r} "
                f"({error}); use 'sdpa' or 'eager', or None for the model's default."
            ) from error
        raise
    return model.to(device).eval()


def weights_elements(source: str) -> int:
    """Weights a checked model source holds, read from file headers (0 where they cannot be
    read before loading: a hub id, pickled weights)."""
    return (
        check_file(source).elements
        if looks_like_gguf(Path(source))
        else _safetensors_elements(source)
    )


def _safetensors_elements(source: str) -> int:
    """Weights in a local directory's safetensors files, from their headers (0 for anything
    else: a hub id, pickled weights, a damaged file, which the load names)."""
    folder = Path(source)
    if not folder.is_dir():
        return 0
    total = 0
    try:
        files = _safetensors_files(folder)
        for file in files:
            with safe_open(str(file), framework="pt") as weights:
                for key in weights.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    total += math.prod(weights.get_slice(key).get_shape())
    except (SafetensorError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0
    return total


def _safetensors_files(folder: Path) -> list[Path]:
    """The files transformers loads: those its index names, or `model.safetensors` (a folder
    may also hold other copies of the weights, Mistral's `consolidated.safetensors` say)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = json.loads(index.read_text())["weight_map"].values()
        return sorted({folder / name for name in shards})
    whole = folder / "model.safetensors"
    return [whole] if whole.is_file() else sorted(folder.glob("*.safetensors"))


def _unreadable_weights(source: str, error: BaseException) -> MissingWeightsError:
    """A weights file that is damaged, or a pickle that holds more than tensors, named."""
    folder = Path(source)
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    damaged = [f for f in files if f.suffix == ".safetensors" and not _readable_safetensors(f)]
    named = ", ".join(repr(str(f)) for f in (damaged or files)) or repr(source)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reason = lines[0][:200] if lines else type(error).__name__
    if isinstance(error, pickle.UnpicklingError):  # torch's weights-only unpickler refused it
        boiler = ("Weights only load failed", "Please file", "Check the documentation")
        reason = next((line for line in lines if not line.startswith(boiler)), reason)
        return MissingWeightsError(
            f"the weights in {named} could not be loaded as plain tensors ({reason}): the file is "
            "damaged, or it is a pickle holding Python objects, which is refused (unpickling "
            "them can run code). Save the model with save_pretrained (safetensors), from a "
            "source you trust."
        )
    return MissingWeightsError(
        f"the weights file {named} is damaged ({type(error).__name__}: {reason}); download or "
        "copy it again, or save the model with save_pretrained."
    )


def _readable_safetensors(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="pt"):  # reads and checks the header only
            return True
    except (SafetensorError, OSError):
        return False


def load_gguf(
    path: str,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str | None = None,
):
    """(model, tokenizer) from one GGUF file: the weights dequantized to `dtype` on `device`,
    the tokenizer and its chat template from the file's metadata. The file is checked first."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

    header = check_file(path)
    folder, name = str(header.path.parent), str(header.path)
    with shared_reader():
        with translated(header):
            config = AutoConfig.from_pretrained(folder, gguf_file=name)
        check_causal(config, name)
        # Dequantized on purpose: the engine runs plain modules. Said explicitly, transformers
        # also does not warn that a dtype other than float32 slows packed weights (none here).
        unpacked = GgufConfig(gguf_file=name, dequantize=True)
        kwargs = {"dtype": dtype, "config": config, "quantization_config": unpacked}
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        with translated(header, attn_implementation):
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, **kwargs)
        with translated(header):
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(
            f"transformers built no fast tokenizer from the GGUF file {name!r}; ensembling "
            "needs one. Load the model's Hugging Face directory (with tokenizer.json) instead."
        )
    return model.to(device).eval(), tokenizer


def _raw_tokenizer_file(source: str) -> str | None:
    local = Path(source) / "tokenizer.json"
    if local.is_file():
        return str(local)
    try:
        from transformers.utils.hub import cached_file

        return cached_file(
            source,
            "tokenizer.json",
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
    except OSError:
        return None


def load_tokenizer(source: str):
    """AutoTokenizer, verified against the raw tokenizer.json (falls back to the plain fast
    tokenizer when a family-specific class re-wrapped the file and changed the ids)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ModelNotFoundError(f"could not load a tokenizer for {source!r} ({error}).") from error
    raw_path = _raw_tokenizer_file(source)
    if raw_path is None:
        if not getattr(tokenizer, "is_fast", False):
            raise TokenizerMismatchError(
                f"{source!r} has only a slow tokenizer; ensembling needs a fast tokenizer "
                "(tokenizer.json). Convert it once with AutoTokenizer(...).save_pretrained()."
            )
        return tokenizer
    expected = Tokenizer.from_file(raw_path).encode(TOKENIZER_PROBE, add_special_tokens=False).ids

    def matches(tok) -> bool:
        return tok(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"] == expected

    if matches(tokenizer):
        return tokenizer
    fallback = PreTrainedTokenizerFast.from_pretrained(source)
    if matches(fallback):
        return fallback
    raise TokenizerMismatchError(
        f"the tokenizer loaded for {source!r} does not reproduce its own tokenizer.json; "
        "re-save the tokenizer with save_pretrained from the library version that made it."
    )


def source_files(source: str) -> tuple[tuple[str, int, int], ...] | None:
    """The files a member was loaded from, each as (resolved path, size, modification time in
    ns): a GGUF file, or every file at the top of a model directory (config, weights,
    tokenizer; for a hub id, its snapshot in the hub cache, each file resolved to its blob,
    whose name is its content's hash). What a measurement made over the member may be kept
    under; None where no file is found."""
    path = Path(source).expanduser()
    if not path.exists():
        path = _hub_snapshot(source)
    if path is not None and path.is_file():
        files = [path]
    elif path is not None and path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file())
    else:
        return None
    stats = [(str(p.resolve()), p.stat()) for p in files]
    return tuple((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats)


def _hub_snapshot(repo_id: str) -> Path | None:
    """The hub cache's folder of the revision `from_pretrained(repo_id)` loaded, if any."""
    from transformers.utils import cached_file

    try:
        found = cached_file(
            repo_id,
            "config.json",
            local_files_only=True,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
    except (OSError, ValueError):  # not a repo id the hub cache can name
        return None
    return Path(found).parent if found else None
