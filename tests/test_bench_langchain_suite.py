"""The LangChain standard-suite benchmark: LangChain's own integration suite, run unmarked over a
configuration in its own pytest process, every test's outcome recorded with its failure."""

from __future__ import annotations

import json

from conftest import needs_trained

from core.testbed import model_paths
from lab.bench import langchain_suite

pytestmark = needs_trained


def test_the_suite_records_every_outcome_and_why_a_test_failed(tmp_path):
    spm, word = (str(p) for p in model_paths()[1:])
    out = tmp_path / "suite"
    argv = ["--model", spm, "--model", word, "--config", "spm alone=single:member=0"]
    langchain_suite.main([*argv, "--max-tokens", "16", "--out", str(out)])

    result = json.loads((out / "results.json").read_text())
    run = result["runs"]["spm alone"]
    assert result["command"].startswith("python -m lab.bench.langchain_suite --model")
    assert run["test_invoke"] == {"outcome": "passed", "message": ""}
    assert run["test_stream[model0]"]["outcome"] == "passed"
    # the tiny models never end a free-text JSON string: cut at max_tokens, said so
    cut = run["test_structured_output[pydantic]"]
    assert cut["outcome"] == "failed"
    assert cut["message"].startswith("OutputParserException: the answer reached max_tokens")
    assert run["test_pdf_inputs"]["outcome"] == "skipped"  # the model says it takes no PDFs
    table = (out / "results.md").read_text()
    assert "| spm alone |" in table and "| test_structured_output[pydantic] | failed:" in table
    assert "test_invoke" not in table.split("Tests not passed")[1]  # passed everywhere


def test_outcomes_read_failures_errors_and_skips_from_junit_xml(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="c" name="test_invoke"/>'
        '<testcase classname="c" name="test_json_mode">'
        '<failure message="langchain_core.exceptions.OutputParserException: cut&#10;more"/>'
        "</testcase>"
        '<testcase classname="c" name="test_stream[model0]"><error message="boom"/></testcase>'
        '<testcase classname="c" name="test_pdf_inputs"><skipped message="no PDFs"/></testcase>'
        "</testsuite></testsuites>"
    )
    found = langchain_suite.outcomes(report)
    assert found == {
        "test_invoke": {"outcome": "passed", "message": ""},
        "test_json_mode": {"outcome": "failed", "message": "OutputParserException: cut"},
        "test_stream[model0]": {"outcome": "failed", "message": "boom"},
        "test_pdf_inputs": {"outcome": "skipped", "message": "no PDFs"},
    }
    runs = {"a": found, "b": {**found, "test_json_mode": {"outcome": "passed", "message": ""}}}
    table = langchain_suite.markdown({"members": "m", "max_tokens": 8, "runs": runs})
    assert "| a | 1 | 2 | 1 |" in table and "| b | 2 | 1 | 1 |" in table
    uneven = table.split("Tests not passed by every configuration:")[1]
    assert "| test_json_mode | failed: OutputParserException: cut | passed |" in uneven
    assert "test_invoke" not in uneven and "test_pdf_inputs" not in uneven  # skipped by both
