"""The benchmarks of concurrency, reliability, constrained decoding and tool use, end to end
through the CLI (and the tool benchmark's API with a stand-in task): outputs written, numbers
consistent with each other, answers checked."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import needs_trained

from core.testbed import check_answer, make_problems
from lab.bench import tools as bench_tools
from lab.cli import main

pytestmark = needs_trained


def _results(out):
    return json.loads((out / "results.json").read_text())


def test_concurrency_sweep_compares_every_level_with_one_at_a_time(tmp_path):
    out = tmp_path / "concurrency"
    args = ["bench", "--concurrency", "1,2,4", "--methods", "single,token", "--n", "6"]
    args += ["--max-new-tokens", "16", "--threads", "1", "--out", str(out)]
    args += ["--form", "rag", "--prompt-tokens", "200"]
    assert main(args) == 0
    data = _results(out)
    assert data["prompt_tokens"] >= 200  # the retrieved context padded with more passages
    rows = {(r["label"], r["level"]): r for r in data["rows"]}
    assert set(rows) == {(label, level) for label in ("single tb-gpt2-bpe", "token")
                         for level in (1, 2, 4)}  # fmt: skip
    for (label, _), row in rows.items():
        alone = rows[label, 1]
        assert row["requests"] == 6 and row["tokens"] > 0
        assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["wall_s"])
        assert row["throughput_ratio"] == pytest.approx(row["tokens_per_s"] / alone["tokens_per_s"])
        assert row["p50_ratio"] == pytest.approx(row["p50_ms"] / alone["p50_ms"])
        assert row["p95_ms"] >= row["p50_ms"]
        # concurrent greedy requests write exactly what they write alone
        assert row["same_text"] == 6 and row["differences"] == []
        assert all(v >= 1 for v in row["rows_per_pass"].values())
        assert row["tokens"] == alone["tokens"]
        # the bare models' batching bound, measured in the same run
        assert row["bare_bound"] > 0 and row["bare_batch_ms"] > 0
        assert row["of_bound"] == pytest.approx(row["throughput_ratio"] / row["bare_bound"])
    assert rows["token", 1]["bare_bound"] == 1.0
    assert rows["token", 1]["rows_per_pass"].keys() == set(data["members"])
    assert rows["single tb-gpt2-bpe", 1]["rows_per_pass"] == {"tb-gpt2-bpe": 1.0}  # alone
    assert [g["label"] for g in data["goals"]] == []  # no level 8 in this run
    table = (out / "results.md").read_text()
    assert "| token | 4 |" in table and "Every request wrote exactly the text" in table
    assert (out / "concurrency.png").stat().st_size > 0


def test_grammar_cost_compares_the_same_texts(tmp_path):
    out = tmp_path / "grammar"
    args = ["bench", "--grammar-cost", "--methods", "single,safe", "--n", "3"]
    args += ["--max-new-tokens", "16", "--threads", "1", "--out", str(out)]
    assert main(args) == 0
    data = _results(out)
    assert [r["label"] for r in data["rows"]] == ["single tb-gpt2-bpe", "safe"]
    for row in data["rows"]:
        assert row["same_text"] == 3 and row["differences"] == []  # the grammar allows them
        assert row["grammar_forced_tokens"] == 0
        assert row["ratio"] == pytest.approx(row["ms_per_token_grammar"] / row["ms_per_token"])
        assert row["goal_met"] == (row["ratio"] <= 1.15)
    runs = data["runs"]
    assert {(r["variant"], r["problem"]) for r in runs} == {
        (v, p) for v in ("plain", "grammar") for p in range(3)
    }
    assert "| safe |" in (out / "results.md").read_text()


def test_soak_checks_every_answer_and_tracks_memory(tmp_path):
    out = tmp_path / "soak"
    args = ["soak", "--requests", "40", "--window", "20", "--methods", "single,safe"]
    args += ["--workers", "3", "--tasks", "3", "--max-new-tokens", "12", "--problems", "6"]
    args += ["--threads", "1", "--out", str(out)]
    assert main(args) == 0
    data = _results(out)
    assert data["requests"] == 40 and data["mismatches"] == 0 and data["held_slots"] == 0
    assert data["held_rows"] == 0
    assert sum(data["statuses"].values()) == 40
    assert [w["requests_done"] for w in data["windows"]] == [20, 40]
    assert all(w["rss_mib"] > 0 and w["threads"] >= 1 for w in data["windows"])
    faulty = [o for o in data["outcomes"] if o["target"] is not None]
    assert faulty and sum(data["faults_fired"].values()) >= len(faulty)
    for o in faulty:  # a fault ends the request, or (drop, several members) drops the member
        if o["status"] == "failed":
            assert o["failed_member"] == o["target"]
        else:
            assert o["policy"] == "drop" and o["dropped"] == [o["target"]]
    assert all(o["verdict"] == "ok" for o in data["outcomes"])
    assert "0 mismatches" in (out / "results.md").read_text()
    assert (out / "soak.png").stat().st_size > 0


# --- tool use, with a stand-in task ----------------------------------------------------------

DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.",
       "parameters": {"type": "object", "properties": {"a": DIGIT, "b": DIGIT},
                      "required": ["a", "b"]}}}  # fmt: skip


def _stand_in(n: int) -> bench_tools.ToolTask:
    """Arithmetic problems offering one `add` tool; the right call adds the first step."""
    problems = [
        SimpleNamespace(
            messages=p.messages,
            tools=[ADD],
            response_format=None,
            answer=p.answer,
            expected_call=("add", {"a": p.start, "b": p.steps[0][1]}),
        )  # fmt: skip
        for p in make_problems(n, seed=5)
    ]

    def followup(call_id, name, arguments, result):
        call = {"id": call_id, "type": "function",
                "function": {"name": name, "arguments": arguments}}  # fmt: skip
        return [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": result, "tool_call_id": call_id, "name": name},
        ]

    def add(name, arguments):  # as a tool loop runs it: a wrong call gets an error back
        if name != "add" or set(arguments) != {"a", "b"}:
            return f"Error: no tool {name!r} taking {sorted(arguments)}"
        return str(arguments["a"] + arguments["b"])

    return bench_tools.ToolTask(
        "stand-in",
        problems,
        add,
        followup,
        lambda name, arguments, problem: (name, arguments) == problem.expected_call,
        lambda text, problem, cut: check_answer(text, problem),
    )


def test_tool_benchmark_plays_the_tool_loop(shipped_members, tmp_path):
    task = _stand_in(2)
    names = [m.name for m in shipped_members]
    setups = bench_tools.tool_setups(["single", "safe"], names)
    assert [s.label for s in setups] == [f"single {n}" for n in names] + ["safe"]
    result = bench_tools.run(
        members=shipped_members, setups=setups, task=task, max_new_tokens=48,
        tool_choice="required", out=tmp_path / "tool", progress=False,
    )  # fmt: skip
    rows = {r["label"]: r for r in result["rows"]}
    for label, row in rows.items():
        grammar = row["grammar"]
        # one tool offered and a call required: the grammar writes a valid call to it
        assert grammar["calls"] >= 2 and grammar["schema_valid"] == 1.0
        assert grammar["right_tool"] == 1.0
        records = result["per_problem"][f"{label} / grammar"]
        for record, problem in zip(records, task.problems, strict=True):
            call = record["call"]
            assert record["args_right"] == (
                (call["name"], call["arguments"]) == problem.expected_call
            )
            assert record["answer_right"] == check_answer(record["final"], problem)
        free = row["prompt only"]
        assert 0.0 <= free["right_tool"] <= 1.0
        assert free["schema_valid"] is None or 0.0 <= free["schema_valid"] <= 1.0
    table = (tmp_path / "tool" / "results.md").read_text()
    assert "| safe |" in table and "prompt only" in table


def test_tool_benchmark_on_the_testbed_tool_form(tmp_path):
    out = tmp_path / "tool"
    args = ["bench", "--form", "tool", "--methods", "single,safe", "--n", "4"]
    args += ["--max-new-tokens", "64", "--threads", "1", "--out", str(out)]
    assert main(args) == 0
    data = _results(out)
    problems = make_problems(4, seed=1, form="tool")
    assert data["problems"] == 4
    assert data["needs_call"] == sum(p.expected_call is not None for p in problems)
    assert [r["label"] for r in data["rows"]] == [
        "single tb-gpt2-bpe", "single tb-qwen2-spm", "single tb-llama-word", "safe"
    ]  # fmt: skip
    for key, records in data["per_problem"].items():
        for record, problem in zip(records, problems, strict=True):
            assert record["answer_right"] == check_answer(record["final"], problem)
            assert not record["args_right"] or record["tool_right"]
            if problem.expected_call is None:
                assert record["tool_right"] == (record["calls"] == 0)
            if key.endswith("/ grammar"):  # every call the grammar let close is schema-valid
                assert record["valid_calls"] == record["calls"] - record["cut_calls"]
    assert "| safe |" in (out / "results.md").read_text()


def test_bad_arguments_of_the_new_modes_are_clear_errors(tmp_path, capsys):
    base = ["bench", "--n", "1", "--out", str(tmp_path / "x")]
    for extra, message in [
        (["--concurrency", "2,4"], "including 1"),
        (["--concurrency", "1,x"], "comma-separated request counts"),
        (["--concurrency", "1,2", "--aggregator", "gac"], "default options"),
        (["--grammar-cost", "--temperature", "0.7"], "greedy"),
        (["--concurrency", "1,2", "--grammar-cost"], "pick one"),
        (["--prompt-tokens", "700"], "--concurrency run"),
        (["--concurrency", "1,2", "--prompt-tokens", "700"], "--form rag"),
        (["--form", "tool", "--task", str(tmp_path / "t.jsonl")], "no tools to offer"),
        (["--concurrency", "1,2", "--config", "p=safe:frequency_penalty=0.5"], "drop it here"),
        (["--grammar-cost", "--config", "p=safe:presence_penalty=1"], "drop it here"),
    ]:
        assert main(base + extra) == 2
        assert message in capsys.readouterr().err
    assert main(["soak", "--requests", "0"]) == 2
    assert "--requests must be at least 1" in capsys.readouterr().err


def test_a_differing_text_is_explained_by_the_drafter_gap(shipped_members):
    """Where two texts of one prompt part, `first_difference` names the token and the
    drafter's log-prob gap: for its own greedy text against any other, never negative."""
    from core import Ensemble
    from lab.bench.concurrency import first_difference

    problem = make_problems(1, seed=9)[0]
    drafter = shipped_members[0]
    alone = Ensemble([drafter], "single").generate(problem.messages, max_new_tokens=24).text
    cut = alone.index(" ", 8)  # a word boundary inside the answer
    together = alone[:cut] + " zebra"
    found = first_difference(drafter, problem.messages, alone, together)
    ids = drafter.canonical_ids(alone)
    assert 0 < found["shared_tokens"] < len(ids)
    assert found["gap"] >= 0 and found["tokens"][0] != found["tokens"][1]
    assert first_difference(drafter, problem.messages, alone, alone[:cut])["shared_tokens"] > 0
