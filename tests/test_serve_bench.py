"""`python -m lab bench --serve` and `soak --serve` at their smallest: the tables they record
(a server process against the same method in process; an HTTP soak checked answer by answer)."""

from __future__ import annotations

import json

import pytest

from lab.cli import main


def test_bench_serve_compares_http_with_in_process(tmp_path, shipped_members):
    out = tmp_path / "load"
    argv = ["bench", "--serve", "1,2", "--n", "2", "--methods", "single", "--threads", "1",
            "--max-new-tokens", "8", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["command"].startswith("python -m lab bench --serve")
    modes = {(r["level"], r["mode"]) for r in result["rows"]}
    assert modes == {(1, "http"), (1, "process"), (2, "http"), (2, "process")}
    assert all(r["tokens"] > 0 and r["ttft_p50_ms"] is not None for r in result["rows"])
    assert list(result["same_text"].values()) == [{"1": 2, "2": 2}]
    assert "| single tb-gpt2-bpe | 2 |" in (out / "results.md").read_text()


def test_soak_serve_checks_every_answer(tmp_path, shipped_members):
    out = tmp_path / "soak"
    argv = ["soak", "--serve", "--requests", "16", "--window", "8", "--methods",
            "single,safe", "--tasks", "3", "--max-new-tokens", "12", "--problems", "4",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["requests"] == 16 and len(result["windows"]) == 2
    assert result["mismatches"] == 0 and result["server_errors"] == 0
    assert result["held_slots"] == 0
    assert {o["verdict"] for o in result["outcomes"]} == {"ok"}


def test_served_members_are_the_members_in_process():
    """The server's ensemble.toml carries each member as the run in process loads it: a Local
    with its own template and stop strings reads back as the same Local."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on; the server reads 3.10's by tomli
    from core import Local
    from core.sources import public_sources
    from core.testbed.real_models import GEMMA_STOP, GEMMA_TEMPLATE
    from lab.bench.serve import toml_value

    members = [
        "models/tb-gpt2-bpe",
        Local("g.gguf", chat_template=GEMMA_TEMPLATE, stop=GEMMA_STOP, name="gemma-3-270m"),
    ]
    text = f"members = {toml_value(public_sources(members))}\n"
    read = tomllib.loads(text)["members"]
    assert read[0] == "models/tb-gpt2-bpe"
    assert Local(**read[1]) == members[1]


def test_bench_serve_refuses_random_shapes(capsys):
    argv = ["bench", "--serve", "1", "--shape", "tiny", "--n", "1", "--methods", "single"]
    assert main(argv) != 0
    assert "--shape" in capsys.readouterr().err
