"""Ensemble: the facade users, adapters and benchmarks call.

It holds the members and one method, validates every input at the boundary, and turns the
method's commits into a stream of deltas: stop strings trimmed (never partially streamed),
max_new_tokens enforced, events delivered both to `on_event` and inside each delta, per-request
stats collected. A lock makes one instance safe to share between threads; requests on one
instance run one at a time (they share the members' caches).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from .chat import normalize_messages
from .concurrency import iterate_in_thread
from .config import Delta, GenerationConfig, Output
from .errors import EnsembleError, InvalidConfigError, MemberError
from .events import Event
from .member import ContextOverflow, HFMember, Member
from .methods import Request, build_method, check_method
from .remote import Remote, connect
from .sampling import Sampler
from .stops import StopFilter

Messages = str | Sequence[dict[str, Any]]
OnEvent = Callable[[Event], None] | None


def _per_member(value: Any, n: int, what: str) -> list[Any]:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise InvalidConfigError(f"{what} has {len(value)} entries for {n} models.")
        return list(value)
    return [value] * n


class Ensemble:
    def __init__(self, members: Sequence[Member], method: str = "safe", **options: Any) -> None:
        if not members:
            raise InvalidConfigError("an ensemble needs at least one member.")
        seen: dict[str, int] = {}
        for member in members:  # unique names: events and stats are keyed by them
            if member.name in seen:
                seen[member.name] += 1
                member.name = f"{member.name}#{seen[member.name]}"
            else:
                seen[member.name] = 1
        self.members = list(members)
        self.method_name = method
        self.options = dict(options)
        self.method = build_method(method, self.members, options)
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(
        cls,
        models: str | os.PathLike | Remote | Sequence[str | os.PathLike | Remote],
        method: str = "safe",
        *,
        device: str | Sequence[str] = "auto",
        dtype: str | Sequence[str] = "auto",
        names: Sequence[str] | None = None,
        use_safetensors: bool = True,
        attn_implementation: str | None = None,
        progress: bool = False,
        **options: Any,
    ) -> Ensemble:
        """Load members from local directories or hub ids, or connect to members served by vLLM
        (`Remote(base_url=..., model=..., tokenizer=...)`); they mix freely. SAFE: the first
        member drafts. `device`/`dtype` concern in-process members only."""
        if isinstance(models, (str, os.PathLike, Remote)):
            models = [models]
        models = list(models)
        if not models:
            raise InvalidConfigError(
                "models is empty; pass one or more local model directories or hub ids."
            )
        check_method(method, len(models), options)  # fail before loading anything
        devices = _per_member(device, len(models), "device")
        dtypes = _per_member(dtype, len(models), "dtype")
        labels = _per_member(names, len(models), "names") if names else [None] * len(models)
        steps = range(len(models))
        if progress:
            from tqdm.auto import tqdm

            steps = tqdm(steps, desc="loading models", unit="model")
        members = [
            connect(models[i], labels[i])
            if isinstance(models[i], Remote)
            else HFMember.load(
                models[i],
                device=devices[i],
                dtype=dtypes[i],
                name=labels[i],
                use_safetensors=use_safetensors,
                attn_implementation=attn_implementation,
            )
            for i in steps
        ]
        return cls(members, method, **options)

    @classmethod
    def demo(cls, method: str = "safe", **kwargs: Any) -> Ensemble:
        """The shipped tiny testbed models: runs offline, on CPU."""
        from .testbed import model_paths

        kwargs.setdefault("device", "cpu")
        return cls.from_pretrained(model_paths(), method, **kwargs)

    # --- requests --------------------------------------------------------------------------

    def stream(
        self,
        messages: Messages,
        config: GenerationConfig | None = None,
        *,
        on_event: OnEvent = None,
        **overrides: Any,
    ) -> Iterator[Delta]:
        """Deltas of the response as it is committed; the last one has finish_reason and stats.

        Inputs are checked here, before the first `next()`, so bad input fails at the call."""
        config = self._config(config, overrides)
        return self._run(normalize_messages(messages), config, on_event)

    def generate(
        self,
        messages: Messages,
        config: GenerationConfig | None = None,
        *,
        on_event: OnEvent = None,
        **overrides: Any,
    ) -> Output:
        parts, events, last = [], [], None
        for delta in self.stream(messages, config, on_event=on_event, **overrides):
            parts.append(delta.text)
            events.extend(delta.events)
            last = delta
        return Output("".join(parts), last.finish_reason, last.stats, events)

    async def astream(
        self,
        messages: Messages,
        config: GenerationConfig | None = None,
        *,
        on_event: OnEvent = None,
        **overrides: Any,
    ) -> AsyncIterator[Delta]:
        """`stream` on a worker thread: the event loop keeps running while models compute."""
        iterator = self.stream(messages, config, on_event=on_event, **overrides)
        async for delta in iterate_in_thread(iterator):
            yield delta

    async def agenerate(
        self,
        messages: Messages,
        config: GenerationConfig | None = None,
        *,
        on_event: OnEvent = None,
        **overrides: Any,
    ) -> Output:
        parts, events, last = [], [], None
        async for delta in self.astream(messages, config, on_event=on_event, **overrides):
            parts.append(delta.text)
            events.extend(delta.events)
            last = delta
        return Output("".join(parts), last.finish_reason, last.stats, events)

    @property
    def weights(self) -> dict[str, float] | None:
        """Voting weights, for methods that learn them (SpecEM)."""
        weights = getattr(self.method, "weights", None)
        return dict(weights) if isinstance(weights, dict) else None

    def reset_weights(self) -> None:
        reset = getattr(self.method, "reset_weights", None)
        if reset is None:
            raise InvalidConfigError(f"method {self.method_name!r} has no weights to reset.")
        reset()

    def summary(self) -> dict:
        return self.method.summary()

    # --- internals -------------------------------------------------------------------------

    @staticmethod
    def _config(config: GenerationConfig | None, overrides: dict[str, Any]) -> GenerationConfig:
        config = config or GenerationConfig()
        if not overrides:
            return config
        known = {f.name for f in dataclasses.fields(GenerationConfig)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise InvalidConfigError(
                f"unknown generation setting(s) {', '.join(unknown)}; use "
                f"{', '.join(sorted(known))}."
            )
        return dataclasses.replace(config, **overrides)

    def _run(self, messages, config: GenerationConfig, on_event: OnEvent) -> Iterator[Delta]:
        with self._lock:
            started = time.perf_counter()
            request = Request(config, Sampler(config), on_event=on_event)
            for member in self.method.active:
                member.reset_counters()
                request.stats.prompt_tokens[member.name] = member.start(messages)
            stops = StopFilter(config.stop)
            finish, text = "length", ""
            commits = self.method.run(request)
            try:
                for commit in commits:
                    request.text += commit.text
                    request.stats.tokens += commit.tokens
                    text = stops.feed(commit.text)
                    if stops.stopped or commit.finish or request.remaining <= 0:
                        finish = "stop" if stops.stopped else (commit.finish or "length")
                        break
                    if text or request.pending:
                        yield self._delta(text, request, started)
                    text = ""
            except ContextOverflow:
                finish = "length"
            except EnsembleError:
                raise
            except Exception as error:
                raise MemberError(
                    f"method {self.method_name!r} failed: {type(error).__name__}: {error}"
                ) from error
            finally:
                commits.close()
            if not stops.stopped:
                text += stops.flush()
            stats = request.stats
            for member in self.method.active:
                stats.member_seconds[member.name] = member.seconds
                stats.member_calls[member.name] = member.calls
            if self.weights is not None:
                stats.weights = self.weights
            stats.seconds = time.perf_counter() - started
            if stats.first_delta_seconds is None and text:
                stats.first_delta_seconds = stats.seconds
            events, request.pending = tuple(request.pending), []
            yield Delta(text, events, finish, stats)

    @staticmethod
    def _delta(text: str, request: Request, started: float) -> Delta:
        if text and request.stats.first_delta_seconds is None:
            request.stats.first_delta_seconds = time.perf_counter() - started
        events, request.pending = tuple(request.pending), []
        return Delta(text, events)
