"""The real pair's Gemma template (`GEMMA_TEMPLATE`): plain question-and-answer text for a base
model, rendered through the project's own prompt path on a shipped testbed tokenizer (no real
model needed)."""

from __future__ import annotations

import pytest

from core.chat import render_prompt
from core.testbed import model_paths
from core.testbed.models import load_tokenizer
from core.testbed.real_models import GEMMA_STOP, GEMMA_TEMPLATE


@pytest.fixture(scope="module")
def tokenizer():
    tok = load_tokenizer(model_paths()[0])
    tok.chat_template = GEMMA_TEMPLATE
    return tok


def test_system_user_and_assistant_turns_render_as_questions_and_answers(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": " What is 3 + 3? "},
    ]
    assert render_prompt(tokenizer, messages, "gemma") == (
        f"{tokenizer.bos_token}Be brief.\n\nQuestion: What is 2 + 2?\nAnswer: 4\n\n"
        "Question: What is 3 + 3?\nAnswer:"
    )


def test_a_prompt_that_ends_with_answer_keeps_one(tokenizer):
    messages = [
        {"role": "user", "content": "Context: Ann is a baker.\nQuery: Ann's job?\nAnswer: "}
    ]
    prompt = render_prompt(tokenizer, messages, "gemma")
    assert prompt == (
        f"{tokenizer.bos_token}Question: Context: Ann is a baker.\nQuery: Ann's job?\nAnswer:"
    )
    assert prompt.count("Answer:") == 1


def test_the_stop_is_where_a_base_model_starts_the_next_question(tokenizer):
    two_turns = render_prompt(
        tokenizer,
        [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "Q2"},
        ],
        "gemma",
    )
    assert GEMMA_STOP == ("\nQuestion:",)
    answer = two_turns.split("Answer: ", 1)[1]
    assert answer.startswith("A1") and GEMMA_STOP[0] in answer  # it ends the first answer
