"""Forward passes of concurrent requests on one loaded model, run as one batched pass.

A forward pass costs nearly the same for one row as for eight (on a CPU the per-call work of the
layers dominates a small model; on a GPU a decode step is bound by reading the weights), so
requests that share a model gain most by sharing its passes. Their keys and values live in the
model's `KVStore` (`core.kv`), one row per request: a batched pass runs over a range of rows in
place, each request's new tokens written at its own row's positions, one 4-D attention mask
built from the rows' lengths keeping each request to its own past (and, for verify-in-line
scoring, to the blocks it may see), position ids per row. Nothing is padded, gathered or copied
back. A model the store cannot serve (`KVStore` explains which) runs each pass alone, on the
request's own `KVPrefix`.

No thread is added: the first request thread to arrive runs the batch (the leader), later
arrivals wait; when the leader's own pass is done it hands its role to a waiting thread. Before
it runs, the leader waits for the request threads that are still computing their next pass in
Python, for a bounded time: twice the longer of a mean pass and a mean stretch of a request's
Python between two passes. A batch that waited for them costs little more than a lone pass, a
batch that left them out costs them a whole pass; and while the leader waits, the interpreter
runs their Python, which one interpreter lock would serialise anyway. A lone request has nobody
to wait for, and runs its pass at once, in its own thread.

Which threads a leader waits for is scoped to the models that share them: each ensemble keeps
its own `RequestThreads` (its admission marks a thread that runs one of its requests; a thread
in a batcher, or waiting for a slot, is parked), and a model's batcher waits for the request
threads of the ensembles that use it (`Batcher.serve`), never for another ensemble's. Nothing
here changes a process-wide setting.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from .kv import KVStore, probe_layout

Layers = tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer: keys, values [1, H, T, D]

_MAX_ROWS = 32  # rows per batched pass
_TRIANGLE = 512  # new ids per pass whose causal triangle is kept for the next passes
_SIMILAR = 8  # passes batch together when their new-token counts are within 2x (or <= this)
# A leader waits for computing threads at most _PATIENCE times the longer of a mean pass of its
# model and a mean stretch of Python between two passes of a request, within these bounds:
_PATIENCE = 2.0
_PATIENCE_FLOOR = 0.0005  # seconds (before anything was timed)
_PATIENCE_CAP = 0.05  # seconds (a thread busy elsewhere, e.g. with a remote member, is not waited
# for longer than this)


class RequestThreads:
    """How many of one ensemble's request threads are computing right now, outside every
    batcher: the passes a leader may still expect from them. Threads that never said they run
    one of its requests (a lane's worker, a direct `Member` call, another ensemble's requests)
    are not counted here, and never waited for."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.computing = 0
        self.gap_seconds = 0.0  # running mean of a request's Python between two waits
        self._gaps = 0
        self._local = threading.local()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """This thread computes one of the ensemble's requests (its admission wraps each step
        of a request stream)."""
        local = self._local
        outer = getattr(local, "depth", 0)
        counted = False
        previous = getattr(_thread, "threads", None)
        try:
            local.depth = outer + 1
            local.since = time.perf_counter()
            _thread.threads = self
            if outer == 0:
                self._add(1)
                counted = True
            yield
        finally:
            local.depth = outer
            _thread.threads = previous
            if counted:
                self._add(-1)

    def park(self) -> Park:
        """This thread waits (for a pass, or for a request slot): nobody should wait for it
        until its `Park` is released."""
        local = self._local
        if getattr(local, "depth", 0) == 0 or getattr(local, "parked", False):
            return Park(self, False)  # not a request thread, or already parked
        local.parked = True
        self._add(-1, time.perf_counter() - local.since)
        return Park(self, True)

    def unpark(self, park: Park) -> None:
        """The parked thread goes on computing (its park released, if nobody did yet)."""
        if park.counted:
            park.release()
            self._local.parked = False
            self._local.since = time.perf_counter()

    @contextlib.contextmanager
    def parked(self) -> Iterator[None]:
        park = self.park()
        try:
            yield
        finally:
            self.unpark(park)

    def _add(self, delta: int, gap: float | None = None) -> None:
        with self.changed:
            self._change(delta, gap)

    def _change(self, delta: int, gap: float | None = None) -> None:
        """(Under `changed`.) A waiting leader is woken when nobody computes any more."""
        self.computing += delta
        if gap is not None:
            self._gaps += 1
            self.gap_seconds += (gap - self.gap_seconds) / min(self._gaps, 16)
        if self.computing == 0:
            self.changed.notify_all()

    def wait_for_passes(self, patience: float) -> None:
        """Until no request thread computes outside a batcher, for at most `patience` seconds."""
        deadline = time.perf_counter() + patience
        with self.changed:
            while self.computing > 0:
                left = deadline - time.perf_counter()
                if left <= 0:
                    return
                self.changed.wait(left)


class Park:
    """One wait of a request thread. Released once, by whoever comes first: the leader that
    finished the thread's pass (so the next leader already counts the thread as computing, though
    it has not woken yet) or the thread itself when it goes on."""

    __slots__ = ("_threads", "counted", "_held")

    def __init__(self, threads: RequestThreads | None, counted: bool) -> None:
        self._threads = threads
        self.counted = counted
        self._held = counted

    def release(self) -> None:
        if not self._held:
            return
        with self._threads.changed:
            if self._held:
                self._held = False
                self._threads._change(1)


_NO_PARK = Park(None, False)  # the wait of a thread that runs no request
_thread = threading.local()  # .threads: the RequestThreads whose request this thread runs


def running_threads() -> RequestThreads | None:
    """The request threads the calling thread counts among (None: it runs no request)."""
    return getattr(_thread, "threads", None)


@dataclass
class Pass:
    """One forward pass a request asks for: feed `ids` after `past_len` cached positions, held in
    the store's `row` (their keys and values are written there, at past_len onwards) or, for a
    model without a store, in `past` (the grown tensors come back in `present`).

    `allowed[i, j]` says whether new token i may attend to position j of past + new (None: plain
    causal attention over everything); `positions` are the new tokens' position ids (None: right
    after the past); `keep` are the indices of the new tokens whose next-token rows come back."""

    ids: list[int]
    keep: list[int]
    row: int | None = None  # the request's row in the model's KVStore (None: `past` instead)
    past: Layers | None = None
    past_len: int = 0
    allowed: torch.Tensor | None = None
    positions: list[int] | None = None
    raw: bool = False
    # filled in by the batcher
    rows: torch.Tensor | None = field(default=None, repr=False)
    present: Layers | None = field(default=None, repr=False)


def _cache(past: Layers | None):
    """A DynamicCache over existing tensors (no copy: a DynamicCache only ever concatenates, so
    the tensors given here are never written)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache()
    for keys, values in past or ():
        layer = DynamicLayer()
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        cache.layers.append(layer)
    return cache


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)


class Batcher:
    """Runs `Pass`es on one model; concurrent passes are batched. Thread-safe."""

    def __init__(self, model) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        # what the model caches per position, and why a store cannot serve it (None: it can)
        self.layout, self.unsupported = probe_layout(model)
        self.store = None if self.unsupported else KVStore(self.layout, self.device)
        self.batched = self.store is not None
        self._lock = threading.Lock()
        self._lane = _lane_for(self.device)
        self._queue: list[_Ticket] = []
        self._busy = False
        self._pass_seconds = 0.0  # running mean duration of a forward pass
        self._served: weakref.WeakSet[RequestThreads] = weakref.WeakSet()
        self._triangle_mask: torch.Tensor | None = None  # `_triangle`, grown on demand
        self.batches = 0  # passes run (a batched pass counts once)
        self.rows = 0  # requests' passes served

    def serve(self, threads: RequestThreads) -> None:
        """Requests running on `threads` (one ensemble's) use this model: a leader waits for
        them while they compute their next pass."""
        with self._lock:
            self._served.add(threads)

    # --- the combining protocol ----------------------------------------------------------------
    # Every change of the queue and of who leads happens under the lock, and a thread's own
    # bookkeeping is in `finally` blocks that an interrupt (Ctrl-C lands in whichever thread runs
    # the main loop, a leader included) cannot skip: an interrupted waiter leaves the queue and
    # passes on a leader's role it was given; an interrupted leader puts the others' passes back.

    def run(self, job: Pass) -> Pass:
        threads = running_threads()
        park = threads.park() if threads is not None else _NO_PARK
        try:
            return self._run_ticket(_Ticket(job, park))
        finally:
            if threads is not None:
                threads.unpark(park)

    def _run_ticket(self, ticket: _Ticket) -> Pass:
        try:
            with self._lock:
                self._queue.append(ticket)
                if not self._busy:
                    self._busy = ticket.leads = True
            if not ticket.leads:
                ticket.ready.wait()
            if ticket.leads:
                self._serve(ticket)
            return ticket.result()
        finally:
            with self._lock:
                if ticket in self._queue:  # interrupted while waiting
                    self._queue.remove(ticket)
                if ticket.leads:
                    ticket.leads = False
                    self._pass_lead()

    def _pass_lead(self) -> None:
        """The next waiting thread leads (called under the lock)."""
        if self._queue:
            successor = self._queue[0]
            successor.leads = True
            successor.ready.set()
        else:
            self._busy = False

    def _serve(self, own: _Ticket) -> None:
        """Run batches until the leader's own pass is done (its pass is always in the first).

        Passes on one device take turns (`_lane_for`): models on one CPU or one GPU gain
        nothing from running at once, and on a CPU two concurrent passes fight for the one
        interpreter lock at every tensor operation. Taking turns also lines requests up: while
        one model's pass runs, the requests heading for another model gather in its queue."""
        while not own.finished:
            batch: list[_Ticket] = []
            try:
                with self._lane:
                    self._gather()
                    with self._lock:
                        batch = self._pick(own)
                        for ticket in batch:
                            self._queue.remove(ticket)
                    self._execute(batch)
            except BaseException:  # an interrupt in the leader: the others' passes go back
                with self._lock:
                    back = [t for t in batch if not (t.finished or t is own or t in self._queue)]
                    self._queue[:0] = back
                raise

    def _gather(self) -> None:
        """Wait while other request threads of the ensembles this model serves still compute
        their next pass (they may come here), within the patience bounds."""
        if not self.batched:
            return
        with self._lock:
            served = list(self._served)
        if not any(threads.computing for threads in served):
            return
        longer = max(self._pass_seconds, *(threads.gap_seconds for threads in served))
        patience = min(_PATIENCE_CAP, max(_PATIENCE_FLOOR, _PATIENCE * longer))
        deadline = time.perf_counter() + patience
        for threads in served:
            threads.wait_for_passes(deadline - time.perf_counter())

    def _pick(self, own: _Ticket) -> list[_Ticket]:
        """The leader's own pass first, then others of a similar size whose rows lie near its
        own: a pass runs over the range of rows between its lowest and highest, so at least
        half of that range must be rows it serves."""
        if not self.batched:
            return [own]
        n, lo, hi = len(own.job.ids), own.job.row, own.job.row
        batch = [own]
        near = sorted(
            (t for t in self._queue if t is not own and _similar(n, len(t.job.ids))),
            key=lambda t: abs(t.job.row - own.job.row),
        )
        for ticket in near:
            if len(batch) == _MAX_ROWS:
                break
            low, high = min(lo, ticket.job.row), max(hi, ticket.job.row)
            if high - low + 1 <= 2 * (len(batch) + 1):
                batch.append(ticket)
                lo, hi = low, high
        return batch

    def _execute(self, batch: list[_Ticket]) -> None:
        try:
            self._run(batch)
            for ticket in batch:
                ticket.finish()
        except Exception as error:
            if len(batch) == 1:
                batch[0].fail(error)
                return
            for ticket in batch:  # find out whose pass fails: each alone
                try:
                    self._run([ticket])
                    ticket.finish()
                except Exception as alone:
                    ticket.fail(alone)

    def _run(self, batch: list[_Ticket]) -> None:
        if self.batched:
            self._run_rows([t.job for t in batch])
        else:
            self._run_one(batch[0].job)

    # --- running passes ------------------------------------------------------------------------

    def _call(self, ids: torch.Tensor, cache, keep: list[int], **extra) -> torch.Tensor:
        start = time.perf_counter()
        width = ids.shape[-1]
        if keep == list(range(width - len(keep), width)):  # the last rows: a plain slice
            to_keep: int | torch.Tensor = len(keep)
        else:
            to_keep = torch.tensor(keep, device=self.device)
        with torch.no_grad():
            out = self.model(
                input_ids=ids.to(self.device),
                cache=cache,
                use_cache=True,
                logits_to_keep=to_keep,
                **extra,
            )
        logits = out.logits.float()
        self.batches += 1
        seconds = time.perf_counter() - start
        self._pass_seconds += (seconds - self._pass_seconds) / min(self.batches, 16)
        return logits

    def _run_one(self, job: Pass) -> None:
        cache, extra = _cache(job.past), {}
        if job.allowed is not None:
            extra["attention_mask"] = _additive(job.allowed, self.dtype)[None, None].to(self.device)
        if job.positions is not None:
            extra["position_ids"] = torch.tensor([job.positions], device=self.device)
        logits = self._call(torch.tensor([job.ids]), cache, job.keep, **extra)[0]
        job.rows = logits if job.raw else torch.log_softmax(logits, dim=-1)
        job.present = tuple((layer.keys, layer.values) for layer in cache.layers)
        self.rows += 1

    def _run_rows(self, jobs: Sequence[Pass]) -> None:
        """One pass over the store's rows lo..hi-1 for the jobs' requests, in place. Each
        request's new ids fill the start of its row of the batch; the rest of the row is
        padding, as are rows between requests (another request's, or free), which see one
        position and write nothing."""
        store = self.store
        lo, hi = min(j.row for j in jobs), max(j.row for j in jobs) + 1
        width = max(len(j.ids) for j in jobs)
        columns = max(j.past_len + len(j.ids) for j in jobs)
        ids = [[0] * width for _ in range(hi - lo)]
        positions = [[0] * width for _ in range(hi - lo)]
        past, sizes, writes = [0] * (hi - lo), [0] * (hi - lo), []
        for job in jobs:
            b, n = job.row - lo, len(job.ids)
            own = job.positions or range(job.past_len, job.past_len + n)
            ids[b][:n] = job.ids
            positions[b] = [*own, *[own[-1]] * (width - n)]
            past[b], sizes[b] = job.past_len, n
            writes.append((job.row, job.past_len, n, b))
        keep = sorted({k for job in jobs for k in job.keep})
        at = {k: i for i, k in enumerate(keep)}
        if len(jobs) == 1 and jobs[0].allowed is None:  # one plain pass: causal after its past
            mask = self._plain_mask(past[0], width)
        else:
            allowed = _rows_mask(jobs, lo, past, sizes, width, columns, self.device)
            mask = _additive(allowed, self.dtype)
        mask = store.layout.masks(mask, past, sizes)  # per layer type where windows differ
        with store.lock:
            store.fit(columns)
            logits = self._call(
                torch.tensor(ids),
                store.pass_cache(lo, hi, columns, writes),
                keep,
                attention_mask=mask,
                position_ids=torch.tensor(positions, device=self.device),
            )
        if len(jobs) > 1:
            logits = logits[[job.row - lo for job in jobs]]
        soft = None if all(j.raw for j in jobs) else torch.log_softmax(logits, dim=-1)
        for b, job in enumerate(jobs):  # a lone pass's rows are the whole result (no copy)
            rows = logits if job.raw else soft
            alone = len(jobs) == 1 and job.keep == keep
            job.rows = rows[b] if alone else rows[b, [at[k] for k in job.keep]]
        self.rows += len(jobs)

    def _plain_mask(self, past: int, width: int) -> torch.Tensor:
        """[1, 1, width, past + width]: what `_rows_mask` gives one plain pass (each new id sees
        the past and the new ids up to itself), built from a cached triangle."""
        mask = torch.zeros(1, 1, width, past + width, dtype=self.dtype, device=self.device)
        if width > 1:
            mask[0, 0, :, past:] = self._triangle(width)
        return mask

    def _triangle(self, width: int) -> torch.Tensor:
        """The additive causal mask of `width` new ids among themselves (cached up to
        `_TRIANGLE` ids)."""
        cached = self._triangle_mask
        if cached is not None and cached.shape[0] >= width:
            return cached[:width, :width]
        allowed = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
        triangle = _additive(allowed, self.dtype)
        if width <= _TRIANGLE:
            self._triangle_mask = triangle
        return triangle


def _rows_mask(jobs, lo, past, sizes, width, columns, device) -> torch.Tensor:
    """[rows, 1, width, columns]: which positions each new id of a pass over store rows may
    attend to. A plain row's new id i sees its row's first past + i + 1 positions (its past,
    then its new ids causally: they are written right after the past); padding sees position 0
    only. Rows with their own pattern (verify-in-line scoring, branches) are written in."""
    column = torch.arange(columns, device=device)
    token = torch.arange(width, device=device)[:, None]
    allowed = column <= torch.tensor(past, device=device)[:, None, None] + token
    if min(sizes) < width:  # padding: ids past a row's own, rows between requests
        real = token[None] < torch.tensor(sizes, device=device)[:, None, None]
        allowed = torch.where(real, allowed, column == 0)
    for job in jobs:
        if job.allowed is not None:
            b, n = job.row - lo, len(job.ids)
            allowed[b, :n] = False
            allowed[b, :n, : job.past_len + n] = job.allowed.to(device)
    return allowed[:, None]


def _similar(n: int, m: int) -> bool:
    return max(n, m) <= _SIMILAR or max(n, m) <= 2 * min(n, m)


class _Ticket:
    """One waiting pass: its result or error, and whether its thread must become the leader."""

    def __init__(self, job: Pass, park: Park) -> None:
        self.job = job
        self.park = park
        self.ready = _Signal()
        self.leads = False
        self.finished = False
        self.error: BaseException | None = None

    def finish(self) -> None:
        self.finished = True
        self.park.release()  # its thread computes again (as soon as it wakes)
        self.ready.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.finish()

    def result(self) -> Pass:
        if self.error is not None:
            raise self.error
        return self.job


class _Signal:
    """A one-shot wake-up for one waiting thread (a ticket is told once: its pass is done, or
    it leads now): one lock, where `threading.Event` builds a condition and a lock per wait."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        if self._lock.locked():
            self._lock.release()

    def wait(self) -> None:
        self._lock.acquire()
        self._lock.release()


_registry_lock = threading.Lock()
_lanes_lock = threading.Lock()
_lanes: dict[str, threading.Lock] = {}


def _lane_for(device: torch.device) -> threading.Lock:
    """The one lock of a device's passes (a CUDA device without an index is the current one)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _lanes_lock:
        return _lanes.setdefault(str(device), threading.Lock())


def batcher_for(model) -> Batcher:
    """The one batcher (and key/value store) of a loaded model: members that share weights
    share it. It lives on the model object, so it goes when the model goes."""
    with _registry_lock:
        found = model.__dict__.get("_ensemble_batcher")
        if found is None:
            found = Batcher(model)
            model.__dict__["_ensemble_batcher"] = found
        return found
