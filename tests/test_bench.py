"""The benchmark harness end to end, through the CLI: outputs written, ratios from one run."""

from __future__ import annotations

import json

import pytest

from lab.bench.answers import answer_checker
from lab.cli import main


def _results(out):
    data = json.loads((out / "results.json").read_text())
    return data, {row["label"]: row for row in data["rows"]}


def test_bench_writes_json_table_and_plots(tiny_dirs, tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "--methods", "single,token", "--aggregator", "unite,gac", "--n", "3"]
    args += ["--max-new-tokens", "12", "--out", str(out)]
    for path in tiny_dirs.values():
        args += ["--model", path]
    assert main(args) == 0
    data, rows = _results(out)
    assert data["problems"] == 3 and data["command"].startswith("python -m lab bench")
    assert set(rows) == {
        "single tb-gpt2-bpe",
        "single tb-qwen2-spm",
        "single tb-llama-word",
        "token unite",
        "token gac",
    }
    singles = [rows[f"single {n}"] for n in ("tb-gpt2-bpe", "tb-qwen2-spm", "tb-llama-word")]
    fastest = min(r["ms_per_token"] for r in singles)
    for row in rows.values():
        assert 0.0 <= row["accuracy"] <= 1.0
        assert row["tokens"] == sum(p["tokens"] for p in data["per_problem"][row["label"]])
        # ratios are computed from this run's own numbers
        drafter = singles[row["drafter"]]
        assert row["ratio_to_drafter"] == pytest.approx(
            row["ms_per_token"] / drafter["ms_per_token"]
        )
        assert row["ratio_to_fastest_single"] == pytest.approx(row["ms_per_token"] / fastest)
        assert row["peak_memory_mb"] > 0
    assert all(r["first_delta_ms"] > 0 for r in singles)  # they always write something
    assert (
        rows["token gac"]["ensemble_rate"] == 1.0
        and rows["single tb-gpt2-bpe"]["ensemble_rate"] == 0
    )
    table = (out / "results.md").read_text()
    assert "| token gac |" in table and "× drafter" in table
    assert (out / "accuracy_vs_time.png").stat().st_size > 0
    assert (out / "ensemble_rate.png").stat().st_size > 0


def test_gpu_shape_mode_runs_on_cpu(tmp_path):
    out = tmp_path / "shape"
    args = ["bench", "--shape", "tiny", "--device", "cpu", "--methods", "single,token"]
    args += ["--aggregator", "gac", "--n", "2", "--max-new-tokens", "8", "--out", str(out)]
    args += ["--ignore-stop", "--temperature", "1.0", "--threads", "1"]
    assert main(args) == 0
    data, rows = _results(out)
    assert data["shape"] == "tiny" and all(r["accuracy"] is None for r in rows.values())
    # fixed-length speed runs: nobody stops before max_new_tokens
    assert all(r["tokens_per_problem"] == 8 for r in rows.values())
    assert "accuracy" not in (out / "results.md").read_text()


def test_jsonl_task_with_simple_checker(tiny_dirs, tmp_path):
    task = tmp_path / "task.jsonl"
    task.write_text(
        '{"prompt": "What is 2+2?", "answer": 4}\n{"prompt": "Say hi", "answer": "hi"}\n'
    )
    out = tmp_path / "jsonl"
    args = ["bench", "--methods", "single", "--task", str(task), "--n", "2"]
    args += ["--max-new-tokens", "4", "--out", str(out), "--model", tiny_dirs["tb-gpt2-bpe"]]
    assert main(args) == 0
    data = _results(out)[0]
    assert data["task"] == "task"
    records = data["per_problem"]["single tb-gpt2-bpe"]
    assert len(records) == 2 and all(type(r["correct"]) is bool for r in records)  # scored


def test_bad_bench_arguments_are_clear_errors(tmp_path, capsys):
    missing = str(tmp_path / "missing.jsonl")
    assert main(["bench", "--methods", "single", "--task", missing, "--shape", "tiny"]) == 2
    assert "neither 'arithmetic', 'real' nor a JSONL file" in capsys.readouterr().err
    assert main(["bench", "--methods", "nope", "--shape", "tiny", "--n", "1"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("answer", "output", "right"),
    [
        # numbers, as numbers: after the last marker, else the last number
        ("12", "7 + 5 = 12. The answer is 12.", True),
        ("12", "The answer is 12 apples, not 13.", True),
        ("12", "He had 12 apples, then 13.", False),
        ("1234", "Answer: 1,234", True),
        ("-3.5", "so x = -3.50", True),
        ("12", "The answer is 120.", False),
        ("12", "no number here", False),
        # a multiple-choice letter, as a whole token at the answer position
        ("B", "The answer is B.", True),
        ("B", "Answer: (B)", True),
        ("(B)", "Paris is in France.\nThe answer is **B**: Paris", True),
        ("B", "Paris is the capital.\nB", True),
        ("b", "**Answer:** B", True),
        ("B", "Because Bob bought a Banana, B looks likely; but the answer is C.", False),
        ("B", "The answer is Blue.", False),
        ("A", "The answer is a cat.", False),
        ("B", "Options A, B and C all look plausible.", False),
        ("B", "I think B.\nBut on reflection I am not sure.", False),
        ("B", "", False),
        # free text, by normalised equality of the extracted answer
        ("Paris", "The capital of France is Paris.\nThe answer is Paris.", True),
        ("Paris", 'The answer is "paris"', True),
        ("St. Louis", "The answer is St. Louis.", True),
        ("Paris", "The answer is Paris. It lies on the Seine.", True),
        ("Paris", "Paris", True),
        ("Paris", "Paris? No: the answer is Lyon.", False),
        ("Paris", "It is probably Paris or Lyon", False),
        ("Paris", "The answer is Parisian food.", False),
    ],
)
def test_the_checker_compares_the_final_answer_exactly(answer, output, right):
    assert answer_checker(answer)(output) is right


def test_bad_task_files_are_clear_errors(tmp_path, capsys):
    args = ["bench", "--methods", "single", "--shape", "tiny", "--n", "1", "--task"]
    for content, message in [
        ('{"prompt": "Hi", "answer": "B"\n', "task.jsonl:1 is not JSON"),
        ('{"prompt": "Hi"}\n', "task.jsonl:1 needs 'prompt' and 'answer'"),
        ('{"prompt": "Hi", "answer": " "}\n', "task.jsonl:1 has an empty 'answer'"),
    ]:
        (tmp_path / "task.jsonl").write_text(content)
        assert main([*args, str(tmp_path / "task.jsonl"), "--out", str(tmp_path / "out")]) == 2
        assert message in capsys.readouterr().err
