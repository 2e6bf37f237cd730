"""A Member: one model's private view of the shared response text, and the only owner of its cache.

The committed response TEXT is the ensemble's one shared state. Each member keeps its own
tokenization of it (canonical for text that came from elsewhere; its own tokens for what it
drafted itself and was accepted) and a KV cache valid for a prefix of those ids. `sync(text)`
re-tokenizes from the last safe cut before the change, keeps the longest common prefix of ids,
and crops the cache there; logits are computed lazily, in one forward pass, only for the
boundaries a method asks for.

Methods talk to the `Member` interface only (render, sync, logprobs, draft, score), never to a
model or a cache, so another backend (a model served over HTTP) can stand in for `HFMember`.
"""

from __future__ import annotations

import bisect
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .chat import Message, render_prompt
from .errors import ContextWindowError
from .sampling import Sampler
from .vocab import Vocab, is_cut

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
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Member(ABC):
    """One model, seen by methods as: a tokenized view of the shared text + distributions."""

    name: str
    vocab: Vocab
    stop_ids: frozenset[int]
    context_window: int
    gives_logits = True  # `score(raw=True)` works (a server may give log-probs only)

    def __init__(self) -> None:
        self._seq: list[int] = []  # prompt ids + response ids
        self._prompt_len = 0
        self._bytes = b""  # the response as this member spells it
        self._ends: list[int] = []  # byte offset where each response token ends
        self.calls = 0
        self.seconds = 0.0

    # --- the sequence state (shared by every backend) ----------------------------------------

    @property
    def ids(self) -> list[int]:
        """Response ids (prompt excluded)."""
        return self._seq[self._prompt_len :]

    @property
    def n_tokens(self) -> int:
        return len(self._seq) - self._prompt_len

    @property
    def prompt_ids(self) -> list[int]:
        return self._seq[: self._prompt_len]

    @property
    def text(self) -> str:
        """The response text so far (an unfinished multi-byte character is left out)."""
        return self._bytes.decode("utf-8", errors="ignore")

    @property
    def token_ends(self) -> list[int]:
        """Byte offsets (in the UTF-8 response) where each response token ends."""
        return list(self._ends)

    @property
    def lane(self) -> str:
        """Members on one lane compute one after the other, distinct lanes overlap
        (`core.parallel`): in-process members share their device, a remote one has its own."""
        return "local"

    @property
    def room(self) -> int:
        """How many more tokens fit in the context window."""
        return self.context_window - len(self._seq)

    def render(self, messages: list[Message]) -> list[int]:
        prompt = render_prompt(self.tokenizer, messages, self.name)
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def start(self, messages: list[Message]) -> int:
        """Begin a request: render the prompt with this member's template. Returns its length."""
        prompt = self.render(messages)
        if len(prompt) >= self.context_window:
            raise ContextWindowError(
                f"the prompt is {len(prompt)} tokens for member {self.name!r}, whose context "
                f"window is {self.context_window}; shorten the messages (or drop a member with "
                "a small window)."
            )
        self._rewind(_common_prefix(self._seq, prompt))
        self._seq, self._prompt_len, self._bytes, self._ends = list(prompt), len(prompt), b"", []
        return len(prompt)

    def sync(self, text: str) -> None:
        """Make this member's ids spell exactly `text` (the committed response)."""
        data = text.encode("utf-8")
        if data == self._bytes:
            return
        ids, ends = self._retokenize(data)
        seq = self._seq[: self._prompt_len] + ids
        if len(seq) > self.context_window:
            raise ContextOverflow(f"member {self.name!r} reached its context window")
        self._rewind(_common_prefix(self._seq, seq))
        self._seq, self._bytes, self._ends = seq, data, ends

    def _retokenize(self, data: bytes, within: int | None = None) -> tuple[list[int], list[int]]:
        """Ids and byte ends for `data`, keeping every current token before the last safe cut
        (at most `within` bytes in: tokens past it are re-encoded canonically)."""
        keep = 0
        starters = self.vocab.cut_starters
        if starters:
            changed = _common_prefix(self._bytes, data)
            changed = changed if within is None else min(changed, within)
            k = len(self._ends)
            while k > 0 and len(self._ends) - k < _MAX_CUT_SCAN:
                start = self._ends[k - 1]
                if (
                    start <= changed
                    and is_cut(self._bytes, start, starters)
                    and is_cut(data, start, starters)
                ):
                    keep = k
                    break
                k -= 1
        start = self._ends[keep - 1] if keep else 0
        fresh = self.vocab.encode(data[start:].decode("utf-8"))
        ends, offset = self._ends[:keep], start
        for i, token in enumerate(fresh):
            size = len(self.vocab.token_bytes[token])
            if not keep and i == 0 and self.vocab.dummy_prefix and size:
                size -= 1  # the tokenizer's own leading space is not part of the text
            offset += size
            ends.append(offset)
        return self.ids[:keep] + fresh, ends

    def _append(self, token: int) -> None:
        data = self.vocab.token_bytes[token]
        if not self._ends and self.vocab.dummy_prefix and data.startswith(b" "):
            data = data[1:]
        self._seq.append(token)
        self._bytes += data
        self._ends.append(len(self._bytes))

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
        if base is not None and not self._bytes.startswith(base.encode()):
            raise ValueError(f"base is not a prefix of member {self.name!r}'s text")
        base = self.text if base is None else base
        data = base.encode("utf-8")
        ends = [False] * len(continuations) if ends is None else list(ends)
        if len(ends) != len(continuations):
            raise ValueError(f"{len(ends)} ends for {len(continuations)} continuations")
        tokenized = [self._retokenize((base + c).encode(), len(data))[0] for c in continuations]
        inside = bisect.bisect_right(self._ends, len(data))  # response tokens within `base`
        shared = min([_common_prefix(self.ids, t) for t in tokenized] + [inside])
        blocks = [t[shared:] for t in tokenized]
        start = self._prompt_len + shared  # position of every block's first token
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
        if self._prompt_len + boundary + longest > self.context_window:
            raise ContextOverflow(f"a branch does not fit member {self.name!r}'s window")
        return branches

    def draft(self, max_tokens: int, sampler: Sampler) -> Draft:
        """Continue the current text by up to `max_tokens` tokens, appending them."""
        ids, rows, stopped = [], [], False
        for _ in range(max_tokens):
            if self.room <= 0:
                break
            row = self.logprobs([self.n_tokens])[0]
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
        """Forget the sequence and everything computed for it (benchmarks use this so no
        request profits from a cache another one left behind)."""
        self._rewind(0)
        self._seq, self._prompt_len, self._bytes, self._ends = [], 0, b"", []

    def memory_bytes(self) -> int:
        """Bytes this member holds for the current request beyond its weights (the KV cache)."""
        return 0


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
        self._new_cache()

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

    # --- cache and forward ----------------------------------------------------------------

    @property
    def lane(self) -> str:
        device = self.device
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return str(device)

    def memory_bytes(self) -> int:
        total = 0
        for layer in getattr(self._cache, "layers", []):
            for name in ("keys", "values"):
                tensor = getattr(layer, name, None)
                if isinstance(tensor, torch.Tensor):
                    total += tensor.numel() * tensor.element_size()
        return total

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def _new_cache(self) -> None:
        from transformers import DynamicCache

        self._cache = DynamicCache(config=self.model.config)
        self._cached = 0  # positions held by the cache
        self._last_row: torch.Tensor | None = None  # log-probs at position _cached - 1

    def _rewind(self, keep: int) -> None:
        if keep >= self._cached:
            return
        if keep == 0:
            self._new_cache()
            return
        self._cache.crop(keep - self._cached)
        self._cached, self._last_row = keep, None

    def _forward(self, ids: list[int], keep: list[int], raw: bool = False, **extra) -> torch.Tensor:
        """Feed ids after the cache; log-probs (or raw logits) at the given input indices."""
        start = time.perf_counter()
        with torch.no_grad():
            out = self.model(
                input_ids=torch.tensor([ids], device=self.device),
                cache=self._cache,
                use_cache=True,
                logits_to_keep=torch.tensor(keep, device=self.device),
                **extra,
            )
            rows = out.logits[0].float()
            rows = rows if raw else torch.log_softmax(rows, dim=-1)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.calls += 1
        self.seconds += time.perf_counter() - start
        self._cached += len(ids)
        return rows

    def logprobs(self, boundaries: Sequence[int]) -> torch.Tensor:
        self._check_boundaries(boundaries)
        rows = [self._prompt_len + b - 1 for b in boundaries]
        have = self._cached - 1 if self._last_row is not None else None
        got = {have: self._last_row} if have is not None else {}
        missing = sorted({r for r in rows if r != have})
        if missing:
            if missing[0] < self._cached:
                self._rewind(missing[0])
                got, missing = {}, sorted(set(rows))
            start = self._cached
            out = self._forward(self._seq[start : missing[-1] + 1], [r - start for r in missing])
            got.update(zip(missing, out, strict=True))
            self._last_row = got[missing[-1]]
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
        blocks, ends, start = self._continuation_blocks(continuations, base, ends)
        visible = min(self._cached, start - 1)  # cached positions the blocks may attend to
        tail = self._seq[visible:start]  # the prefix's uncached end (>= its last token)
        if not self.takes_block_mask:
            return self._score_each(visible, tail, blocks, ends, raw)
        cached, last_row = self._cached, self._last_row
        flat = tail + [i for block in blocks for i in block]
        n, t = len(flat), len(tail)
        allowed = torch.zeros(n, cached + n, dtype=torch.bool)
        allowed[:, :visible] = True
        allowed[:, cached : cached + t] = True
        allowed[:t, cached : cached + t] = torch.tril(torch.ones(t, t, dtype=torch.bool))
        positions, offset = list(range(visible, start)), t
        for block in blocks:
            k = len(block)
            at = cached + offset
            allowed[offset : offset + k, at : at + k] = torch.tril(
                torch.ones(k, k, dtype=torch.bool)
            )
            positions.extend(range(start, start + k))
            offset += k
        mask = torch.where(allowed, 0.0, torch.finfo(self.dtype).min).to(self.dtype)
        rows = self._forward(
            flat,
            list(range(n)),
            raw=raw,
            attention_mask=mask[None, None].to(self.device),
            position_ids=torch.tensor([positions], device=self.device),
        )
        if visible == cached:  # the tail filled the cache up to the prefix end: keep it
            self._rewind(start)
            self._last_row = rows[t - 1] if not raw else torch.log_softmax(rows[t - 1], -1)
        else:  # the cache reaches past the prefix: drop only what this pass added
            self._rewind(cached)
            self._last_row = last_row
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
            stops = [i for i in self.stop_ids if i < predictors.shape[-1]]
            values = torch.cat([values, torch.logsumexp(predictors[len(block), stops], 0)[None]])
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
        self._last_row = first if not raw else torch.log_softmax(first, -1)
        return scores

    def branch_logprobs(self, boundary: int, branches: Sequence[Sequence[int]]) -> torch.Tensor:
        branches = self._check_branches(boundary, branches)
        if not branches:
            return torch.empty(0, self.vocab.size)
        prefix = self._prompt_len + boundary
        if self._cached < prefix:
            self.logprobs([boundary])  # the cache now reaches the branch point
        if not self.takes_block_mask:  # no mask: the cache must end at the branch point
            self._rewind(prefix)
            rows = []
            for branch in branches:
                rows.append(self._forward(branch, [len(branch) - 1])[0])
                self._rewind(prefix)
            return torch.stack(rows)
        cached, last_row = self._cached, self._last_row
        flat = [i for branch in branches for i in branch]
        n = len(flat)
        allowed = torch.zeros(n, cached + n, dtype=torch.bool)
        allowed[:, :prefix] = True  # cached ids past the branch point stay cached but hidden
        positions, keep, offset = [], [], 0
        for branch in branches:
            k, at = len(branch), cached + offset
            allowed[offset : offset + k, at : at + k] = torch.tril(
                torch.ones(k, k, dtype=torch.bool)
            )
            positions.extend(range(prefix, prefix + k))
            offset += k
            keep.append(offset - 1)
        mask = torch.where(allowed, 0.0, torch.finfo(self.dtype).min).to(self.dtype)
        rows = self._forward(
            flat,
            keep,
            attention_mask=mask[None, None].to(self.device),
            position_ids=torch.tensor([positions], device=self.device),
        )
        self._rewind(cached)
        self._last_row = last_row
        return rows
