"""Failures leave no trace, through the public API: a fault injected into a member at any of its
operations (before the forward pass, inside it after the first decoder layer wrote its keys, or
after it), as an exception or as a KeyboardInterrupt, and a real Ctrl-C at a random moment of
`generate`, for every method; afterwards the next requests give exactly what a fresh ensemble
gives. Then the member-failure policy ("raise" names the member and the operation; "drop" goes
on without the member, says so, and tries it again next request) and errors from the user's
own callback, which reach the caller as themselves."""

from __future__ import annotations

import _thread
import random
import signal

import pytest
from conftest import needs_trained

from core import Ensemble, GenerationConfig, MemberError
from core.events import MemberFailed
from core.testbed import make_problems
from core.user_cache import CACHE_ENV

pytestmark = needs_trained
CONFIG = GenerationConfig(max_new_tokens=24)
PROBLEMS = make_problems(4, seed=21)
METHODS = ["single", "token", "safe", "specem"]


class Fault(RuntimeError):
    pass


class Injector:
    """Raises on the `at`-th forward call of one model: before it runs (a pre-hook on the
    model), inside it (a pre-hook on the second decoder layer: the first one has written its
    keys and values by then) or after it (a hook on the model's output)."""

    def __init__(self, model, where: str, error: type[BaseException], at: int) -> None:
        self.error, self.at, self.calls, self.fired = error, at, 0, False
        self.handles = []
        if where == "before":
            self.handles.append(model.register_forward_pre_hook(self._count_and_raise))
        elif where == "inside":
            self.handles.append(model.register_forward_pre_hook(self._count))
            layer = _decoder_layers(model)[1]
            self.handles.append(layer.register_forward_pre_hook(self._raise_if_due))
        else:
            self.handles.append(model.register_forward_hook(self._count_and_raise_after))

    def _count(self, *_):
        self.calls += 1

    def _raise_if_due(self, *_):
        if self.calls == self.at and not self.fired:
            self.fired = True
            raise self.error(f"injected fault (call {self.at})")

    def _count_and_raise(self, *_):
        self._count()
        self._raise_if_due()

    def _count_and_raise_after(self, *_):
        self._count()
        self._raise_if_due()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _decoder_layers(model):
    base = getattr(model, "model", None) or getattr(model, "transformer", None)
    return getattr(base, "layers", None) or base.h


@pytest.fixture(scope="module")
def fresh_texts(shipped_members):
    """What a fresh ensemble answers, per method, for each problem."""
    return {
        method: [
            Ensemble(list(shipped_members), method).generate(p.messages, CONFIG).text
            for p in PROBLEMS
        ]  # fmt: skip
        for method in METHODS
    }


def _next_requests_are_fresh(ens, fresh, n=3) -> None:
    for problem, want in zip(PROBLEMS[:n], fresh[:n], strict=True):
        assert ens.generate(problem.messages, CONFIG).text == want


@pytest.mark.parametrize("kind", [Fault, KeyboardInterrupt], ids=["error", "interrupt"])
@pytest.mark.parametrize("where", ["before", "inside", "after"])
@pytest.mark.parametrize("method", METHODS)
def test_an_injected_fault_leaves_no_trace(shipped_members, fresh_texts, method, where, kind):
    ens = Ensemble(list(shipped_members), method)
    operations = set()
    for member in ens.active_members:
        for at in (1, 3, 11):  # the prompt's prefill, then later steps of the member's work
            injector = Injector(member.model, where, kind, at)
            try:
                if kind is KeyboardInterrupt:
                    with pytest.raises(KeyboardInterrupt):
                        ens.generate(PROBLEMS[3].messages, CONFIG)
                else:
                    with pytest.raises(MemberError) as raised:
                        ens.generate(PROBLEMS[3].messages, CONFIG)
                    error = raised.value
                    assert error.member == member.name and error.operation
                    assert repr(member.name) in str(error) and error.operation in str(error)
                    assert isinstance(error.__cause__, Fault)
                    operations.add(error.operation)
            except BaseException:
                if injector.fired:
                    raise
                continue  # the member does not run that many passes on this problem
            finally:
                injector.remove()
            assert ens.admission.running == 0
            assert ens.generate(PROBLEMS[0].messages, CONFIG).text == fresh_texts[method][0]
    _next_requests_are_fresh(ens, fresh_texts[method])
    if kind is Fault:  # the faults landed in the operations each method performs
        expected = {
            "single": {"draft"},
            "token": {"next-token distributions"},
            "safe": {"draft", "next-token distributions"},
            "specem": {"draft", "verify-in-line scoring"},
        }[method]
        assert expected <= operations


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler for the test, the one found put back after it: a process
    started in the background (`nohup`, `&` in a script) starts with SIGINT ignored, and then
    `interrupt_main` does nothing."""
    found = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, found)


@pytest.mark.parametrize("method", METHODS)
def test_a_real_ctrl_c_at_random_moments_leaves_no_trace(
    shipped_members, fresh_texts, method, python_sigint
):
    """SIGINT, what Ctrl-C sends (`_thread.interrupt_main`), arriving inside a forward pass:
    a random member's random call, at a random decoder layer. The KeyboardInterrupt lands
    wherever the main thread next checks for signals, so every try is interrupted somewhere
    new, and afterwards the ensemble answers as a fresh one does."""
    ens = Ensemble(list(shipped_members), method)
    for _ in range(2):  # the second run as every later one runs (its prompt prefix kept)
        calls = ens.generate(PROBLEMS[3].messages, CONFIG).stats.member_calls
    rng = random.Random(7)
    for _ in range(6):
        member = rng.choice([m for m in ens.active_members if calls.get(m.name)])
        at = rng.randint(1, calls[member.name])
        layer = rng.choice(list(_decoder_layers(member.model)))
        seen = []

        def ctrl_c(*_, at=at, seen=seen) -> None:
            seen.append(True)
            if len(seen) == at:
                _thread.interrupt_main()

        handle = layer.register_forward_pre_hook(ctrl_c)
        try:
            with pytest.raises(KeyboardInterrupt):
                ens.generate(PROBLEMS[3].messages, CONFIG)
        finally:
            handle.remove()
        assert ens.admission.running == 0
    _next_requests_are_fresh(ens, fresh_texts[method])


# --- the member-failure policy ------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, options, failing, survivors",
    [
        ("token", {}, 1, [0, 2]),
        ("safe", {}, 0, [1, 2]),  # the drafter fails: the next member drafts
        ("safe", {}, 2, [0, 1]),
        ("specem", {}, 1, [0, 2]),
    ],
    ids=["token", "safe-drafter", "safe-verifier", "specem"],
)
def test_drop_goes_on_without_the_member(shipped_members, method, options, failing, survivors):
    """A member that fails at its first forward pass leaves before anything was committed, so
    the answer is what the other members give alone; the next request tries it again."""
    ens = Ensemble(list(shipped_members), method, on_member_failure="drop", **options)
    alone = Ensemble([shipped_members[i] for i in survivors], method, **options)
    problem = PROBLEMS[1]
    name = shipped_members[failing].name
    injector = Injector(shipped_members[failing].model, "inside", Fault, 1)
    try:
        out = ens.generate(problem.messages, CONFIG)
    finally:
        injector.remove()
    failed = [e for e in out.events if isinstance(e, MemberFailed)]
    assert [e.member for e in failed] == [name] and "injected fault" in failed[0].error
    assert failed[0].operation
    assert out.stats.failed.keys() == {name} and out.stats.counts["member_failed"] == 1
    assert out.text == alone.generate(problem.messages, CONFIG).text
    again = ens.generate(problem.messages, CONFIG)  # the member is back for the next request
    assert not again.stats.failed
    assert (
        again.text
        == Ensemble(list(shipped_members), method).generate(problem.messages, CONFIG).text
    )


def test_drop_with_one_member_left_runs_it_alone(shipped_members):
    ens = Ensemble(list(shipped_members[:2]), "safe", on_member_failure="drop")
    injector = Injector(shipped_members[1].model, "after", Fault, 1)
    try:
        out = ens.generate(PROBLEMS[0].messages, CONFIG)
    finally:
        injector.remove()
    single = Ensemble([shipped_members[0]], "single").generate(PROBLEMS[0].messages, CONFIG)
    assert out.text == single.text
    assert list(out.stats.failed) == [shipped_members[1].name]


def test_raise_reports_the_failure_as_an_event_too(shipped_members):
    ens = Ensemble(list(shipped_members), "safe")
    seen = []
    injector = Injector(shipped_members[1].model, "inside", Fault, 1)
    try:
        with pytest.raises(MemberError, match=rf"{shipped_members[1].name!r}.*injected fault"):
            ens.generate(PROBLEMS[0].messages, CONFIG, on_event=seen.append)
    finally:
        injector.remove()
    assert [e.member for e in seen if isinstance(e, MemberFailed)] == [shipped_members[1].name]


def test_drop_never_drops_the_only_active_member(shipped_members):
    ens = Ensemble(list(shipped_members), "single", on_member_failure="drop")
    injector = Injector(shipped_members[0].model, "before", Fault, 2)
    try:
        with pytest.raises(MemberError, match="draft"):
            ens.generate(PROBLEMS[0].messages, CONFIG)
    finally:
        injector.remove()


def test_the_policy_is_checked_at_the_call(shipped_members):
    from core import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="'raise'.*'drop'"):
        Ensemble(list(shipped_members), "safe", on_member_failure="skip")


# --- errors from the user's own callbacks ---------------------------------------------------------


class Mine(ValueError):
    pass


def test_a_callback_error_reaches_the_caller_as_itself(shipped_members, fresh_texts):
    ens = Ensemble(list(shipped_members), "safe")
    raised = Mine("my handler is broken")

    def handler(event):
        raise raised

    with pytest.raises(Mine) as caught:
        ens.generate(PROBLEMS[0].messages, CONFIG, on_event=handler)
    assert caught.value is raised
    with pytest.raises(Mine):
        list(ens.stream(PROBLEMS[0].messages, CONFIG, on_event=handler))
    assert ens.generate(PROBLEMS[0].messages, CONFIG).text == fresh_texts["safe"][0]


async def test_a_callback_error_reaches_an_async_caller_as_itself(shipped_members):
    ens = Ensemble(list(shipped_members), "specem")

    def handler(event):
        raise Mine("async handler")

    with pytest.raises(Mine, match="async handler"):
        await ens.agenerate(PROBLEMS[0].messages, CONFIG, on_event=handler)


def test_adapters_pass_callback_errors_through(shipped_members):
    from langchain_ensemble import ChatEnsemble
    from llamaindex_ensemble import EnsembleLLM

    ens = Ensemble(list(shipped_members), "safe")

    def handler(event):
        raise Mine("adapter handler")

    with pytest.raises(Mine):
        ChatEnsemble.from_ensemble(ens, on_event=handler, max_tokens=8).invoke("Hi")
    with pytest.raises(Mine):
        EnsembleLLM(ensemble=ens, on_event=handler, max_new_tokens=8).complete("Hi")


def test_a_member_failing_while_the_builtin_self_preference_is_measured_fails_the_build(
    shipped_members, tmp_path, monkeypatch
):
    """The measurement runs when the ensemble is built: a member that fails there fails the
    build, naming the member, the option and the way on; the members serve the next ensemble
    as if nothing had happened. (An empty cache folder: a kept measurement runs no pass.)"""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    name = shipped_members[1].name

    def broken(*_):  # every pass fails, so no retry of a batched pass can get past it
        raise Fault("injected fault")

    handle = shipped_members[1].model.register_forward_pre_hook(broken)
    try:
        with pytest.raises(
            MemberError, match="self_preference='builtin'.*self_preference='off'"
        ) as e:
            Ensemble(list(shipped_members), "specem", self_preference="builtin")
    finally:
        handle.remove()
    assert e.value.member == name and "injected fault" in str(e.value)
    built = Ensemble(list(shipped_members), "specem", self_preference="builtin")
    fresh = Ensemble(list(shipped_members), "specem")
    fresh.calibrate(max_new_tokens=64)
    assert built.summary()["self_preference"]["margins"] == pytest.approx(
        fresh.summary()["self_preference"]["margins"], rel=1e-5
    )
