"""Structured output from an ensemble of the shipped tiny models, three ways over one engine:
the core (`GenerationConfig(response_format=...)`), LangChain (`with_structured_output`) and
LlamaIndex (`structured_predict`).

    python examples/structured_output.py                 # SAFE, a testbed question
    python examples/structured_output.py --method specem --question "Mia has 4 cookies. ..."

Runs offline on CPU. The answer's JSON schema is a grammar over the shared text: every member's
next-token distribution is masked to what the schema allows, and the keys, quotes and
punctuation the schema forces are written without a model call, so the answer always parses
and validates. The values are the models' own; the tiny models learned JSON answers of one
integer only, so other fields are often wrong. Bounded fields (a number range, a short string,
a fixed set of words) keep them from writing a value without end.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Literal

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from llama_index.core.prompts import PromptTemplate  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from core import Ensemble, GenerationConfig  # noqa: E402
from core.testbed import make_problems, model_paths  # noqa: E402
from langchain_ensemble import ChatEnsemble  # noqa: E402
from llamaindex_ensemble import EnsembleLLM  # noqa: E402


class Solution(BaseModel):
    """The answer to a word problem."""

    person: str = Field(max_length=12, description="who the problem is about")
    operation: Literal["add", "subtract", "mixed"] = Field(description="what the steps do")
    answer: int = Field(ge=0, le=999, description="the number asked for")


def with_core(engine: Ensemble, question: str) -> Solution:
    config = GenerationConfig(max_new_tokens=64, response_format=Solution.model_json_schema())
    out = engine.generate([{"role": "user", "content": question}], config)
    return Solution.model_validate_json(out.text)


def with_langchain(engine: Ensemble, question: str) -> Solution:
    chat = ChatEnsemble.from_ensemble(engine, max_tokens=64)
    return chat.with_structured_output(Solution).invoke(question)


def with_llamaindex(engine: Ensemble, question: str) -> Solution:
    llm = EnsembleLLM(ensemble=engine, max_new_tokens=64)
    return llm.structured_predict(Solution, PromptTemplate("{question}"), question=question)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="safe", help="safe | specem | token | single")
    parser.add_argument("--question", default=make_problems(1, seed=3)[0].question)
    args = parser.parse_args()
    engine = Ensemble.from_pretrained(model_paths(), method=args.method, device="cpu")
    print(f"question: {args.question}")
    for name, run in (
        ("core", with_core),
        ("langchain", with_langchain),
        ("llamaindex", with_llamaindex),
    ):
        print(f"  {name:10} {run(engine, args.question)!r}")


if __name__ == "__main__":
    main()
