"""The real task's problems: short questions with one checkable answer, for small chat models.

Three forms, each seeded and deterministic (the first k of n problems are the k problems):

- ``qa``: seven kinds, each block of seven problems holding one of each in a seeded order:
  arithmetic, word problems, facts (capitals, opposites, plurals, colours, the order of days and
  months, animal sounds), unit conversions, number and letter sequences, JSON extraction from a
  sentence, and a question over three short passages in the prompt.
- ``rag``: the passage question as a LlamaIndex query engine sends it (its default chat QA
  prompt, holding the relevant passage and one distractor); ``passages`` are the documents to
  index (the relevant one first, then three distractors).
- ``tool``: tools of ``core.testbed.tool_set`` offered as OpenAI-style specs; the right first
  turn is one call with arguments taken from the question (``expected_call``), the right final
  answer follows from the tool's result. One kind in seven needs no tool (a fact question).

Held-out splits: every finite pool (facts, names, cities, jobs, goods) and every number
combination is split by a hash of its key into a reporting part and a tuning part. Seed 1 is the
reporting seed (``REPORT_SEED``): its problems use the reporting part only. Every other seed
(seed 2 is the one to tune on) uses the tuning part only, so no tuning problem shares a fact, a
person, a place, a good or a number combination with a reported one. Within one seed no item
repeats; asking for more problems than a part holds is an error.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import InvalidConfigError
from ..task import (
    ANSWER_KEYS,
    RAG_CONTEXT_SEPARATOR,
    RAG_DISTRACTORS,
    RAG_SYSTEM_PROMPT,
    RAG_USER_TEMPLATE,
    answer_schema,
)
from ..tool_set import TOOL_SPECS, call_tool
from . import pools

FORMS = ("qa", "rag", "tool")
QA_KINDS = ("arithmetic", "word_problem", "fact", "conversion", "sequence", "json", "passage")
TOOL_KINDS = ("add", "subtract", "multiply", "calculator", "price", "stock", "direct")
PARTS = ("report", "tune")
REPORT_SEED = 1  # the seed whose problems are reported; every other seed tunes

NUMBER_ONLY = "Answer with the number only."
ONE_WORD = "Answer with one word."
ONE_LETTER = "Answer with one letter."
JSON_ONLY = "Answer with the JSON object only."
RESPONSE_FORMAT_RATE = 0.3  # share of tool calls whose final answer must be JSON
QA_PASSAGES = 3  # passages in the prompt of a qa passage question
MAX_TRIES = 5000  # draws before a combinatorial topic counts as used up

Answer = int | str | dict[str, Any]


@dataclass(frozen=True)
class RealProblem:
    """One question. `messages` is everything before the first assistant turn.

    The answer is a number (int), a word (str; `aliases` are its other accepted spellings) or a
    JSON object (dict; `schema` is its JSON schema, to pass as `response_format` for structured
    output). `options` are the wrong answers of the same sort that a reply must not give
    instead of the answer or beside it; `rivals` are the wrong answers the prompt itself offers
    (the other passages' facts), which a right reply does not name at all; `echoes` are the
    question's own numbers, which a reply may repeat.
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


class _UsedUp(Exception):
    """A topic has no unused item left in this part."""


class _Deck:
    """A finite pool's items, in a seeded order, each drawn once."""

    def __init__(self, items: list, rng: random.Random) -> None:
        self.items = list(items)
        rng.shuffle(self.items)

    def draw(self):
        if not self.items:
            raise _UsedUp
        return self.items.pop()


class _Draws:
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
        raise _UsedUp


def _in_turn(rng: random.Random, makers: dict[str, Callable[[], RealProblem]]):
    """Problems of each topic in turn (a seeded order per round); a used-up topic drops out,
    and the kind is used up when all have."""
    live = list(makers)
    while live:
        round_ = list(live)
        rng.shuffle(round_)
        for topic in round_:
            try:
                yield makers[topic]()
            except _UsedUp:
                live.remove(topic)
    raise _UsedUp


# --------------------------------------------------------------------------- small helpers

_NUMBER = re.compile(r"(?<![\w.])\d+")


def numbers_in(text: str) -> tuple[int, ...]:
    """The distinct whole numbers written in `text` (digits), sorted."""
    return tuple(sorted({int(n) for n in _NUMBER.findall(text)}))


def _words(text: str) -> set[str]:
    return set(re.findall(r"[\w'-]+", text.lower()))


def _options(pool, accepted: tuple[str, ...], question: str) -> tuple[str, ...]:
    """The wrong options of a word answer: the pool, less the accepted forms and the words of
    the question (a reply may repeat those)."""
    skip = {a.lower() for a in accepted} | _words(question)
    return tuple(sorted({w for w in pool if w.lower() not in skip}))


def _article(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _solution(answer: Answer) -> str:
    return json.dumps(answer) if isinstance(answer, dict) else f"The answer is {answer}."


def _number_problem(form, kind, topic, question: str, answer: int, key: str) -> RealProblem:
    echoes = tuple(n for n in numbers_in(question) if n != answer)
    return RealProblem(
        form, kind, topic, _user(question), question, answer, _solution(answer), key,
        echoes=echoes,
    )  # fmt: skip


def _word_problem(form, kind, topic, question, answer: str, aliases, pool, key) -> RealProblem:
    return RealProblem(
        form, kind, topic, _user(question), question, answer, _solution(answer), key,
        aliases=tuple(aliases), options=_options(pool, (answer, *aliases), question),
    )  # fmt: skip


def _shows_answer(question: str, answer: int) -> bool:
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
        question = f"What sound does {_article(animal)} make?"
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


def _fact_problem(form: str, kind: str, fact: Fact, rng: random.Random) -> RealProblem:
    question, answer = rng.choice(fact.questions)
    return _word_problem(
        form, kind, fact.topic, f"{question} {ONE_WORD}", answer, fact.aliases, fact.pool,
        fact.key,
    )  # fmt: skip


# --------------------------------------------------------------------------- qa kinds


def _arithmetic(rng: random.Random, draws: _Draws) -> Iterator[RealProblem]:
    r = rng.randint

    def make(symbol: str, operands: Callable[[], tuple[int, int]], value) -> Callable:
        def one() -> RealProblem:
            def sample():
                a, b = operands()
                question = f"What is {a} {symbol} {b}? {NUMBER_ONLY}"
                if _shows_answer(question, value(a, b)):
                    return None
                return f"arithmetic/{a}{symbol}{b}", (question, value(a, b))

            key, (question, answer) = draws.draw(sample)
            return _number_problem("qa", "arithmetic", symbol, question, answer, key)

        return one

    def subtraction() -> tuple[int, int]:
        a = r(20, 99)
        return a, r(10, a - 1)

    def division() -> tuple[int, int]:
        b = r(2, 9)
        return b * r(2, 12), b

    yield from _in_turn(rng, {
        "+": make("+", lambda: (r(10, 99), r(10, 99)), lambda a, b: a + b),
        "-": make("-", subtraction, lambda a, b: a - b),
        "*": make("*", lambda: (r(2, 9), r(2, 19)), lambda a, b: a * b),
        "/": make("/", division, lambda a, b: a // b),
    })  # fmt: skip


_CONTAINERS = ("bags", "boxes", "baskets", "jars")

# topic -> (numbers drawn, the answer, the question)
_WORD_PROBLEMS: dict[str, tuple[tuple[tuple[int, int], ...], Callable, str]] = {
    "add": (((2, 20), (2, 20)), lambda a, b: a + b,
            "{n} has {a} {obj}. {p} gets {b} more. How many {obj} does {n} have now?"),
    "subtract": (((5, 30), (2, 20)), lambda a, b: a - b,
                 "{n} has {a} {obj}. {p} gives {b} of them to a friend. How many {obj} does {n} "
                 "have left?"),
    "two steps": (((2, 20), (2, 20), (2, 20)), lambda a, b, c: a + b - c,
                  "{n} has {a} {obj}. {p} buys {b} more and then gives away {c}. How many {obj} "
                  "does {n} have now?"),
    "groups": (((2, 9), (2, 9)), lambda a, b: a * b,
               "{n} has {a} {box} with {b} {obj} in each. How many {obj} does {n} have in all?"),
    "share": (((2, 9), (2, 9)), lambda a, b: b,
              "{n} shares {ab} {obj} equally among {a} friends. How many {obj} does each friend "
              "get?"),
    "compare": (((5, 30), (2, 20)), lambda a, b: a - b,
                "{n} has {a} {obj} and {o} has {b}. How many more {obj} does {n} have than {o}?"),
}  # fmt: skip


def _word_problems(rng: random.Random, draws: _Draws, split: PartPools) -> Iterator[RealProblem]:
    objects = [g for g in split.goods if g not in _CONTAINERS]

    def make(topic: str) -> Callable[[], RealProblem]:
        ranges, value, template = _WORD_PROBLEMS[topic]

        def one() -> RealProblem:
            def sample():
                numbers = [rng.randint(*span) for span in ranges]
                answer = value(*numbers)
                name, other = rng.sample(split.names, 2)
                text = template.format(
                    n=name, o=other, p=pools.NAMES[name].capitalize(), obj=rng.choice(objects),
                    box=rng.choice(_CONTAINERS), ab=numbers[0] * numbers[-1],
                    **dict(zip("abc", numbers, strict=False)),
                )  # fmt: skip
                question = f"{text} {NUMBER_ONLY}"
                if answer <= 0 or _shows_answer(question, answer):
                    return None
                return f"word/{topic}/{numbers}", (question, answer)

            key, (question, answer) = draws.draw(sample)
            return _number_problem("qa", "word_problem", topic, question, answer, key)

        return one

    yield from _in_turn(rng, {topic: make(topic) for topic in _WORD_PROBLEMS})


def _facts(rng: random.Random, split: PartPools) -> Iterator[RealProblem]:
    deck = _Deck(split.facts, rng)
    while True:
        yield _fact_problem("qa", "fact", deck.draw(), rng)


CONVERSIONS = (  # (big unit, small unit, how many small in one big)
    ("meters", "centimeters", 100), ("kilometers", "meters", 1000),
    ("centimeters", "millimeters", 10), ("meters", "millimeters", 1000),
    ("kilograms", "grams", 1000), ("liters", "milliliters", 1000), ("hours", "minutes", 60),
    ("minutes", "seconds", 60), ("days", "hours", 24), ("weeks", "days", 7),
    ("years", "months", 12), ("feet", "inches", 12), ("yards", "feet", 3),
    ("decades", "years", 10), ("centuries", "years", 100),
)  # fmt: skip
CONVERSION_AMOUNTS = range(2, 21)


def _conversions(rng: random.Random, part: str) -> Iterator[RealProblem]:
    items = [
        (f"conversion/{big}/{small}/{amount}", big, small, factor, amount)
        for big, small, factor in CONVERSIONS
        for amount in CONVERSION_AMOUNTS
    ]
    deck = _Deck([item for item in items if part_of(item[0]) == part], rng)
    while True:
        key, big, small, factor, amount = deck.draw()
        if rng.random() < 0.5:  # both directions of one amount are one item
            question, answer = f"How many {small} are in {amount} {big}?", amount * factor
        else:
            question, answer = f"How many {big} are in {amount * factor} {small}?", amount
        question = f"{question} {NUMBER_ONLY}"
        yield _number_problem("qa", "conversion", f"{big} and {small}", question, answer, key)


LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
NOT_LETTER_ANSWERS = ("A", "I")  # an article and a pronoun: never an answer or an option
SEQUENCE_TERMS = 4  # terms shown; the answer is the fifth

_NUMBER_SEQUENCES = {  # topic -> (start range, step range, the i-th term)
    "counting up": ((1, 30), (2, 9), lambda s, d, i: s + i * d),
    "counting down": ((50, 99), (2, 9), lambda s, d, i: s - i * d),
    "multiplying": ((1, 20), (2, 3), lambda s, d, i: s * d**i),
}


def _sequences(rng: random.Random, draws: _Draws) -> Iterator[RealProblem]:
    def numbers(topic: str) -> Callable[[], RealProblem]:
        starts, steps, term = _NUMBER_SEQUENCES[topic]

        def one() -> RealProblem:
            def sample():
                start, step = rng.randint(*starts), rng.randint(*steps)
                return f"sequence/{topic}/{start}/{step}", (start, step)

            key, (start, step) = draws.draw(sample)
            *shown, answer = (term(start, step, i) for i in range(SEQUENCE_TERMS + 1))
            listed = ", ".join(map(str, shown))
            question = f"What number comes next in the sequence {listed}? {NUMBER_ONLY}"
            return _number_problem("qa", "sequence", topic, question, answer, key)

        return one

    def letters() -> RealProblem:
        def sample():
            start, step = rng.randint(1, 20), rng.randint(1, 3)
            last = start + SEQUENCE_TERMS * step
            if last >= len(LETTERS) or LETTERS[last] in NOT_LETTER_ANSWERS:
                return None
            return f"sequence/letters/{start}/{step}", (start, step)

        key, (start, step) = draws.draw(sample)
        *shown, answer = (LETTERS[start + i * step] for i in range(SEQUENCE_TERMS + 1))
        question = f"What letter comes next in the sequence {', '.join(shown)}? {ONE_LETTER}"
        pool = [c for c in LETTERS if c not in NOT_LETTER_ANSWERS and c not in shown]
        return _word_problem("qa", "sequence", "letters", question, answer, (), pool, key)

    makers = {topic: numbers(topic) for topic in _NUMBER_SEQUENCES}
    yield from _in_turn(rng, {**makers, "letters": letters})


def _json_sentences(rng: random.Random, split: PartPools) -> dict[str, Callable]:
    """topic -> a function drawing (sentence, the JSON object it holds)."""

    def age():
        name, years = rng.choice(split.names), rng.randint(18, 90)
        return f"{name} is {years} years old.", {"name": name, "age": years}

    def city():
        name, place = rng.choice(split.names), rng.choice(split.cities)
        return f"{name} lives in {place}.", {"name": name, "city": place}

    def job():
        name, work = rng.choice(split.names), rng.choice(split.jobs)
        return f"{name} works as {_article(work)}.", {"name": name, "job": work}

    def price():
        item, cost = rng.choice(split.goods), rng.randint(2, 99)
        return f"The {item} cost {cost} dollars.", {"item": item, "price": cost}

    def purchase():
        name, item, count = rng.choice(split.names), rng.choice(split.goods), rng.randint(2, 30)
        return f"{name} bought {count} {item}.", {"name": name, "item": item, "count": count}

    def birth_year():
        name, year = rng.choice(split.names), rng.randint(1950, 2015)
        return f"{name} was born in {year}.", {"name": name, "year": year}

    def age_and_city():
        name, years, place = rng.choice(split.names), rng.randint(18, 90), rng.choice(split.cities)
        sentence = f"{name} is {years} years old and lives in {place}."
        return sentence, {"name": name, "age": years, "city": place}

    return {
        "age": age, "city": city, "job": job, "price": price, "purchase": purchase,
        "birth year": birth_year, "age and city": age_and_city,
    }  # fmt: skip


def json_schema_of(answer: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema a JSON answer follows: its keys, required, typed as its values."""
    return {
        "type": "object",
        "properties": {
            k: {"type": "integer" if isinstance(v, int) else "string"} for k, v in answer.items()
        },
        "required": list(answer),
    }


def _json(rng: random.Random, draws: _Draws, split: PartPools) -> Iterator[RealProblem]:
    sentences = _json_sentences(rng, split)

    def make(topic: str) -> Callable[[], RealProblem]:
        def one() -> RealProblem:
            def sample():
                sentence, answer = sentences[topic]()
                return f"json/{sentence}", (sentence, answer)

            key, (sentence, answer) = draws.draw(sample, split=False)  # the pools are split
            keys = " and ".join(f'"{k}"' for k in answer)
            question = (
                f'Write a JSON object with the keys {keys} for this sentence: "{sentence}" '
                f"{JSON_ONLY}"
            )
            return RealProblem(
                "qa", "json", topic, _user(question), question, answer, _solution(answer), key,
                schema=json_schema_of(answer),
            )  # fmt: skip

        return one

    yield from _in_turn(rng, {topic: make(topic) for topic in sentences})


# --------------------------------------------------------------------------- passages

PASSAGE_QUESTIONS = {  # attribute -> (question, instruction)
    "city": ("Where does {name} live?", ONE_WORD),
    "job": ("What is {name}'s job?", ONE_WORD),
    "age": ("How old is {name}?", NUMBER_ONLY),
}
Person = tuple[str, str, str, int]  # name, city, job, age


def passage_of(person: Person) -> str:
    """The passage that tells a person's facts."""
    name, city, job, age = person
    pronoun = pools.NAMES[name].capitalize()
    return f"{name} lives in {city} and works as {_article(job)}. {pronoun} is {age} years old."


def _people(rng: random.Random, draws: _Draws, split: PartPools, count: int):
    """(attribute asked, the people: the asked one first, every fact different), in turn."""

    def make(attribute: str):
        def one():
            def sample():
                people = list(
                    zip(
                        rng.sample(split.names, count), rng.sample(split.cities, count),
                        rng.sample(split.jobs, count), rng.sample(range(20, 71), count),
                        strict=True,
                    )
                )  # fmt: skip
                return f"passage/{attribute}/{people[0]}", people

            return attribute, draws.draw(sample, split=False)  # the pools are split

        return one

    yield from _in_turn(rng, {attribute: make(attribute) for attribute in PASSAGE_QUESTIONS})


def _passage_problem(form: str, attribute: str, key: str, people: list[Person], shown: list[int]):
    asked = people[0]
    question_text, instruction = PASSAGE_QUESTIONS[attribute]
    query = f"{question_text.format(name=asked[0])} {instruction}"
    passages = [passage_of(p) for p in people]
    if form == "qa":
        listed = "\n".join(f"Passage {i + 1}: {passages[j]}" for i, j in enumerate(shown))
        question = f"Read the passages and answer the question.\n\n{listed}\n\nQuestion: {query}"
        messages = _user(question)
        documents: dict[str, Any] = {}
    else:
        question = query
        context = RAG_CONTEXT_SEPARATOR.join(passages[j] for j in shown)
        messages = [
            {"role": "system", "content": RAG_SYSTEM_PROMPT},
            {"role": "user", "content": RAG_USER_TEMPLATE.format(context_str=context,
                                                                 query_str=query)},
        ]  # fmt: skip
        documents = {"passages": tuple(passages), "relevant_passage": passages[0]}
    column = {"city": 1, "job": 2, "age": 3}[attribute]
    answer = asked[column]
    rivals = tuple(p[column] for p in people[1:])
    if attribute == "age":
        extra: dict[str, Any] = {}
    else:
        pool = pools.CITIES if attribute == "city" else pools.JOBS
        extra = {"options": _options(pool, (answer,), query)}
    return RealProblem(
        form, "passage", attribute, messages, question, answer, _solution(answer), key,
        rivals=rivals, **extra, **documents,
    )  # fmt: skip


def _passages_qa(rng: random.Random, draws: _Draws, split: PartPools) -> Iterator[RealProblem]:
    for attribute, (key, people) in _people(rng, draws, split, QA_PASSAGES):
        shown = list(range(QA_PASSAGES))
        rng.shuffle(shown)
        yield _passage_problem("qa", attribute, key, people, shown)


def _passages_rag(rng: random.Random, draws: _Draws, split: PartPools) -> Iterator[RealProblem]:
    for attribute, (key, people) in _people(rng, draws, split, 1 + RAG_DISTRACTORS):
        shown = [0, 1]  # what the default retriever (top 2) finds at best: relevant + one more
        rng.shuffle(shown)
        yield _passage_problem("rag", attribute, key, people, shown)


# --------------------------------------------------------------------------- tools


def _tool_problems(rng: random.Random, draws: _Draws, split: PartPools) -> Iterator[RealProblem]:
    r = rng.randint
    goods = {tool: _Deck(split.goods, rng) for tool in ("get_price", "get_stock")}
    facts = _Deck(split.facts, rng)

    def arithmetic(tool: str, symbol: str, operands: Callable[[], tuple[int, int]]):
        def one():
            def sample():
                a, b = operands()
                if int(call_tool(tool, {"a": a, "b": b})) in (a, b):
                    return None
                return f"tool/{tool}/{a}/{b}", (a, b)

            key, (a, b) = draws.draw(sample)
            return key, f"What is {a} {symbol} {b}?", {"a": a, "b": b}

        return one

    def subtraction() -> tuple[int, int]:
        a = r(200, 999)
        return a, r(100, a - 1)

    def calculator():
        def sample():
            expression = f"{r(11, 30)} * {r(3, 9)} {rng.choice('+-')} {r(10, 99)}"
            if _shows_answer(expression, int(call_tool("calculator", {"expression": expression}))):
                return None
            return f"tool/calculator/{expression}", expression

        key, expression = draws.draw(sample)
        return key, f"What is {expression}?", {"expression": expression}

    def lookup(tool: str, question: str):
        def one():
            item = goods[tool].draw()
            return f"tool/{tool}/{item}", question.format(item=item), {"item": item}

        return one

    calls = {  # kind -> (tool, draw (key, question, arguments))
        "add": ("add", arithmetic("add", "+", lambda: (r(100, 999), r(100, 999)))),
        "subtract": ("subtract", arithmetic("subtract", "-", subtraction)),
        "multiply": ("multiply", arithmetic("multiply", "*", lambda: (r(11, 99), r(11, 99)))),
        "calculator": ("calculator", calculator),
        "price": ("get_price", lookup("get_price", "How many coins do {item} cost at the shop?")),
        "stock": ("get_stock", lookup("get_stock", "How many {item} does the shop have in stock?")),
    }  # fmt: skip
    while True:
        kinds = list(TOOL_KINDS)
        rng.shuffle(kinds)
        for kind in kinds:
            if kind == "direct":
                offered = rng.sample(sorted(TOOL_SPECS), r(2, 3))
                problem = _fact_problem("tool", "direct", facts.draw(), rng)
                yield replace(problem, tools=[TOOL_SPECS[t] for t in offered])
                continue
            tool, draw = calls[kind]
            key, question, arguments = draw()
            answer = int(call_tool(tool, arguments))
            others = [t for t in sorted(TOOL_SPECS) if t != tool]
            offered = [tool, *rng.sample(others, r(1, 3))]
            rng.shuffle(offered)
            problem = _number_problem("tool", kind, tool, f"{question} {NUMBER_ONLY}", answer, key)
            response_format = None
            if rng.random() < RESPONSE_FORMAT_RATE:
                response_format = answer_schema(rng.choice(ANSWER_KEYS))
                (answer_key,) = response_format["required"]
                problem = replace(problem, solution=json.dumps({answer_key: answer}))
            yield replace(
                problem,
                tools=[TOOL_SPECS[t] for t in offered],
                response_format=response_format,
                expected_call=(tool, arguments),
            )


# --------------------------------------------------------------------------- the generator


def _streams(form: str, rng: random.Random, part: str) -> dict[str, Iterator[RealProblem]]:
    split, draws = PartPools(part), _Draws(part)
    if form == "rag":
        return {"passage": _passages_rag(rng, draws, split)}
    if form == "tool":
        return {"tool": _tool_problems(rng, draws, split)}
    return {
        "arithmetic": _arithmetic(rng, draws),
        "word_problem": _word_problems(rng, draws, split),
        "fact": _facts(rng, split),
        "conversion": _conversions(rng, part),
        "sequence": _sequences(rng, draws),
        "json": _json(rng, draws, split),
        "passage": _passages_qa(rng, draws, split),
    }


def make_real_problems(n: int, seed: int = REPORT_SEED, form: str = "qa") -> list[RealProblem]:
    """`n` problems of `form` ("qa", "rag" or "tool"); the same (n, seed, form) gives the same
    problems, and the first k of them are `make_real_problems(k, seed, form)`.

    Seed 1 draws from the reporting part of every pool, every other seed from the tuning part.
    """
    if form not in FORMS:
        raise InvalidConfigError(f"form must be one of {FORMS}, got {form!r}.")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidConfigError(f"n must be a count of problems (an int >= 0), got {n!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidConfigError(f"seed must be an int (1 reports, others tune), got {seed!r}.")
    part = part_of_seed(seed)
    rng = random.Random(f"real-task/{form}/{seed}")
    streams = _streams(form, rng, part)
    problems: list[RealProblem] = []
    while len(problems) < n:
        kinds = list(streams)
        rng.shuffle(kinds)
        for kind in kinds[: n - len(problems)]:
            try:
                problems.append(next(streams[kind]))
            except _UsedUp:
                raise InvalidConfigError(
                    f"seed {seed} draws from the {part} part, which holds no more distinct "
                    f"{kind!r} problems after {len(problems)} {form!r} problems; ask for at most "
                    f"{len(problems)}."
                ) from None
    return problems
