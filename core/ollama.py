"""Models Ollama has pulled, named as Ollama names them: `ollama:llama3.2:1b`.

Ollama keeps each model as content-addressed blobs under its models directory
(`$OLLAMA_MODELS`, else `~/.ollama/models`, or `/usr/share/ollama/.ollama/models` for the Linux
service): a manifest per name and tag (`manifests/<host>/<namespace>/<model>/<tag>`, JSON) lists
the model's layers by digest, and each layer is a file `blobs/sha256-<hex>`. The weights layer
is a GGUF file, which loads like any other (`core.gguf`); the parameters layer holds the stop
strings the model's template ends a turn with, which become the member's `Local.stop`. The
template layer is a Go template, which transformers cannot render: the chat template comes from
the GGUF file's own metadata, as for any GGUF member. Nothing here talks to an Ollama server.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelLoadError, ModelNotFoundError
from .gguf import check_file

PREFIX = "ollama:"
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
MODEL_LAYER = "application/vnd.ollama.image.model"
PARAMS_LAYER = "application/vnd.ollama.image.params"
ADAPTER_LAYER = "application/vnd.ollama.image.adapter"
_SHOWN = 8  # pulled models an error lists


@dataclass(frozen=True)
class OllamaModel:
    """One pulled model: its name as the user wrote it (the member's name), its GGUF blob
    and its stop strings."""

    name: str
    path: Path
    stop: tuple[str, ...]


def is_ollama_name(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def member_name(spec: str) -> str:
    """The member's name for an Ollama model: its name as written, without the prefix."""
    return spec[len(PREFIX) :].strip()


def models_dirs() -> list[Path]:
    """Where Ollama keeps models: `$OLLAMA_MODELS` when set (Ollama reads only that one),
    else the user's and the Linux service's directories."""
    chosen = os.environ.get("OLLAMA_MODELS")
    if chosen:
        return [Path(chosen).expanduser()]
    return [Path("~/.ollama/models").expanduser(), Path("/usr/share/ollama/.ollama/models")]


def manifest_parts(name: str) -> tuple[str, str, str, str]:
    """`[host/][namespace/]model[:tag]` as Ollama reads it: host, namespace, model, tag."""
    path, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "")
    parts = path.split("/")
    if not path or len(parts) > 3 or not all(parts) or (":" in name and not tag):
        raise ModelNotFoundError(
            f"{PREFIX}{name!r} is not an Ollama model name; write it as `ollama list` shows "
            "it, e.g. 'ollama:llama3.2:1b', 'ollama:user/model:tag' or "
            "'ollama:hf.co/owner/repo:Q4_K_M'."
        )
    host, namespace = DEFAULT_HOST, DEFAULT_NAMESPACE
    if len(parts) == 3:
        host, namespace = parts[0], parts[1]
    elif len(parts) == 2:
        namespace = parts[0]
    return host, namespace, parts[-1], tag or DEFAULT_TAG


def find_model(spec: str) -> OllamaModel:
    """The pulled model `spec` ('ollama:NAME[:TAG]') names: its GGUF blob (its header
    checked, `core.gguf.check_file`) and stop strings."""
    name = member_name(spec)
    parts = manifest_parts(name)
    label = name if name.endswith(f":{parts[-1]}") else f"{name}:{parts[-1]}"  # with its tag
    searched = models_dirs()
    for root in searched:
        manifest = _find_path(root / "manifests", parts)
        if manifest is not None:
            return _read_manifest(spec, name, label, root, manifest)
    pulled = sorted({n for root in searched for n in _pulled(root)})
    listed = ", ".join(pulled[:_SHOWN]) + (", ..." if len(pulled) > _SHOWN else "")
    raise ModelNotFoundError(
        f"no Ollama model {label!r} in {' or '.join(str(r) for r in searched)}"
        f"{f' (pulled: {listed})' if pulled else ''}; run `ollama pull {label}`, or set "
        "OLLAMA_MODELS to the directory Ollama keeps its models in."
    )


def _find_path(base: Path, parts: tuple[str, ...]) -> Path | None:
    """base/parts..., each part matched exactly or else ignoring case (Ollama's names are
    case-insensitive), the last one a file."""
    path = base
    for part in parts:
        candidate = path / part
        if not candidate.exists():
            try:
                entries = os.listdir(path)
            except OSError:
                return None
            match = [e for e in entries if e.casefold() == part.casefold()]
            if not match:
                return None
            candidate = path / match[0]
        path = candidate
    return path if path.is_file() else None


def _read_manifest(spec: str, name: str, label: str, root: Path, manifest: Path) -> OllamaModel:
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8"))["layers"]
        kinds = {layer["mediaType"]: layer["digest"] for layer in layers}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(
            f"the Ollama manifest of {label!r} ({manifest}) could not be read ({error}); run "
            f"`ollama pull {label}` again."
        ) from None
    if ADAPTER_LAYER in kinds:
        raise ModelLoadError(
            f"Ollama model {label!r} applies a LoRA adapter to its weights, which this library "
            "does not apply; pass its base model, or a GGUF file with the adapter merged in."
        )
    if MODEL_LAYER not in kinds:
        raise ModelLoadError(
            f"Ollama model {label!r} holds no GGUF weights layer (its manifest {manifest} lists "
            f"{', '.join(sorted(kinds)) or 'no layers'}); pass the model's own files instead "
            f"of {spec!r}."
        )
    blob = _blob(root, kinds[MODEL_LAYER], label)
    check_file(blob)  # a damaged blob is named as a bad GGUF file, not as a stray file
    stop = ()
    if PARAMS_LAYER in kinds:
        stop = _stops(_blob(root, kinds[PARAMS_LAYER], label), label)
    return OllamaModel(name, blob, stop)


def _blob(root: Path, digest: str, label: str) -> Path:
    path = root / "blobs" / str(digest).replace(":", "-")
    if not path.is_file():
        raise ModelNotFoundError(
            f"Ollama model {label!r} lists a layer {digest} that is not in {root / 'blobs'} (a "
            f"pull that did not finish, or a blob removed); run `ollama pull {label}` again."
        )
    return path


def _stops(path: Path, label: str) -> tuple[str, ...]:
    """The `stop` parameters of the model's Modelfile (a JSON object in its params layer)."""
    try:
        stop = json.loads(path.read_text(encoding="utf-8")).get("stop", [])
    except (OSError, ValueError, AttributeError) as error:
        raise ModelLoadError(
            f"the parameters of Ollama model {label!r} ({path}) could not be read ({error}); "
            f"run `ollama pull {label}` again."
        ) from None
    stop = [stop] if isinstance(stop, str) else stop
    return tuple(s for s in stop if isinstance(s, str) and s)


def _pulled(root: Path) -> list[str]:
    """The names of the models under `root`, as `ollama list` shows them."""
    base = root / "manifests"
    names = []
    for path in base.glob("*/*/*/*") if base.is_dir() else ():
        if path.is_file():
            host, namespace, model, tag = path.relative_to(base).parts
            if host != DEFAULT_HOST:
                model = f"{host}/{namespace}/{model}"
            elif namespace != DEFAULT_NAMESPACE:
                model = f"{namespace}/{model}"
            names.append(f"{model}:{tag}")
    return names
