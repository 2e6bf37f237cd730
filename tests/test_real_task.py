"""The real task: deterministic problems, held-out splits, balanced kinds, and a checker that
reads free-text replies fairly (right, wrong, hedged and listing replies written by hand)."""

from __future__ import annotations

import json
import re
from collections import Counter
from functools import cache

import jsonschema
import pytest

from core.errors import InvalidConfigError
from core.json_schema import closed_schema
from core.testbed import (
    QA_KINDS,
    TOOL_KINDS,
    call_tool,
    check_real_answer,
    check_real_tool_call,
    make_real_problems,
    score_real,
)
from core.testbed.real import pools
from core.testbed.real.problem import PartPools, all_facts, part_of_seed

SIZE = 700  # 100 problems of each qa and tool kind


@cache
def problems(form: str, seed: int, n: int = SIZE) -> tuple:
    return tuple(make_real_problems(n, seed=seed, form=form))


def every_problem():
    for form in ("qa", "rag", "tool"):
        for seed in (1, 2):
            yield from problems(form, seed)


def of_kind(kind: str, form: str = "qa", seed: int = 1, topic: str | None = None) -> list:
    return [p for p in problems(form, seed) if p.kind == kind and topic in (None, p.topic)]


# --------------------------------------------------------------------------- generation


@pytest.mark.parametrize("form", ["qa", "rag", "tool"])
def test_problems_are_deterministic_and_a_prefix_is_the_smaller_set(form):
    again = make_real_problems(SIZE, seed=1, form=form)
    assert again == list(problems(form, 1))
    assert make_real_problems(50, seed=1, form=form) == list(problems(form, 1)[:50])
    assert make_real_problems(50, seed=3, form=form) != list(problems(form, 1)[:50])


@pytest.mark.parametrize("form", ["qa", "rag", "tool"])
def test_no_item_repeats_within_a_seed(form):
    for seed in (1, 2):
        keys = [p.key for p in problems(form, seed)]
        assert len(set(keys)) == len(keys)


def test_kinds_are_balanced_and_sizes_reach_several_hundred():
    assert Counter(p.kind for p in problems("qa", 1)) == {k: SIZE // 7 for k in QA_KINDS}
    assert Counter(p.kind for p in problems("tool", 2)) == {k: SIZE // 7 for k in TOOL_KINDS}
    rag = Counter(p.topic for p in problems("rag", 1))
    assert set(rag) == {"city", "job", "age"} and max(rag.values()) - min(rag.values()) <= 1
    # any prefix stays balanced within one problem per kind
    for form, kinds in (("qa", QA_KINDS), ("tool", TOOL_KINDS)):
        counts = Counter(p.kind for p in problems(form, 1)[:100])
        assert set(counts) == set(kinds) and max(counts.values()) - min(counts.values()) <= 1
    assert len(make_real_problems(1000, seed=1, form="qa")) == 1000


def test_asking_for_more_problems_than_a_part_holds_is_a_clear_error():
    with pytest.raises(InvalidConfigError, match="ask for at most"):
        make_real_problems(3000, seed=1, form="tool")


@pytest.mark.parametrize(
    ("arguments", "fix"),
    [
        (dict(n=5, form="chat"), "form must be one of"),
        (dict(n=-1), "count of problems"),
        (dict(n=2.5), "count of problems"),
        (dict(n=5, seed="1"), "seed must be an int"),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(arguments, fix):
    with pytest.raises(InvalidConfigError, match=fix):
        make_real_problems(**arguments)


# --------------------------------------------------------------------------- held-out splits


def test_the_pools_split_into_two_disjoint_parts_that_cover_them():
    report, tune = PartPools("report"), PartPools("tune")
    for field, whole in (
        ("names", pools.NAMES),
        ("cities", pools.CITIES),
        ("jobs", pools.JOBS),
        ("goods", pools.GOODS),
        ("facts", all_facts()),
    ):
        a, b = getattr(report, field), getattr(tune, field)
        assert not {str(x) for x in a} & {str(x) for x in b}
        assert len(a) + len(b) == len(whole)
        assert min(len(a), len(b)) >= 0.3 * len(whole), field
    assert part_of_seed(1) == "report"
    assert {part_of_seed(s) for s in (0, 2, 3, 7)} == {"tune"}


_PEOPLE_AND_PLACES = re.compile(rf"\b(?:{'|'.join((*pools.NAMES, *pools.CITIES))})\b")
_JOBS = re.compile(rf"\b(?:{'|'.join(pools.JOBS)})\b")


def _people_and_places(problem) -> set[str]:
    """The names, cities, jobs and goods a problem uses."""
    text = json.dumps(problem.messages)
    found = set(_PEOPLE_AND_PLACES.findall(text))
    if problem.kind == "passage":
        found |= set(_JOBS.findall(text))
    if problem.expected_call and "item" in problem.expected_call[1]:
        found.add(problem.expected_call[1]["item"])
    if isinstance(problem.answer, dict):
        found |= {v for k, v in problem.answer.items() if k in ("item", "job")}
    return found


@pytest.mark.parametrize("form", ["qa", "rag", "tool"])
def test_tuning_seeds_share_no_item_person_place_or_good_with_the_reporting_seed(form):
    reported = problems(form, 1)
    for seed in (2, 3):
        tuned = problems(form, seed, 300)
        assert not {p.key for p in reported} & {p.key for p in tuned}
        assert not set().union(*map(_people_and_places, reported)) & set().union(
            *map(_people_and_places, tuned)
        )
        if form != "rag":
            facts = {p.key for p in reported if p.kind in ("fact", "direct")}
            assert facts and not facts & {p.key for p in tuned}


# --------------------------------------------------------------------------- the answers


def test_every_problem_s_reference_reply_passes_its_checker():
    for p in every_problem():
        assert check_real_answer(p.solution, p), p


def test_repeating_the_prompt_never_passes():
    """What a base model without a chat template often does."""
    for p in every_problem():
        assert not check_real_answer(p.messages[-1]["content"], p), p.question


def test_perturbed_answers_fail():
    for p in every_problem():
        if p.response_format is not None or isinstance(p.answer, dict):
            continue
        if isinstance(p.answer, int):
            wrong = [
                f"The answer is {p.answer + 1}.",
                f"{p.answer - 1}",
                f"{p.answer} or {p.answer + 1}",
            ]
        else:
            option = p.options[0]
            wrong = [f"The answer is {option}.", option, f"{p.answer} or {option}",
                     f"{option}, {p.answer}"]  # fmt: skip
        for text in wrong:
            assert not check_real_answer(text, p), (text, p.question)
    for p in of_kind("json"):
        key = next(iter(p.answer))
        value = p.answer[key]
        changed = {**p.answer, key: value + 1 if isinstance(value, int) else value + "x"}
        assert not check_real_answer(json.dumps(changed), p)
        assert not check_real_answer(json.dumps({k: v for k, v in p.answer.items() if k != key}), p)
        assert not check_real_answer(json.dumps({**p.answer, "extra": 1}), p)


def test_word_answers_never_appear_in_their_question_and_options_exclude_them():
    for p in every_problem():
        if not isinstance(p.answer, str):
            continue
        accepted = {a.lower() for a in (p.answer, *p.aliases)}
        question_words = set(re.findall(r"[\w'-]+", p.question.lower()))
        if p.kind != "passage":  # a passage question holds its answer in a passage, not the query
            assert not accepted & question_words, p.question
        assert not accepted & {o.lower() for o in p.options}
        assert p.options


def test_number_answers_are_not_written_in_their_question():
    for p in every_problem():
        if isinstance(p.answer, int) and p.kind != "passage":
            assert p.answer not in p.echoes
            assert not re.search(rf"(?<![\d.]){p.answer}(?!\d)", p.question), p.question


def test_json_answers_parse_and_follow_their_schema():
    for p in of_kind("json") + of_kind("json", seed=2):
        assert json.loads(p.solution) == p.answer
        jsonschema.validate(p.answer, closed_schema(p.schema))
        for key in p.answer:
            assert f'"{key}"' in p.question


def test_rag_problems_hold_their_documents_and_retrieved_context():
    for p in problems("rag", 1)[:100]:
        assert p.passages[0] == p.relevant_passage and len(p.passages) == 4
        assert len(set(p.passages)) == 4
        user = p.messages[-1]["content"]
        assert p.relevant_passage in user and p.question in user
        assert str(p.answer) in p.relevant_passage
        assert not any(re.search(rf"\b{p.answer}\b", d) for d in p.passages[1:])
        assert sum(d in user for d in p.passages) == 2  # the default retriever's top 2


# --------------------------------------------------------------------------- tools


def test_tool_problems_expected_calls_validate_against_their_specs_and_give_the_answer():
    for p in problems("tool", 1) + problems("tool", 2):
        offered = {t["function"]["name"]: t["function"] for t in p.tools}
        assert 2 <= len(offered) <= 4
        if p.expected_call is None:
            assert p.kind == "direct" and isinstance(p.answer, str)
            continue
        name, arguments = p.expected_call
        assert name in offered
        jsonschema.validate(arguments, closed_schema(offered[name]["parameters"]))
        assert call_tool(name, arguments) == str(p.answer)
        assert check_real_tool_call(name, arguments, p)
        assert check_real_tool_call(name, json.dumps(arguments), p)


def test_tool_calls_are_compared_as_a_fair_grader_would():
    first = {kind: of_kind(kind, "tool")[0] for kind in TOOL_KINDS}
    add, subtract = first["add"], first["subtract"]
    a, b = add.expected_call[1]["a"], add.expected_call[1]["b"]
    assert check_real_tool_call("add", {"a": b, "b": a}, add)
    assert not check_real_tool_call("add", {"a": a, "b": b + 1}, add)
    assert not check_real_tool_call("add", {"a": str(a), "b": b}, add)
    assert not check_real_tool_call("multiply", {"a": a, "b": b}, add)
    assert not check_real_tool_call("add", {"a": a, "b": b, "c": 1}, add)
    assert not check_real_tool_call("add", "not json", add)
    a, b = subtract.expected_call[1]["a"], subtract.expected_call[1]["b"]
    assert not check_real_tool_call("subtract", {"a": b, "b": a}, subtract)
    calc = first["calculator"]
    expression = calc.expected_call[1]["expression"]
    assert check_real_tool_call("calculator", {"expression": expression.replace(" ", "")}, calc)
    assert check_real_tool_call("calculator", {"expression": f"({expression})"}, calc)
    assert not check_real_tool_call("calculator", {"expression": str(calc.answer)}, calc)
    price = first["price"]
    item = price.expected_call[1]["item"]
    assert check_real_tool_call("get_price", {"item": f" {item.upper()}"}, price)
    assert not check_real_tool_call("get_price", {"item": item + "x"}, price)
    assert not check_real_tool_call("get_price", {"item": item}, first["direct"])


def test_a_tool_problem_s_final_answer_is_json_where_its_schema_asks():
    asks = [p for p in problems("tool", 1) if p.response_format is not None]
    assert 0.2 < len(asks) / sum(p.expected_call is not None for p in problems("tool", 1)) < 0.4
    p = asks[0]
    (key,) = p.response_format["required"]
    assert check_real_answer(f'{{"{key}": {p.answer}}}', p)
    assert check_real_answer(f'```json\n{{"{key}": {p.answer}}}\n```', p)
    assert not check_real_answer(f"The answer is {p.answer}.", p)
    assert not check_real_answer(f'{{"other": {p.answer}}}', p)


# --------------------------------------------------------------------------- hand-written replies


def test_numbers_are_read_from_what_a_reply_commits_to():
    p = next(p for p in of_kind("arithmetic", topic="+"))
    a, b = sorted(p.echoes)
    n = p.answer
    right = [
        f"{n}", f"{n}.", f"The answer is {n}.", f"{a} + {b} = {n}", f"{b} + {a} = {n}.",
        f"**Answer:** {n}", f"#### {n}", f"Sure!\n\nThe answer is {n}.",
        f"{a} + {b} = {n}.\n\nWhat is 3 + 4? 7",  # a base model rambling on after its answer
        f"The answer is {n}, because {a} + {b} = {n}.",
    ]  # fmt: skip
    wrong = [
        f"{n + 1}", f"{n} or {n + 1}", f"It is {n}, or maybe {n + 10}.", f"{n - 1}-{n}",
        f"between {n - 1} and {n + 1}", f"The answer is {n + 1}. {a} + {b} = {n}", "",
        f"What is {a} + {b}?", "I don't know.", f"{a}, {b}, {n}, {n + 1}",
    ]  # fmt: skip
    assert [t for t in right if not check_real_answer(t, p)] == []
    assert [t for t in wrong if check_real_answer(t, p)] == []


def test_number_words_and_reasoning_chains_count():
    words = {12: "twelve", 18: "eighteen", 24: "twenty-four", 35: "thirty five", 40: "forty"}
    chosen = [p for p in of_kind("arithmetic", topic="*") if p.answer in words][:3]
    assert len(chosen) == 3
    for p in chosen:
        assert check_real_answer(f"It is {words[p.answer]}.", p)
        assert check_real_answer(f"The answer is {words[p.answer].upper()}", p)
        assert not check_real_answer(f"It is {words[p.answer]} or {p.answer + 1}.", p)
    conversion = next(p for p in of_kind("conversion") if "centimeters are in" in p.question)
    meters = conversion.echoes[0]
    reply = f"{meters} meters is equal to {meters} * 100 = {conversion.answer} centimeters."
    assert check_real_answer(reply, conversion)
    assert check_real_answer(f"There are {conversion.answer} centimeters in {meters} meters.",
                             conversion)  # fmt: skip
    two_steps = of_kind("word_problem", topic="two steps")[0]
    a, b, c = (int(x) for x in re.findall(r"\d+", two_steps.question))
    reply = f"{a} + {b} = {a + b}.\n{a + b} - {c} = {two_steps.answer}."
    assert check_real_answer(reply, two_steps)


def test_an_unfinished_last_number_of_a_cut_reply_is_not_read():
    p = of_kind("conversion")[0]
    reply = f"It is {p.answer}"  # stopped at the token limit: it may have gone on as {p.answer}0
    assert check_real_answer(reply, p)
    assert not check_real_answer(reply, p, cut=True)
    assert check_real_answer(f"It is {p.answer}. It", p, cut=True)
    word = of_kind("fact")[0]
    assert check_real_answer(f"{word.answer} is the answer, not", word, cut=True)
    assert check_real_answer(f"The answer is {word.answer}.", word, cut=True)
    assert not check_real_answer(f"The answer is {word.answer}", word, cut=True)


def test_a_sequence_reply_may_repeat_the_sequence():
    p = of_kind("sequence", topic="counting up")[0]
    shown = ", ".join(map(str, sorted(p.echoes)))
    assert check_real_answer(f"The sequence is {shown}, {p.answer}.", p)
    assert not check_real_answer(f"The sequence is {shown}.", p)
    assert not check_real_answer(f"{p.answer}, {p.answer + 5}, {p.answer + 10}", p)
    letters = of_kind("sequence", topic="letters")[0]
    assert check_real_answer(f"The next letter is {letters.answer}.", letters)
    assert check_real_answer(letters.answer.lower(), letters)
    other = letters.options[0]
    assert not check_real_answer(f"{letters.answer}, {other}", letters)
    assert not check_real_answer(f"I think it is {other}.", letters)


def test_words_are_read_in_any_case_inside_a_sentence():
    capital = of_kind("fact", topic="capital")[0]
    country = capital.question.removeprefix("What is the capital of ").split("?")[0]
    city, rival = capital.answer, capital.options[0]
    right = [city, city.lower(), f"{city}.", f"The capital of {country} is {city}.",
             f"Answer: {city}", f"The capital is {city}. It is a big city."]  # fmt: skip
    wrong = [rival, f"{city}, {rival}", f"{rival} or {city}", f"{city} or {rival}",
             f"{city}/{rival}", f"The capital of {country} is {rival}.", f"{country}"]  # fmt: skip
    assert [t for t in right if not check_real_answer(t, capital)] == []
    assert [t for t in wrong if check_real_answer(t, capital)] == []
    plural = next(p for p in of_kind("fact", topic="plural"))
    singular = plural.question.removeprefix("What is the plural of ").split("?")[0]
    assert check_real_answer(f"The plural of {singular} is {plural.answer}.", plural)
    assert not check_real_answer(f"The plural of {singular} is {singular}s.", plural)
    sound = next(p for p in every_problem() if p.topic == "animal sound" and p.aliases)
    assert check_real_answer(f"It says {sound.aliases[0]}!", sound)


def test_passage_replies_must_not_name_the_other_passages_facts():
    city = of_kind("passage", topic="city")[0]
    name = city.question.split("Where does ")[1].split(" live?")[0]
    assert check_real_answer(f"{name} lives in {city.answer}.", city)
    assert not check_real_answer(f"{name} lives in {city.rivals[0]}.", city)
    assert not check_real_answer(f"{city.answer} or {city.rivals[0]}", city)
    assert not check_real_answer(f"{name} lives in {city.answer}; the others live in "
                                 f"{city.rivals[0]} and {city.rivals[1]}.", city)  # fmt: skip
    assert check_real_answer(f"According to passage 2, {name} lives in {city.answer}.", city)
    copied = city.messages[-1]["content"].split("\n\n")[1].split("\n")
    relevant = next(line for line in copied if city.answer in line)
    assert not check_real_answer(relevant, city)  # "Passage 2: Mia lives in Rome and ..."
    assert check_real_answer(relevant.split(": ", 1)[1], city)
    rag = next(p for p in problems("rag", 1) if p.topic == "age")
    echo = rag.messages[-1]["content"].split("---------------------\n")[1]
    assert not check_real_answer(f"---------------------\n{rag.relevant_passage}", rag)
    assert not check_real_answer(echo, rag)
    assert check_real_answer(rag.relevant_passage, rag)
    age = of_kind("passage", topic="age")[0]
    assert check_real_answer(f"{age.answer} years old.", age)
    assert not check_real_answer(f"{age.rivals[0]}", age)
    assert not check_real_answer(f"{age.answer}, and the others are {age.rivals[0]}.", age)


def test_json_replies_are_parsed_from_the_text():
    p = next(p for p in of_kind("json", topic="purchase"))
    answer = p.answer
    text = json.dumps(answer)
    right = [
        text, f"```json\n{json.dumps(answer, indent=2)}\n```", f"Here it is: {text}",
        json.dumps({**answer, "count": str(answer["count"])}),
        json.dumps({**answer, "name": answer["name"].upper(), "item": answer["item"][:-1]}),
        json.dumps({**answer, "item": f"The {answer['item']}"}),
        json.dumps(dict(reversed(answer.items()))), f"{text}\n\n{text}",
    ]  # fmt: skip
    wrong = [
        json.dumps({**answer, "count": answer["count"] + 1}), str(answer),
        json.dumps({k.upper(): v for k, v in answer.items()}), "{}", "no JSON here",
        f"{text} or {json.dumps({**answer, 'count': answer['count'] + 1})}",
        json.dumps({**answer, "item": f"These {answer['item']}"}),
    ]  # fmt: skip
    assert [t for t in right if not check_real_answer(t, p)] == []
    assert [t for t in wrong if check_real_answer(t, p)] == []


def test_score_real_is_the_share_of_right_replies():
    some = list(problems("qa", 2)[:4])
    texts = [some[0].solution, some[1].solution, "no", "no"]
    assert score_real(texts, some) == 0.5
    with pytest.raises(InvalidConfigError, match="texts for"):
        score_real(texts[:3], some)
    with pytest.raises(InvalidConfigError, match="reply's text"):
        check_real_answer(None, some[0])
