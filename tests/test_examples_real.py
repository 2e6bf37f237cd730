"""Every `--real` path (the lab's real-task tables, `llm-ensembling demo --real`, the examples'
`--real`) on the real task's problems and checkers. The wiring runs in seconds on the shipped
tiny models standing in for the real pair (`real_members()` patched to give two of them: the
real task's prompts, checkers and tools are the real ones); without the real extra, `--real`
fails with an error that names it. One test runs the real pair itself, marked `real` and
skipped where the extra is not installed."""

from __future__ import annotations

import argparse
import json
import sys

import pytest
from conftest import load_example, needs_trained

import core.testbed.real_models as real_models
from core import Local
from core.cli import main as cli
from core.testbed import (
    check_real_answer,
    check_real_tool_call,
    make_real_problems,
    model_paths,
)
from lab.bench.headroom import paired
from lab.cli import main as lab


@pytest.fixture
def tiny_as_real(monkeypatch) -> list[Local]:
    """`real_members()` gives two shipped tiny models (the real task, on models that load in a
    second)."""
    members = [Local(str(path), name=path.name) for path in model_paths()[:2]]
    monkeypatch.setattr(real_models, "real_members", lambda cache_dir=None: list(members))
    return members


def _results(out) -> dict:
    return json.loads((out / "results.json").read_text())


def _cut(record: dict) -> bool:
    return record["finish_reason"] == "length"


@needs_trained
def test_the_accuracy_table_runs_the_real_task(tiny_as_real, tmp_path):
    out = tmp_path / "qa"
    args = ["bench", "--task", "real", "--methods", "single,safe", "--aggregator", "unite"]
    args += ["--n", "3", "--seed", "2", "--max-new-tokens", "12", "--out", str(out)]
    assert lab(args) == 0
    data = _results(out)
    assert data["task"] == "real-qa" and data["members"] == [m.name for m in tiny_as_real]
    problems = make_real_problems(3, seed=2, form="qa")
    for records in data["per_problem"].values():
        for record, problem in zip(records, problems, strict=True):
            assert record["correct"] == check_real_answer(record["text"], problem, cut=_cut(record))
    assert any(_cut(r) for rs in data["per_problem"].values() for r in rs)  # 12 tokens cut some


@needs_trained
def test_the_headroom_table_runs_the_real_pair_with_paired_differences(tiny_as_real, tmp_path):
    out = tmp_path / "headroom"
    args = ["bench", "--headroom", "--task", "real", "--form", "rag", "--methods", "safe"]
    args += ["--n", "3", "--seed", "2", "--warmup", "1", "--warmup-seed", "3"]
    args += ["--max-new-tokens", "12", "--out", str(out)]
    assert lab(args) == 0
    data = _results(out)
    names = [m.name for m in tiny_as_real]
    rows = {row["label"]: row for row in data["rows"]}
    pair = "bpe + spm"
    assert set(rows) == {f"single {n}" for n in names} | {f"{pair}: safe"}
    right = {label: [r["correct"] for r in rs] for label, rs in data["per_problem"].items()}
    best = max(names, key=lambda n: rows[f"single {n}"]["accuracy"])
    row = rows[f"{pair}: safe"]
    assert row["vs_best"] == paired(right[f"{pair}: safe"], right[f"single {best}"])
    either = [a or b for a, b in zip(*(right[f"single {n}"] for n in names), strict=True)]
    assert row["ceiling"] == pytest.approx(sum(either) / 3)
    assert "vs best member (paired)" in (out / "results.md").read_text()


def test_a_paired_difference_counts_the_discordant_problems():
    mine = [True, True, False, True, False, True]
    theirs = [True, False, False, False, True, True]
    result = paired(mine, theirs)
    assert (result["won"], result["lost"]) == (2, 1)
    assert result["difference"] == pytest.approx(1 / 6)
    assert result["standard_error"] == pytest.approx((3 - 6 * (1 / 6) ** 2) ** 0.5 / 6)
    assert paired([True] * 4, [True] * 4)["standard_error"] == 0.0


@needs_trained
def test_the_tool_table_runs_the_real_tool_form(tiny_as_real, tmp_path):
    out = tmp_path / "tool"
    args = ["bench", "--form", "tool", "--task", "real", "--methods", "single", "--n", "3"]
    args += ["--seed", "2", "--max-new-tokens", "24", "--out", str(out)]
    assert lab(args) == 0
    data = _results(out)
    assert data["task"] == "real-tool"
    problems = make_real_problems(3, seed=2, form="tool")
    for records in data["per_problem"].values():
        for record, problem in zip(records, problems, strict=True):
            call = record["call"]
            if call is not None and problem.expected_call is not None:
                assert record["args_right"] == check_real_tool_call(
                    call["name"], call["arguments"], problem
                )
            # the final answer is read as check_real_answer reads it (not cut at 24 tokens, or
            # cut: either way the record agrees with one of the two readings)
            assert record["answer_right"] in {
                check_real_answer(record["final"], problem, cut=cut) for cut in (False, True)
            }
    assert "s/problem" in (out / "results.md").read_text()


def test_bad_real_task_arguments_are_clear_errors(tmp_path, capsys):
    base = ["bench", "--n", "1", "--out", str(tmp_path / "x")]
    for extra, message in [
        (["--task", "real", "--form", "cot"], "forms qa, rag, tool"),
        (["--form", "qa"], "forms cot, rag, tool"),
        (["--headroom", "--task", "real", "--form", "tool"], "without --headroom"),
    ]:
        assert lab(base + extra) == 2
        assert message in capsys.readouterr().err


def test_real_without_the_extra_names_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(real_models, "_package_dir", lambda name: None)
    assert cli(["demo", "--real", "--n", "1"]) == 2
    assert real_models.REAL_EXTRA in capsys.readouterr().err
    assert lab(["bench", "--task", "real", "--n", "1", "--out", str(tmp_path / "x")]) == 2
    assert real_models.REAL_EXTRA in capsys.readouterr().err


@needs_trained
def test_the_demo_runs_on_the_real_task(tiny_as_real, capsys):
    assert cli(["demo", "--real", "--n", "2", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "Accuracy on 2 held-out problems (make_real_problems(2, seed=1); float32)" in out
    assert all(f"{m.name} alone" in out for m in tiny_as_real)
    assert "at least one member right (the ceiling)" in out


def rag_eval_args(**given) -> argparse.Namespace:
    """The retrieval example's `--real --eval` arguments: one problem of seed 2 by default."""
    defaults = dict(real=True, eval=1, seed=2, device="cpu", threads=0, out="x", methods=None)
    fixed = {"calibrate": 0, "self_preference": "auto", "order": "retriever"}
    return argparse.Namespace(**{**defaults, **fixed, **given})


@needs_trained
def test_the_retrieval_example_evaluates_the_real_rag_form(tiny_as_real, tmp_path):
    example = load_example("llamaindex_rag")
    args = rag_eval_args(eval=2)
    result, table = example.evaluate(args)
    problems = make_real_problems(2, seed=2, form="rag")
    assert result["members"] == [m.name for m in tiny_as_real] and result["problems"] == 2
    singles = [label for label in result["per_problem"] if label.startswith("single")]
    either = [any(r) for r in zip(*(result["per_problem"][s] for s in singles), strict=True)]
    assert result["ceiling"] == sum(either)
    for row in result["rows"]:
        right = result["per_problem"][row["label"]]
        assert row["correct"] == sum(right)
        if row["label"] not in singles:
            assert row["vs_best"] == paired(right, result["per_problem"][result["best_single"]])
    assert "real testbed" in table and f"{len(problems[0].passages)} passages" in table
    assert result["order"] == "retriever" and "retriever's order" in table


@needs_trained
def test_the_retrieval_example_can_put_the_best_passage_next_to_the_question(tiny_as_real):
    example = load_example("llamaindex_rag")
    result, table = example.evaluate(rag_eval_args(eval=2, methods=["single"], order="reorder"))
    assert result["order"] == "reorder" and "--order reorder" in result["command"]
    assert result["relevant_last"] == result["retrieved"] == 2  # the retriever's best, last
    assert "LongContextReorder" in table


@needs_trained
@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("langchain_agent", ["--n", "1", "--trace", "0"]),
        ("llamaindex_function_agent", ["--n", "2", "--trace", "0"]),
        ("structured_output", ["--n", "1"]),
    ],
)
def test_the_tool_examples_run_on_the_real_task(name, argv, tiny_as_real, monkeypatch, capsys):
    import asyncio
    import inspect

    example = load_example(name)
    monkeypatch.setattr(sys, "argv", [name, "--real", "--method", "single", *argv])
    outcome = example.main()
    if inspect.iscoroutine(outcome):
        asyncio.run(outcome)
    out = capsys.readouterr().out
    assert all(f"{m.name} alone" in out for m in tiny_as_real)


@needs_trained
async def test_the_chain_example_asks_a_real_question(tiny_as_real, capsys):
    example = load_example("langchain_chain")
    await example.main(
        argparse.Namespace(method="safe", question=None, max_tokens=8, real=True, model=[])
    )
    out = capsys.readouterr().out
    assert make_real_problems(1, seed=3)[0].question in out


# --- the real pair itself ---------------------------------------------------------------------


@pytest.mark.real
@pytest.mark.skipif(
    not real_models.real_models_available(),
    reason=f"real models not installed: {real_models.REAL_EXTRA}",
)
def test_the_demo_runs_on_the_real_pair(capsys):
    assert cli(["demo", "--real", "--n", "1", "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct alone" in out and "gemma-3-270m alone" in out


@needs_trained
def test_the_retrieval_example_calibrates_the_rows_it_is_asked_for(tiny_as_real):
    example = load_example("llamaindex_rag")
    args = rag_eval_args(methods=["single", "rerank"], calibrate=2)
    result, table = example.evaluate(args)
    singles = [f"single ({m.name})" for m in tiny_as_real]
    assert [row["label"] for row in result["rows"]] == [*singles, "rerank (calibrated)"]
    assert "--methods single,rerank --calibrate 2" in result["command"]
    assert set(result["self_preference"]) <= {"rerank (calibrated)"}
    for preference in result["self_preference"].values():
        assert preference["score"] == "logprob"
        assert set(preference["margins"]) == {m.name for m in tiny_as_real}
    assert "rerank (calibrated)" in table


@needs_trained
def test_the_retrieval_example_builds_its_ensembles_with_a_builtin_self_preference(tiny_as_real):
    example = load_example("llamaindex_rag")
    args = rag_eval_args(methods=["single", "specem"], self_preference="builtin")
    result, table = example.evaluate(args)
    label = "specem (self-preference, built-in prompts)"
    assert [row["label"] for row in result["rows"]][-1] == label and label in table
    assert "--methods single,specem --self-preference builtin" in result["command"]
    assert set(result["self_preference"]) == {label}
    assert set(result["self_preference"][label]["margins"]) == {m.name for m in tiny_as_real}


@needs_trained
@pytest.mark.parametrize(
    "methods, needle", [(["specem"], "include single"), (["single", "vote"], "unknown")]
)
def test_the_retrieval_example_refuses_rows_it_cannot_compare(tiny_as_real, methods, needle):
    example = load_example("llamaindex_rag")
    with pytest.raises(SystemExit, match=needle):
        example.configurations(tiny_as_real, methods)
