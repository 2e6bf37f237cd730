"""A Member: one model's private view of the shared response text, and the only owner of its cache.

The committed response TEXT is the ensemble's one shared state. Each member keeps its own
tokenization of it (canonical for text that came from elsewhere; its own tokens for what it
drafted itself and was accepted) and a KV cache valid for a prefix of those ids. `sync(text)`
re-tokenizes from the last safe cut before the change, keeps the longest common prefix of ids,
and crops the cache there; logits are computed lazily, in one forward pass, only for the
boundaries a method asks for.

What is loaded once (weights, tokenizer, vocabulary tables) is shared; everything a request
changes lives in its `RequestState` (`member.state`): the `SequenceState` (ids, bytes, the
cache), the cancel event, the counters, and what each backend adds. `spawn()` gives a request
its own view of a member: the same model, a freshly constructed state. Every operation is a
transaction on the sequence state: if it raises (a fault inside a forward pass, an
out-of-memory, a Ctrl-C), it is put back as it was before the call, so a failed operation never
leaves ids and cache out of step.

Methods talk to the `Member` interface only (render, sync, logprobs, draft, score), never to a
model or a cache, so another backend can stand in: `core.hf_member.HFMember` (a model in this
process) and `core.remote.RemoteMember` (a model served over HTTP).
"""

from __future__ import annotations

import bisect
import copy
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from .chat import Message, prompt_ids, raw_prompt_ids
from .errors import (
    ContextWindowError,
    EnsembleError,
    InvalidConfigError,
    MemberError,
    RequestCancelled,
)
from .grammar import Constraint, ConstraintError, GrammarViolation, Matcher, constrain
from .kv import common_prefix
from .penalties import Penalties
from .row_memo import RowMemo
from .sampling import Sampler
from .stops import first_hit
from .tools import ToolSpec
from .vocab import Vocab, is_cut, stop_logprob, tokenizer_lock

_MAX_CUT_SCAN = 64  # tokens to look back for a cut before re-tokenizing the whole response


def token_scores(
    predictors: torch.Tensor, block: Sequence[int], end: bool, stop_ids: frozenset[int]
) -> torch.Tensor:
    """A continuation's token log-probs: `predictors[j]` (a log-prob row) produced `block[j]`;
    with `end`, the row after the last token adds the log-prob of ending the turn there."""
    target = torch.tensor(block, dtype=torch.long, device=predictors.device)
    values = predictors[: len(block)].gather(1, target[:, None])[:, 0]
    if end:
        stop = stop_logprob(predictors[len(block)], stop_ids)
        values = torch.cat([values, stop.reshape(1).to(values.dtype)])
    return values.cpu()


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
        return SequenceState(
            list(self.seq), self.prompt_len, self.data, list(self.ends), self.cache, self.grammar
        )


@dataclass
class RequestState:
    """Everything one request changes in one member, declared once: `spawn()` constructs a
    fresh one for each request, so no field can carry over from another request. A backend
    that keeps more per request subclasses it (fields with defaults) and names the subclass
    in `Member.state_type`."""

    sequence: SequenceState = field(default_factory=SequenceState)
    cancel: threading.Event | None = None  # once set, the next forward pass raises
    reuse: bool = True  # take and leave computed prompt prefixes (where the backend keeps any)
    penalties: Penalties = field(default_factory=Penalties)  # the request's, set by `start`
    depth: int = 0  # nested operations: only the outermost one is a transaction
    rows: RowMemo = field(default_factory=RowMemo)  # rows computed, by the ids they follow
    calls: int = 0  # forward passes (or server requests) made for the request
    seconds: float = 0.0  # time spent in them


class _Transaction:
    """`Member._transaction`: the state saved on entry, put back when the block raises."""

    __slots__ = ("member", "operation", "outer", "saved")

    def __init__(self, member: Member, operation: str) -> None:
        self.member, self.operation = member, operation

    def __enter__(self) -> None:
        state = self.member.state
        self.outer = not state.depth
        if self.outer:
            self.saved = state.sequence.copy()
            state.depth = 1

    def __exit__(self, kind, error, traceback) -> bool:
        if not self.outer:
            return False
        member = self.member
        member.state.depth = 0
        if kind is None:
            return False
        member.state.sequence = self.saved
        if isinstance(error, MemberError):
            error.member = error.member or member.name
            error.operation = error.operation or self.operation
        if isinstance(error, EnsembleError) or not isinstance(error, Exception):
            return False
        raise MemberError(
            f"member {member.name!r} failed during {self.operation}: "
            f"{type(error).__name__}: {error}",
            member=member.name,
            operation=self.operation,
        ) from error


class Member(ABC):
    """One model, seen by methods as: a tokenized view of the shared text + distributions."""

    name: str
    vocab: Vocab
    stop_ids: frozenset[int]
    context_window: int
    stop_strings: tuple[str, ...] = ()  # end the response as stop strings do (`Local.stop`)
    stop_texts: tuple[str, ...] = ()  # those it writes as text, not as one control token
    gives_logits = True  # `score(raw=True)` works (a server may give log-probs only)
    full_rows = True  # its rows are whole distributions (a server may give its top-k only)
    state: RequestState  # everything the current request changes (fresh for each `spawn`)
    state_type: ClassVar[type[RequestState]] = RequestState  # what a request's state holds

    def __init__(self) -> None:
        self.state = self.state_type()

    def spawn(self, cancel: threading.Event | None = None, reuse: bool = True) -> Member:
        """This member's view for one request. Every attribute of a member is loaded once
        (model, tokenizer, tables, batcher, client) and the view shares it; its `state` is
        constructed fresh. `cancel`, once set, stops the request at its next forward pass
        (`RequestCancelled`); `reuse` lets it share computed prompt prefixes with other
        requests (where the backend keeps any)."""
        view = copy.copy(self)
        view.state = self.state_type(cancel=cancel, reuse=reuse)
        return view

    @property
    def calls(self) -> int:
        """Forward passes (or server requests) made for the current request."""
        return self.state.calls

    @property
    def seconds(self) -> float:
        """Seconds spent in them."""
        return self.state.seconds

    # --- transactions ------------------------------------------------------------------------

    def _transaction(self, operation: str) -> _Transaction:
        """Put the state back if the operation fails, and name the member and the operation in
        the error (errors the library raises on purpose pass through as they are). Only the
        outermost operation is a transaction: an inner one is part of it."""
        return _Transaction(self, operation)

    def _check_cancelled(self) -> None:
        cancel = self.state.cancel
        if cancel is not None and cancel.is_set():
            raise RequestCancelled("the request was cancelled")

    # --- the sequence state (shared by every backend) ----------------------------------------

    @property
    def ids(self) -> list[int]:
        """Response ids (prompt excluded)."""
        sequence = self.state.sequence
        return sequence.seq[sequence.prompt_len :]

    @property
    def n_tokens(self) -> int:
        sequence = self.state.sequence
        return len(sequence.seq) - sequence.prompt_len

    @property
    def prompt_ids(self) -> list[int]:
        sequence = self.state.sequence
        return sequence.seq[: sequence.prompt_len]

    @property
    def text(self) -> str:
        """The response text so far (an unfinished multi-byte character is left out)."""
        return self.state.sequence.data.decode("utf-8", errors="ignore")

    @property
    def token_ends(self) -> list[int]:
        """Byte offsets (in the UTF-8 response) where each response token ends."""
        return list(self.state.sequence.ends)

    @property
    def runs_on(self) -> str:
        """Where this member computes: members that run on the same place compute one after the
        other, members on different places overlap (`core.parallel`). In-process members run on
        their device; a remote member on its own server connection."""
        return "local"

    @property
    def fingerprint(self) -> dict[str, Any] | None:
        """What this member's outputs depend on, where that can be read without running it
        (the files it was loaded from, its template, stops, dtype, device); None where it
        cannot (a model built in memory, a server), so nothing measured over it is kept
        across processes."""
        return None

    @property
    def window_left(self) -> int:
        """How many more tokens fit in the context window."""
        return self.context_window - len(self.state.sequence.seq)

    def render(
        self,
        messages: list[Message] | str,
        tools: Sequence[ToolSpec] = (),
        response_format: dict | None = None,
    ) -> list[int]:
        """The prompt ids: the messages in this member's own chat template, with the tools and
        the answer's schema where the request has them. Only the template's markup becomes
        control tokens (`core.chat.prompt_ids`): a message that spells `<|im_end|>` is read as
        that text. A string is a raw prompt (`GenerationConfig.raw_prompt`): read as it is,
        with no template (`core.chat.raw_prompt_ids`)."""
        with tokenizer_lock(self.tokenizer):
            if isinstance(messages, str):
                return raw_prompt_ids(self.tokenizer, messages)
            return prompt_ids(self.tokenizer, messages, self.name, tools, response_format)

    def start(
        self,
        messages: list[Message] | str,
        tools: Sequence[ToolSpec] = (),
        response_format: dict | None = None,
        constraint: Constraint | None = None,
        penalties: Penalties | None = None,
    ) -> int:
        """Begin a request: render the prompt with this member's template (and the request's
        tools and answer schema), or take a raw prompt (a string) as it is; a `constraint`
        gives this member a grammar matcher for its own tokenizer, and `penalties` shape every
        row it gives by its own tokens of the response (`core.penalties`). Returns the
        prompt's length."""
        penalties = penalties or Penalties()
        if penalties and not self.full_rows:
            raise InvalidConfigError(
                f"frequency_penalty and presence_penalty need each member's whole next-token "
                f"distribution, and member {self.name!r} is served with its top log-probs "
                "only; leave both at 0 for this ensemble, or load the member in this process."
            )
        prompt = self.render(messages, tools, response_format)
        grammar = Matcher(constraint, self.vocab, self.stop_ids) if constraint else None
        if len(prompt) >= self.context_window:
            raise ContextWindowError(
                f"the prompt is {len(prompt)} tokens for member {self.name!r}, whose context "
                f"window is {self.context_window}; shorten the messages (or drop a member with "
                "a small window)."
            )
        with self._transaction("start"):
            state = self.state
            keep = common_prefix(state.sequence.seq, prompt)
            old = state.sequence.cache
            state.sequence = SequenceState(list(prompt), len(prompt), b"", [], old, grammar)
            state.penalties = penalties
            state.rows.clear()
            self._rewind(keep)
            self._reuse(prompt)
        return len(prompt)

    # --- the request's grammar: every distribution a method reads goes through it ----------

    def logprobs(self, boundaries: Sequence[int]) -> torch.Tensor:
        """Next-token log-probs after the first `b` response tokens, for each b: [len, vocab].
        Under the request's grammar each row is masked to what the grammar allows there and
        renormalised, so a method never sees a distribution the grammar has not shaped; the
        request's penalties apply before the mask. A row computed before for the same ids
        (`core.row_memo`) costs no pass."""

        def histories() -> list[list[int]]:
            ids = self.ids
            return [ids[:b] for b in boundaries]

        rows = self._penalised(self._known_rows(boundaries), histories)
        return self._constrained(rows, boundaries)

    def _penalised(
        self,
        rows: torch.Tensor,
        histories: Callable[[], Sequence[Sequence[int]]],
        raw: bool = False,
    ) -> torch.Tensor:
        """The model's `rows` under the request's penalties: `histories()` gives the response
        ids each row follows (built only when a penalty is set: this is on every row's path).
        The row memo keeps the model's own rows; every reader of a row penalises it here."""
        penalties = self.state.penalties
        return penalties.apply(rows, histories(), normalise=not raw) if penalties else rows

    def _known_rows(self, boundaries: Sequence[int]) -> torch.Tensor:
        """The model's rows after each boundary: remembered ones, and the others in one call of
        the backend (`_model_logprobs`), which are then remembered."""
        self._check_boundaries(boundaries)
        memo, ids = self.state.rows, self.ids
        found = {b: memo.get(ids[:b]) for b in boundaries}
        missing = sorted(b for b, row in found.items() if row is None)
        if missing:
            for b, row in zip(missing, self._model_logprobs(missing), strict=True):
                memo.put(ids[:b], row)
                found[b] = row
        if len(boundaries) == 1:
            return found[boundaries[0]][None]
        return torch.stack([found[b] for b in boundaries])

    def forced(self) -> str:
        """Text the grammar forces after the current text ("" when there is a choice, or when
        unconstrained): the engine commits it without asking any model."""
        grammar = self.state.sequence.grammar
        if grammar is None:
            return ""
        grammar.follow(self.ids)
        return grammar.forced()

    def _constrained(self, rows: torch.Tensor, boundaries: Sequence[int]) -> torch.Tensor:
        """`rows[i]` (next-token log-probs after `boundaries[i]` tokens) masked to what the
        grammar allows there and renormalised; unchanged when unconstrained."""
        grammar = self.state.sequence.grammar
        if grammar is None:
            return rows
        ids, masks = self.ids, []
        for boundary in boundaries:
            grammar.follow(ids[:boundary])
            masks.append(grammar.allowed())
        return constrain(rows, torch.stack(masks))

    def _reuse(self, prompt: list[int]) -> None:  # noqa: B027 (a hook: nothing by default)
        """A backend may take a cached prefix of the prompt from an earlier request."""

    def sync(self, text: str) -> None:
        """Make this member's ids spell exactly `text` (the committed response)."""
        data = text.encode("utf-8")
        if data == self.state.sequence.data:
            return
        with self._transaction("sync"):
            ids, ends = self._retokenize(data)
            seq = self.prompt_ids + ids
            if len(seq) > self.context_window:
                raise ContextOverflow(f"member {self.name!r} reached its context window")
            self._rewind(common_prefix(self.state.sequence.seq, seq))
            state = self.state.sequence
            state.seq, state.data, state.ends = seq, data, ends

    def sync_ids(self, ids: Sequence[int]) -> None:
        """Make this member's response exactly these ids, whether or not its tokenizer would
        spell their text that way (a method that continues from the ids a paper's code gives
        a model: SAFE's remap="as-aligned"). A later `sync` to the same text keeps them."""
        ids = list(ids)
        with self._transaction("sync"):
            state = self.state.sequence
            keep = common_prefix(self.ids, ids)
            if state.prompt_len + len(ids) > self.context_window:
                raise ContextOverflow(f"member {self.name!r} reached its context window")
            self._keep_tokens(keep)
            for token in ids[keep:]:
                self._append(token)

    def _keep_tokens(self, keep: int) -> None:
        """Keep the first `keep` response tokens (their ids, bytes and computed state)."""
        state = self.state.sequence
        self._rewind(state.prompt_len + keep)
        state.seq = state.seq[: state.prompt_len + keep]
        state.data = state.data[: state.ends[keep - 1] if keep else 0]
        state.ends = state.ends[:keep]

    def _retokenize(self, data: bytes, within: int | None = None) -> tuple[list[int], list[int]]:
        """Ids and byte ends for `data`, keeping every current token before the last safe cut
        (at most `within` bytes in: tokens past it are re-encoded canonically)."""
        state, keep = self.state.sequence, 0
        starters = self.vocab.cut_starters
        if starters:
            changed = common_prefix(state.data, data)
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
        state = self.state.sequence
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
    def _model_logprobs(self, boundaries: Sequence[int]) -> torch.Tensor:
        """The model's own next-token log-probs after the first `b` response tokens, for each b:
        [len, vocab] (`logprobs` applies the request's grammar to them)."""

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
        continuation i; `raw` gives pre-softmax logits instead of log-probs.

        A member given stop strings (`Local.stop`: a base model whose text template ends a
        turn with text, "\nQuestion:") ends its turn with a stop id or by writing one of them
        next, so ending counts both: log(P(stop id) + P(stop string)), the stop strings scored
        in the same pass (unless `raw`, or under a grammar, which stop strings do not cut)."""
        stops = () if raw else self._text_stops
        ended = [i for i, end in enumerate(ends or ()) if end] if stops else []
        if not ended:
            return self._scores(continuations, base, ends, raw)
        written = [continuations[i] + stop for i in ended for stop in stops]
        values = self._scores(
            [*continuations, *written], base, [*ends, *[False] * len(written)], raw
        )
        scores, extra = values[: len(continuations)], iter(values[len(continuations) :])
        for i in ended:
            own = scores[i]
            body, end = own[:-1].sum(), own[-1]
            for _ in stops:  # log P(continuation + stop) - log P(continuation), at most 0
                end = torch.logaddexp(end, (next(extra).sum() - body).clamp(max=0.0))
            scores[i] = torch.cat([own[:-1], end.reshape(1).to(own.dtype)])
        return scores

    def _scores(
        self,
        continuations: Sequence[str],
        base: str | None,
        ends: Sequence[bool] | None,
        raw: bool,
    ) -> list[torch.Tensor]:
        """The continuations in this member's tokens (tokenized once, here), each scored from
        its remembered rows where every row it needs is known (`_known_rows`; log-probs of
        whole distributions only), the others by the backend in one call."""
        with self._transaction("verify-in-line scoring"):
            blocks, flags, start = self._continuation_blocks(continuations, base, ends)
            if raw or not self.full_rows or not blocks:
                return self._continuation_scores(blocks, flags, start, raw)
            memo, sequence = self.state.rows, self.state.sequence
            before = sequence.seq[sequence.prompt_len : start]
            known: dict[int, torch.Tensor] = {}
            for i, (block, end) in enumerate(zip(blocks, flags, strict=True)):
                histories = [before + block[:k] for k in range(len(block) + int(end))]
                rows = [memo.get(history) for history in histories]
                if rows and all(row is not None for row in rows):
                    rows = self._penalised(torch.stack(rows), lambda h=histories: h)
                    known[i] = token_scores(rows, block, end, self.stop_ids)
            rest = [i for i in range(len(blocks)) if i not in known]
            if rest:
                computed = self._continuation_scores(
                    [blocks[i] for i in rest], [flags[i] for i in rest], start, raw
                )
                known.update(zip(rest, computed, strict=True))
            return [known[i] for i in range(len(blocks))]

    def _block_scores(
        self, start: int, block: Sequence[int], end: bool, predictors: torch.Tensor, raw: bool
    ) -> torch.Tensor:
        """One continuation's scores from its rows (`predictors[k]` follows its first k ids,
        after the sequence's first `start` ids); log-prob rows are remembered (`_known_rows`),
        and the scores read from them under the request's penalties."""
        sequence, memo = self.state.sequence, self.state.rows
        before = sequence.seq[sequence.prompt_len : start]
        histories = [before + list(block[:k]) for k in range(min(len(predictors), len(block) + 1))]
        if not raw:
            for history, row in zip(histories, predictors, strict=False):
                memo.put(history, row)
        predictors = self._penalised(predictors[: len(histories)], lambda: histories, raw)
        return token_scores(predictors, block, end, self.stop_ids)

    @abstractmethod
    def _continuation_scores(
        self, blocks: list[list[int]], ends: list[bool], start: int, raw: bool
    ) -> list[torch.Tensor]:
        """`score` as the backend computes it, for continuations in this member's tokens:
        `blocks[i]` follows the sequence's first `start` ids; `ends[i]` adds the log-prob of
        ending the turn after it (its stop ids' mass)."""

    def drop_cache(self) -> None:
        """Forget every computed key/value; the ids stay (the recompute-everything baseline)."""
        self._rewind(0)

    def branch_logprobs(self, boundary: int, branches: Sequence[Sequence[int]]) -> torch.Tensor:
        """Next-token log-probs after the first `boundary` response tokens followed by each
        branch of ids (any ids: canonical for some text or not), in one pass: [branches, vocab].
        Text, ids and cache stay as they were. SAFE's `heal` scores a partial word with it.
        Under the request's grammar each row is masked as `logprobs` masks; a branch the
        grammar rejects, or after which it allows nothing this member would write, gets a row
        of -inf (nothing can follow it)."""
        rows = self._model_branch_logprobs(boundary, branches)
        rows = self._penalised(rows, lambda: [[*self.ids[:boundary], *b] for b in branches])
        grammar = self.state.sequence.grammar
        if grammar is None:
            return rows
        base, masked = self.ids[:boundary], []
        for row, branch in zip(rows, branches, strict=True):
            try:
                grammar.follow([*base, *branch])
            except GrammarViolation:
                masked.append(torch.full_like(row, float("-inf")))
                continue
            try:
                masked.append(constrain(row, grammar.allowed()))
            except ConstraintError:  # every allowed id has probability 0 here
                masked.append(torch.full_like(row, float("-inf")))
        return torch.stack(masked) if masked else rows

    def _model_branch_logprobs(
        self, boundary: int, branches: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """The backend's `branch_logprobs`, before the grammar's mask."""
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
        state = self.state.sequence
        if base is not None and not state.data.startswith(base.encode()):
            raise ValueError(f"base is not a prefix of member {self.name!r}'s text")
        base = self.text if base is None else base
        data = base.encode("utf-8")
        ends = [False] * len(continuations) if ends is None else list(ends)
        if len(ends) != len(continuations):
            raise ValueError(f"{len(ends)} ends for {len(continuations)} continuations")
        tokenized = [self._retokenize((base + c).encode(), len(data))[0] for c in continuations]
        inside = bisect.bisect_right(state.ends, len(data))  # response tokens in `base`
        shared = min([common_prefix(self.ids, t) for t in tokenized] + [inside])
        blocks = [t[shared:] for t in tokenized]
        start = state.prompt_len + shared  # position of every block's first token
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
        if self.state.sequence.prompt_len + boundary + longest > self.context_window:
            raise ContextOverflow(f"a branch does not fit member {self.name!r}'s window")
        return branches

    def draft(self, max_tokens: int, sampler: Sampler, guess: str = "") -> Draft:
        """Continue the current text by up to `max_tokens` tokens, appending them. Under a
        grammar every step draws from the allowed tokens only (the rows returned are those
        masked, renormalised distributions), and the turn may end only where it is complete.
        `guess`: text this member may well write next (another member's draft of the same
        continuation); a greedy draft reads its rows along the guess in one pass and keeps the
        guessed tokens it picks itself, drafting on from the first it does not (`_guessed`)."""
        with self._transaction("draft"):
            start = len(self.state.sequence.data)
            ids, rows = self._guessed(guess, max_tokens, sampler) if guess else ([], [])
            before, stopped = self.n_tokens - len(ids), False
            for count in range(1, len(ids) + 1) if self._text_stops else ():  # as the loop below
                keep = self._before_stop_string(start, count, before + count)
                if keep is not None:
                    self._keep_tokens(before + keep)
                    ids, rows, stopped = ids[:keep], rows[: keep + 1], True
                    break
            for _ in range(0 if stopped else max_tokens - len(ids)):
                if self.window_left <= 0:
                    break
                row = self.logprobs([self.n_tokens])[0]
                token = sampler.pick(row)
                rows.append(row)
                if token in self.stop_ids:
                    stopped = True
                    break
                self._append(token)
                ids.append(token)
                keep = self._before_stop_string(start, len(ids))
                if keep is not None:  # its turn ended in text: the tokens from the stop go
                    self._keep_tokens(self.n_tokens - len(ids) + keep)
                    ids, rows, stopped = ids[:keep], rows[: keep + 1], True
                    break
            logprobs = torch.stack(rows) if rows else torch.empty(0, self.vocab.size)
            return Draft(ids, logprobs, stopped)

    def _guessed(
        self, guess: str, max_tokens: int, sampler: Sampler
    ) -> tuple[list[int], list[torch.Tensor]]:
        """The guessed tokens this member's own greedy draft starts with, and their rows: the
        guess in this member's tokens is read in one pass (its rows are remembered, so the next
        step, and a later score of the guess, cost none), and kept up to the first token the
        member would not pick there, or to a stop token (the draft's own step ends there). Only
        where a draft picks each token from its row alone: a greedy draft with no grammar (a stop
        string written inside the kept tokens is found by `draft`, as its loop finds one). A
        guess that would re-spell the current tokens is not read."""
        budget = min(max_tokens, self.window_left)
        if not sampler.greedy or budget <= 0 or self.state.sequence.grammar is not None:
            return [], []
        before = self.ids
        n = len(before)
        try:
            self.sync(self.text + guess)
        except ContextOverflow:  # the whole guess does not fit: it is drafted step by step
            return [], []
        whole = self.ids[n:]
        guessed = whole[:budget]
        if self.ids[:n] != before or not guessed:
            self.sync_ids(before)
            return [], []
        # rows along the whole guess (and after it, where a draft could go on from there): a
        # guess longer than this draft's budget in this member's tokens is still scored later
        ends = range(n, n + len(whole) + (len(whole) < budget))
        rows = list(self.logprobs(list(ends)).unbind(0))[: len(guessed)]
        self._keep_tokens(n + len(guessed))
        kept = 0
        while (
            kept < len(guessed)
            and guessed[kept] not in self.stop_ids
            and sampler.pick(rows[kept]) == guessed[kept]
        ):
            kept += 1
        self._keep_tokens(n + kept)
        return guessed[:kept], rows[:kept]

    @property
    def _text_stops(self) -> tuple[str, ...]:
        """The stop strings this member writes as text, as they apply to the current request:
        none under a grammar, which stop strings do not cut."""
        return () if self.state.sequence.grammar is not None else self.stop_texts

    def cut_at_stop(self, text: str) -> tuple[str, bool]:
        """`text` (this member's continuation) up to the first stop string it writes as text,
        and whether it wrote one."""
        hit = first_hit(text, self._text_stops)
        return (text, False) if hit is None else (text[:hit], True)

    def _before_stop_string(self, start: int, drafted: int, upto: int | None = None) -> int | None:
        """How many of the `drafted` tokens that end with response token `upto` (default: the
        last) come before the first of this member's stop strings written after byte `start` of
        its response and before that token's end (None: none written). A draft ends there, as
        its turn does."""
        stops = self._text_stops
        if not stops:
            return None
        state = self.state.sequence
        if upto is None:
            upto, written = len(state.ends), state.data[start:]
        else:
            written = state.data[start : state.ends[upto - 1]]
        hit = first_hit(written, [s.encode("utf-8") for s in stops])
        if hit is None:
            return None
        return sum(end <= start + hit for end in state.ends[upto - drafted : upto])

    def serve(self, threads) -> None:  # noqa: B027 (a hook: nothing by default)
        """Requests of one ensemble, run on `threads` (a `core.batching.RequestThreads`), use
        this member: a backend that batches their passes waits for them."""

    def reserve(self, new_tokens: int) -> None:  # noqa: B027 (a hook: nothing by default)
        """The request starts: a backend claims the room its cache will need for the prompt and
        up to `new_tokens` more, or raises `EnsembleBusyError` now rather than run out of memory
        mid-request."""

    def keep_prefix(self) -> None:  # noqa: B027 (a hook: nothing by default)
        """The request is over: a backend may keep its computed prefix for later requests (and
        releases what it holds, as `release` does)."""

    def release(self) -> None:  # noqa: B027 (a hook: nothing by default)
        """The request ended (finished, failed, cancelled or dropped): a backend gives back what
        it holds for it (its row in a key/value store); the ids stay."""

    def memory_bytes(self) -> int:
        """Bytes this member holds for the current request beyond its weights (the KV cache)."""
        return 0
