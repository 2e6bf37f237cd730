"""GGUF files: a model as one file, the way llama.cpp, Ollama and LM Studio keep it.

transformers loads such a file itself (`from_pretrained(folder, gguf_file=...)`): it dequantizes
the weights into an ordinary model and builds the tokenizer and the chat template from the
file's metadata. A bad file fails deep inside it (a struct error, a memory map past the end, a
`NotImplementedError` of the `gguf` package), so the header is read here first, cheaply (no
tensor data; the vocabulary arrays are skipped), and what is wrong with the file becomes a
project error that names it and the fix: not a GGUF file, truncated, a version, architecture or
quantization type transformers cannot read, a package missing. Errors transformers raises while
loading a file that passed are translated the same way (`translated`); `core.loading.load_gguf`
loads one.

Ollama keeps its models as GGUF files without the suffix (`~/.ollama/models/blobs/sha256-...`),
so a file is a GGUF file by its first four bytes, not by its name.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import math
import mmap
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import EnsembleError, InvalidConfigError, MissingWeightsError, ModelLoadError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # what transformers reads (v1 counted in 32 bits; nothing current writes it)
GGUF_EXTRA = "pip install 'llm-ensembling[gguf]'"
_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
          10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFHeader:
    """What the loader needs to know about a file before reading its tensors."""

    path: Path
    version: int
    architecture: str
    tensor_types: dict[str, int]  # tensor name -> ggml type id
    data_end: int  # bytes the file must hold for its last tensor to be whole (0: unknown yet)
    elements: int = 0  # numbers in all its tensors: what dequantizing them writes


def is_gguf(path: str | Path) -> bool:
    """A file that starts with the GGUF magic bytes (whatever its name)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == MAGIC
    except OSError:
        return False


def looks_like_gguf(path: Path) -> bool:
    """A file given as a GGUF member: named *.gguf, or starting with the magic bytes."""
    return path.is_file() and (path.suffix.lower() == ".gguf" or is_gguf(path))


def check_file(path: str | Path) -> GGUFHeader:
    """The file's header, with every problem the header shows refused: what `from_pretrained`
    checks before loading anything (adapters call it at construction)."""
    check_packages()
    header = read_header(Path(path))
    _check_types(header)
    size = header.path.stat().st_size
    if header.data_end > size:
        raise MissingWeightsError(
            f"the GGUF file {str(header.path)!r} is truncated: its tensors need "
            f"{header.data_end:,} bytes and the file has {size:,} (an interrupted download or "
            "copy); download or copy it again."
        )
    return header


def check_packages() -> None:
    """transformers reads GGUF through the `gguf` package and loads it with `accelerate`."""
    missing = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    if missing:
        raise ModelLoadError(
            f"loading a GGUF file needs the {' and '.join(missing)} package"
            f"{'s' * (len(missing) > 1)}, which {'are' if len(missing) > 1 else 'is'} not "
            f"installed: {GGUF_EXTRA}."
        )


def read_header(path: Path) -> GGUFHeader:
    """Magic, version, metadata (arrays skipped) and the tensor table of a GGUF file."""
    name = str(path)
    if path.stat().st_size < 24:  # magic, version and the two counts
        with open(path, "rb") as handle:
            start = handle.read(4)
        raise _not_gguf(name, start) if start != MAGIC else _truncated(name)
    try:
        with open(path, "rb") as handle, _mapped(handle) as blob:
            return _parse(blob, path)
    except (struct.error, IndexError, UnicodeDecodeError, OverflowError, MemoryError) as error:
        raise _truncated(name) from error


def _mapped(handle) -> mmap.mmap:
    return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)  # no tensor data is read


def _parse(blob, path: Path) -> GGUFHeader:
    name = str(path)
    if blob[:4] != MAGIC:
        raise _not_gguf(name, bytes(blob[:4]))
    (version,) = struct.unpack_from("<I", blob, 4)
    if version not in VERSIONS:
        swapped = struct.unpack(">I", struct.pack("<I", version))[0] in VERSIONS
        raise ModelLoadError(
            f"{name!r} is a GGUF file of version {version}"
            f"{' written big-endian' if swapped else ''}; transformers reads versions 2 and 3 "
            "(little-endian). Convert the model again with a current llama.cpp "
            "(convert_hf_to_gguf.py), or load its Hugging Face directory instead."
        )
    tensor_count, kv_count = struct.unpack_from("<QQ", blob, 8)
    pos, architecture, alignment = 24, None, 32
    for _ in range(kv_count):
        key, pos = _string(blob, pos)
        (kind,) = struct.unpack_from("<I", blob, pos)
        value, pos = _value(blob, pos + 4, kind)
        if key == "general.architecture":
            architecture = value
        elif key == "general.alignment" and isinstance(value, int) and value > 0:
            alignment = value
    if not isinstance(architecture, str):
        raise ModelLoadError(
            f"the GGUF file {name!r} names no architecture (general.architecture); it is no "
            "model file llama.cpp would load. Convert the model again, or load its directory."
        )
    tensors: dict[str, int] = {}
    extents = []  # (offset, elements, type) per tensor
    for _ in range(tensor_count):
        tensor, pos = _string(blob, pos)
        (dims,) = struct.unpack_from("<I", blob, pos)
        shape = struct.unpack_from(f"<{dims}Q", blob, pos + 4)
        kind, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * dims)
        pos += 4 + 8 * dims + 12
        tensors[tensor] = kind
        extents.append((offset, math.prod(shape), kind))
    if pos > len(blob):
        raise _truncated(name)
    data_start = -(-pos // alignment) * alignment
    elements = sum(e for _, e, _ in extents)
    end = data_start + _data_size(extents)
    return GGUFHeader(path, version, architecture, tensors, end, elements)


def _data_size(extents: list[tuple[int, int, int]]) -> int:
    """Where the last tensor ends in the data section (0 when a type's size is unknown: the
    type check names that problem)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    end = 0
    for offset, elements, kind in extents:
        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            return 0
        end = max(end, offset + elements // block * size)
    return end


def _string(blob, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", blob, pos)
    end = pos + 8 + length
    if end > len(blob):
        raise IndexError("string past the end of the file")
    return bytes(blob[pos + 8 : end]).decode("utf-8"), end


def _value(blob, pos: int, kind: int):
    """One metadata value and the offset past it; arrays are skipped (None)."""
    if kind in _FIXED:
        fmt = _FIXED[kind]
        return struct.unpack_from(fmt, blob, pos)[0], pos + struct.calcsize(fmt)
    if kind == _STRING:
        return _string(blob, pos)
    if kind == _ARRAY:
        element, count = struct.unpack_from("<IQ", blob, pos)
        pos += 12
        if element in _FIXED:
            return None, pos + count * struct.calcsize(_FIXED[element])
        if element != _STRING:
            raise struct.error(f"array of metadata type {element}")
        for _ in range(count):  # a vocabulary: only the lengths are read
            (length,) = struct.unpack_from("<Q", blob, pos)
            pos += 8 + length
        if pos > len(blob):
            raise IndexError("array past the end of the file")
        return None, pos
    raise struct.error(f"metadata type {kind}")


def _check_types(header: GGUFHeader) -> None:
    """Every tensor's quantization type is one the gguf package can dequantize (transformers
    dequantizes with it)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    readable: dict[int, bool] = {}
    for tensor, kind in header.tensor_types.items():
        if kind not in readable:
            try:
                qtype = GGMLQuantizationType(kind)
                _, size = GGML_QUANT_SIZES[qtype]
                dequantize(np.zeros(size, dtype=np.uint8), qtype)
                readable[kind] = True
            except (ValueError, KeyError, NotImplementedError):
                readable[kind] = False
        if not readable[kind]:
            try:
                stored = f"as {GGMLQuantizationType(kind).name}, which the gguf package cannot "
                stored += "dequantize"
            except ValueError:
                stored = f"as ggml type {kind}, which the installed gguf package does not know"
            raise ModelLoadError(
                f"the GGUF file {str(header.path)!r} stores tensor {tensor!r} {stored}, so "
                "transformers cannot load it. Upgrade gguf (pip install -U gguf), re-quantize "
                "the model with llama.cpp's llama-quantize to a common type (Q4_K_M, Q5_K_M, "
                "Q8_0), or load the model's Hugging Face directory."
            )


def _not_gguf(name: str, start: bytes) -> MissingWeightsError:
    return MissingWeightsError(
        f"{name!r} is not a GGUF file (it starts with {start!r}, not b'GGUF'): it is damaged, "
        "or another format under a .gguf name. Download or copy it again; a Hugging Face "
        "model is the directory that holds its config.json and weights."
    )


def _truncated(name: str) -> MissingWeightsError:
    return MissingWeightsError(
        f"the GGUF file {name!r} is truncated or damaged: its header ends before its metadata "
        "or tensor table does (an interrupted download or copy); download or copy it again."
    )


_READER_LOCK = threading.Lock()


@contextlib.contextmanager
def shared_reader() -> Iterator[None]:
    """transformers reads a GGUF file with a new `gguf.GGUFReader` for the config, the
    tokenizer and the weights, and one reader took ~16 s on a 262k-token vocabulary (Gemma's);
    mapping the weights' names, it builds gguf's `TensorNameMap` for the architecture once per
    submodule (397 times for SmolLM2, 11 s). While one member loads, those reads share one
    reader per file (a reader is only read from), which reads a plain array over the file's
    memory map, and its metadata arrays in bulk (`_plain_reader`: 1.2 s for Gemma's, 10.7 s with
    gguf's own reader), and one name map per architecture and depth
    (a map is only read from). The metadata, which the config and the tokenizer's class both
    parse into Python values (0.9 s for Gemma's vocabulary), is parsed once per file, each
    caller getting its own copy. Where transformers stops calling these, this changes
    nothing."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original_reader, original_names = gguf.GGUFReader, gguf.get_tensor_name_map
    plain = _plain_reader(original_reader)
    readers: dict[tuple, object] = {}
    name_maps: dict[tuple, object] = {}

    def shared(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = plain(path, *args, **kwargs)
        return readers[key]

    def name_map(arch, n_blocks):
        if (arch, n_blocks) not in name_maps:
            name_maps[arch, n_blocks] = original_names(arch, n_blocks)
        return name_maps[arch, n_blocks]

    original_checkpoint = gguf_utils.load_gguf_checkpoint
    metadata: dict[str, dict] = {}

    def checkpoint(path, return_tensors=False, *args, **kwargs):
        if return_tensors or args or kwargs:
            return original_checkpoint(path, return_tensors, *args, **kwargs)
        key = os.fspath(path)
        if key not in metadata:
            metadata[key] = original_checkpoint(path, return_tensors=False)
        return copy.deepcopy(metadata[key])

    with _READER_LOCK:
        gguf.GGUFReader, gguf.get_tensor_name_map = shared, name_map
        gguf_utils.load_gguf_checkpoint = checkpoint
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = original_reader, original_names
            gguf_utils.load_gguf_checkpoint = original_checkpoint


def _plain_reader(reader: type) -> type:
    """gguf's reader over a plain ndarray view of its memory map: it reads every metadata
    element by slicing its `data`, and slicing a `np.memmap` runs Python code (`__getitem__`,
    `__array_finalize__`) each time, most of the reader's time over a large vocabulary. The
    view maps the same file; the fields and tensors read are the same."""

    class PlainArrayReader(reader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value) -> None:
            self._plain = value.view(np.ndarray) if isinstance(value, np.memmap) else value

        def _get_field_parts(self, orig_offs: int, raw_type: int):
            """An array of numbers or strings as gguf's reader gives it (one part per element,
            the same values, types and data indices), without its recursive call per element:
            a vocabulary's three arrays of 262k elements took Gemma's reader ~3 s."""
            from gguf import GGUFValueType

            if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            alen = self._get(orig_offs + 4, np.uint64)
            count, item = int(alen[0]), GGUFValueType(raw_itype[0])
            nptype = self.gguf_scalar_to_np.get(item)
            offs = orig_offs + 12
            if count == 0 or (nptype is None and item != GGUFValueType.STRING):
                return super()._get_field_parts(orig_offs, raw_type)  # nested, or empty
            types = [GGUFValueType.ARRAY, item]
            if nptype is not None:
                values = self._get(offs, nptype, count)
                parts = [raw_itype, alen, *values.reshape(count, 1)]
                return 12 + int(values.nbytes), parts, list(range(2, 2 + count)), types
            parts, data = [raw_itype, alen], []
            for _ in range(count):
                length, text = self._get_str(offs)
                data.append(len(parts) + 1)
                parts += (length, text)
                offs += 8 + int(length[0])
            return offs - orig_offs, parts, data, types

    return PlainArrayReader


@contextlib.contextmanager
def translated(header: GGUFHeader, attn_implementation: str | None = None) -> Iterator[None]:
    """Errors transformers raises on a file that passed the header checks (an architecture or
    tokenizer it cannot convert, damaged tensor data), as project errors naming the file."""
    try:
        yield
    except EnsembleError:
        raise
    except Exception as error:
        raise _load_error(header, error, attn_implementation) from error


def _load_error(header: GGUFHeader, error: Exception, attn: str | None) -> EnsembleError:
    name, text = str(header.path), f"{type(error).__name__}: {error}"
    if attn and "attn_implementation" in str(error):
        return InvalidConfigError(
            f"attn_implementation={attn!r} is not available for {name!r} ({error}); use 'sdpa' "
            "or 'eager', or None for the model's default."
        )
    if isinstance(error, ImportError):
        return ModelLoadError(
            f"loading the GGUF file {name!r} needs a package that is missing ({text}): "
            f"{GGUF_EXTRA}."
        )
    if "architecture" in str(error) and "not supported" in str(error):
        return ModelLoadError(
            f"the GGUF file {name!r} holds a {header.architecture!r} model, an architecture "
            f"transformers cannot load from GGUF (it reads {_known()}). Load the model's Hugging "
            "Face directory instead."
        )
    return ModelLoadError(
        f"transformers could not load the GGUF file {name!r} ({text[:300]}); the file may be "
        "damaged (download or copy it again) or use a feature transformers cannot read from "
        "GGUF (load the model's Hugging Face directory instead)."
    )


def _known() -> str:
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:
        return "a fixed list of architectures"
    return ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
