"""Questions about one of several people, each described in a short passage: three passages in
the prompt (`qa`), or the documents of a retrieval index with LlamaIndex's default query-engine
prompt (`rag`)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from ..task import RAG_CONTEXT_SEPARATOR, RAG_DISTRACTORS, RAG_SYSTEM_PROMPT, RAG_USER_TEMPLATE
from . import pools
from .problem import (
    NUMBER_ONLY,
    ONE_WORD,
    Draws,
    PartPools,
    RealProblem,
    article,
    in_turn,
    options_of,
    reference_reply,
    user_turn,
)

QA_PASSAGES = 3  # passages in the prompt of a qa passage question
QA_INSTRUCTION = "Read the passages and answer the question."
# The prompts' own framing: a reply that repeats it copies the prompt, passages and all, and
# names the answer only by copying (a base model's echo), so it does not count as an answer.
QA_FRAMING = (QA_INSTRUCTION, "Question:", *(f"Passage {i + 1}:" for i in range(QA_PASSAGES)))
RAG_FRAMING = (  # RAG_USER_TEMPLATE's fixed lines, less its final "Answer:"
    "Context information is below.", "---------------------", "Given the context information",
    "Query:",
)  # fmt: skip

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
    return f"{name} lives in {city} and works as {article(job)}. {pronoun} is {age} years old."


def _people(rng: random.Random, draws: Draws, split: PartPools, count: int):
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

    yield from in_turn(rng, {attribute: make(attribute) for attribute in PASSAGE_QUESTIONS})


def _passage_problem(form: str, attribute: str, key: str, people: list[Person], shown: list[int]):
    asked = people[0]
    question_text, instruction = PASSAGE_QUESTIONS[attribute]
    query = f"{question_text.format(name=asked[0])} {instruction}"
    passages = [passage_of(p) for p in people]
    if form == "qa":
        listed = "\n".join(f"Passage {i + 1}: {passages[j]}" for i, j in enumerate(shown))
        question = f"{QA_INSTRUCTION}\n\n{listed}\n\nQuestion: {query}"
        messages = user_turn(question)
        documents: dict[str, Any] = {"framing": QA_FRAMING}
    else:
        question = query
        context = RAG_CONTEXT_SEPARATOR.join(passages[j] for j in shown)
        messages = [
            {"role": "system", "content": RAG_SYSTEM_PROMPT},
            {"role": "user", "content": RAG_USER_TEMPLATE.format(context_str=context,
                                                                 query_str=query)},
        ]  # fmt: skip
        documents = {
            "passages": tuple(passages), "relevant_passage": passages[0], "framing": RAG_FRAMING,
        }  # fmt: skip
    column = {"city": 1, "job": 2, "age": 3}[attribute]
    answer = asked[column]
    rivals = tuple(p[column] for p in people[1:])
    if attribute == "age":
        extra: dict[str, Any] = {}
    else:
        pool = pools.CITIES if attribute == "city" else pools.JOBS
        extra = {"options": options_of(pool, (answer,), query)}
    return RealProblem(
        form, "passage", attribute, messages, question, answer, reference_reply(answer), key,
        rivals=rivals, **extra, **documents,
    )  # fmt: skip


def passages_qa(rng: random.Random, draws: Draws, split: PartPools) -> Iterator[RealProblem]:
    for attribute, (key, people) in _people(rng, draws, split, QA_PASSAGES):
        shown = list(range(QA_PASSAGES))
        rng.shuffle(shown)
        yield _passage_problem("qa", attribute, key, people, shown)


def passages_rag(rng: random.Random, draws: Draws, split: PartPools) -> Iterator[RealProblem]:
    for attribute, (key, people) in _people(rng, draws, split, 1 + RAG_DISTRACTORS):
        shown = [0, 1]  # what the default retriever (top 2) finds at best: relevant + one more
        rng.shuffle(shown)
        yield _passage_problem("rag", attribute, key, people, shown)
