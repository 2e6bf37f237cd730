"""Tiny demo models with three different tokenizers, and the synthetic task they were trained on.

    from core.testbed import model_paths, make_problems, check_answer
    paths = model_paths()                                # the three shipped model directories
    paths = model_paths(weak=True)                       # ... and a weak fourth, last
    problems = make_problems(200, seed=1, form="cot")    # "cot" | "rag" | "react" | "tool"
    check_answer(text, problems[0])

Tool use (``form="tool"``): each problem offers ``problem.tools`` (OpenAI-style specs, exactly
what LangChain's ``convert_to_openai_tool`` writes for the functions in ``TOOL_FUNCTIONS``) and
maybe a ``problem.response_format`` (a JSON schema); the right first turn is one call,
``problem.expected_call`` = (name, arguments), or a direct answer where it is None::

    name, arguments = ...                           # the call a model or ensemble made
    check_tool_call(name, arguments, problem)
    result = call_tool(name, arguments)             # runs the Python tool, result as text
    messages = [*problem.messages, *tool_followup("call_1", name, arguments, result)]
    check_answer(final_text, problem)               # JSON checked where the schema asks for it

Built by ``python -m lab.testbed.build`` from a source checkout (deterministic); see
``models/REPORT.md``.

Real small chat models (SmolLM2, Gemma 3) get a task of their own (``core.testbed.real``): short
questions of seven kinds, a retrieval form and a tool form, seed 1 reported and other seeds for
tuning, each with one checkable answer::

    problems = make_real_problems(400, seed=1, form="qa")    # "qa" | "rag" | "tool"
    check_real_answer(text, problems[0])                     # free text, read as a grader would

``testbed(real=False | True)`` gives either testbed behind one shape (members, problems of a
form, the answer and tool-call checkers), for code that runs on both::

    bed = testbed(real=True)
    bed.members(); bed.problems(20, seed=1, form="tool"); bed.right(text, problem, cut=False)

The models were trained on ReAct traces in exactly the messages this LlamaIndex agent sends
(checked against the real classes in tests/test_testbed_forms.py)::

    from llama_index.core.agent.react.formatter import ReActChatFormatter
    from llama_index.core.agent.workflow import ReActAgent
    from llama_index.core.tools import FunctionTool
    from core.testbed import (CALCULATOR_DESCRIPTION, CALCULATOR_NAME, REACT_SYSTEM_HEADER,
                              calculator)

    tool = FunctionTool.from_defaults(fn=calculator, name=CALCULATOR_NAME,
                                      description=CALCULATOR_DESCRIPTION)
    agent = ReActAgent(tools=[tool], llm=llm,  # no system_prompt: it would replace the header
                       formatter=ReActChatFormatter.from_defaults(system_header=REACT_SYSTEM_HEADER))
    await agent.run(user_msg=problem.question)
"""

from __future__ import annotations

from .models import MODEL_ORDER, WEAK_MODEL, model_paths, random_model
from .real import (
    QA_KINDS,
    TOOL_KINDS,
    RealProblem,
    check_real_answer,
    check_real_tool_call,
    make_real_problems,
    score_real,
)
from .task import (
    ANSWER_KEYS,
    CALCULATOR_ARG,
    CALCULATOR_DESCRIPTION,
    CALCULATOR_NAME,
    CALCULATOR_TOOL_DESC,
    REACT_FINAL_THOUGHT,
    REACT_SYSTEM_HEADER,
    Problem,
    answer_schema,
    check_answer,
    check_tool_call,
    extract_answer,
    make_problems,
    react_steps,
    react_system_message,
    score,
    tool_followup,
    tool_steps,
)
from .testbeds import Testbed, testbed
from .tool_set import TOOL_FUNCTIONS, TOOL_SPECS, calculator, call_tool

__all__ = [
    "ANSWER_KEYS",
    "CALCULATOR_ARG",
    "CALCULATOR_DESCRIPTION",
    "CALCULATOR_NAME",
    "CALCULATOR_TOOL_DESC",
    "MODEL_ORDER",
    "QA_KINDS",
    "REACT_FINAL_THOUGHT",
    "REACT_SYSTEM_HEADER",
    "TOOL_FUNCTIONS",
    "TOOL_KINDS",
    "TOOL_SPECS",
    "Testbed",
    "WEAK_MODEL",
    "Problem",
    "RealProblem",
    "answer_schema",
    "calculator",
    "call_tool",
    "check_answer",
    "check_real_answer",
    "check_real_tool_call",
    "check_tool_call",
    "extract_answer",
    "make_problems",
    "make_real_problems",
    "model_paths",
    "random_model",
    "react_steps",
    "react_system_message",
    "score",
    "score_real",
    "testbed",
    "tool_followup",
    "tool_steps",
]
