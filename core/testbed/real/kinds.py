"""The `qa` form's kinds: arithmetic, word problems, facts, unit conversions, sequences and
JSON extraction (the passage kind lives in `passages`). Each is a stream of problems whose topics
take turns."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from . import pools
from .problem import (
    JSON_ONLY,
    NUMBER_ONLY,
    ONE_LETTER,
    Deck,
    Draws,
    PartPools,
    RealProblem,
    article,
    fact_problem,
    in_turn,
    number_answer_problem,
    part_of,
    reference_reply,
    shows_answer,
    user_turn,
    word_answer_problem,
)


def arithmetic(rng: random.Random, draws: Draws) -> Iterator[RealProblem]:
    r = rng.randint

    def make(symbol: str, operands: Callable[[], tuple[int, int]], value) -> Callable:
        def one() -> RealProblem:
            def sample():
                a, b = operands()
                question = f"What is {a} {symbol} {b}? {NUMBER_ONLY}"
                if shows_answer(question, value(a, b)):
                    return None
                return f"arithmetic/{a}{symbol}{b}", (question, value(a, b))

            key, (question, answer) = draws.draw(sample)
            return number_answer_problem("qa", "arithmetic", symbol, question, answer, key)

        return one

    def subtraction() -> tuple[int, int]:
        a = r(20, 99)
        return a, r(10, a - 1)

    def division() -> tuple[int, int]:
        b = r(2, 9)
        return b * r(2, 12), b

    yield from in_turn(rng, {
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


def word_problems(rng: random.Random, draws: Draws, split: PartPools) -> Iterator[RealProblem]:
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
                if answer <= 0 or shows_answer(question, answer):
                    return None
                return f"word/{topic}/{numbers}", (question, answer)

            key, (question, answer) = draws.draw(sample)
            return number_answer_problem("qa", "word_problem", topic, question, answer, key)

        return one

    yield from in_turn(rng, {topic: make(topic) for topic in _WORD_PROBLEMS})


def facts(rng: random.Random, split: PartPools) -> Iterator[RealProblem]:
    deck = Deck(split.facts, rng)
    while True:
        yield fact_problem("qa", "fact", deck.draw(), rng)


CONVERSIONS = (  # (big unit, small unit, how many small in one big)
    ("meters", "centimeters", 100), ("kilometers", "meters", 1000),
    ("centimeters", "millimeters", 10), ("meters", "millimeters", 1000),
    ("kilograms", "grams", 1000), ("liters", "milliliters", 1000), ("hours", "minutes", 60),
    ("minutes", "seconds", 60), ("days", "hours", 24), ("weeks", "days", 7),
    ("years", "months", 12), ("feet", "inches", 12), ("yards", "feet", 3),
    ("decades", "years", 10), ("centuries", "years", 100),
)  # fmt: skip
CONVERSION_AMOUNTS = range(2, 21)


def conversions(rng: random.Random, part: str) -> Iterator[RealProblem]:
    items = [
        (f"conversion/{big}/{small}/{amount}", big, small, factor, amount)
        for big, small, factor in CONVERSIONS
        for amount in CONVERSION_AMOUNTS
    ]
    deck = Deck([item for item in items if part_of(item[0]) == part], rng)
    while True:
        key, big, small, factor, amount = deck.draw()
        if rng.random() < 0.5:  # both directions of one amount are one item
            question, answer = f"How many {small} are in {amount} {big}?", amount * factor
        else:
            question, answer = f"How many {big} are in {amount * factor} {small}?", amount
        question = f"{question} {NUMBER_ONLY}"
        yield number_answer_problem("qa", "conversion", f"{big} and {small}", question, answer, key)


LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
NOT_LETTER_ANSWERS = ("A", "I")  # an article and a pronoun: never an answer or an option
SEQUENCE_TERMS = 4  # terms shown; the answer is the fifth

_NUMBER_SEQUENCES = {  # topic -> (start range, step range, the i-th term)
    "counting up": ((1, 30), (2, 9), lambda s, d, i: s + i * d),
    "counting down": ((50, 99), (2, 9), lambda s, d, i: s - i * d),
    "multiplying": ((1, 20), (2, 3), lambda s, d, i: s * d**i),
}


def sequences(rng: random.Random, draws: Draws) -> Iterator[RealProblem]:
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
            return number_answer_problem("qa", "sequence", topic, question, answer, key)

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
        return word_answer_problem("qa", "sequence", "letters", question, answer, (), pool, key)

    makers = {topic: numbers(topic) for topic in _NUMBER_SEQUENCES}
    yield from in_turn(rng, {**makers, "letters": letters})


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
        return f"{name} works as {article(work)}.", {"name": name, "job": work}

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


def json_extraction(rng: random.Random, draws: Draws, split: PartPools) -> Iterator[RealProblem]:
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
                "qa", "json", topic, user_turn(question), question, answer,
                reference_reply(answer), key, schema=json_schema_of(answer),
            )  # fmt: skip

        return one

    yield from in_turn(rng, {topic: make(topic) for topic in sentences})
