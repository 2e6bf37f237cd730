"""Ensemble: the facade users, adapters and benchmarks call.

It holds the members and one method, validates every input at the boundary, and turns the
method's commits into a stream of deltas: stop strings trimmed (never partially streamed),
max_new_tokens enforced, events delivered both to `on_event` and inside each delta, per-request
stats collected.

One instance serves many requests at once, from threads or asyncio tasks: each request gets its
own view of every member (ids, KV cache) and its own copy of the method, while the loaded models
are shared and their forward passes are batched across requests (`core.batching`). No lock is
held across a request, so a paused stream or a request started from a callback blocks nobody;
`max_concurrency` bounds how many run at once (`core.admission`).

A member that fails mid-request either ends it (`on_member_failure="raise"`, the default:
`MemberError` naming the member and the operation) or leaves it (`"drop"`: the request goes on
with the others). Either way a `member_failed` event says who and why, and nothing of the
failure stays behind: member state changes are transactions, and the next request starts from
a fresh view.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .admission import Admission, Slot, default_concurrency
from .batching import RequestThreads
from .calibration import MAX_NEW_TOKENS as CALIBRATION_TOKENS
from .calibration import check_prompts, judge, rate_weights
from .chat import normalize_messages, raw_prompt_text
from .concurrency import iterate_in_thread
from .config import Delta, GenerationConfig, Output
from .errors import EnsembleError, InvalidConfigError, MemberError
from .events import Event, MemberFailed, ToolCallEvent
from .hf_member import HFMember, check_members_fit
from .member import ContextOverflow, Member
from .methods import DEFAULT_METHOD, Method, Request, build_method, check_method
from .methods.base import CallbackFailed
from .options import GROUPS, RUNNING, split_options, takes_options
from .preference_store import measurement_key, store, stored
from .remote import Remote, connect
from .sampling import Sampler
from .sources import Models, model_sources
from .splitter import ResponseSplitter
from .tool_calls import InvalidToolCall, ToolCall
from .trust import MemberTrust, TrustView
from .validate import check_bool

log = logging.getLogger("llm_ensembling")

Messages = str | Sequence[dict[str, Any]]
OnEvent = Callable[[Event], None] | None


class Ensemble:
    @takes_options(*RUNNING)
    def __init__(
        self, members: Sequence[Member], method: str = DEFAULT_METHOD, **options: Any
    ) -> None:
        """Members already loaded (`HFMember`, `RemoteMember`, ...), the method, and by keyword
        the method's options (SAFE's `lookahead`, ...) and the ensemble's running options
        (`core.options`), each checked here."""
        if not members:
            raise InvalidConfigError("an ensemble needs at least one member.")
        for member in members:
            if not isinstance(member, Member):
                raise InvalidConfigError(
                    f"Ensemble(members) takes loaded members, got {member!r}; load paths, "
                    "Local(...) and Remote(...) with Ensemble.from_pretrained([...])."
                )
        self.options, method_options = split_options(options, RUNNING)  # as built
        seen: dict[str, int] = {}
        for member in members:  # unique names: events and stats are keyed by them
            if member.name in seen:
                seen[member.name] += 1
                member.name = f"{member.name}#{seen[member.name]}"
            else:
                seen[member.name] = 1
        self.members = list(members)
        self.method = method  # its name, as given; `algorithm` runs it
        self.method_options = method_options
        self.algorithm = build_method(method, self.members, method_options)
        self.trust = MemberTrust(
            [m.name for m in self.members],
            learn=self.options.learn_weights,
            lr=self.options.weight_lr,
            floor=self.options.weight_floor,
            probe_every=self.options.probe_every,
        )
        limit = self.options.max_concurrency or default_concurrency(self.members)
        queue = 4 * limit if self.options.max_queue is None else self.options.max_queue
        threads = RequestThreads()  # this ensemble's requests: what its batchers wait for
        for member in self.members:
            member.serve(threads)
        self.admission = Admission(limit, queue, self.options.queue_timeout, threads)
        self._built_preference = None
        if self.self_preference_mode == "builtin":
            self._built_preference = self._measure_self_preference()
            self.trust.prefer(self._built_preference)

    @classmethod
    @takes_options(*GROUPS)
    def from_pretrained(
        cls, models: Models, method: str = DEFAULT_METHOD, **options: Any
    ) -> Ensemble:
        """Load members from local directories, GGUF files or hub ids (each a `Local(...)` when it
        needs options of its own: a chat template, stop strings, its device, dtype or name), or
        connect to members served by vLLM (`Remote(base_url=..., model=..., tokenizer=...)`);
        they mix freely. SAFE: the member trusted most drafts (the first while all are trusted
        alike). By keyword: the method's options and every ensemble option (`core.options`),
        all checked before anything loads; `device`, `dtype`, `names`, `use_safetensors` and
        `attn_implementation` concern in-process members, where a Local's own option wins."""
        models = model_sources(models)
        if not models:
            raise InvalidConfigError(
                "models is empty; pass one or more local model directories or hub ids."
            )
        settings, method_options = split_options(options)
        check_method(method, len(models), method_options)  # fail before loading anything
        devices, dtypes, labels = (
            settings.for_members(name, len(models)) for name in ("device", "dtype", "names")
        )
        local = [i for i, model in enumerate(models) if not isinstance(model, Remote)]
        check_members_fit(
            [models[i] for i in local],
            [devices[i] for i in local],
            [dtypes[i] for i in local],
            settings.use_safetensors,
        )
        steps = range(len(models))
        if settings.progress:
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
                use_safetensors=settings.use_safetensors,
                attn_implementation=settings.attn_implementation,
            )
            for i in steps
        ]
        return cls(members, method, **settings.of(RUNNING), **method_options)

    @classmethod
    def demo(cls, method: str = DEFAULT_METHOD, **kwargs: Any) -> Ensemble:
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
        admitted: Slot | None = None,
        **overrides: Any,
    ) -> Iterator[Delta]:
        """Deltas of the response as it is committed; the last one has finish_reason and stats.

        The request is checked and every member's prompt rendered here, before the first
        `next()`, so bad input fails at the call. Iteration waits for a request slot
        (`max_concurrency`) first, unless the caller holds one already (`admitted`, from
        `self.admission.admit()`: the stream then owns it); closing the stream (or dropping it)
        frees its slot."""
        config = self._config(config, overrides)
        if on_event is not None and not callable(on_event):
            raise InvalidConfigError(
                f"on_event must be a function that takes one event, or None; got {on_event!r}"
                f" (a {type(on_event).__name__}). Pass e.g. on_event=print, or on_event=lambda e: "
                "print(e.to_dict())."
            )
        prompt = raw_prompt_text(messages) if config.raw_prompt else normalize_messages(messages)
        return self._start(prompt, config, on_event, admitted)

    def generate(
        self,
        messages: Messages,
        config: GenerationConfig | None = None,
        *,
        on_event: OnEvent = None,
        **overrides: Any,
    ) -> Output:
        deltas = self.stream(messages, config, on_event=on_event, **overrides)
        try:
            return Output.from_deltas(deltas)
        finally:
            deltas.close()

    def astream(
        self,
        messages: Messages,
        config: GenerationConfig | None = None,
        *,
        on_event: OnEvent = None,
        **overrides: Any,
    ) -> AsyncIterator[Delta]:
        """`stream` on a worker thread: the event loop keeps running while models compute, and
        cancelling the consumer stops the request at its next forward pass. The request is
        checked here, at the call, as `stream` does."""
        return iterate_in_thread(self.stream(messages, config, on_event=on_event, **overrides))

    async def agenerate(
        self,
        messages: Messages,
        config: GenerationConfig | None = None,
        *,
        on_event: OnEvent = None,
        **overrides: Any,
    ) -> Output:
        return Output.from_deltas(
            [d async for d in self.astream(messages, config, on_event=on_event, **overrides)]
        )

    # --- member trust (core.trust) -----------------------------------------------------------

    @property
    def member_weights(self) -> dict[str, float]:
        """How far the ensemble trusts each member: weights that sum to 1, learned from its
        own decisions across requests (`learn_weights`). Each request starts from the weights
        as they are when it starts; they are in its `stats.member_weights`."""
        return self.trust.weights

    @property
    def learn_weights(self) -> bool:
        """Whether requests update `member_weights`. False freezes them: a request's text then
        depends on that request alone."""
        return self.trust.learn

    @learn_weights.setter
    def learn_weights(self, learn: bool) -> None:
        self.trust.learn = check_bool("learn_weights", learn)

    def reset_weights(self) -> None:
        """Equal weights again: every method then decides exactly as it does without them
        (with `self_preference="builtin"`, its votes still even out what the ensemble measured
        when it was built)."""
        self.trust.reset()
        self.trust.prefer(self._built_preference)

    def save_weights(self, path: str | os.PathLike) -> Path:
        """`member_weights` as JSON, written atomically. Returns the path."""
        return self.trust.save(path)

    def load_weights(self, path: str | os.PathLike, *, freeze: bool = True) -> None:
        """Weights from a file `save_weights` wrote. The file is checked first (member names,
        count, finite weights above 0); a bad one raises InvalidConfigError naming it, and
        nothing changes. `freeze=True` also stops learning, so texts are reproducible.
        `freeze=False` keeps `learn_weights` as it is: a learning ensemble learns on from
        the loaded weights."""
        self.trust.load(path, freeze=freeze)

    def calibrate(
        self, prompts: Sequence[Any] | None = None, *, max_new_tokens: int = CALIBRATION_TOKENS
    ) -> dict[str, float]:
        """Member trust without labels, measured once and then frozen (`core.calibration`):
        each member answers `prompts` alone (strings or message lists; None: the built-in
        set), every member scores every answer, and a member's weight is proportional to how
        often the OTHER members prefer its answer. A member no other member ever prefers falls
        under `weight_floor` and is no longer run. A voting method (SpecEM, rerank) also gets
        each member's self-preference as a judge, and its votes read each member's scores at
        a temperature of its self-preference over the least partial member's (`summary()`
        shows it). Learning stops (`learn_weights=False`), so each request's text still
        depends on that request alone; `save_weights` keeps the result. Returns the weights."""
        prompts = check_prompts(prompts)
        if len(self.members) < 2:
            raise InvalidConfigError(
                "calibrate() weighs members against each other; this ensemble has one member."
            )
        measured = judge(
            self.members, prompts, max_new_tokens, self.algorithm.vote_score, self.admission
        )
        self.trust.fix(rate_weights(measured.rates), measured.self_preference)
        return self.member_weights

    def summary(self) -> dict:
        """The method, its settings and the member trust, as the next request would see them
        (SAFE: the drafter that trust picks)."""
        return {**self._trusted_algorithm().summary(), **self.trust.summary()}

    @property
    def active_members(self) -> list[Member]:
        """The members the method runs, its leading one first (SAFE's drafter, `single`'s
        member): a request starts only these (as the member trust stands now)."""
        return list(self._trusted_algorithm().active)

    @property
    def prompt_tokenizer(self):
        """The tokenizer `input_tokens` counts the prompt in: the leading active member's."""
        return self._trusted_algorithm().active[0].tokenizer

    @property
    def context_window(self) -> int:
        """The smallest window among the active members: a prompt and its answer must fit all."""
        return min(member.context_window for member in self.algorithm.active)

    @property
    def self_preference_mode(self) -> str:
        """The `self_preference` option as this ensemble runs it ("auto" resolved by the method)."""
        given = self.options.self_preference
        return self.algorithm.default_self_preference if given == "auto" else given

    def _measure_self_preference(self):
        """Each voter's self-preference on the built-in calibration prompts
        (`self_preference="builtin"`); None for a method that does not vote, or one member.
        Measured once per member set and kept on disk (`core.preference_store`)."""
        score = self.algorithm.vote_score
        if score is None or len(self.algorithm.active) < 2:
            return None
        prompts = check_prompts(None)
        key = measurement_key(self.members, score, prompts, CALIBRATION_TOKENS)
        found, preference = stored(key, [m.name for m in self.members])
        if found:
            return preference
        log.info(
            "measuring each member's self-preference as a judge on %d built-in prompts "
            "(self_preference='builtin'; %s)",
            len(prompts),
            "kept for later builds over the same member files"
            if key
            else "measured at every build: a member was not loaded from files",
        )
        try:
            measured = judge(self.members, prompts, CALIBRATION_TOKENS, score, self.admission)
        except MemberError as error:
            raise MemberError(
                f"self_preference='builtin' could not be measured on the built-in prompts: "
                f"{error} Build the ensemble with self_preference='off' to go on without it.",
                member=error.member,
                operation=error.operation,
            ) from error
        store(key, measured.self_preference)
        return measured.self_preference

    def _trusted_algorithm(self) -> Method:
        """The method as the next request would run it (SAFE: the drafter trust picks)."""
        return self.algorithm.trusting(self.trust.weights)

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

    def _start(
        self, messages, config: GenerationConfig, on_event: OnEvent, admitted: Slot | None
    ) -> RequestStream:
        """A request's own member views and method copy, with every prompt rendered, and what
        the method is for this request (`stats.method_summary`)."""
        cancel = threading.Event()
        members = [m.spawn(cancel, self.options.prefix_reuse) for m in self.members]
        algorithm = self.algorithm.bind(members)
        admission = self.admission
        request = Request(
            config, Sampler(config), on_event=on_event, alone=lambda: admission.running <= 1
        )
        if len(algorithm.active) > 1:  # trust weighs members that decide together
            algorithm = self._trusted(algorithm, request)
        request.stats.method_summary = {**algorithm.summary(), **self.trust.summary()}
        if request.stats.member_weights:
            request.stats.method_summary["member_weights"] = dict(request.stats.member_weights)
        tools = config.tools if config.calls_tools else ()
        for member in algorithm.active:
            request.stats.prompt_tokens[member.name] = member.start(
                messages, tools, config.response_format, config.constraint, config.penalties
            )
        run = _Run(self, members, algorithm, request, cancel, admitted)
        return RequestStream(run.deltas(), members, cancel, self.admission, admitted)

    def _trusted(self, algorithm: Method, request: Request) -> Method:
        """The request's method under the member trust: members under the floor left out
        (unless this request probes them), roles that follow trust set, and the request's
        handle for reporting decisions."""
        plan = self.trust.plan()
        for name in [m.name for m in algorithm.members if m.name not in plan.asked]:
            algorithm = algorithm.without(name)
        request.trust = TrustView(plan.weights, self.trust, plan.self_preference)
        request.stats.member_weights = dict(plan.weights)
        if plan.probe:
            request.stats.count("trust_probe")
        return algorithm.trusting(plan.weights)


class RequestStream(Iterator[Delta]):
    """The deltas of one request. `close()` ends it (its slot and state go at once);
    `cancel()`, callable from any thread, stops it at its next forward pass. `members` are the
    request's own member views (ids, text, cache), in the ensemble's order."""

    def __init__(
        self,
        deltas: Iterator[Delta],
        members: list[Member],
        cancel: threading.Event,
        admission: Admission,
        admitted: Slot | None = None,
    ) -> None:
        self._deltas = deltas
        self.members = members
        self._cancel = cancel
        self._admission = admission
        self._admitted = admitted

    def __iter__(self) -> RequestStream:
        return self

    def __next__(self) -> Delta:
        self._admission.resume(self)
        with self._admission.running_here():
            delta = next(self._deltas)
        self._admission.pause(self)  # holding its slot until the consumer asks again
        return delta

    def close(self) -> None:
        self._admission.resume(self)
        self._deltas.close()
        if self._admitted is not None:  # a stream closed before its first step held it
            self._admitted.release()

    def cancel(self) -> None:
        self._cancel.set()
        self._admission.wake()  # a request waiting in the queue leaves it now

    def computing(self):
        """Count the calling thread as computing this request between its steps too (a worker
        handing each delta on to an event loop): a batched pass then waits for its next pass as
        it waits for a thread that reads its own deltas, instead of leaving it for the next one."""
        return self._admission.threads.running()


class _Run:
    """One request in flight: the loop from commits to deltas, the member-failure policy."""

    def __init__(
        self,
        ensemble: Ensemble,
        members,
        algorithm: Method,
        request: Request,
        cancel: threading.Event,
        admitted: Slot | None,
    ) -> None:
        self.ensemble = ensemble
        self.members = members
        self.algorithm = algorithm
        self.request = request
        self.cancel = cancel
        self.admitted = admitted
        self.started = time.perf_counter()
        self.calls: list[ToolCall | InvalidToolCall] = []  # every call of the response
        self.call_opened = 0  # stats.ensembled_tokens when the open call region began
        self.last_text = ""  # content of the last commit, shown with the last delta...
        self.last_calls: list[ToolCall | InvalidToolCall] = []  # ...and the calls it closed

    def deltas(self) -> Iterator[Delta]:
        with self.admitted or self.ensemble.admission.admit(self.cancel):
            try:
                for member in self.algorithm.active:  # the members' cache room, claimed first
                    member.reserve(self.request.config.max_new_tokens)
                self.started = time.perf_counter()
                stops = [s for member in self.members for s in member.stop_strings]
                splitter = ResponseSplitter(self.request.config, stops)
                try:
                    finish = yield from self._commits(splitter)
                except CallbackFailed as failed:
                    raise failed.error from None
                text, calls = splitter.finish()
                self._report(calls)
                learned = self.request.trust.commit()  # a request that fails never gets here
                if learned is not None:
                    self.request.emit(learned)
                if any(isinstance(c, ToolCall) for c in self.calls) and not any(
                    isinstance(c, InvalidToolCall) for c in self.calls
                ):
                    finish = "tool_calls"  # every call whole (a grammar closes them itself)
                last = self._last(self.last_text + text, finish, self.last_calls + calls)
                for member in self.members:  # a finished request's prefixes serve later ones
                    member.keep_prefix()
                yield last
            finally:
                for member in self.members:
                    member.release()

    def _commits(self, splitter: ResponseSplitter):
        """Runs the method (again, without a failed member, under "drop") until it is done;
        returns the finish reason."""
        request, algorithm = self.request, self.algorithm
        while True:
            commits = algorithm.commits(request)
            try:
                while True:
                    commit = next(commits, None)
                    if commit is None:
                        return "length"
                    request.text += commit.text
                    request.stats.tokens += commit.tokens
                    opened = splitter.in_call
                    text, calls = splitter.feed(commit.text)
                    if splitter.in_call and not opened:
                        self.call_opened = request.stats.ensembled_tokens
                    self._report(calls)
                    if splitter.stop_string_found or commit.finish or request.remaining <= 0:
                        finish = (
                            "stop" if splitter.stop_string_found else (commit.finish or "length")
                        )
                        self.last_text, self.last_calls = text, calls
                        return finish
                    if text or calls or request.pending:
                        yield self._delta(text, calls)
            except ContextOverflow:
                return "length"
            except MemberError as error:
                algorithm = self._after_failure(algorithm, error)
            except (EnsembleError, CallbackFailed):
                raise
            except Exception as error:
                raise MemberError(
                    f"method {self.ensemble.method!r} failed: {type(error).__name__}: {error}"
                ) from error
            finally:
                commits.close()

    def _report(self, calls) -> None:
        """Tool calls that closed: kept for the output, and told as events."""
        for call in calls:
            self.calls.append(call)
            if isinstance(call, ToolCall):
                ensembled = self.request.stats.ensembled_tokens - self.call_opened
                self.request.emit(ToolCallEvent(call.id, call.name, call.arguments, ensembled))

    def _after_failure(self, algorithm: Method, error: MemberError) -> Method:
        """Report the failure; under "drop" the method without that member, else re-raise."""
        request = self.request
        name = error.member
        request.emit(MemberFailed(name or "", str(error), error.operation or ""))
        request.stats.count("member_failed")
        if name is not None:
            request.stats.failed[name] = str(error)
        active = [m.name for m in algorithm.active]
        dropping = self.ensemble.options.on_member_failure == "drop"
        if not dropping or name not in active or len(active) < 2:
            raise error
        return algorithm.without(name)

    def _delta(self, text: str, calls) -> Delta:
        stats = self.request.stats
        if text and stats.first_delta_seconds is None:
            stats.first_delta_seconds = time.perf_counter() - self.started
        events, self.request.pending = tuple(self.request.pending), []
        return Delta(text, events, tool_calls=tuple(calls))

    def _last(self, text: str, finish: str, calls) -> Delta:
        stats = self.request.stats
        for member in self.members:
            state = member.state
            if state.calls or member.name in stats.prompt_tokens:
                stats.member_seconds[member.name] = state.seconds
                stats.member_calls[member.name] = state.calls
                stats.prefilled[member.name] = getattr(state, "prefilled", 0)
                stats.cache_bytes += member.memory_bytes()
        stats.seconds = time.perf_counter() - self.started
        if stats.first_delta_seconds is None and text:
            stats.first_delta_seconds = stats.seconds
        events, self.request.pending = tuple(self.request.pending), []
        return Delta(text, events, finish, stats, tuple(calls))
