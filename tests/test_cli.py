"""The console script: the demo on the shipped models and `generate` streaming an answer."""

from __future__ import annotations

from core.cli import main
from core.testbed import make_problems, model_paths


def test_demo_runs_every_method_on_the_shipped_models(capsys):
    assert main(["demo", "--n", "1", "--max-new-tokens", "60"]) == 0
    out = capsys.readouterr().out
    labels = ("single tb-gpt2-bpe", "token (UniTE as published)", "token, first sub-token")
    for label in (*labels, "safe", "specem"):
        assert f"--- {label}:" in out
    assert "accuracy on these problems:" in out


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
