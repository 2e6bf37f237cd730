"""Token ids as exact surface bytes, the same way for every tokenizer family.

The ensemble's shared state is text, so each member must be able to say exactly which bytes each
of its tokens spells: GPT-2 style byte-level tokens (`Ġ` for a space, `Ċ` for a newline),
SentencePiece tokens (`▁` for a space, `<0x0A>` byte fallback), plain tokens, and control tokens
that spell nothing. The table is derived from the tokenizer's own decoder description, never from
hard-coded ids, and the per-family quirk of a "dummy prefix" space is detected by probing.

Aligning several members on these strings (UniTE's and GaC's unions) is `core.alignment`.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import threading
from collections.abc import Iterable, Sequence
from functools import lru_cache

import torch

EOS = "<EOS>"  # the one candidate string that stands for "stop" in every member's vocabulary

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_CUT_PROBES = (
    "Tom has 7 apples. He buys 5 more.\nThen 7 + 5 = 12  and  12 - 3 = 9.\tThe answer is 9.",
    "Hello world, a test:  double  spaces,\n\nnew lines, caf\u00e9 \u00fcn\u00efc\u00f8de \u2603.",
    "x = [1, 2, 3]; print(x)  # done\n    indented line\r\nwindows\x0bv\x0cf end\n",
)


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable-unicode alphabet for the 256 bytes, inverted."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def _decoder_steps(tokenizer) -> list[dict]:
    """The decoder's steps as the tokenizer's JSON spells them. Read from the decoder's own
    state: serialising the whole tokenizer to find them took a second on Gemma's 262k-token
    vocabulary (the vocabulary and merges written and parsed back)."""
    decoder = tokenizer.backend_tokenizer.decoder
    if decoder is None:
        return []
    spec = json.loads(decoder.__getstate__())
    return spec["decoders"] if spec.get("type") == "Sequence" else [spec]


def _token_bytes(token: str, steps: list[dict], tokenizer) -> bytes:
    """Apply a tokenizer's decoder steps to ONE token, as if it stood in the middle of a text."""
    value: str | bytes = token
    for step in steps:
        kind = step.get("type")
        if isinstance(value, bytes):
            break
        if kind == "ByteLevel":
            table = _byte_level_decoder()
            if all(c in table for c in value):
                value = bytes(table[c] for c in value)
        elif kind == "ByteFallback":
            match = _BYTE_TOKEN.match(value)
            if match:
                value = bytes([int(match.group(1), 16)])
        elif kind == "Replace":
            pattern = step["pattern"]
            if "String" in pattern:
                value = value.replace(pattern["String"], step["content"])
            else:
                value = re.sub(pattern["Regex"], step["content"], value)
        elif kind == "Metaspace":
            value = value.replace(step.get("replacement", "\u2581"), " ")
        elif kind == "BPEDecoder":
            suffix = step.get("suffix", "</w>")
            if value.endswith(suffix):
                value = value[: -len(suffix)] + " "
        elif kind in ("Fuse", "Strip"):
            # Fuse joins tokens; a Strip after it only trims the start of a whole text (the dummy
            # prefix), which `Vocab.dummy_prefix` handles. Per token, both are no-ops.
            continue
        else:  # unknown decoder: trust the library on this one token
            return tokenizer.backend_tokenizer.decoder.decode([token]).encode("utf-8")
    return value if isinstance(value, bytes) else value.encode("utf-8")


_LOCKS_LOCK = threading.Lock()


def tokenizer_lock(tokenizer) -> threading.Lock:
    """The lock every call into `tokenizer` takes. A fast tokenizer is not safe to call from
    several threads at once: each call sets flags on the shared backend (`split_special_tokens`
    becomes its `encode_special_tokens`), so a prompt tokenized while another thread encodes
    response text with special tokens split comes out wrong. Concurrent requests share
    tokenizers, so every call goes through this one lock per tokenizer object."""
    with _LOCKS_LOCK:
        lock = tokenizer.__dict__.get("_ensemble_lock")
        if lock is None:
            lock = tokenizer.__dict__["_ensemble_lock"] = threading.Lock()
        return lock


def _utf8_or_none(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


_ASCII_SPACE = frozenset(b" \t\n\r\x0b\x0c")


def is_cut(data: bytes, i: int, starters: frozenset[int] = _ASCII_SPACE) -> bool:
    """A byte offset where canonical tokenization can restart: the start of a whitespace run.

    Every family we know pre-tokenizes so that no token crosses the start of a whitespace run
    that follows a non-space character. Which whitespace bytes may start a cut is probed per
    tokenizer (`Vocab.cut_starters`): a dummy-prefix tokenizer, say, allows a space but not a
    newline. The character before the cut must not be whitespace of any kind.
    """
    if i <= 0 or i >= len(data):
        return True
    if data[i] not in starters:
        return False
    j = i - 1
    while j > 0 and i - j < 4 and 0x80 <= data[j] < 0xC0:  # back to the previous char's start
        j -= 1
    previous = data[j:i].decode("utf-8", errors="replace")
    return not previous.isspace()


class Vocab:
    """One tokenizer, seen as token id -> exact bytes, plus canonical encoding of text."""

    def __init__(self, tokenizer, model_vocab_size: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.size = max(len(tokenizer), model_vocab_size or 0)
        steps = _decoder_steps(tokenizer)
        special = set(tokenizer.all_special_ids)
        special |= {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        self.special_ids: frozenset[int] = frozenset(special)
        id_to_token = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        # what `decode` writes for each control token ("<|im_end|>"): it spells nothing here
        self.special_text: dict[int, str] = {
            i: id_to_token[i] for i in sorted(special) if i < len(id_to_token) and id_to_token[i]
        }
        self.token_bytes: list[bytes] = [b""] * self.size
        self.strings: list[str | None] = [None] * self.size
        for i, token in enumerate(id_to_token):
            if token is None or i in special:
                continue
            data = _token_bytes(token, steps, tokenizer)
            self.token_bytes[i] = data
            self.strings[i] = _utf8_or_none(data)
        # A string spelled by several ids (a byte-fallback twin of a normal token, say) maps to
        # the id the tokenizer itself produces for it, when it produces one id; only those
        # strings are encoded (a string spelled once can only map to its one id).
        self.string_to_id: dict[str, int] = {}
        twins: set[str] = set()
        for i, s in enumerate(self.strings):
            if not s:
                continue
            if s in self.string_to_id:
                twins.add(s)
            else:
                self.string_to_id[s] = i
        if twins:
            spelled = sorted(twins)
            for s, ids in zip(spelled, self._raw_encode(spelled), strict=True):
                if len(ids) == 1 and self.strings[ids[0]] == s:
                    self.string_to_id[s] = ids[0]
        self.dummy_prefix = self.decode_bytes(self._raw_encode("a"), strip=False) == b" a"
        self.cut_starters = frozenset(
            b
            for b in _ASCII_SPACE
            if any(b in t.encode() for t in _CUT_PROBES)  # never seen, never trusted
            and all(self._cuts_reproduce(t, b) for t in _CUT_PROBES)
        )

    def _raw_encode(self, text):
        """Ids of a text (or of each text of a list), control-token look-alikes read as text:
        what `tokenizer(text, add_special_tokens=False, split_special_tokens=True)` gives, from
        the Rust tokenizer directly, 2-3 times faster (a Vocab encodes every token's spelling
        when it is built: 256k strings for Gemma)."""
        backend = self.tokenizer.backend_tokenizer
        with tokenizer_lock(self.tokenizer):
            before, backend.encode_special_tokens = backend.encode_special_tokens, True
            try:
                if isinstance(text, str):
                    return backend.encode(text, add_special_tokens=False).ids
                return [e.ids for e in backend.encode_batch(text, add_special_tokens=False)]
            finally:
                backend.encode_special_tokens = before

    def encode_prompt(self, prompt: str) -> list[int]:
        """Ids of a rendered prompt: its special tokens (the template's markers) stay tokens."""
        with tokenizer_lock(self.tokenizer):
            return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def encode(self, text: str) -> list[int]:
        """Canonical ids of a response text (control-token look-alikes stay plain text)."""
        return self._raw_encode(text) if text else []

    def decode_bytes(self, ids: Sequence[int], strip: bool = True) -> bytes:
        data = b"".join(self.token_bytes[i] for i in ids)
        if strip and self.dummy_prefix and data.startswith(b" "):
            data = data[1:]
        return data

    def _cuts_reproduce(self, text: str, starter: int) -> bool:
        """Does re-tokenizing from every cut that starts with byte `starter` give the same ids?"""
        whole, data = self.encode(text), text.encode("utf-8")
        for i in range(1, len(data)):
            if data[i] == starter and is_cut(data, i):
                head, tail = data[:i].decode("utf-8"), data[i:].decode("utf-8")
                if self.encode(head) + self.encode(tail) != whole:
                    return False
        return True


def stop_logprob(logprobs: torch.Tensor, stop_ids: Iterable[int]) -> torch.Tensor:
    """log P(the turn ends here): the total probability of a member's stop ids, along the last
    dimension (any of its end-of-turn ids ends the turn, so their mass is one event); -inf where
    none of them is in the row. The one place the core computes a stop's probability."""
    ids = stop_index(stop_ids, logprobs.shape[-1], logprobs.device)
    if not len(ids):
        return torch.full(logprobs.shape[:-1], -math.inf, device=logprobs.device)
    return torch.logsumexp(logprobs[..., ids], dim=-1)


def stop_index(stop_ids: Iterable[int], size: int, device: torch.device | str = "cpu"):
    """The stop ids below `size`, in the order the ids come, as an index tensor (cached per
    frozenset of ids: a model can have thousands of control tokens, each of them a stop)."""
    if isinstance(stop_ids, frozenset):
        return _stop_index(stop_ids, size, str(device))
    return _stop_index.__wrapped__(frozenset(stop_ids), size, str(device))


@lru_cache(maxsize=64)
def _stop_index(stop_ids: frozenset[int], size: int, device: str) -> torch.Tensor:
    return torch.tensor([i for i in stop_ids if i < size], dtype=torch.long, device=device)


def _successor(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string that starts with `prefix`."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class ByteIndex:
    """A vocabulary sorted by token bytes: the tokens that start with a byte string are one
    contiguous range (two bisections), the tokens that equal one are a dict lookup. Stops and
    control tokens are left out (they spell nothing)."""

    def __init__(self, vocab: Vocab, stop_ids: Iterable[int]) -> None:
        stops = frozenset(stop_ids)
        pairs = sorted(
            (data, i)
            for i, data in enumerate(vocab.token_bytes)
            if data and i not in stops and i not in vocab.special_ids
        )
        self.keys = [data for data, _ in pairs]
        self.ids = torch.tensor([i for _, i in pairs], dtype=torch.long)
        self.exact: dict[bytes, list[int]] = {}
        for data, i in pairs:
            self.exact.setdefault(data, []).append(i)
        self.spelled = torch.tensor([s is not None for s in vocab.strings], dtype=torch.bool)

    def span(self, prefix: bytes) -> tuple[int, int]:
        """The slice of `ids` whose bytes start with `prefix` (itself included)."""
        lo = bisect.bisect_left(self.keys, prefix)
        after = _successor(prefix)
        return lo, len(self.keys) if after is None else bisect.bisect_left(self.keys, after)

    def extending(self, prefix: bytes) -> torch.Tensor:
        lo, hi = self.span(prefix)
        return self.ids[lo:hi]

    def prefixes(self, s: bytes, proper: bool) -> list[tuple[int, list[int]]]:
        """(length, ids) for every token that spells s[:length] exactly."""
        top = len(s) - 1 if proper else len(s)
        return [(n, self.exact[s[:n]]) for n in range(1, top + 1) if s[:n] in self.exact]
