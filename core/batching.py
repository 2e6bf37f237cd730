"""Forward passes of concurrent requests on one loaded model, run as one batched pass.

A forward pass of a small model costs nearly the same for one row as for eight (on a CPU the
per-call work of the layers dominates; on a GPU a decode step is bound by reading the weights), so
requests that share a model gain most by sharing its passes. Each request keeps its own key/value
tensors (a `Pass` carries them in and the grown ones out: nothing here outlives the call), and a
`Batcher` per model gathers the passes that arrive while another batch runs and runs them as one:
past keys right-padded to a common length, new tokens after the padding, one 4-D attention mask
that lets every row see only its own past (and, for verify-in-line scoring, only the blocks it
may see), position ids per row.

No thread is added: the first request thread to arrive runs the batch ("leads"), later arrivals
wait; when the leader's own pass is done it hands the lead to a waiting thread. A lone request
therefore runs its pass exactly as before, in its own thread, with no padding.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

Layers = tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer: keys, values [1, H, T, D]

_MAX_ROWS = 32  # rows per batched pass
_SIMILAR = 8  # passes batch together when their new-token counts are within 2x (or <= this)
_GATHER_SECONDS = 0.0005  # the most a leader waits for passes still arriving


@dataclass
class Pass:
    """One forward pass a request asks for: feed `ids` after `past_len` cached positions.

    `allowed[i, j]` says whether new token i may attend to position j of past + new (None: plain
    causal attention over everything); `positions` are the new tokens' position ids (None: right
    after the past); `keep` are the indices of the new tokens whose next-token rows come back."""

    ids: list[int]
    keep: list[int]
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

    def __init__(self, model, batched: bool = True) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.batched = batched  # the attention kernel takes a custom 4-D mask
        self._lock = threading.Lock()
        self._queue: list[_Ticket] = []
        self._busy = False
        self.batches = 0  # passes run (a batched pass counts once)
        self.rows = 0  # requests' passes served

    # --- the combining protocol ----------------------------------------------------------------
    # Every change of the queue and of who leads happens under the lock, and a thread's own
    # bookkeeping is in `finally` blocks that an interrupt (Ctrl-C lands in whichever thread runs
    # the main loop, a leader included) cannot skip: an interrupted waiter leaves the queue and
    # passes on a lead it was given; an interrupted leader puts the others' passes back.

    def run(self, job: Pass) -> Pass:
        ticket = _Ticket(job)
        try:
            with self._lock:
                self._queue.append(ticket)
                if not self._busy:
                    self._busy = ticket.lead = True
            if not ticket.lead:
                ticket.ready.wait()
            if ticket.lead:
                self._serve(ticket)
            return ticket.result()
        finally:
            with self._lock:
                if ticket in self._queue:  # interrupted while waiting
                    self._queue.remove(ticket)
                if ticket.lead:
                    ticket.lead = False
                    self._pass_lead()

    def _pass_lead(self) -> None:
        """The next waiting thread leads (called under the lock)."""
        if self._queue:
            successor = self._queue[0]
            successor.lead = True
            successor.ready.set()
        else:
            self._busy = False

    def _serve(self, own: _Ticket) -> None:
        """Run batches until the leader's own pass is done (its pass is always in the first)."""
        while not own.finished:
            self._gather()
            batch: list[_Ticket] = []
            try:
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
        """Let the other request threads run while more passes keep arriving (a few hundred
        microseconds at most): a batch that waited for them costs little more than a lone pass,
        a batch that left them out costs them a whole pass."""
        if not self.batched:
            return
        deadline = time.perf_counter() + _GATHER_SECONDS
        seen = len(self._queue)
        while time.perf_counter() < deadline:
            time.sleep(0)  # hand the interpreter to the other threads
            if len(self._queue) == seen:
                return
            seen = len(self._queue)

    def _pick(self, own: _Ticket) -> list[_Ticket]:
        """The leader's own pass first, then others of a similar size."""
        n = len(own.job.ids)
        batch = [own]
        if self.batched:
            for ticket in self._queue:
                m = len(ticket.job.ids)
                if ticket is not own and len(batch) < _MAX_ROWS and _similar(n, m):
                    batch.append(ticket)
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
        if len(batch) == 1:
            self._run_one(batch[0].job)
        else:
            self._run_many([t.job for t in batch])

    # --- running passes ------------------------------------------------------------------------

    def _call(self, ids: torch.Tensor, cache, keep: list[int], **extra) -> torch.Tensor:
        with torch.no_grad():
            out = self.model(
                input_ids=ids.to(self.device),
                cache=cache,
                use_cache=True,
                logits_to_keep=torch.tensor(keep, device=self.device),
                **extra,
            )
        self.batches += 1
        return out.logits.float()

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

    def _run_many(self, jobs: Sequence[Pass]) -> None:
        rows, longest = len(jobs), max(j.past_len for j in jobs)
        width = max(len(j.ids) for j in jobs)
        ids = torch.zeros(rows, width, dtype=torch.long)
        positions = torch.zeros(rows, width, dtype=torch.long)
        allowed = torch.zeros(rows, 1, width, longest + width, dtype=torch.bool)
        for b, job in enumerate(jobs):
            n, past = len(job.ids), job.past_len
            ids[b, :n] = torch.tensor(job.ids)
            own = job.positions or list(range(past, past + n))
            positions[b, :n] = torch.tensor(own)
            positions[b, n:] = own[-1]
            mask = job.allowed
            if mask is None:
                mask = torch.ones(n, past + n, dtype=torch.bool).tril(past)
            allowed[b, 0, :n, :past] = mask[:, :past]
            allowed[b, 0, :n, longest : longest + n] = mask[:, past:]
            pad = torch.arange(n, width)
            allowed[b, 0, pad, longest + pad] = True  # padding rows see themselves only
        layers = self._padded_past(jobs, longest)
        keep = sorted({k for job in jobs for k in job.keep})
        at = {k: i for i, k in enumerate(keep)}
        cache = _cache(layers)
        logits = self._call(
            ids,
            cache,
            keep,
            attention_mask=_additive(allowed, self.dtype).to(self.device),
            position_ids=positions.to(self.device),
        )
        for b, job in enumerate(jobs):
            n = len(job.ids)
            picked = logits[b, [at[k] for k in job.keep]]
            job.rows = picked if job.raw else torch.log_softmax(picked, dim=-1)
            present = []
            for layer, old in zip(
                cache.layers, job.past or [None] * len(cache.layers), strict=True
            ):
                new_keys = layer.keys[b : b + 1, :, longest : longest + n]
                new_values = layer.values[b : b + 1, :, longest : longest + n]
                if old is not None:
                    new_keys = torch.cat([old[0], new_keys], dim=-2)
                    new_values = torch.cat([old[1], new_values], dim=-2)
                present.append((new_keys, new_values))
            job.present = tuple(present)
        self.rows += rows

    @staticmethod
    def _padded_past(jobs: Sequence[Pass], longest: int) -> Layers | None:
        if longest == 0:
            return None
        template = next(j.past for j in jobs if j.past)
        layers = []
        for index, (keys, values) in enumerate(template):
            shape_k = (len(jobs), keys.shape[1], longest, keys.shape[3])
            shape_v = (len(jobs), values.shape[1], longest, values.shape[3])
            pk = keys.new_zeros(shape_k)
            pv = values.new_zeros(shape_v)
            for b, job in enumerate(jobs):
                if job.past_len:
                    pk[b, :, : job.past_len] = job.past[index][0][0]
                    pv[b, :, : job.past_len] = job.past[index][1][0]
            layers.append((pk, pv))
        return tuple(layers)


def _similar(n: int, m: int) -> bool:
    return max(n, m) <= _SIMILAR or max(n, m) <= 2 * min(n, m)


class _Ticket:
    """One waiting pass: its result or error, and whether its thread must take the lead."""

    def __init__(self, job: Pass) -> None:
        self.job = job
        self.ready = threading.Event()
        self.lead = False
        self.finished = False
        self.error: BaseException | None = None

    def finish(self) -> None:
        self.finished = True
        self.ready.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.finish()

    def result(self) -> Pass:
        if self.error is not None:
            raise self.error
        return self.job


_registry_lock = threading.Lock()


def batcher_for(model, batched: bool) -> Batcher:
    """The one batcher of a loaded model: members that share weights share it. It lives on the
    model object, so it goes when the model goes."""
    with _registry_lock:
        found = model.__dict__.get("_ensemble_batcher")
        if found is None:
            found = Batcher(model, batched)
            model.__dict__["_ensemble_batcher"] = found
        return found
