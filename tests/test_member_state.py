"""Per-request state: everything a request changes in a member lives in the state its view gets
from `spawn`, constructed fresh for each request; every other attribute of the view is the
member's own, shared. A request cannot see what another left behind, whichever backend."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

import pytest
from conftest import needs_trained
from fake_server import FakeServer

from core import GenerationConfig, HFMember
from core.hf_member import HFRequestState
from core.remote import Remote, connect
from core.sampling import Sampler
from core.testbed import model_paths

MESSAGES = [{"role": "user", "content": "Tom has 7 apples. How many?"}]


def _request(view) -> None:
    """A request's worth of operations: every kind of state a backend keeps gets written."""
    view.start(MESSAGES)
    draft = view.draft(3, Sampler(GenerationConfig()))
    view.score([" yes", " no"], ends=[True, False])
    view.sync(view.text + " 12")
    view.logprobs([0, view.n_tokens])
    assert draft.logprobs.shape[0] >= len(draft.ids)  # read last: a remote member notes it


def _mutable(value) -> bool:
    return not isinstance(value, (int, float, bool, str, bytes, type(None)))


def _assert_requests_share_nothing(member) -> None:
    before, cancels = member.state, [threading.Event(), threading.Event()]
    first = member.spawn(cancels[0], reuse=False)
    _request(first)
    assert first.calls > 0 and first.state.sequence.seq
    second = member.spawn(cancels[1])
    # every field of the dataclass, whichever backend declares it, starts fresh
    assert second.state == type(second.state)(cancel=cancels[1], reuse=True)
    _request(second)
    assert first.state is not second.state
    for part in ("state", "state.sequence"):
        one, two = (_attribute(view, part) for view in (first, second))
        for f in fields(one):
            a, b = getattr(one, f.name), getattr(two, f.name)
            assert not (_mutable(a) and a is b), f"{part}.{f.name} shared"
    # what a request changes lives in its state only: every other attribute is the member's
    for view in (first, second):
        assert vars(view).keys() == vars(member).keys()
        assert all(vars(view)[k] is v for k, v in vars(member).items() if k != "state")
    assert member.state is before


def _attribute(view, dotted: str):
    value = view
    for name in dotted.split("."):
        value = getattr(value, name)
    return value


@pytest.mark.parametrize("family", [0, 1, 2], ids=["bpe", "spm", "word"])
def test_in_process_requests_share_nothing(tiny_members, family):
    _assert_requests_share_nothing(tiny_members[family])


@needs_trained
def test_remote_requests_share_nothing():
    path = model_paths()[0]
    fake = FakeServer(path, name=path.name)
    member = connect(Remote(fake.url, model=fake.name, tokenizer=fake.root))
    try:
        _assert_requests_share_nothing(member)
    finally:
        member.close()
        fake.stop()


@dataclass
class _NotedState(HFRequestState):
    notes: list[str] = field(default_factory=list)


class _NotedMember(HFMember):
    """A backend that keeps one more thing per request: declared in its state, nowhere else."""

    state_type = _NotedState


def test_a_field_declared_in_the_state_is_fresh_for_every_request(tiny_members):
    base = tiny_members[0]
    member = _NotedMember(base.name, base.model, base.tokenizer)
    first = member.spawn()
    first.start(MESSAGES)
    first.logprobs([0])
    first.state.notes.append("seen by the first request")
    second = member.spawn()
    assert second.state.notes == [] and member.state.notes == []
    assert second.state.prefilled == 0 and first.state.prefilled > 0
