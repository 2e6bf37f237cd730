"""Alignment: several members' next-token distributions on one list of candidate strings.

Members with different tokenizers cannot be averaged id by id; they are averaged over strings.
Two rules, as published:
- UniTE (Yao et al., 2025): the union of each member's top-k strings; a member's value for a
  string outside its top-k is its log-prob of that string as one token, else of one of its
  sub-tokens (`SUBTOKEN_RULES`), and each member is renormalised over the union.
- GaC (Yu et al., 2024): the union of the full vocabularies, built once per member set; a
  member's distribution projects onto it by summing the ids that spell each string.

The `token` baseline and SAFE both align through `Aligner`, which keeps GaC's union per member
set. A member's stop is one candidate, `EOS`, carrying its whole stop mass; with
`stops_as_text` (SAFE's authors' rule) each stop id is instead the string its tokenizer
decodes it to ("<|im_end|>"), a candidate of its own.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .validate import check_choice
from .vocab import EOS, Vocab, stop_logprob

AGGREGATORS = ("unite", "gac")
GATE = 0.5  # GaC's threshold on its main member's probability (SAFE+GaC applies it too)

# Which id stands for a string outside a member's top-k when the string is several of its tokens
# (UniTE's alignment): "nonblank" = its first sub-token that is not a bare space, as UniTE's and
# SAFE's released code do (" 12" -> "1" for a tokenizer that spells it "▁" "1" "2"); "first" =
# its first sub-token whatever it is (" 12" -> "▁").
SUBTOKEN_RULES = ("nonblank", "first")

_SUBTOKENS: weakref.WeakKeyDictionary[Vocab, dict] = weakref.WeakKeyDictionary()


def subtoken_id(vocab: Vocab, s: str, rule: str = "first") -> int | None:
    """The id a member would start spelling `s` with: the token itself when `s` is one token,
    else a sub-token chosen by `rule` (SUBTOKEN_RULES). Cached per vocabulary."""
    cache = _SUBTOKENS.setdefault(vocab, {})
    key = (s, rule)
    if key not in cache:
        ids = vocab.encode(s)
        if rule == "nonblank":  # UniTE's code: sub-tokens equal to its " " token are skipped
            blank = vocab.encode(" ")[:1]
            found = ids[0] if len(ids) == 1 else next((i for i in ids if [i] != blank), None)
            found = ids[0] if found is None and ids else found
        else:
            dummy_only = ids and vocab.token_bytes[ids[0]] == b" " and len(ids) > 1
            if vocab.dummy_prefix and dummy_only and not s.startswith(" "):
                ids = ids[1:]  # a "▁" the tokenizer put in front of the string
            found = vocab.string_to_id.get(s, ids[0] if ids else None)
        cache[key] = found
    return cache[key]


@dataclass(frozen=True)
class Aligned:
    """Candidate strings and each member's probability for each of them: probs[m, c]."""

    strings: list[str]
    probs: torch.Tensor  # [members, candidates], float32 on CPU
    index: dict[str, int]  # string -> its column
    stops: frozenset[str] = frozenset({EOS})  # the candidates that end the turn


def stop_texts(vocab: Vocab, stop_ids) -> dict[int, str]:
    """Each stop id's text, as its tokenizer decodes it ("<|im_end|>"; `stops_as_text`)."""
    texts = {}
    for i in sorted(stop_ids):
        text = (vocab.special_text.get(i) or vocab.strings[i]) if i < vocab.size else None
        if text:
            texts[i] = text
    return texts


def _by_text(texts: dict[int, str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for i, text in texts.items():
        found.setdefault(text, i)
    return found


def unite_union(
    vocabs: Sequence[Vocab],
    stop_ids: Sequence[Sequence[int]],
    logprobs: Sequence[torch.Tensor],
    k: int = 10,
    subtoken: str = "nonblank",
    stops_as_text: bool = False,
) -> Aligned:
    """UniTE: the union of each member's top-k strings; a member's value for a string outside its
    top-k is its log-prob of that string as one token, or of one of its sub-tokens (`subtoken`,
    see SUBTOKEN_RULES). Each member is then renormalised over the union (softmax), as UniTE
    does."""
    pairs = zip(vocabs, stop_ids, strict=True)
    texts = [stop_texts(v, s) if stops_as_text else {} for v, s in pairs]
    union: dict[str, None] = {}
    for vocab, stops, lp, own in zip(vocabs, stop_ids, logprobs, texts, strict=True):
        top = torch.topk(lp, min(k, lp.shape[-1])).indices.tolist()
        for i in top:
            if i in stops:
                union[own.get(i, EOS)] = None
            elif vocab.strings[i]:
                union[vocab.strings[i]] = None
    strings = list(union)
    rows = []
    for vocab, stops, lp, own in zip(vocabs, stop_ids, logprobs, texts, strict=True):
        lp_cpu, own_ids = lp.float().cpu(), _by_text(own)
        values = []
        for s in strings:
            if s == EOS:
                values.append(stop_logprob(lp_cpu, stops).item())
                continue
            i = own_ids[s] if s in own_ids else subtoken_id(vocab, s, subtoken)
            values.append(lp_cpu[i].item() if i is not None else float("-inf"))
        values = torch.tensor(values)
        if bool(torch.isneginf(values).all()):  # none of the strings can come from this member
            rows.append(torch.zeros_like(values))  # (a constrained row: none is allowed there)
        else:
            rows.append(torch.softmax(values, dim=0))
    stops = frozenset({EOS}).union(*(t.values() for t in texts))
    return Aligned(strings, torch.stack(rows), {s: c for c, s in enumerate(strings)}, stops)


class UnionVocab:
    """GaC's full-vocabulary union: every member's ids mapped onto one string index (built once
    per ensemble; the map is a dense index tensor, so projecting a distribution is one
    scatter_add). Stops map to `EOS`, or with `stops_as_text` to their own texts."""

    def __init__(
        self,
        vocabs: Sequence[Vocab],
        stop_ids: Sequence[Sequence[int]],
        stops_as_text: bool = False,
    ) -> None:
        index: dict[str, int] = {EOS: 0}
        self.maps: list[torch.Tensor] = []
        self.stops = {EOS}
        for vocab, stops in zip(vocabs, stop_ids, strict=True):
            target = torch.full((vocab.size,), -1, dtype=torch.long)
            for i, s in enumerate(vocab.strings):
                if s:
                    target[i] = index.setdefault(s, len(index))
            texts = stop_texts(vocab, stops) if stops_as_text else {}
            self.stops.update(texts.values())
            for i in stops:
                if i < vocab.size:
                    target[i] = index.setdefault(texts[i], len(index)) if i in texts else 0
            self.maps.append(target)
        self.strings = list(index)
        self.index = index  # string -> its position in `strings`
        void = len(self.strings)  # unspellable ids (control tokens, partial bytes) land here
        self.maps = [torch.where(m < 0, void, m) for m in self.maps]
        self._device_maps: dict[tuple[int, str], torch.Tensor] = {}

    def project(self, member: int, logprobs: torch.Tensor) -> torch.Tensor:
        """A member's distribution as probabilities over the union strings (CPU, float32)."""
        key = (member, str(logprobs.device))
        if key not in self._device_maps:
            self._device_maps[key] = self.maps[member].to(logprobs.device)
        index = self._device_maps[key]
        out = torch.zeros(len(self.strings) + 1, device=logprobs.device, dtype=torch.float32)
        n = min(index.shape[0], logprobs.shape[-1])
        out.scatter_add_(0, index[:n], logprobs.float()[:n].exp())
        return out[:-1].cpu()

    def align(self, logprobs: Sequence[torch.Tensor], which: Sequence[int] | None = None):
        """Members `which` (default: the first len(logprobs)), one row each, on the union."""
        which = range(len(logprobs)) if which is None else which
        probs = torch.stack([self.project(m, lp) for m, lp in zip(which, logprobs, strict=True)])
        return Aligned(self.strings, probs, self.index, frozenset(self.stops))


class Aligner:
    """Next-token distributions of several members -> probabilities over shared strings, by
    `aggregator` ("unite" | "gac"). GaC's union of full vocabularies is built once per member
    set and shared by every request's copy (keyed by names: a member that leaves a request
    shifts the indices)."""

    def __init__(
        self, aggregator: str, top_k: int, subtoken: str = "nonblank", stops_as_text: bool = False
    ) -> None:
        check_choice("aggregator", aggregator, AGGREGATORS)
        check_choice("subtoken", subtoken, SUBTOKEN_RULES)
        self.aggregator = aggregator
        self.top_k = top_k
        self.subtoken = subtoken
        self.stops_as_text = stops_as_text
        self._unions: dict[tuple[str, ...], UnionVocab] = {}

    def align(
        self, members: Sequence, rows: Sequence[torch.Tensor], which: Sequence[int] | None = None
    ) -> Aligned:
        """`rows[n]` is the row of `members[which[n]]` (default: of the first len(rows))."""
        which = list(range(len(rows))) if which is None else list(which)
        if self.aggregator == "unite":
            chosen = [members[i] for i in which]
            return unite_union(
                [m.vocab for m in chosen],
                [m.stop_ids for m in chosen],
                rows,
                k=self.top_k,
                subtoken=self.subtoken,
                stops_as_text=self.stops_as_text,
            )
        return self.union(members).align(rows, which)

    def top_strings(self, member, row: torch.Tensor) -> list[tuple[int, str | None]]:
        """The member's top-k ids and their candidate strings (a stop: EOS, or its text)."""
        texts = stop_texts(member.vocab, member.stop_ids) if self.stops_as_text else {}
        ids = torch.topk(row, min(self.top_k, row.shape[-1])).indices.tolist()
        return [
            (i, texts.get(i, EOS) if i in member.stop_ids else member.vocab.strings[i]) for i in ids
        ]

    def column_id(self, member, row: torch.Tensor, s: str) -> int | None:
        """UniTE: the id the member's value for candidate `s` is read from (its likeliest top-k
        id that spells it, else its sub-token); GaC: None (every id that spells it counts)."""
        if self.aggregator != "unite" or s == EOS:
            return None
        for i, string in self.top_strings(member, row):
            if string == s:
                return i
        return subtoken_id(member.vocab, s, self.subtoken)

    def union(self, members: Sequence) -> UnionVocab:
        """GaC's union of these members' vocabularies (built on first use)."""
        key = tuple(m.name for m in members)
        if key not in self._unions:
            vocabs, stops = [m.vocab for m in members], [m.stop_ids for m in members]
            self._unions[key] = UnionVocab(vocabs, stops, self.stops_as_text)
        return self._unions[key]


def top_candidates(strings: list[str], probs: torch.Tensor, k: int = 5) -> list[tuple[str, float]]:
    """The k likeliest candidates and their probabilities (events report them)."""
    values, index = torch.topk(probs, min(k, probs.shape[0]))
    return [(strings[i], float(v)) for v, i in zip(values.tolist(), index.tolist(), strict=True)]
