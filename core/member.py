"""A Member: one model's private view of the shared response text, and the only owner of its cache.

The committed response TEXT is the ensemble's one shared state. Each member keeps its own
tokenization of it (canonical for text that came from elsewhere; its own tokens for what it
drafted itself and was accepted) and a KV cache valid for a prefix of those ids. `sync(text)`
re-tokenizes from the last safe cut before the change, keeps the longest common prefix of ids,
and crops the cache there; logits are computed lazily, in one forward pass, only for the
boundaries a method asks for.

What is loaded once (weights, tokenizer, vocabulary tables) is shared; what a request changes
lives in a `SequenceState` (ids, bytes, the cache). `spawn()` gives a request its own view of a
member: the same model, a fresh state. Every operation is a transaction on that state: if it
raises (a fault inside a forward pass, an out-of-memory, a Ctrl-C), the state is put back as it
was before the call, so a failed operation never leaves ids and cache out of step.

Methods talk to the `Member` interface only (render, sync, logprobs, draft, score), never to a
model or a cache, so another backend (a model served over HTTP) can stand in for `HFMember`.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import threading
import time
from abc import ABC, abstractmethod
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .batching import Pass, batcher_for
from .chat import Message, prompt_ids
from .errors import ContextWindowError, EnsembleError, MemberError, RequestCancelled
from .grammar import Constraint, Matcher, constrain
from .sampling import Sampler
from .vocab import Vocab, is_cut, stop_logprob, tokenizer_lock

_MAX_CUT_SCAN = 64  # tokens to look back for a cut before re-tokenizing the whole response


class ContextOverflow(ContextWindowError):
    """The response reached a member's context window mid-request (ends it with "length")."""


@dataclass
class Draft:
    """Tokens a member appended to its own sequence, with the distribution each came from.

    `logprobs[j]` is the distribution that produced `ids[j]`; when `stopped`, one more row
    holds the distribution that chose the stop token."""

    ids: list[int]
    logprobs: torch.Tensor
    stopped: bool


def _common_prefix(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two id lists (or two byte strings)."""
    n = min(len(a), len(b))
    if isinstance(a, (bytes, bytearray)):
        x, y, width = a[:n], b[:n], 1
    elif n > 32:  # long id lists: compare machine words in C, not ints in Python
        x, y, width = array("q", a[:n]).tobytes(), array("q", b[:n]).tobytes(), 8
    else:
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i
    lo, hi = 0, n
    while lo < hi:  # the longest equal prefix, by bisection
        mid = (lo + hi + 1) // 2
        if x[: mid * width] == y[: mid * width]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class SequenceState:
    """One request's view of the shared text in one member: prompt ids + response ids, the
    response's bytes as this member spells them, where each response token ends, what the
    backend computed for a prefix of the ids (`cache`: the backend's own immutable value), and
    the request's grammar matcher for this member's tokenizer (`grammar`, None when the request
    is unconstrained). The matcher is, like the cache, a function of a prefix of the ids: it
    follows them when asked (`Matcher.follow`), so a rolled-back state needs nothing else."""

    seq: list[int] = field(default_factory=list)
    prompt_len: int = 0
    data: bytes = b""
    ends: list[int] = field(default_factory=list)
    cache: Any = None
    grammar: Matcher | None = None

    def copy(self) -> SequenceState:
        return replace(self, seq=list(self.seq), ends=list(self.ends))


class Member(ABC):
    """One model, seen by methods as: a tokenized view of the shared text + distributions."""

    name: str
    vocab: Vocab
    stop_ids: frozenset[int]
    context_window: int
    gives_logits = True  # `score(raw=True)` works (a server may give log-probs only)

    def __init__(self) -> None:
        self._state = SequenceState()
        self._depth = 0  # nested operations: only the outermost one is a transaction
        self._cancel: threading.Event | None = None
        self.calls = 0
        self.seconds = 0.0

    def spawn(self, cancel: threading.Event | None = None, reuse: bool = True) -> Member:
        """This member's view for one request: the same model, tokenizer and tables, its own
        sequence state and counters. `cancel`, once set, stops the request at its next forward
        pass (`RequestCancelled`); `reuse` lets it share computed prompt prefixes with other
        requests (where the backend keeps any)."""
        twin = copy.copy(self)
        twin._state, twin._depth, twin._cancel = SequenceState(), 0, cancel
        twin.calls, twin.seconds = 0, 0.0
        return twin

    # --- transactions ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, operation: str) -> Iterator[None]:
        """Put the state back if the operation fails, and name the member and the operation in
        the error (errors the library raises on purpose pass through as they are)."""
        if self._depth:
            yield
            return
        saved = self._state.copy()
        self._depth = 1
        try:
            yield
        except BaseException as error:
            self._state = saved
            if isinstance(error, MemberError):
                error.member = error.member or self.name
                error.operation = error.operation or operation
            if isinstance(error, EnsembleError) or not isinstance(error, Exception):
                raise
            raise MemberError(
                f"member {self.name!r} failed during {operation}: {type(error).__name__}: {error}",
                member=self.name,
                operation=operation,
            ) from error
        finally:
            self._depth = 0

    def _check_cancelled(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise RequestCancelled("the request was cancelled")

    # --- the sequence state (shared by every backend) ----------------------------------------

    @property
    def ids(self) -> list[int]:
        """Response ids (prompt excluded)."""
        return self._state.seq[self._state.prompt_len :]

    @property
    def n_tokens(self) -> int:
        return len(self._state.seq) - self._state.prompt_len

    @property
    def prompt_ids(self) -> list[int]:
        return self._state.seq[: self._state.prompt_len]

    @property
    def text(self) -> str:
        """The response text so far (an unfinished multi-byte character is left out)."""
        return self._state.data.decode("utf-8", errors="ignore")

    @property
    def token_ends(self) -> list[int]:
        """Byte offsets (in the UTF-8 response) where each response token ends."""
        return list(self._state.ends)

    @property
    def lane(self) -> str:
        """Members on one lane compute one after the other, distinct lanes overlap
        (`core.parallel`): in-process members share their device, a remote one has its own."""
        return "local"

    @property
    def room(self) -> int:
        """How many more tokens fit in the context window."""
        return self.context_window - len(self._state.seq)

    def render(
        self,
        messages: list[Message],
        tools: Sequence[dict] = (),
        response_format: dict | None = None,
    ) -> list[int]:
        """The prompt ids: the messages in this member's own chat template, with the tools (as
        OpenAI-style dicts) and the answer's schema where the request has them. Only the
        template's markup becomes control tokens (`core.chat.prompt_ids`): a message that
        spells `<|im_end|>` is read as that text."""
        extra = {}
        if tools:
            extra["tools"] = list(tools)
        if response_format is not None:
            extra["response_format"] = response_format
        with tokenizer_lock(self.tokenizer):
            return prompt_ids(self.tokenizer, messages, self.name, **extra)

    def start(
        self,
        messages: list[Message],
        tools: Sequence[dict] = (),
        response_format: dict | None = None,
        constraint: Constraint | None = None,
    ) -> int:
        """Begin a request: render the prompt with this member's template (and the request's
        tools and answer schema); a `constraint` gives this member a grammar matcher for its
        own tokenizer. Returns the prompt's length."""
        prompt = self.render(messages, tools, response_format)
        grammar = Matcher(constraint, self.vocab, self.stop_ids) if constraint else None
        if len(prompt) >= self.context_window:
            raise ContextWindowError(
                f"the prompt is {len(prompt)} tokens for member {self.name!r}, whose context "
                f"window is {self.context_window}; shorten the messages (or drop a member with "
                "a small window)."
            )
        with self._transaction("start"):
            keep = _common_prefix(self._state.seq, prompt)
            old = self._state.cache
            self._state = SequenceState(list(prompt), len(prompt), b"", [], old, grammar)
            self._rewind(keep)
            self._reuse(prompt)
        return len(prompt)

    # --- the request's grammar ------------------------------------------------------------

    @property
    def constrained(self) -> bool:
        return self._state.grammar is not None

    def allowed(self, boundary: int | None = None) -> torch.Tensor | None:
        """Which next ids keep the response valid after its first `boundary` tokens (default:
        all of them), as a bool mask over the vocabulary; None when unconstrained."""
        grammar = self._state.grammar
        if grammar is None:
            return None
        ids = self.ids
        grammar.follow(ids if boundary is None else ids[:boundary])
        return grammar.allowed()

    def constrained_rows(self, rows: torch.Tensor, boundaries: Sequence[int]) -> torch.Tensor:
        """`rows[i]` (next-token log-probs after `boundaries[i]` tokens) masked to what the
        grammar allows there and renormalised; unchanged when unconstrained."""
        if self._state.grammar is None:
            return rows
        masks = torch.stack([self.allowed(b) for b in boundaries])
        return constrain(rows, masks)

    def forced(self) -> str:
        """Text the grammar forces after the current text ("" when there is a choice, or when
        unconstrained): the engine commits it without asking any model."""
        grammar = self._state.grammar
        if grammar is None:
            return ""
        grammar.follow(self.ids)
        return grammar.forced()

    def _reuse(self, prompt: list[int]) -> None:  # noqa: B027 (a hook: nothing by default)
        """A backend may take a cached prefix of the prompt from an earlier request."""

    def sync(self, text: str) -> None:
        """Make this member's ids spell exactly `text` (the committed response)."""
        data = text.encode("utf-8")
        if data == self._state.data:
            return
        with self._transaction("sync"):
            ids, ends = self._retokenize(data)
            seq = self._state.seq[: self._state.prompt_len] + ids
            if len(seq) > self.context_window:
                raise ContextOverflow(f"member {self.name!r} reached its context window")
            self._rewind(_common_prefix(self._state.seq, seq))
            self._state.seq, self._state.data, self._state.ends = seq, data, ends

    def _retokenize(self, data: bytes, within: int | None = None) -> tuple[list[int], list[int]]:
        """Ids and byte ends for `data`, keeping every current token before the last safe cut
        (at most `within` bytes in: tokens past it are re-encoded canonically)."""
        state, keep = self._state, 0
        starters = self.vocab.cut_starters
        if starters:
            changed = _common_prefix(state.data, data)
            changed = changed if within is None else min(changed, within)
            k = len(state.ends)
            while k > 0 and len(state.ends) - k < _MAX_CUT_SCAN:
                start = state.ends[k - 1]
                if (
                    start <= changed
                    and is_cut(state.data, start, starters)
                    and is_cut(data, start, starters)
                ):
                    keep = k
                    break
                k -= 1
        start = state.ends[keep - 1] if keep else 0
        fresh = self.vocab.encode(data[start:].decode("utf-8"))
        ends, offset = state.ends[:keep], start
        for i, token in enumerate(fresh):
            size = len(self.vocab.token_bytes[token])
            if not keep and i == 0 and self.vocab.dummy_prefix and size:
                size -= 1  # the tokenizer's own leading space is not part of the text
            offset += size
            ends.append(offset)
        return self.ids[:keep] + fresh, ends

    def _append(self, token: int) -> None:
        state = self._state
        data = self.vocab.token_bytes[token]
        if not state.ends and self.vocab.dummy_prefix and data.startswith(b" "):
            data = data[1:]
        state.seq.append(token)
        state.data += data
        state.ends.append(len(state.data))

    def canonical_ids(self, text: str) -> list[int]:
        """The tokenizer's own ids for a whole response text (what `sync` must agree with)."""
        return self.vocab.encode(text)

    # --- what a backend provides ---------------------------------------------------------------

    @abstractmethod
    def _rewind(self, keep: int) -> None:
        """Forget computed state beyond the first `keep` ids of the sequence."""

    @abstractmethod
    def logprobs(self, boundaries: Sequence[int]) -> torch.Tensor:
        """Next-token log-probs after the first `b` response tokens, for each b: [len, vocab]."""

    @abstractmethod
    def score(
        self,
        continuations: Sequence[str],
        *,
        base: str | None = None,
        ends: Sequence[bool] | None = None,
        raw: bool = False,
    ) -> list[torch.Tensor]:
        """Token log-probs of each continuation of `base` (default: the current text), in one
        pass. `base` may be a prefix of the current text (a drafter scoring everyone's drafts
        keeps its own draft); `ends[i]` adds the log-prob of ending the turn after
        continuation i; `raw` gives pre-softmax logits instead of log-probs."""

    def drop_cache(self) -> None:
        """Forget every computed key/value; the ids stay (the recompute-everything baseline)."""
        self._rewind(0)

    def branch_logprobs(self, boundary: int, branches: Sequence[Sequence[int]]) -> torch.Tensor:
        """Next-token log-probs after the first `boundary` response tokens followed by each
        branch of ids (any ids: canonical for some text or not), in one pass: [branches, vocab].
        Text, ids and cache stay as they were. SAFE's `heal` scores a partial word with it."""
        raise NotImplementedError(
            f"member {self.name!r} cannot score token branches; use SAFE with heal=False."
        )

    # --- argument checks and tokenization every backend shares ------------------------------

    def _check_boundaries(self, boundaries: Sequence[int]) -> None:
        if any(b < 0 or b > self.n_tokens for b in boundaries):
            raise IndexError(f"boundaries {list(boundaries)} outside 0..{self.n_tokens}")

    def _continuation_blocks(
        self, continuations: Sequence[str], base: str | None, ends: Sequence[bool] | None
    ) -> tuple[list[list[int]], list[bool], int]:
        """`score`'s continuations in this member's canonical tokens, each cut after the ids
        they all share with the current sequence: (blocks, ends, start), where `start` is the
        sequence position of every block's first token."""
        if base is not None and not self._state.data.startswith(base.encode()):
            raise ValueError(f"base is not a prefix of member {self.name!r}'s text")
        base = self.text if base is None else base
        data = base.encode("utf-8")
        ends = [False] * len(continuations) if ends is None else list(ends)
        if len(ends) != len(continuations):
            raise ValueError(f"{len(ends)} ends for {len(continuations)} continuations")
        tokenized = [self._retokenize((base + c).encode(), len(data))[0] for c in continuations]
        inside = bisect.bisect_right(self._state.ends, len(data))  # response tokens in `base`
        shared = min([_common_prefix(self.ids, t) for t in tokenized] + [inside])
        blocks = [t[shared:] for t in tokenized]
        start = self._state.prompt_len + shared  # position of every block's first token
        if start + max(map(len, blocks), default=0) > self.context_window:
            raise ContextOverflow(f"a continuation does not fit member {self.name!r}'s window")
        return blocks, ends, start

    def _check_branches(self, boundary: int, branches: Sequence[Sequence[int]]) -> list[list[int]]:
        if not 0 <= boundary <= self.n_tokens:
            raise IndexError(f"boundary {boundary} outside 0..{self.n_tokens}")
        branches = [list(b) for b in branches]
        if any(not b for b in branches):
            raise ValueError("every branch needs at least one id")
        longest = max(map(len, branches), default=0)
        if self._state.prompt_len + boundary + longest > self.context_window:
            raise ContextOverflow(f"a branch does not fit member {self.name!r}'s window")
        return branches

    def draft(self, max_tokens: int, sampler: Sampler) -> Draft:
        """Continue the current text by up to `max_tokens` tokens, appending them. Under a
        grammar every step draws from the allowed tokens only (the rows returned are those
        masked, renormalised distributions), and the turn may end only where it is complete."""
        with self._transaction("draft"):
            ids, rows, stopped = [], [], False
            for _ in range(max_tokens):
                if self.room <= 0:
                    break
                row = self.logprobs([self.n_tokens])[0]
                if self._state.grammar is not None:
                    row = constrain(row, self.allowed())
                token = sampler.pick(row)
                rows.append(row)
                if token in self.stop_ids:
                    stopped = True
                    break
                self._append(token)
                ids.append(token)
            logprobs = torch.stack(rows) if rows else torch.empty(0, self.vocab.size)
            return Draft(ids, logprobs, stopped)

    def reset_counters(self) -> None:
        self.calls, self.seconds = 0, 0.0

    def reset(self) -> None:
        """Forget the sequence and everything computed for it, and every prefix kept for later
        requests (benchmarks use this so no request profits from a cache another one left)."""
        self._rewind(0)
        self._state = SequenceState()

    def keep_prefix(self) -> None:  # noqa: B027 (a hook: nothing by default)
        """The request is over: a backend may keep its computed prefix for later requests."""

    def memory_bytes(self) -> int:
        """Bytes this member holds for the current request beyond its weights (the KV cache)."""
        return 0


@dataclass(frozen=True)
class _KV:
    """Keys and values for the first `length` ids of a sequence. Never written in place: a
    forward pass makes new tensors (concatenation), a crop makes views, so a state can share
    them with a copy of itself and with other requests (prefix reuse) safely."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    length: int
    last_row: torch.Tensor | None = None  # log-probs at position length - 1

    def crop(self, keep: int) -> _KV | None:
        if keep <= 0:
            return None
        if keep >= self.length:
            return self
        layers = tuple((k[..., :keep, :], v[..., :keep, :]) for k, v in self.layers)
        return _KV(layers, keep)

    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() * 2 for k, _ in self.layers)


class _PrefixPool:
    """Computed prefixes of finished requests, for later requests whose prompts share them (an
    agent loop or a multi-turn chat resends the whole history). Bounded: least recently used
    out beyond `entries` or `max_bytes`."""

    def __init__(self, entries: int = 16, max_bytes: int = 1 << 30) -> None:
        self.entries, self.max_bytes = entries, max_bytes
        self._items: list[tuple[list[int], _KV]] = []  # most recently used last
        self._lock = threading.Lock()

    def put(self, ids: list[int], kv: _KV) -> None:
        if self.entries <= 0 or kv is None:
            return
        with self._lock:
            self._items = [
                (i, k) for i, k in self._items if _common_prefix(i, ids) < min(len(i), k.length)
            ]  # an entry this one extends is superseded
            self._items.append((list(ids[: kv.length]), kv))
            while len(self._items) > self.entries or (
                len(self._items) > 1 and sum(k.nbytes() for _, k in self._items) > self.max_bytes
            ):
                self._items.pop(0)

    def take(self, prompt: list[int]) -> _KV | None:
        """The cached keys of the longest prefix of `prompt` held here (shared, not copied)."""
        with self._lock:
            best, found = 0, None
            for index, (ids, kv) in enumerate(self._items):
                n = min(_common_prefix(ids, prompt), kv.length)
                if n > best:
                    best, found = n, index
            if found is None:
                return None
            entry = self._items.pop(found)
            self._items.append(entry)  # most recently used
        # one position is left to compute: the prompt's last row comes from a forward pass
        return entry[1].crop(min(best, len(prompt) - 1))

    def clear(self) -> None:
        with self._lock:
            self._items = []


class HFMember(Member):
    """An in-process Hugging Face causal LM with its tokenizer, device, dtype and KV cache."""

    def __init__(self, name: str, model, tokenizer) -> None:
        super().__init__()
        self.name = name
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab = Vocab(tokenizer, model_vocab_size=model.config.get_text_config().vocab_size)
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if tokenizer.eos_token_id is not None:
            eos.append(tokenizer.eos_token_id)
        self.stop_ids = frozenset(self.vocab.special_ids) | frozenset(eos)
        config = model.config.get_text_config()
        self.context_window = int(
            getattr(config, "max_position_embeddings", None)
            or getattr(config, "n_positions", None)
            or getattr(config, "n_ctx", None)
            or 2048
        )
        attention = getattr(model.config, "_attn_implementation", "eager") or "eager"
        self.takes_block_mask = attention in ("eager", "sdpa")
        self._batcher = batcher_for(model, batched=self.takes_block_mask)
        self._pool = _PrefixPool()
        self._reuse_prefixes = True
        self.prefilled = 0  # prompt ids computed for the request (prefix reuse saves these)

    @classmethod
    def load(
        cls,
        source,
        *,
        device: str | torch.device | None = "auto",
        dtype: str | torch.dtype | None = "auto",
        name: str | None = None,
        use_safetensors: bool = True,
        attn_implementation: str | None = None,
    ) -> HFMember:
        from pathlib import Path

        from .loading import (
            check_model_source,
            load_config,
            load_model,
            load_tokenizer,
            resolve_device,
            resolve_dtype,
        )

        source = check_model_source(source, use_safetensors)
        load_config(source)
        resolved = resolve_device(device)
        model = load_model(
            source, resolved, resolve_dtype(dtype, resolved), use_safetensors, attn_implementation
        )
        tokenizer = load_tokenizer(source)
        return cls(name or Path(source).name or source, model, tokenizer)

    def spawn(self, cancel: threading.Event | None = None, reuse: bool = True) -> HFMember:
        """`reuse=False`: this request neither takes nor leaves cached prompt prefixes."""
        twin = super().spawn(cancel)
        twin.prefilled, twin._reuse_prefixes = 0, reuse
        return twin

    # --- cache and forward ----------------------------------------------------------------

    @property
    def lane(self) -> str:
        device = self.device
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return str(device)

    @property
    def _kv(self) -> _KV | None:
        return self._state.cache

    @property
    def _cached(self) -> int:
        """Positions the cache holds."""
        return self._kv.length if self._kv is not None else 0

    def memory_bytes(self) -> int:
        return self._kv.nbytes() if self._kv is not None else 0

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def reset(self) -> None:
        super().reset()
        self._pool.clear()

    def keep_prefix(self) -> None:
        if self._kv is not None and self._reuse_prefixes:
            self._pool.put(self._state.seq, self._kv)

    def _reuse(self, prompt: list[int]) -> None:
        if self._cached == 0 and self._reuse_prefixes:
            self._state.cache = self._pool.take(prompt)

    def _rewind(self, keep: int) -> None:
        if self._kv is not None and keep < self._kv.length:
            self._state.cache = self._kv.crop(keep)

    def _forward(
        self,
        ids: list[int],
        keep: list[int],
        raw: bool = False,
        allowed: torch.Tensor | None = None,
        positions: list[int] | None = None,
    ) -> torch.Tensor:
        """Feed ids after the cache; log-probs (or raw logits) at the given input indices.
        `allowed` [len(ids), cached + len(ids)]: which positions each new id may attend to
        (None: causal); `positions`: their position ids (None: right after the cache)."""
        self._check_cancelled()
        start = time.perf_counter()
        kv = self._kv
        job = Pass(
            ids=list(ids),
            keep=list(keep),
            past=kv.layers if kv is not None else None,
            past_len=self._cached,
            allowed=allowed,
            positions=positions,
            raw=raw,
        )
        self._batcher.run(job)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.calls += 1
        self.seconds += time.perf_counter() - start
        self._state.cache = _KV(job.present, self._cached + len(ids))
        return job.rows

    def _set_last_row(self, row: torch.Tensor | None) -> None:
        if self._kv is not None:
            self._state.cache = replace(self._kv, last_row=row)

    def logprobs(self, boundaries: Sequence[int]) -> torch.Tensor:
        self._check_boundaries(boundaries)
        with self._transaction("next-token distributions"):
            prompt_len, seq = self._state.prompt_len, self._state.seq
            rows = [prompt_len + b - 1 for b in boundaries]
            kv = self._kv
            have = kv.length - 1 if kv is not None and kv.last_row is not None else None
            got = {have: kv.last_row} if have is not None else {}
            missing = sorted({r for r in rows if r != have})
            if missing:
                if missing[0] < self._cached:
                    self._rewind(missing[0])
                    got, missing = {}, sorted(set(rows))
                start = self._cached
                out = self._forward(seq[start : missing[-1] + 1], [r - start for r in missing])
                self.prefilled += max(0, min(prompt_len, missing[-1] + 1) - start)
                got.update(zip(missing, out, strict=True))
                self._set_last_row(got[missing[-1]])
            return torch.stack([got[r] for r in rows])

    def score(
        self,
        continuations: Sequence[str],
        *,
        base: str | None = None,
        ends: Sequence[bool] | None = None,
        raw: bool = False,
    ) -> list[torch.Tensor]:
        """Verify-in-line: all continuations after the cached prefix in ONE forward pass, each
        seeing the prefix and its own earlier tokens only (block mask, positions restarting at
        the prefix end). Cached ids beyond `base` (a drafter's own draft) are hidden by the mask
        and stay cached; the cache is otherwise returned to the prefix afterwards."""
        with self._transaction("verify-in-line scoring"):
            blocks, ends, start = self._continuation_blocks(continuations, base, ends)
            visible = min(self._cached, start - 1)  # cached positions the blocks may see
            tail = self._state.seq[visible:start]  # the prefix's uncached end (>= its last id)
            if not self.takes_block_mask:
                return self._score_each(visible, tail, blocks, ends, raw)
            kv = self._kv
            cached = self._cached
            flat = tail + [i for block in blocks for i in block]
            t = len(tail)
            allowed = block_mask(cached, visible, t, [len(b) for b in blocks])
            positions = list(range(visible, start))
            for block in blocks:
                positions.extend(range(start, start + len(block)))
            rows = self._forward(flat, list(range(len(flat))), raw, allowed, positions)
            last = rows[t - 1] if not raw else torch.log_softmax(rows[t - 1], -1)
            if visible == cached:  # the tail filled the cache up to the prefix end: keep it
                self._rewind(start)
                self._set_last_row(last)
            else:  # the cache reaches past the prefix: drop only what this pass added
                self._state.cache = kv
            scores, offset = [], t
            for block, end in zip(blocks, ends, strict=True):
                k = len(block)
                predictors = torch.cat([rows[t - 1 : t], rows[offset : offset + k]])
                scores.append(self._token_scores(predictors, block, end))
                offset += k
            return scores

    def _token_scores(self, predictors: torch.Tensor, block: list[int], end: bool) -> torch.Tensor:
        """predictors[j] produced block[j]; the row after the last token scores ending there."""
        target = torch.tensor(block, dtype=torch.long, device=predictors.device)
        values = predictors[: len(block)].gather(1, target[:, None])[:, 0]
        if end:
            stop = stop_logprob(predictors[len(block)], self.stop_ids)
            values = torch.cat([values, stop.reshape(1).to(values.dtype)])
        return values.cpu()

    def _score_each(
        self, visible: int, tail: list[int], blocks: list[list[int]], ends: list[bool], raw: bool
    ) -> list[torch.Tensor]:
        """Fallback for attention kernels that cannot take a block mask: one pass per
        continuation on the same cached prefix (same numbers, more passes). Without a mask the
        cache must end at the prefix, so a drafter's cached draft is dropped (its ids stay)."""
        self._rewind(visible)
        start, first, scores = visible + len(tail), None, []
        for block, end in zip(blocks, ends, strict=True):
            feed = block if first is not None else tail + block
            rows = self._forward(feed, list(range(len(feed))), raw=raw) if feed else None
            if first is None:
                first, rows = rows[len(tail) - 1], rows[len(tail) :]
            self._rewind(start)
            predictors = first[None] if rows is None else torch.cat([first[None], rows])
            scores.append(self._token_scores(predictors, block, end))
        if first is None:  # no continuations: nothing was computed
            return scores
        self._set_last_row(first if not raw else torch.log_softmax(first, -1))
        return scores

    def branch_logprobs(self, boundary: int, branches: Sequence[Sequence[int]]) -> torch.Tensor:
        with self._transaction("branch scoring"):
            branches = self._check_branches(boundary, branches)
            if not branches:
                return torch.empty(0, self.vocab.size)
            prefix = self._state.prompt_len + boundary
            if self._cached < prefix:
                self.logprobs([boundary])  # the cache now reaches the branch point
            if not self.takes_block_mask:  # no mask: the cache must end at the branch point
                self._rewind(prefix)
                rows = []
                for branch in branches:
                    rows.append(self._forward(branch, [len(branch) - 1])[0])
                    self._rewind(prefix)
                return torch.stack(rows)
            kv, cached = self._kv, self._cached
            flat = [i for branch in branches for i in branch]
            allowed = block_mask(cached, prefix, 0, [len(b) for b in branches])
            positions, keep, offset = [], [], 0
            for branch in branches:
                positions.extend(range(prefix, prefix + len(branch)))
                offset += len(branch)
                keep.append(offset - 1)
            rows = self._forward(flat, keep, allowed=allowed, positions=positions)
            self._state.cache = kv  # what this pass added is dropped
            return rows


def block_mask(past: int, visible: int, tail: int, blocks: Sequence[int]) -> torch.Tensor:
    """Which positions each new id of a verify-in-line pass may attend to: [n, past + n].

    The new ids are a `tail` (the uncached end of a shared prefix) followed by blocks of the
    given sizes. Every new id sees the first `visible` cached positions (cached ids beyond them,
    a drafter's own draft, stay hidden) and the whole tail (the tail itself causally); each
    block sees its own earlier ids only, never another block."""
    n = tail + sum(blocks)
    allowed = torch.zeros(n, past + n, dtype=torch.bool)
    allowed[:, :visible] = True
    allowed[:, past : past + tail] = True
    allowed[:tail, past : past + tail] = torch.ones(tail, tail, dtype=torch.bool).tril()
    offset = tail
    for size in blocks:
        at = past + offset
        allowed[offset : offset + size, at : at + size] = torch.ones(size, size).bool().tril()
        offset += size
    return allowed
