"""`Local(...)`: a member loaded in this process, with the options that belong to it alone.

A plain path or hub id is `Local(path)`. The spec exists for what one member needs that the
others do not: a chat template for a base model or a GGUF file that carries none, the stop
strings that template ends a turn with, and its own dtype, device and name. It is the in-process
twin of `Remote(...)`, and goes wherever a path goes (`Ensemble.from_pretrained`, both adapters'
`models`, `serve --model`, `ensemble.toml`), as itself or as a dict of its fields with a `path`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from .errors import InvalidConfigError
from .ollama import find_model, is_ollama_name, member_name
from .validate import check_strings

_JINJA_MARKS = ("{{", "{%")


@dataclass(frozen=True)
class Local:
    """A member loaded in this process.

    path: a model directory (config.json, weights, tokenizer files), a GGUF file (what llama.cpp,
        Ollama and LM Studio keep; loaded through transformers, dequantized, with the tokenizer
        and the chat template its metadata holds), a model Ollama has pulled, named as Ollama
        names it ('ollama:llama3.2:1b': its GGUF file, with the stop strings of its parameters
        unless `stop` is given; `core.ollama`), or a hub id.
    chat_template: the member's chat template, as Jinja text or the path of a file holding it;
        None keeps the model's own. A base model has none: give it one here to chat with it.
    stop: the strings the template ends a turn with, where the model's own end-of-turn token
        does not (Gemma's "<end_of_turn>" in a base model). Each ends the response the way a
        `GenerationConfig.stop` string does; one that is a single control token of this member's
        vocabulary also joins its stop ids, so the member itself stops on it.
    dtype, device: this member's; None takes `from_pretrained`'s (`device=`, `dtype=`).
    name: the member's name in events and stats (default: the directory's or file's name).
    """

    path: str
    chat_template: str | None = None
    stop: tuple[str, ...] = ()
    dtype: str | None = None
    device: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        path = os.fspath(self.path) if isinstance(self.path, os.PathLike) else self.path
        if not isinstance(path, str) or not path.strip():
            raise InvalidConfigError(
                f"Local path={self.path!r}: pass a model directory, a .gguf file or a hub id, "
                "e.g. Local('models/gemma-3-270m.gguf')."
            )
        put("path", path)
        put("chat_template", _checked_template(self.chat_template))
        put("stop", check_strings("Local stop", self.stop, example=["<end_of_turn>"]))
        for what in ("dtype", "device"):
            value = getattr(self, what)
            if isinstance(value, (torch.dtype, torch.device)):
                put(what, str(value).removeprefix("torch."))
            elif value is not None and (not isinstance(value, str) or not value):
                raise InvalidConfigError(
                    f"Local {what}={value!r}: pass a name like "
                    f"{'float32' if what == 'dtype' else 'cpu'!r}, or None for the ensemble's."
                )
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise InvalidConfigError(f"Local name={self.name!r}: pass a non-empty string or None.")

    @property
    def label(self) -> str:
        """The member's name before loading: `name`, else an Ollama model's name, else the
        directory or file name (a GGUF file without its suffix), else the hub id."""
        if self.name:
            return self.name
        if is_ollama_name(self.path):
            return member_name(self.path)
        path = Path(self.path)
        return (path.stem if path.suffix == ".gguf" else path.name) or self.path

    def resolved(self) -> Local:
        """This spec with an Ollama name replaced by the model's GGUF file: the member keeps
        the name as written and the stop strings of the model's parameters, unless the spec
        sets its own."""
        if not is_ollama_name(self.path):
            return self
        model = find_model(self.path)
        return replace(
            self, path=str(model.path), stop=self.stop or model.stop, name=self.name or model.name
        )

    def template_text(self) -> str | None:
        """The chat template to give the member (a file's content is read here)."""
        template = self.chat_template
        if template is None or any(mark in template for mark in _JINJA_MARKS):
            return template
        try:
            return Path(template).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidConfigError(
                f"Local chat_template={template!r} could not be read ({error}); pass the Jinja "
                "text itself or the path of a readable UTF-8 file."
            ) from None

    def public_fields(self) -> dict[str, Any]:
        """The fields that differ from their defaults, as plain values: what a dump, a config
        file or a log shows, and what `Local(**fields)` rebuilds."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "path" or value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def _checked_template(template: Any) -> str | None:
    """Jinja text as it is, a file path as a str (it must exist); anything else refused."""
    if template is None:
        return None
    if isinstance(template, os.PathLike):
        template = os.fspath(template)
    if not isinstance(template, str) or not template.strip():
        raise InvalidConfigError(
            f"Local chat_template={template!r}: pass the template's Jinja text or the path of a "
            "file holding it, or None to keep the model's own."
        )
    if any(mark in template for mark in _JINJA_MARKS):
        return template
    if not Path(template).expanduser().is_file():
        raise InvalidConfigError(
            f"Local chat_template={template!r} is neither Jinja text (it has no '{{{{' or "
            "'{%') nor an existing file; pass the template itself or the path of its file."
        )
    return template


def single_token_ids(tokenizer, texts) -> frozenset[int]:
    """The ids of those `texts` that are each one control token of the tokenizer (an added
    token, like Gemma's `<end_of_turn>`): a stop string spelled by one such token is also a
    stop id of the member."""
    added = {token.content: i for i, token in tokenizer.added_tokens_decoder.items()}
    return frozenset(added[t] for t in texts if t in added)


def written_stops(tokenizer, texts) -> tuple[str, ...]:
    """Those stop strings a member writes as text (a base model's "\nQuestion:"), not as one
    control token: its drafts end where it writes one, and ending a turn counts them."""
    added = {token.content for token in tokenizer.added_tokens_decoder.values()}
    return tuple(t for t in texts if t and t not in added)
