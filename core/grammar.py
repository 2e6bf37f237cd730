"""Grammar-constrained decoding over the shared response text: tool calls and JSON answers.

The ensemble's one shared state is the committed response TEXT, so the language is defined over
text (`build_constraint`), and each member gets a matcher compiled for its OWN tokenizer
(`Matcher`), kept in step with its own ids the way its KV cache is: roll back to the common
prefix, consume what is new. Drafts, retractions and crops therefore cannot desynchronise it,
and any tokenization of valid text is accepted (masks are exact at the byte level: the grammar
runs with llguidance's `no_forcing`; without it llguidance allows only its own split of forced
text, which rejects the canonical ids of whole texts). A SentencePiece member whose first token
carries a dummy-prefix space (Llama 2, Phi-3) gets the grammar behind an optional leading space,
the one byte its first token spells that the text does not.

How the engine calls it (a request with tools or a response_format)::

    prepare(member.vocab, member.stop_ids)   # optional, at load: the ~1 s tokenizer build

    constraint = build_constraint(tools, tool_choice, parallel_tool_calls, response_format)
    # None: nothing to constrain. Compiled grammars are cached per (constraint.key, vocab).
    matcher = Matcher(constraint, member.vocab, member.stop_ids)  # one per member and request
    matcher.follow(member.ids)         # after every sync / append / crop: cheap when little moved
    row = constrain(logprobs, matcher.allowed())   # masked, renormalised next-token log-probs
    text = matcher.forced()            # text the grammar forces next: commit it, no forward pass
    n = matcher.valid_prefix(draft_ids)            # how much of a (remote) draft is valid
    matcher.accepting()                # may the response end here?

`follow` raises `GrammarViolation` (with the index of the first rejected id) when the ids spell
text outside the language; the engine decides what to do (cut the draft there, say). A call
interrupted by an exception or KeyboardInterrupt leaves the matcher flagged, and the next call
rebuilds its state from the ids it had followed.

The language (tools and tool_choice as `core.tools` normalises them):
- tool calls are written exactly as `core.tool_calls.format_tool_calls` writes them, each call's
  arguments following its tool's parameters schema;
- "required": one call (`parallel_tool_calls=False`) or one or more; a tool name: calls of that
  tool only; "auto": free text that never contains `<tool_call>`, then optionally calls, and
  nothing after the calls; "auto" with a response_format (LangChain's `create_agent` sends both):
  either the JSON answer or calls;
- a response_format alone (or with tool_choice "none"): exactly one JSON value of the schema
  (with "required" or a tool name, the answer is calls and the response_format is not used);
- tools with tool_choice "none" and no response_format: free text that never contains
  `<tool_call>` (a model that saw tools in earlier turns cannot call one).

JSON is written as `json.dumps(value, ensure_ascii=False)` writes it (", " and ": ", no other
whitespace), so a small model cannot loop on whitespace and forced text is predictable. Object
properties come in the schema's order (llguidance's rule, as in OpenAI's strict mode), and an
object schema without "additionalProperties" accepts no other keys (OpenAI's strict mode too):
a tool without parameters must be called with exactly `{}`. Objects assembled with allOf, anyOf,
oneOf or $ref at the same level keep JSON Schema's open default, since closing each part would
forbid the other parts' keys. Two departures from `json.dumps`, both llguidance's: a number with
minimum/maximum bounds is written without an exponent (0.00001, not 1e-05), and the DEL
character (U+007F) inside a string must be escaped as \\u007f.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

from .errors import EnsembleError, InvalidConfigError
from .json_schema import GRAMMAR_OPTIONS, check_grammar, explain, json_rule
from .kv import common_prefix
from .tool_calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_SEPARATOR
from .tools import ToolSpec
from .vocab import Vocab

_START = "start: response"
_START_AFTER_DUMMY_SPACE = 'start: " "? response'
_COMPILED_PER_VOCAB = 64  # compiled grammars kept per member tokenizer (least recently used go)


class GrammarViolation(EnsembleError):
    """Ids that spell text the grammar rejects; `index` is the position of the first one."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index


class ConstraintError(EnsembleError):
    """Constrained decoding cannot continue: no token a member can produce is allowed."""


# --------------------------------------------------------------------------------------------
# The language over the shared text.


@dataclass(frozen=True)
class Constraint:
    """One request's language over the response text: an llguidance Lark grammar, the key that
    identifies it in the compiled-grammar caches, and for error messages what it is made of
    (`what`: "the tools", "response_format", ...) and its largest tool (`largest`)."""

    key: str
    grammar: str
    what: str = "the constraint"
    largest: str | None = None


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a Lark string literal (JSON escapes are Lark escapes)


def build_constraint(
    tools: tuple[ToolSpec, ...],
    tool_choice: str,
    parallel_tool_calls: bool,
    response_format: dict | None,
) -> Constraint | None:
    """The language of a request's response (see the module docstring), or None when there is
    nothing to constrain. `tools`, `tool_choice` and `response_format` as `core.tools`
    normalises them."""
    calls = bool(tools) and tool_choice != "none"
    if not calls and response_format is None and not tools:
        return None
    rules = [GRAMMAR_OPTIONS, _START]
    if calls:
        chosen = (
            tools
            if tool_choice in ("auto", "required")
            else [t for t in tools if t.name == tool_choice]
        )
        if not chosen:
            raise InvalidConfigError(
                f"tool_choice names {tool_choice!r}, which is not among the tools; normalise it "
                "with core.tools.normalize_tool_choice."
            )
        open_, close, sep = map(
            _lark_string, (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_SEPARATOR)
        )
        more = f" ({sep} call)*" if parallel_tool_calls else ""
        rules += [
            f"calls: call{more}",
            f"call: {open_} body {close}",
            "body: " + " | ".join(f"call_{i}" for i in range(len(chosen))),
        ]
        for i, tool in enumerate(chosen):
            head = _lark_string(f'{{"name": "{tool.name}", "arguments": ')
            rules += [f'call_{i}: {head} args_{i} "}}"', f"args_{i}: {json_rule(tool.parameters)}"]
    if response_format is not None:
        rules.append(f"answer: {json_rule(response_format)}")
    free = r"/(?s:.*)/ & ~/(?s:.*)" + re.escape(TOOL_CALL_OPEN.strip()) + r"(?s:.*)/"
    if not calls and response_format is None:  # tools, but "none": text that calls nothing
        rules += ["response: FREE", f"FREE: {free}"]
    elif not calls:
        rules.append("response: answer")
    elif tool_choice != "auto":
        rules.append("response: calls")
    elif response_format is not None:
        rules.append("response: answer | calls")
    else:
        rules += [
            f"response: FREE | FREE_OPEN body {_lark_string(TOOL_CALL_CLOSE)}{more}",
            f"FREE: {free}",
            f"FREE_OPEN: FREE {_lark_string(TOOL_CALL_OPEN)}",
        ]
    grammar = "\n".join(rules) + "\n"
    what = (
        "the tools and response_format"
        if calls and response_format
        else ("the tools" if calls else "response_format")
    )
    largest = _largest_tool(chosen) if calls else None
    check_grammar(grammar, what, largest)
    return Constraint(hashlib.sha256(grammar.encode()).hexdigest(), grammar, what, largest)


def _largest_tool(tools: Sequence[ToolSpec]) -> str:
    """The tool with the largest parameters schema, named for an error about size."""
    sizes = [(len(json.dumps(t.parameters, ensure_ascii=False)), t.name) for t in tools]
    size, name = max(sizes)
    return f"tool {name!r} ({size:,} characters of parameters)"


# --------------------------------------------------------------------------------------------
# Per member tokenizer: llguidance's view of a Vocab, and compiled grammars; shared, cached.


class _VocabTokenizer:
    """What `llguidance.TokenizerWrapper` reads: each id's exact bytes as the engine sees them
    (a non-special added token such as Qwen's `<tool_call>` is its text), the control tokens
    (special and stop ids, which spell nothing), and an exact encoder."""

    def __init__(self, vocab: Vocab, stop_ids: frozenset[int]) -> None:
        control = sorted(set(vocab.special_ids) | {i for i in stop_ids if i < vocab.size})
        known = [i for i in control if i < len(vocab.tokenizer)]
        names = dict(zip(known, vocab.tokenizer.convert_ids_to_tokens(known), strict=True))
        self.tokens = list(vocab.token_bytes)
        for i in control:
            self.tokens[i] = (names.get(i) or f"<[{i}]>").encode("utf-8")
        self.special_token_ids = control
        self.eos_token_id = min(stop_ids)  # `Matcher` checks there is one
        self.bos_token_id = None
        # weak: llguidance keeps this object, and the per-Vocab cache must not keep its key alive
        self._vocab = weakref.ref(vocab)
        self._byte_ids: dict[int, int] = {}
        for i, data in enumerate(vocab.token_bytes):
            if len(data) == 1 and i not in stop_ids:
                self._byte_ids.setdefault(data[0], i)

    def __call__(self, data: bytes) -> list[int]:
        """Ids that spell `data` (llguidance's own bookkeeping; masks do not depend on it under
        `no_forcing`): canonical ids for the whole characters, without the dummy-prefix space a
        SentencePiece tokenizer adds in front, then one id per remaining byte (a byte no single
        token spells, in a vocabulary without byte tokens, is left out)."""
        vocab = self._vocab()
        if vocab is None:  # the member is gone; nothing will ask for masks any more
            return []
        head = data[: len(data) - len(_incomplete_tail(data))]
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            text, head = "", b""
        ids = vocab.encode(text)
        if ids and vocab.decode_bytes(ids, strip=False) != head:
            first = vocab.token_bytes[ids[0]][1:]  # without the dummy-prefix space
            ids = self._spell_bytes(vocab, first) + ids[1:]
        return ids + self._spell_bytes(vocab, data[len(head) :])

    def _spell_bytes(self, vocab: Vocab, data: bytes) -> list[int]:
        whole = vocab.string_to_id.get(data.decode("utf-8", errors="replace"))
        if whole is not None and vocab.token_bytes[whole] == data:
            return [whole]
        return [self._byte_ids[b] for b in data if b in self._byte_ids]


class _Compiled:
    """One member tokenizer's llguidance tokenizer and its compiled grammars (templates that
    request matchers are deep-copied from; a template itself never consumes a token)."""

    def __init__(self, vocab: Vocab, stop_ids: frozenset[int]) -> None:
        wrapper = TokenizerWrapper(_VocabTokenizer(vocab, stop_ids))
        self.tokenizer = LLTokenizer(wrapper, n_vocab=vocab.size, eos_token=sorted(stop_ids))
        # the member's stop ids are the grammar's end: allowed only where the language may end
        self.dummy_prefix = vocab.dummy_prefix
        self._templates: OrderedDict[str, LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def template(self, constraint: Constraint) -> LLMatcher:
        with self._lock:
            found = self._templates.get(constraint.key)
            if found is not None:
                self._templates.move_to_end(constraint.key)
                return found
        grammar = constraint.grammar
        if self.dummy_prefix:  # the member's first token carries a space the text does not
            grammar = grammar.replace(_START, _START_AFTER_DUMMY_SPACE, 1)
        matcher = LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            message = matcher.get_error()
            raise InvalidConfigError(explain(constraint.what, message, constraint.largest))
        probe = matcher.deep_copy()  # the first mask: a language with no text at all fails here
        probe.compute_bitmask()
        if probe.is_error():
            raise InvalidConfigError(
                f"{constraint.what} admits no text at all (the grammar compiler says: "
                f"{probe.get_error().strip().splitlines()[0]}); a schema whose $ref only refers "
                "to itself has no valid value: fix the schema."
            )
        with self._lock:
            self._templates[constraint.key] = matcher
            while len(self._templates) > _COMPILED_PER_VOCAB:
                self._templates.popitem(last=False)
        return matcher


_PER_VOCAB: weakref.WeakKeyDictionary[Vocab, dict[frozenset[int], _Compiled]] = (
    weakref.WeakKeyDictionary()
)
_PER_VOCAB_LOCK = threading.Lock()


def prepare(vocab: Vocab, stop_ids: Sequence[int]) -> None:
    """Build a member's grammar tokenizer now (about 1 s for a 150k vocabulary, then cached for
    as long as the Vocab lives), e.g. when the member loads, rather than in its first
    constrained request."""
    _compiled(vocab, _stops_in(vocab, stop_ids))


def _stops_in(vocab: Vocab, stop_ids: Sequence[int]) -> frozenset[int]:
    stops = frozenset(i for i in stop_ids if 0 <= i < vocab.size)
    if not stops:
        raise InvalidConfigError(
            "a constrained member needs stop ids (its end-of-turn tokens) inside its "
            f"vocabulary of {vocab.size}; got {sorted(stop_ids)!r}."
        )
    return stops


def _compiled(vocab: Vocab, stop_ids: frozenset[int]) -> _Compiled:
    with _PER_VOCAB_LOCK:
        per_stops = _PER_VOCAB.setdefault(vocab, {})
        found = per_stops.get(stop_ids)
    if found is None:
        found = _Compiled(vocab, stop_ids)  # ~1 s for a 150k vocabulary: outside the lock
        with _PER_VOCAB_LOCK:
            found = per_stops.setdefault(stop_ids, found)
    return found


# --------------------------------------------------------------------------------------------
# The request-scoped matcher.


def _incomplete_tail(data: bytes) -> bytes:
    """The trailing bytes of an unfinished UTF-8 character (empty when the text ends whole)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return b""
        if byte >= 0xC0:  # a leading byte: is its character complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data[-back:] if back < need else b""
    return b""


def _whole_chars(data: bytes) -> str:
    return data[: len(data) - len(_incomplete_tail(data))].decode("utf-8", errors="ignore")


class Matcher:
    """One member's grammar state for one request: "after exactly these response ids".

    Cheap to create once the member's tokenizer and the grammar are compiled (both cached);
    not for sharing between threads (one per member and request, like its KV cache)."""

    def __init__(self, constraint: Constraint, vocab: Vocab, stop_ids: Sequence[int]) -> None:
        self.constraint = constraint
        self.vocab = vocab
        self.stop_ids = _stops_in(vocab, stop_ids)
        self._compiled = _compiled(vocab, self.stop_ids)
        self._template = self._compiled.template(constraint)
        self._native = self._template.deep_copy()
        self._followed: tuple[int, ...] = ()
        self._mask: torch.Tensor | None = None
        self._dirty = False
        space = vocab.string_to_id.get(" ") if vocab.dummy_prefix else None
        self._dummy_space = space  # stands for the dummy prefix when asking what is forced first

    @property
    def followed(self) -> tuple[int, ...]:
        return self._followed

    # --- keeping in step ----------------------------------------------------------------------

    def _restore(self) -> None:
        """After an interrupted call: a fresh state, replaying the ids known to be accepted."""
        if not self._dirty:
            return
        self._native = self._template.deep_copy()
        self._mask = None
        if self._followed:
            done = self._native.try_consume_tokens(list(self._followed))
            self._followed = self._followed[:done]
        self._dirty = False

    def _native_error(self) -> None:
        if self._native.is_error():
            message = self._native.get_error().strip().splitlines()[0]
            self._dirty = True  # rebuilt on the next call
            raise ConstraintError(
                f"{self.constraint.what} cannot be followed: the grammar matcher failed "
                f"({message}); a schema that admits no value (a $ref that only refers to "
                "itself, say) has none to write: fix the schema."
            )

    def follow(self, ids: Sequence[int]) -> None:
        """Make the state "after exactly `ids`": roll back to the common prefix with the ids
        followed so far, consume the rest. Raises `GrammarViolation` at the first rejected id
        (the state is then after the ids before it)."""
        self._restore()
        ids = tuple(ids)
        old = self._followed
        if ids == old:
            return
        n = len(old)
        keep = n if len(ids) >= n and ids[:n] == old else common_prefix(old, ids)
        self._dirty = True
        if keep < n and not self._native.rollback(n - keep):
            raise ConstraintError(
                f"the grammar matcher could not roll back: {self._native.get_error()}"
            )
        self._followed, self._mask = old[:keep], None
        new = self._in_vocab(ids[keep:])  # an id outside the vocabulary is rejected like text
        done = self._native.try_consume_tokens(new) if new else 0
        self._followed = ids[: keep + done]
        self._native_error()
        self._dirty = False
        if keep + done < len(ids):
            index = keep + done
            spelled = (
                repr(self.vocab.token_bytes[ids[index]])
                if 0 <= ids[index] < self.vocab.size
                else "outside the vocabulary"
            )
            before = _whole_chars(self.vocab.decode_bytes(ids[:index]))[-60:]
            raise GrammarViolation(
                f"token {ids[index]} ({spelled}) at position {index} spells text the grammar "
                f"does not allow after {before!r}",
                index,
            )

    def _in_vocab(self, ids: Sequence[int]) -> list[int]:
        """The ids up to the first one outside the vocabulary."""
        size = self.vocab.size
        cut = next((j for j, i in enumerate(ids) if not 0 <= i < size), len(ids))
        return list(ids[:cut])

    # --- questions about the current state ----------------------------------------------------

    def allowed(self) -> torch.Tensor:
        """Which next ids keep the text valid: a bool tensor of `vocab.size` (stop ids only where
        the grammar may end). Shared between calls at the same state: do not modify it."""
        self._restore()
        if self._mask is None:
            self._dirty = True
            bits = self._native.compute_bitmask()
            self._native_error()
            unpacked = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), bitorder="little")
            self._mask = torch.from_numpy(unpacked[: self.vocab.size].view(np.bool_))
            self._dirty = False
        return self._mask

    def accepting(self) -> bool:
        """May the response end here?"""
        self._restore()
        return self._native.is_accepting()

    def forced(self) -> str:
        """The text the grammar forces next (whole characters only; "" when there is a choice),
        which the engine can commit without asking any model."""
        self._restore()
        self._dirty = True
        if not self._followed and self._dummy_space is not None:
            probe = self._native.deep_copy()  # past the dummy-prefix space, which is not text
            forced = probe.compute_ff_bytes() if probe.consume_token(self._dummy_space) else b""
        else:
            forced = self._native.compute_ff_bytes()
        self._dirty = False
        pending = _incomplete_tail(self.vocab.decode_bytes(self._followed[-8:], strip=False))
        return _whole_chars(pending + forced)

    def valid_prefix(self, ids: Sequence[int]) -> int:
        """How many of `ids`, after the followed ones, the grammar accepts (the state does not
        move). A stop id counts only where the grammar may end, and nothing after it."""
        self._restore()
        ids = self._in_vocab(ids)
        stop_at = next((j for j, i in enumerate(ids) if i in self.stop_ids), len(ids))
        head = ids[:stop_at]
        self._dirty = True
        valid = self._native.validate_tokens(head) if head else 0
        if valid == len(head) and stop_at < len(ids):
            done = self._native.try_consume_tokens(head) if head else 0
            ends = done == len(head) and self._native.is_accepting()
            if done and not self._native.rollback(done):
                raise ConstraintError(
                    f"the grammar matcher could not roll back: {self._native.get_error()}"
                )
            valid += int(ends)
        self._dirty = False
        return valid


# --------------------------------------------------------------------------------------------


def constrain(logprobs: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Log-probs renormalised over the allowed ids (-inf elsewhere), for [vocab] or [n, vocab]
    rows. A row whose allowed ids all have zero probability is an error, not a silent NaN."""
    if allowed.shape[-1] < logprobs.shape[-1]:
        pad = torch.zeros(
            *allowed.shape[:-1], logprobs.shape[-1] - allowed.shape[-1], dtype=torch.bool
        )
        allowed = torch.cat([allowed, pad], dim=-1)
    allowed = allowed[..., : logprobs.shape[-1]].to(logprobs.device)
    masked = logprobs.masked_fill(~allowed, float("-inf"))
    dead = torch.isneginf(masked).all(dim=-1)
    if bool(dead.any()):
        rows = dead.reshape(-1).nonzero().flatten().tolist()
        raise ConstraintError(
            f"no allowed token has a non-zero probability (row {rows}); the member cannot "
            "continue the constrained text. A server that returns only top-k log-probs must "
            "return the full vocabulary (vLLM: --max-logprobs -1) for constrained decoding."
        )
    return torch.log_softmax(masked, dim=-1)
