"""The console script: the demo on the shipped models and `generate` streaming an answer."""

from __future__ import annotations

from core.cli import main
from core.testbed import make_problems, model_paths


def test_demo_shows_the_headroom_and_a_problem_the_ensemble_decides(capsys):
    assert main(["demo", "--n", "12", "--max-new-tokens", "60", "--methods", "specem"]) == 0
    out = capsys.readouterr().out
    for label in ("tb-gpt2-bpe alone", "tb-qwen2-spm alone", "tb-llama-word alone"):
        assert f"  {label} " in out
    assert "default ensemble: " in out and "SAFE as published (preset='paper')" in out
    assert "specem (its defaults)" in out
    assert "at least one member right (the ceiling)" in out and "best single member: " in out
    assert "of the gap" in out or "no gap to close" in out
    # the problem where the members disagree: each member's answer, the ensemble's, its events
    assert "Where the members disagree: " in out and "how it decided:" in out


def test_generate_streams_with_events(capsys):
    paths = [str(p) for p in model_paths()[:2]]
    question = make_problems(1, seed=3)[0].question
    args = ["generate", "--model", paths[0], "--model", paths[1], "--method", "safe"]
    args += ["--max-new-tokens", "40", "--events", "--device", "cpu", question]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "answer" in captured.out.lower()
    assert '"name": "draft"' in captured.err and "E/T" in captured.err


def test_generate_reports_bad_input_without_a_traceback(capsys, tmp_path):
    missing = str(tmp_path / "missing")
    assert main(["generate", "--model", missing, "--method", "single", "hello"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_demo_runs_its_members_in_the_dtype_asked(capsys):
    args = ["demo", "--n", "3", "--max-new-tokens", "30", "--dtype", "bfloat16"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "make_problems(3, seed=1); bfloat16):" in out
    assert "default ensemble: " in out and "best single member: " in out


def test_demo_names_a_bad_dtype_and_the_fix(capsys):
    assert main(["demo", "--n", "3", "--dtype", "int8"]) == 2
    err = capsys.readouterr().err
    assert "dtype 'int8'" in err and "'bfloat16'" in err
