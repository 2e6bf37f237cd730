"""Running one step for several members at once, when that can help.

Methods loop over members (draft with each, score with each). Members that compute on the same
local resource gain nothing from overlapping: CPU members only fight for the same cores, two
members on one GPU queue on it anyway. Members elsewhere do gain: a remote member spends its
time waiting on a server, an in-process member on another GPU computes there. Each member names
where it `runs_on` (the CPU, a GPU, one server connection); members that run on the same place
run one after the other, and places run concurrently. With a single place nothing changes: the
members run in order, in the calling thread, exactly as a plain loop would.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

from .member import Member
from .sampling import Sampler

T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="member")
        return _pool


def places(members: Sequence[Member]) -> list[list[int]]:
    """Member indices grouped by where they run (`Member.runs_on`), in first-appearance order."""
    groups: dict[str, list[int]] = {}
    for i, member in enumerate(members):
        groups.setdefault(member.runs_on, []).append(i)
    return list(groups.values())


def overlaps(members: Sequence[Member]) -> bool:
    """Whether `each` would run some of these members concurrently."""
    return len(places(members)) > 1


def _child(sampler: Sampler) -> Sampler:
    """An independent sampler seeded from `sampler`'s generator (a seeded request stays
    reproducible when its members draw concurrently: each draws from its own stream)."""
    child = copy.copy(sampler)
    seed = int(torch.randint(0, 2**62, (1,), generator=sampler.generator))
    child.generator = torch.Generator().manual_seed(seed)
    return child


def each(
    members: Sequence[Member], fn: Callable[..., T], sampler: Sampler | None = None
) -> list[T]:
    """`fn(member)` for every member (or `fn(member, sampler)` when a sampler is given), results
    in member order. Places run concurrently; every call finishes before the first error (in
    member order) is raised, so no member is left mid-request behind the caller's back.

    A sampling (non-greedy) sampler is split into one child per member when members overlap,
    drawn in member order before anything runs: concurrent draws from one generator would
    depend on thread timing."""
    groups = places(members)
    concurrent = len(groups) > 1
    if sampler is None:
        calls = [lambda m=m: fn(m) for m in members]
    else:
        split = concurrent and not sampler.greedy
        samplers = [_child(sampler) if split else sampler for _ in members]
        calls = [lambda m=m, s=s: fn(m, s) for m, s in zip(members, samplers, strict=True)]
    if not concurrent:
        return [call() for call in calls]

    results: list = [None] * len(members)
    errors: dict[int, BaseException] = {}

    def run_place(indices: list[int]) -> None:
        for i in indices:
            try:
                results[i] = calls[i]()
            except BaseException as error:  # re-raised below, after every place is done
                errors[i] = error
                return  # the rest of this place would see a member in an unknown state

    futures: list[Future] = [_executor().submit(run_place, g) for g in groups[1:]]
    run_place(groups[0])  # the first place (often the local one) in the calling thread
    for future in futures:
        future.result()
    if errors:
        raise errors[min(errors)]
    return results


def draft_each(members: Sequence[Member], limit: int, sampler: Sampler, committed: str) -> list:
    """Every member's draft of the same continuation of `committed` (`Member.draft`, up to
    `limit` tokens each), in member order. Members that run one after another on the same
    place, drafting greedily, read the first member's draft as a guess of their own: the same
    drafts, with one forward pass for the stretch where a member agrees with it."""
    if overlaps(members) or not sampler.greedy:
        return each(members, lambda m, s: m.draft(limit, s), sampler)
    first = members[0].draft(limit, sampler)
    guess = members[0].text[len(committed) :]
    return [first] + [m.draft(limit, sampler, guess=guess) for m in members[1:]]
