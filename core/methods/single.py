"""One member alone: the quality and speed baseline every ensemble is measured against."""

from __future__ import annotations

from collections.abc import Iterator

from .base import Commit, Method, Request, pick_member


class Single(Method):
    name = "single"
    member_options = ("index",)

    def __init__(self, members, member: int | str = 0) -> None:
        super().__init__(members)
        self.index = pick_member(self.members, member, "member")

    @property
    def active(self):
        return [self.members[self.index]]

    def run(self, request: Request) -> Iterator[Commit]:
        member = self.members[self.index]
        while request.remaining > 0:
            if member.text != request.text:  # grown by text a grammar forced (a member
                member.sync(request.text)  # holding part of a character keeps it)
            draft = member.draft(1, request.sampler)
            if draft.stopped:
                yield Commit("", 1, "stop")  # the stop token is a generated token
                return
            if not draft.ids:  # context window full
                yield Commit("", 0, "length")
                return
            yield Commit(member.text[len(request.text) :], 1)

    def summary(self) -> dict:
        return {**super().summary(), "member": self.members[self.index].name}


METHOD = Single
