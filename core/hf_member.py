"""The in-process backend: a Hugging Face causal LM on this machine's CPU or GPU.

Its forward passes go through the model's batcher (`core.batching`), so concurrent requests on
one model share passes. Its computed keys and values live in the model's `KVStore` (`core.kv`):
the request's `SequenceState` holds a `KVRow` (its row, and how many positions of it are valid),
so a snapshot of the state is a length and putting it back undoes any pass. No pass writes
below a row's length: a pass that reads a prefix without extending it (verify-in-line scoring,
branches, the distribution after an earlier cached position) writes past it, into positions
that stay dead. A model the store cannot serve keeps a `KVPrefix` per request instead. Finished
requests leave their prefixes in the member's `PrefixPool` (copied out of the store once).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .batching import Pass, batcher_for
from .kv import KVPrefix, KVRow, PrefixPool, block_mask, earlier_rows_mask
from .local import Local, single_token_ids, written_stops
from .member import Member, RequestState
from .vocab import Vocab

_SCORING_ROOM = 64  # positions a request's row keeps free past its text for scoring passes


@dataclass
class HFRequestState(RequestState):
    """A request's state in an in-process member: the member's own plus how many prompt ids
    its passes computed (prefix reuse saves these)."""

    prefilled: int = 0


class HFMember(Member):
    """An in-process Hugging Face causal LM with its tokenizer, device, dtype and KV cache."""

    state: HFRequestState
    state_type = HFRequestState

    def __init__(self, name: str, model, tokenizer, stop: Sequence[str] = ()) -> None:
        """`stop`: the strings this member's chat template ends a turn with (`Local.stop`);
        those that are one control token of its vocabulary join its stop ids."""
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
        self.stop_strings = tuple(stop)
        self.stop_texts = written_stops(tokenizer, stop)
        self.stop_ids = (
            frozenset(self.vocab.special_ids) | frozenset(eos) | single_token_ids(tokenizer, stop)
        )
        config = model.config.get_text_config()
        self.context_window = int(
            getattr(config, "max_position_embeddings", None)
            or getattr(config, "n_positions", None)
            or getattr(config, "n_ctx", None)
            or 2048
        )
        # the attention kernel transformers chose ("sdpa", "eager", "flash_attention_2", ...)
        self.attention = getattr(model.config, "_attn_implementation", "eager") or "eager"
        self.takes_block_mask = self.attention in ("eager", "sdpa")
        self.batcher = batcher_for(model)
        self.store = self.batcher.store  # None: each request keeps its own KVPrefix
        self._pool = PrefixPool()  # shared by every request on this member, on purpose
        self.files: tuple[tuple[str, int, int], ...] | None = None  # set by `load`

    @classmethod
    def load(
        cls,
        source: str | os.PathLike | Local,
        *,
        device: str | torch.device | None = "auto",
        dtype: str | torch.dtype | None = "auto",
        name: str | None = None,
        use_safetensors: bool = True,
        attn_implementation: str | None = None,
    ) -> HFMember:
        """A member from a model directory, a GGUF file, an Ollama model name or a hub id, or
        from a `Local(...)` spec, whose own options (chat template, stop strings, device,
        dtype, name) win over the arguments here."""
        from .few_rows import use_few_row_kernels
        from .gguf import is_gguf
        from .loading import load_config, load_gguf, load_model, load_tokenizer, source_files
        from .memory import check_all_fit

        spec, path, resolved, resolved_dtype = _resolved(source, device, dtype, use_safetensors)
        check_all_fit([_footprint(path, resolved, resolved_dtype)])
        if is_gguf(path):
            model, tokenizer = load_gguf(path, resolved, resolved_dtype, attn_implementation)
        else:
            load_config(path)
            model = load_model(path, resolved, resolved_dtype, use_safetensors, attn_implementation)
            tokenizer = load_tokenizer(path)
        use_few_row_kernels(model)
        template = spec.template_text()
        if template is not None:
            tokenizer.chat_template = template
        member = cls(spec.name or name or spec.label, model, tokenizer, spec.stop)
        member.files = source_files(path)
        return member

    @property
    def prefilled(self) -> int:
        """Prompt ids computed for the current request (prefix reuse saves these)."""
        return self.state.prefilled

    # --- cache and forward ----------------------------------------------------------------

    @property
    def fingerprint(self) -> dict[str, Any] | None:
        if self.files is None or type(self) is not HFMember:  # built from a model in memory,
            return None  # or a subclass computing what it likes: no file says what it does
        return {
            "name": self.name,
            "files": [list(f) for f in self.files],
            "chat_template": self.tokenizer.chat_template,
            "stop": list(self.stop_strings),
            "dtype": str(self.dtype),
            "device": self.device.type,
        }

    @property
    def runs_on(self) -> str:
        device = self.device
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return str(device)

    @property
    def _kv(self) -> KVRow | KVPrefix | None:
        return self.state.sequence.cache

    @property
    def _cached(self) -> int:
        """Positions the cache holds."""
        return self._kv.length if self._kv is not None else 0

    @property
    def kv_bytes_per_token(self) -> int:
        """Key/value bytes one position of one request takes on this model (measured)."""
        layout = self.batcher.layout
        return layout.bytes_per_token if layout is not None else 0

    def memory_bytes(self) -> int:
        kv = self._kv
        if isinstance(kv, KVRow):
            return kv.length * self.kv_bytes_per_token
        return kv.nbytes() if kv is not None else 0

    def serve(self, threads) -> None:
        self.batcher.serve(threads)

    def reserve(self, new_tokens: int) -> None:
        """A row in the store with room for the prompt and `new_tokens` more (plus what
        scoring passes write past the end), claimed now rather than mid-request."""
        if self.store is not None:
            need = len(self.state.sequence.seq) + new_tokens
            need = min(need, self.context_window) + _SCORING_ROOM
            self._store_row(need)

    def keep_prefix(self) -> None:
        kv = self._kv
        if kv is not None and kv.length and self.state.reuse:
            stored = self.store.read(kv) if isinstance(kv, KVRow) else kv
            self._pool.put(self.state.sequence.seq, stored)
        self.release()

    def release(self) -> None:
        kv = self._kv
        if isinstance(kv, KVRow):
            kv.slot.release()
            self.state.sequence.cache = None

    def _reuse(self, prompt: list[int]) -> None:
        if self._cached == 0 and self.state.reuse:
            found = self._pool.take(prompt)  # a KVPrefix: copied into a row at the first pass
            if found is not None:
                self.state.sequence.cache = found

    def _rewind(self, keep: int) -> None:
        if self._kv is not None and keep < self._kv.length:
            self.state.sequence.cache = self._kv.crop(keep)

    def _store_row(self, tokens: int = 0) -> KVRow:
        """The request's row in the store (claimed, and a pooled prefix copied in, on first
        use), with room for `tokens` positions."""
        kv = self._kv
        if not isinstance(kv, KVRow):
            slot = self.store.slot(max(tokens, self._cached))
            kv = self.store.write(slot, kv) if kv is not None else KVRow(slot, 0)
            self.state.sequence.cache = kv
        if tokens > self.store.capacity:
            with self.store.lock:
                self.store.fit(tokens)
        return kv

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
        (None: causal); `positions`: their position ids (None: right after the cache). The
        cache then holds the ids too (crop it to drop them)."""
        self._check_cancelled()
        start = time.perf_counter()
        cached = self._cached
        job = Pass(ids=list(ids), keep=list(keep), past_len=cached, allowed=allowed,
                   positions=positions, raw=raw)  # fmt: skip
        if self.store is not None:
            row = self._store_row()
            job.row = row.slot.index
            self.batcher.run(job)
            self.state.sequence.cache = KVRow(row.slot, cached + len(ids))
        else:
            job.past = self._kv.layers if self._kv is not None else None
            self.batcher.run(job)
            self.state.sequence.cache = KVPrefix(job.present, cached + len(ids))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.state.calls += 1
        self.state.seconds += time.perf_counter() - start
        return job.rows

    def _materialised(self) -> KVRow | KVPrefix | None:
        """The cache, in the store when there is one (a pass's result is then cropped back to
        exactly this value)."""
        if self.store is not None and self._kv is not None:
            return self._store_row()
        return self._kv

    def _set_last_row(self, row: torch.Tensor | None) -> None:
        kv = self._kv
        if isinstance(kv, KVRow):
            self.state.sequence.cache = KVRow(kv.slot, kv.length, row)
        elif kv is not None:
            self.state.sequence.cache = KVPrefix(kv.layers, kv.length, row)

    def _model_logprobs(self, boundaries: Sequence[int]) -> torch.Tensor:
        self._check_boundaries(boundaries)
        with self._transaction("next-token distributions"):
            state = self.state
            prompt_len, seq = state.sequence.prompt_len, state.sequence.seq
            rows = [prompt_len + b - 1 for b in boundaries]
            kv = self._kv
            have = kv.length - 1 if kv is not None and kv.last_row is not None else None
            got = {have: kv.last_row} if have is not None else {}
            missing = sorted({r for r in rows if r != have})
            if missing:
                cached = self._cached
                earlier = [r for r in missing if r < cached]  # their keys are cached already
                end = max(missing[-1] + 1, cached)
                tail = seq[cached:end]
                if earlier:  # their ids again, after the tail, seeing only what preceded them
                    feed = tail + [seq[r] for r in earlier]
                    allowed = earlier_rows_mask(cached, len(tail), earlier)
                    positions = [*range(cached, end), *earlier]
                else:
                    feed, allowed, positions = tail, None, None
                keep = [r - cached for r in missing if r >= cached]
                keep += range(len(tail), len(feed))
                out = self._forward(feed, keep, allowed=allowed, positions=positions)
                self._rewind(end)  # the repeated ids' keys are dead
                state.prefilled += max(0, min(prompt_len, end) - cached)
                done = [r for r in missing if r >= cached] + earlier
                got.update(zip(done, out.unbind(0), strict=True))
                if end - 1 in got:
                    self._set_last_row(got[end - 1])
            if len(rows) == 1:
                return got[rows[0]][None]
            return torch.stack([got[r] for r in rows])

    def _continuation_scores(
        self, blocks: list[list[int]], ends: list[bool], start: int, raw: bool
    ) -> list[torch.Tensor]:
        """Verify-in-line: all continuations after the cached prefix in ONE forward pass, each
        seeing the prefix and its own earlier tokens only (block mask, positions restarting at
        the prefix end). Cached ids beyond the prefix (a drafter's own draft) are hidden by the
        mask and stay cached; the cache is otherwise returned to the prefix afterwards."""
        with self._transaction("verify-in-line scoring"):
            visible = min(self._cached, start - 1)  # cached positions the blocks may see
            tail = self.state.sequence.seq[visible:start]  # the prefix's uncached end (>= last id)
            if not self.takes_block_mask:
                return self._score_each(visible, tail, blocks, ends, raw)
            kv = self._materialised()
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
                self.state.sequence.cache = kv
            scores, offset = [], t
            for block, end in zip(blocks, ends, strict=True):
                k = len(block)
                predictors = torch.cat([rows[t - 1 : t], rows[offset : offset + k]])
                scores.append(self._block_scores(start, block, end, predictors, raw))
                offset += k
            return scores

    def _score_each(
        self, visible: int, tail: list[int], blocks: list[list[int]], ends: list[bool], raw: bool
    ) -> list[torch.Tensor]:
        """Fallback for attention kernels that cannot take a block mask: one pass per
        continuation on the same cached prefix (same numbers, more passes). Without a mask the
        cache must end at the prefix, so a drafter's cached draft is dropped (its ids stay).
        Such kernels never have a store: their per-request caches are immutable, so the passes
        written over a dropped draft here cannot reach a rolled-back state."""
        self._rewind(visible)
        start, first, scores = visible + len(tail), None, []
        for block, end in zip(blocks, ends, strict=True):
            feed = block if first is not None else tail + block
            rows = self._forward(feed, list(range(len(feed))), raw=raw) if feed else None
            if first is None:
                first, rows = rows[len(tail) - 1], rows[len(tail) :]
            self._rewind(start)
            predictors = first[None] if rows is None else torch.cat([first[None], rows])
            scores.append(self._block_scores(start, block, end, predictors, raw))
        if first is None:  # no continuations: nothing was computed
            return scores
        self._set_last_row(first if not raw else torch.log_softmax(first, -1))
        return scores

    def _model_branch_logprobs(
        self, boundary: int, branches: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        with self._transaction("branch scoring"):
            branches = self._check_branches(boundary, branches)
            if not branches:
                return torch.empty(0, self.vocab.size)
            prefix = self.state.sequence.prompt_len + boundary
            if self._cached < prefix:
                self._model_logprobs([boundary])  # the cache now reaches the branch point
            if not self.takes_block_mask:  # no mask: the cache must end at the branch point
                self._rewind(prefix)
                rows = []
                for branch in branches:
                    rows.append(self._forward(branch, [len(branch) - 1])[0])
                    self._rewind(prefix)
                return torch.stack(rows)
            kv, cached = self._materialised(), self._cached
            flat = [i for branch in branches for i in branch]
            allowed = block_mask(cached, prefix, 0, [len(b) for b in branches])
            positions, keep, offset = [], [], 0
            for branch in branches:
                positions.extend(range(prefix, prefix + len(branch)))
                offset += len(branch)
                keep.append(offset - 1)
            rows = self._forward(flat, keep, allowed=allowed, positions=positions)
            self.state.sequence.cache = kv  # what this pass added is dropped
            return rows


def _resolved(
    source: str | os.PathLike | Local,
    device: str | torch.device | None,
    dtype: str | torch.dtype | None,
    use_safetensors: bool,
) -> tuple[Local, str, torch.device, torch.dtype]:
    """A member's spec, checked path, device and dtype (a Local's own options winning)."""
    from .loading import check_model_source, resolve_device, resolve_dtype

    spec = (source if isinstance(source, Local) else Local(source)).resolved()
    path = check_model_source(spec.path, use_safetensors)
    resolved = resolve_device(spec.device or device)
    return spec, path, resolved, resolve_dtype(spec.dtype or dtype, resolved)


def check_members_fit(
    sources: Sequence[str | os.PathLike | Local],
    devices: Sequence[str | torch.device | None],
    dtypes: Sequence[str | torch.dtype | None],
    use_safetensors: bool,
) -> None:
    """Every member's weights, summed per device, against its free memory, before the first
    member loads: members that fit one by one but not together are refused at once, not after
    minutes of loading the first ones."""
    from .memory import check_all_fit

    loads = []
    for source, device, dtype in zip(sources, devices, dtypes, strict=True):
        _, path, resolved, resolved_dtype = _resolved(source, device, dtype, use_safetensors)
        loads.append(_footprint(path, resolved, resolved_dtype))
    check_all_fit(loads)


def _footprint(
    path: str, device: torch.device, dtype: torch.dtype
) -> tuple[str, int, torch.device, torch.dtype]:
    """What a load asks of its device's memory: the weights a model's file headers hold (a GGUF
    file's as dequantized), in the dtype they load in."""
    from .loading import weights_elements

    return path, weights_elements(path), device, dtype
