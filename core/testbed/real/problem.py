"""A real-task problem, the held-out split of every item, and how items are drawn.

Every finite pool (facts, names, cities, jobs, goods) and every number combination is split by a
fixed hash of its key into a reporting part and a tuning part (`part_of`). Seed 1 is the
reporting seed (`REPORT_SEED`): its problems use the reporting part only; every other seed
(seed 2 is the one to tune on) uses the tuning part only. Within one seed no item repeats: a
finite pool is a `Deck`, each item drawn once; combinatorial items are `Draws`, each key once.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import pools

PARTS = ("report", "tune")
REPORT_SEED = 1  # the seed whose problems are reported; every other seed tunes

NUMBER_ONLY = "Answer with the number only."
ONE_WORD = "Answer with one word."
ONE_LETTER = "Answer with one letter."
JSON_ONLY = "Answer with the JSON object only."
MAX_TRIES = 5000  # draws before a combinatorial topic counts as used up

Answer = int | str | dict[str, Any]


@dataclass(frozen=True)
class RealProblem:
    """One question. `messages` is everything before the first assistant turn.

    The answer is a number (int), a word (str; `aliases` are its other accepted spellings) or a
    JSON object (dict; `schema` is its JSON schema, to pass as `response_format` for structured
    output). `options` are the wrong answers of the same sort that a reply must not give
    instead of the answer or beside it; `rivals` are the wrong answers the prompt itself offers
    (the other passages' facts), which a right reply does not name at all; `framing` is the
    prompt's own framing around them ("Passage 1:"), which a reply that answers does not copy;
    `echoes` are the question's own numbers, which a reply may repeat.
    """

    form: str
    kind: str
    topic: str  # finer than kind: the fact list, the operation, the passage's attribute, ...
    messages: list[dict[str, Any]]
    question: str  # the user's question (qa, tool) or the retrieval query (rag)
    answer: Answer
    solution: str  # a reference reply (tool: the final answer after the tool's result)
    key: str  # the item; no two problems of one seed share it
    aliases: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    rivals: tuple[int | str, ...] = ()
    framing: tuple[str, ...] = ()
    echoes: tuple[int, ...] = ()
    schema: dict[str, Any] | None = None
    passages: tuple[str, ...] = ()  # rag: the relevant passage first, then distractors
    relevant_passage: str = ""
    # tool: the offered tools (OpenAI specs), the JSON schema of the final answer (or None), and
    # the one right call (name, arguments), None when no tool is needed
    tools: list[dict[str, Any]] = field(default_factory=list)
    response_format: dict[str, Any] | None = None
    expected_call: tuple[str, dict[str, Any]] | None = None


# --------------------------------------------------------------------------- splits


def part_of(key: str) -> str:
    """The part an item belongs to: a fixed hash of its key (stable across Python runs)."""
    digest = hashlib.sha256(f"real-task/{key}".encode()).digest()
    return PARTS[digest[0] % 2]


def part_of_seed(seed: int) -> str:
    """Seed 1 reports; every other seed tunes."""
    return "report" if seed == REPORT_SEED else "tune"


class UsedUp(Exception):
    """A topic has no unused item left in this part."""


class Deck:
    """A finite pool's items, in a seeded order, each drawn once."""

    def __init__(self, items: list, rng: random.Random) -> None:
        self.items = list(items)
        rng.shuffle(self.items)

    def draw(self):
        if not self.items:
            raise UsedUp
        return self.items.pop()


class Draws:
    """Combinatorial items: drawn at random until one is new to the seed and, where the key
    decides the split (`split=True`), in the seed's part."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.used: set[str] = set()

    def draw(self, sample: Callable[[], tuple[str, Any] | None], split: bool = True):
        for _ in range(MAX_TRIES):
            drawn = sample()
            if drawn is None:
                continue
            key, item = drawn
            if key not in self.used and (not split or part_of(key) == self.part):
                self.used.add(key)
                return key, item
        raise UsedUp


def in_turn(rng: random.Random, makers: dict[str, Callable[[], RealProblem]]):
    """Problems of each topic in turn (a seeded order per round); a used-up topic drops out,
    and the kind is used up when all have."""
    live = list(makers)
    while live:
        round_ = list(live)
        rng.shuffle(round_)
        for topic in round_:
            try:
                yield makers[topic]()
            except UsedUp:
                live.remove(topic)
    raise UsedUp


# --------------------------------------------------------------------------- small helpers

_NUMBER = re.compile(r"(?<![\w.])\d+")


def numbers_in(text: str) -> tuple[int, ...]:
    """The distinct whole numbers written in `text` (digits), sorted."""
    return tuple(sorted({int(n) for n in _NUMBER.findall(text)}))


def words_of(text: str) -> set[str]:
    return set(re.findall(r"[\w'-]+", text.lower()))


def options_of(pool, accepted: tuple[str, ...], question: str) -> tuple[str, ...]:
    """The wrong options of a word answer: the pool, less the accepted forms and the words of
    the question (a reply may repeat those)."""
    skip = {a.lower() for a in accepted} | words_of(question)
    return tuple(sorted({w for w in pool if w.lower() not in skip}))


def article(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def user_turn(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def reference_reply(answer: Answer) -> str:
    return json.dumps(answer) if isinstance(answer, dict) else f"The answer is {answer}."


def number_answer_problem(form, kind, topic, question: str, answer: int, key: str) -> RealProblem:
    echoes = tuple(n for n in numbers_in(question) if n != answer)
    return RealProblem(
        form, kind, topic, user_turn(question), question, answer, reference_reply(answer), key,
        echoes=echoes,
    )  # fmt: skip


def word_answer_problem(
    form, kind, topic, question, answer: str, aliases, pool, key
) -> RealProblem:
    return RealProblem(
        form, kind, topic, user_turn(question), question, answer, reference_reply(answer), key,
        aliases=tuple(aliases), options=options_of(pool, (answer, *aliases), question),
    )  # fmt: skip


def shows_answer(question: str, answer: int) -> bool:
    return answer in numbers_in(question)


# --------------------------------------------------------------------------- the split pools


@dataclass(frozen=True)
class Fact:
    """A fact and its questions: (question, answer) per direction (the day after Sunday and the
    day before Monday are one fact)."""

    key: str
    topic: str
    questions: tuple[tuple[str, str], ...]
    aliases: tuple[str, ...]
    pool: tuple[str, ...]  # the answers of the topic's facts: the options a reply could name


def all_facts() -> list[Fact]:
    """Every fact the task asks about."""
    out = []
    capitals = tuple(
        c for city in pools.CAPITALS.values() for c in (city, *pools.CAPITAL_ALIASES.get(city, ()))
    )
    for country, city in pools.CAPITALS.items():
        question = f"What is the capital of {country}?"
        out.append(Fact(f"capital/{country}", "capital", ((question, city),),
                        pools.CAPITAL_ALIASES.get(city, ()), capitals))  # fmt: skip
    opposites = tuple(w for pair in pools.OPPOSITES for w in pair)
    for word, answer, *aliases in pools.OPPOSITES:
        question = f"What is the opposite of {word}?"
        out.append(Fact(f"opposite/{word}", "opposite", ((question, answer),), tuple(aliases),
                        opposites))  # fmt: skip
    plurals = tuple(pools.PLURALS.values()) + tuple(f"{s}s" for s in pools.PLURALS)
    for singular, plural in pools.PLURALS.items():
        question = f"What is the plural of {singular}?"
        out.append(Fact(f"plural/{singular}", "plural", ((question, plural),), (), plurals))
    for thing, colour in pools.COLOURS.items():
        question = f"What colour is {thing}?"
        out.append(Fact(f"colour/{thing}", "colour", ((question, colour),),
                        pools.COLOUR_ALIASES.get(colour, ()), pools.COLOUR_WORDS))  # fmt: skip
    for unit, names in (("day", pools.DAYS), ("month", pools.MONTHS)):
        for i, name in enumerate(names):
            after = names[(i + 1) % len(names)]
            questions = (
                (f"Which {unit} comes after {name}?", after),
                (f"Which {unit} comes before {after}?", name),
            )
            out.append(Fact(f"{unit}/{name}/{after}", f"{unit} order", questions, (), names))
    sounds = tuple(w for words in pools.SOUNDS.values() for w in words)
    for animal, (sound, *aliases) in pools.SOUNDS.items():
        question = f"What sound does {article(animal)} make?"
        out.append(Fact(f"sound/{animal}", "animal sound", ((question, sound),), tuple(aliases),
                        sounds))  # fmt: skip
    return out


class PartPools:
    """The part's share of every finite pool, split by each item's own key."""

    def __init__(self, part: str) -> None:
        def mine(items, key=str):
            return [item for item in items if part_of(key(item)) == part]

        self.part = part
        self.names = mine(sorted(pools.NAMES), lambda n: f"name/{n}")
        self.cities = mine(pools.CITIES, lambda c: f"city/{c}")
        self.jobs = mine(pools.JOBS, lambda j: f"job/{j}")
        self.goods = mine(pools.GOODS, lambda g: f"good/{g}")
        self.facts = mine(all_facts(), lambda f: f.key)


def fact_problem(form: str, kind: str, fact: Fact, rng: random.Random) -> RealProblem:
    question, answer = rng.choice(fact.questions)
    return word_answer_problem(
        form, kind, fact.topic, f"{question} {ONE_WORD}", answer, fact.aliases, fact.pool,
        fact.key,
    )  # fmt: skip
