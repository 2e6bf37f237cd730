"""The keys and values a model computed, and where they are kept.

`KVStore` is one loaded model's store, shared by every request on it: per layer one tensor of
keys and one of values, [rows, heads, capacity, head_dim]. A request's view of the model holds a
row (a `Slot`) while it lives, and its computed prefix is the first `length` positions of that
row (`KVRow`): writes past `length` are dead, so rolling back, cropping, or undoing a failed
pass only changes a length. A batched pass (`core.batching`) writes each request's new keys at
its own row's positions and attends over a range of rows in place (`PassCache`), with nothing
gathered, padded or copied back. Rows and capacity grow when a request needs more (one copy of
the store, counted in `copies`), never by more than the free memory allows.

A model whose layers mix full attention with a sliding window (Gemma 2 and 3, and others whose
config names each layer's type) keeps every position of every layer in the store too: a batched
pass gives its sliding layers a mask that also hides the keys a window leaves out
(`core.batching`). Models the store cannot serve (an attention kernel without a 4-D mask, a
cache that is not one key/value tensor per layer: linear attention, shared layers) keep each
request's keys and values as a `KVPrefix`: immutable tensors that grow by concatenation and crop
to views. A `KVPrefix` is also what `PrefixPool` keeps of finished requests for later ones whose
prompts share a prefix (an agent loop, a chat resending its history). `block_mask` and
`earlier_rows_mask` are the attention patterns of passes that read a prefix without extending
it; `common_prefix` is the one way the engine compares two id (or byte) sequences.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import os
import threading
import weakref
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .errors import EnsembleBusyError

CHUNK = 256  # positions: a store's capacity grows in whole chunks
_ROW_STEP = 4  # rows: a store grows by at least this many
_GROWTH_SHARE = 0.8  # a grown store may take at most this share of the memory free at the time


def common_prefix(a: Sequence, b: Sequence) -> int:
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


def free_bytes(device: torch.device | str) -> int:
    """Memory free on the device now: a GPU's free memory (with what torch's allocator holds
    unused), else the machine's available RAM."""
    device = str(device)
    if device.startswith("cuda") and torch.cuda.is_available():
        gpu = torch.device(device)
        unused = torch.cuda.memory_reserved(gpu) - torch.cuda.memory_allocated(gpu)
        return torch.cuda.mem_get_info(gpu)[0] + unused
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return 8 << 30


# --- one request's keys and values, outside a store ------------------------------------------


@dataclass(frozen=True)
class KVPrefix:
    """Keys and values for the first `length` ids of a sequence. Never written in place: a
    forward pass makes new tensors (concatenation), a crop makes views, so a state can share
    them with a copy of itself and with other requests (prefix reuse) safely."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    length: int
    last_row: torch.Tensor | None = None  # log-probs at position length - 1

    def crop(self, keep: int) -> KVPrefix | None:
        if keep <= 0:
            return None
        if keep >= self.length:
            return self
        layers = tuple((k[..., :keep, :], v[..., :keep, :]) for k, v in self.layers)
        return KVPrefix(layers, keep)

    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size()
                   for k, v in self.layers)  # fmt: skip


class PrefixPool:
    """Computed prefixes of finished requests, for later requests whose prompts share them (an
    agent loop or a multi-turn chat resends the whole history). Bounded: least recently used
    out beyond `entries` or `max_bytes`."""

    def __init__(self, entries: int = 16, max_bytes: int = 1 << 30) -> None:
        self.entries, self.max_bytes = entries, max_bytes
        self._items: list[tuple[list[int], KVPrefix]] = []  # most recently used last
        self._lock = threading.Lock()

    def put(self, ids: list[int], kv: KVPrefix) -> None:
        if self.entries <= 0 or kv is None:
            return
        with self._lock:
            self._items = [
                (i, k) for i, k in self._items if common_prefix(i, ids) < min(len(i), k.length)
            ]  # an entry this one extends is superseded
            self._items.append((list(ids[: kv.length]), kv))
            while len(self._items) > self.entries or (
                len(self._items) > 1 and sum(k.nbytes() for _, k in self._items) > self.max_bytes
            ):
                self._items.pop(0)

    def take(self, prompt: list[int]) -> KVPrefix | None:
        """The cached keys of the longest prefix of `prompt` held here (shared, not copied)."""
        with self._lock:
            best, found = 0, None
            for index, (ids, kv) in enumerate(self._items):
                n = min(common_prefix(ids, prompt), kv.length)
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


# --- the store ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVLayout:
    """What a model caches per position: per layer (key heads, key dim, value heads, value
    dim), in `dtype`; measured from a real forward pass (`probe_layout`). `sliding_window`:
    the window of the model's sliding-window layers (None: every layer attends to everything);
    such a model takes its attention mask per layer type (`masks`)."""

    layers: tuple[tuple[int, int, int, int], ...]
    dtype: torch.dtype
    sliding_window: int | None = None

    def masks(
        self, full: torch.Tensor, past: Sequence[int], sizes: Sequence[int]
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """The attention mask a pass over store rows gives the model: `full` ([rows, 1, width,
        columns], additive; row b's `sizes[b]` new ids written from column `past[b]`) alone, or
        per layer type, where a sliding layer's new id at column past + i also stops seeing the
        keys `sliding_window` or more columns before it (padding ids keep what they see)."""
        window = self.sliding_window
        if window is None:
            return full
        _, _, width, columns = full.shape
        sliding = full
        if max(past) + width - 1 >= window:  # some new id reaches past its window
            device = full.device
            token = torch.arange(width, device=device)[None, :, None]
            query = torch.tensor(list(past), device=device)[:, None, None] + token
            far = query - torch.arange(columns, device=device) >= window
            far &= token < torch.tensor(list(sizes), device=device)[:, None, None]
            sliding = full.masked_fill(far[:, None], torch.finfo(full.dtype).min)
        return {"full_attention": full, "sliding_attention": sliding}

    @property
    def bytes_per_token(self) -> int:
        size = torch.empty(0, dtype=self.dtype).element_size()
        return sum(kh * kd + vh * vd for kh, kd, vh, vd in self.layers) * size


def probe_layout(model) -> tuple[KVLayout | None, str | None]:
    """The model's per-position cache layout, from one 1-token forward pass through the
    model's own `DynamicCache`; and why a `KVStore` cannot serve the model (None if it can)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    config = model.config
    attention = getattr(config, "_attn_implementation", None) or "eager"
    cache = DynamicCache(config=config)
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            one = torch.ones(1, 1, dtype=torch.long, device=device)
            model(input_ids=one, attention_mask=one, cache=cache, use_cache=True)
    except Exception as error:  # then each request keeps its own cache, its passes alone
        return None, f"a one-token probe pass failed ({type(error).__name__}: {error})"
    kinds = {type(layer) for layer in cache.layers}
    window = _sliding_window(model) if DynamicSlidingWindowLayer in kinds else None
    if DynamicSlidingWindowLayer in kinds and window is None:
        return None, (
            "its sliding-window layers need a mask per layer type, which its config (no "
            "layer_types) or its forward does not take"
        )
    if not kinds <= {DynamicLayer, DynamicSlidingWindowLayer} or any(
        not layer.is_initialized for layer in cache.layers
    ):
        names = ", ".join(sorted(k.__name__ for k in kinds))
        return None, f"its cache is not one plain key/value tensor per layer ({names})"
    layout = KVLayout(
        tuple((k.shape[1], k.shape[3], v.shape[1], v.shape[3])
              for k, v in ((layer.keys, layer.values) for layer in cache.layers)),
        cache.layers[0].keys.dtype,
        window,
    )  # fmt: skip
    if getattr(config, "is_encoder_decoder", False):
        return layout, "it is an encoder-decoder model"
    if len({layer.keys.device for layer in cache.layers}) > 1:
        return layout, "its layers are spread over several devices"
    if attention not in ("eager", "sdpa"):
        return layout, f"its attention kernel ({attention!r}) takes no 4-D attention mask"
    return layout, None


class Slot:
    """One row of a `KVStore`, held by one request view (and by the snapshots of its state).
    The row goes back to the store when `release` is called or when nothing refers to the slot
    any more (a dropped stream, a rolled-back state), whichever comes first."""

    __slots__ = ("index", "_done", "__weakref__")

    def __init__(self, store: KVStore, index: int) -> None:
        self.index: int | None = index
        self._done = weakref.finalize(self, store.released.append, index)

    def release(self) -> None:
        self.index = None
        self._done()  # runs once: the row is back in the store


@dataclass(frozen=True)
class KVRow:
    """A request's keys and values in its model's store: the first `length` positions of its
    slot's row. Immutable like `KVPrefix`: a crop is a shorter length on the same row."""

    slot: Slot
    length: int
    last_row: torch.Tensor | None = None  # log-probs at position length - 1

    def crop(self, keep: int) -> KVRow:
        if keep >= self.length:
            return self
        return KVRow(self.slot, max(keep, 0))


class KVStore:
    """One model's keys and values, for every request on it (see the module docstring).

    Thread-safe: `lock` is held by a batched pass from its growth to its last layer, and by
    every change of rows, capacity or a row's content outside passes. Counters: `copies` (the
    whole store copied on growth, a prefix copied out to or in from a `PrefixPool`), `growths`,
    `held` (rows held by request views)."""

    def __init__(self, layout: KVLayout, device: torch.device, chunk: int = CHUNK) -> None:
        self.layout = layout
        self.device = device
        self.chunk = chunk
        self.lock = threading.RLock()
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.rows = 0
        self.capacity = 0
        self.released: list[int] = []  # rows given back by finalizers (appended lock-free)
        self._free: list[int] = []  # a heap: the lowest free row first keeps rows together
        self.copies = 0
        self.growths = 0

    @property
    def bytes_per_token(self) -> int:
        return self.layout.bytes_per_token

    @property
    def nbytes(self) -> int:
        return self.rows * self.capacity * self.bytes_per_token

    @property
    def held(self) -> int:
        with self.lock:
            self._collect()
            return self.rows - len(self._free)

    def _collect(self) -> None:
        """Rows that slots gave back go to the free heap (under the lock)."""
        while self.released:
            heapq.heappush(self._free, self.released.pop())

    # --- rows and capacity ----------------------------------------------------------------------

    def slot(self, tokens: int = 0) -> Slot:
        """A row for a request, with room for `tokens` positions; EnsembleBusyError when the
        store would have to grow beyond the free memory."""
        with self.lock:
            self._collect()
            self.fit(tokens, self.rows if self._free else self.rows + 1)
            return Slot(self, heapq.heappop(self._free))

    def fit(self, tokens: int, rows: int | None = None) -> None:
        """Grow (under the lock) so that every row has `tokens` positions and there are `rows`
        rows."""
        rows = self.rows if rows is None else rows
        if tokens <= self.capacity and rows <= self.rows:
            return
        new_rows = self.rows if rows <= self.rows else max(rows, self.rows + self.rows // 2,
                                                           self.rows + _ROW_STEP)  # fmt: skip
        new_capacity = max(self.capacity, -(-tokens // self.chunk) * self.chunk)
        need = new_rows * new_capacity * self.bytes_per_token
        free = free_bytes(self.device)
        if need > _GROWTH_SHARE * free:
            raise EnsembleBusyError(
                f"the key/value store of this model needs {need / 2**20:.0f} MiB for "
                f"{new_rows} requests of {new_capacity} tokens, but only {free / 2**20:.0f} MiB "
                "are free; retry later, or lower max_concurrency / max_new_tokens."
            )
        self._grow(new_rows, new_capacity)

    def _grow(self, rows: int, capacity: int) -> None:
        """New tensors with the old ones copied in (when any row is held), put in place at
        once: an interrupt (Ctrl-C) anywhere before leaves the store as it was."""
        keep = len(self._free) < self.rows and self.capacity > 0
        keys, values = [], []
        for index, (kh, kd, vh, vd) in enumerate(self.layout.layers):
            dtype, device = self.layout.dtype, self.device
            keys.append(torch.zeros(rows, kh, capacity, kd, dtype=dtype, device=device))
            values.append(torch.zeros(rows, vh, capacity, vd, dtype=dtype, device=device))
            if keep:
                keys[-1][: self.rows, :, : self.capacity] = self.keys[index]
                values[-1][: self.rows, :, : self.capacity] = self.values[index]
        free = self._free + list(range(self.rows, rows))
        heapq.heapify(free)
        self.__dict__.update(  # one call: no interrupt lands between these
            keys=keys,
            values=values,
            rows=rows,
            capacity=capacity,
            _free=free,
            growths=self.growths + 1,
            copies=self.copies + int(keep),
        )

    # --- prefixes in and out ------------------------------------------------------------------

    def read(self, row: KVRow) -> KVPrefix:
        """A copy of a row's prefix, for a `PrefixPool` (the row itself goes back)."""
        with self.lock:
            n, index = row.length, _index(row)
            rows = slice(index, index + 1)
            layers = tuple((k[rows, :, :n].clone(), v[rows, :, :n].clone())
                           for k, v in zip(self.keys, self.values, strict=True))  # fmt: skip
            self.copies += 1
        return KVPrefix(layers, n)

    def write(self, slot: Slot, prefix: KVPrefix) -> KVRow:
        """A pooled prefix copied into a request's row."""
        with self.lock:
            self.fit(prefix.length)
            index, n = slot.index, prefix.length
            for (k, v), (pk, pv) in zip(zip(self.keys, self.values, strict=True), prefix.layers,
                                        strict=True):  # fmt: skip
                k[index, :, :n] = pk[0]
                v[index, :, :n] = pv[0]
            self.copies += 1
        return KVRow(slot, n)

    def pass_cache(self, lo: int, hi: int, columns: int, writes: Sequence[tuple]):
        """The transformers `Cache` of one batched pass over rows lo..hi-1 (`PassCache`)."""
        return _pass_cache_class()(self, lo, hi, columns, writes)


def _sliding_window(model) -> int | None:
    """The window of a model with sliding-window layers, where the store can serve it: its
    config names each layer's type, and its forward takes a mask per type (a one-token probe
    with such a mask runs). None otherwise."""
    from transformers import DynamicCache

    config = model.config
    types = set(getattr(config, "layer_types", None) or ())
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or not types:
        return None
    if not types <= {"full_attention", "sliding_attention"}:
        return None
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    zero = torch.zeros(1, 1, 1, 1, dtype=dtype, device=device)
    try:
        with torch.no_grad():
            model(
                input_ids=torch.ones(1, 1, dtype=torch.long, device=device),
                attention_mask={"full_attention": zero, "sliding_attention": zero},
                cache=DynamicCache(config=config),
                use_cache=True,
            )
    except Exception:  # a forward that builds its own masks: each request's passes alone
        return None
    return window


def _index(row: KVRow) -> int:
    index = row.slot.index
    if index is None:
        raise RuntimeError("a released key/value row was used again")
    return index


class _Layer:
    """One layer of a pass's `Cache` (what the model's attention calls `update` on)."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    is_initialized = True
    supports_early_init = False

    def __init__(self, cache, index: int) -> None:
        self.cache, self.index = cache, index

    def update(self, keys: torch.Tensor, values: torch.Tensor, *args, **kwargs):
        return self.cache.write(self.index, keys, values)

    def get_seq_length(self) -> int:
        return self.cache.past

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.columns, 0

    def get_max_length(self) -> int:
        return -1


@functools.cache
def _pass_cache_class() -> type:
    """`PassCache`, a subclass of transformers' `Cache` (built on first use: importing
    transformers' cache module takes seconds, and `import core` does not need it)."""
    from transformers.cache_utils import Cache

    class PassCache(Cache):
        """The `Cache` of one batched pass over rows lo..hi-1 of a `KVStore`.

        `writes` holds (row, past, count, batch index) per request in the pass: each layer
        writes that request's `count` new keys and values at its row's positions past ..
        past + count - 1, then returns the rows' first `columns` positions as views of the
        store (the attention mask hides what a row must not see: positions past its own
        length, and its dead ones)."""

        def __init__(self, store: KVStore, lo: int, hi: int, columns: int, writes) -> None:
            super().__init__(layers=[_Layer(self, i) for i in range(len(store.layout.layers))])
            self.store, self.span, self.columns = store, slice(lo, hi), columns
            self.past = max(past for _, past, _, _ in writes)
            self.single = writes[0] if len(writes) == 1 else None
            if self.single is None:  # one index per new token: its row, position, source
                rows, positions, batch, tokens = [], [], [], []
                for row, past, count, b in writes:
                    rows += [row] * count
                    positions += range(past, past + count)
                    batch += [b] * count
                    tokens += range(count)
                index = torch.tensor([rows, positions, batch, tokens], device=store.device)
                self.rows_at, self.positions, self.batch, self.tokens = index

        def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor):
            stored_keys, stored_values = self.store.keys[layer], self.store.values[layer]
            if self.single is not None:
                row, past, count, b = self.single
                stored_keys[row, :, past : past + count] = keys[b, :, :count]
                stored_values[row, :, past : past + count] = values[b, :, :count]
            else:
                at = (self.rows_at, slice(None), self.positions)
                source = (self.batch, slice(None), self.tokens)
                stored_keys[at] = keys[source]
                stored_values[at] = values[source]
            return (stored_keys[self.span, :, : self.columns],
                    stored_values[self.span, :, : self.columns])  # fmt: skip

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return self.past

    return PassCache


# --- attention patterns -------------------------------------------------------------------------


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


def earlier_rows_mask(past: int, tail: int, rows: Sequence[int]) -> torch.Tensor:
    """[n, past + n] for a pass that feeds `tail` new ids after `past` cached positions, then
    the id at each of `rows` (positions already cached) once more, to get that position's
    next-token distribution back without writing over the cache: the tail sees the whole cache
    and itself causally, each repeated id sees the cache before its position and itself."""
    n = tail + len(rows)
    allowed = torch.zeros(n, past + n, dtype=torch.bool)
    allowed[:tail, :past] = True
    allowed[:tail, past : past + tail] = torch.ones(tail, tail, dtype=torch.bool).tril()
    for i, row in enumerate(rows):
        allowed[tail + i, :row] = True
        allowed[tail + i, past + tail + i] = True
    return allowed
